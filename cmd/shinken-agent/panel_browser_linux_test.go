package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
)

// findChromium returns Debian's chromium (or another Chrome) or skips the
// test; in CI (CI set) a missing browser fails it, since .ci/install-deps
// installs one.
func findChromium(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("no chromium on PATH in CI: .ci/install-deps installs Debian's chromium")
	}
	t.Skip("no chromium on PATH (apt-get install chromium); the browser test needs a real browser")
	return ""
}

// startPanel runs `shinkenctl panel` against the test agent and returns the
// URL it prints.
func (e *env) startPanel() string {
	e.t.Helper()
	cmd := exec.Command(filepath.Join(e.bin, "shinkenctl"), "-socket", e.socket, "panel")
	out, err := cmd.StdoutPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { cmd.Process.Signal(os.Interrupt); cmd.Wait() })
	urls := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "http://127.0.0.1:") {
				urls <- sc.Text()
			}
		}
		io.Copy(io.Discard, out)
	}()
	select {
	case u := <-urls:
		return u
	case <-time.After(10 * time.Second):
		e.t.Fatal("shinkenctl panel printed no URL")
	}
	return ""
}

// TestPanelBrowser drives the panel in headless Chromium against a real
// agent: it sees the session and its grant tree, approves a pending card
// (the kernel then lets the connection through), flips a revoke switch (the
// kernel then refuses the connection with EPERM), watches a denial arrive on
// the live stream, and checks that requests without the token, and POSTs
// from another origin, are refused.
func TestPanelBrowser(t *testing.T) {
	chrome := findChromium(t)
	e := newEnv(t)
	e.startAgent()
	pA := listen(t, "127.0.0.2:0") // auto-granted, then revoked with the switch
	pC := listen(t, "127.0.0.3:0") // through a card approved in the panel
	e.mustCtl("session", "create", "web", "-image", "e2e")
	var res []reqResult
	e.ctlJSON(&res, "request", "web", "net.egress", "-cidr", "127.0.0.2/32", "-port", strconv.Itoa(pA))
	if len(res) != 1 || res[0].Outcome != "granted" {
		t.Fatalf("auto request: %+v", res)
	}
	parent := res[0].Grant
	var child struct {
		ID string `json:"id"`
	}
	e.ctlJSON(&child, "attenuate", parent.Handle, "web", "net.egress", "-cidr", "127.0.0.2/32", "-port", strconv.Itoa(pA))
	if child.ID == "" {
		t.Fatal("attenuate gave no grant")
	}
	e.ctlJSON(&res, "request", "web", "net.egress", "-cidr", "127.0.0.3/32", "-port", strconv.Itoa(pC))
	if len(res) != 1 || res[0].Outcome != "pending" {
		t.Fatalf("ask request: %+v", res)
	}
	card := res[0].Card
	if !e.connect("web", "127.0.0.2", pA) || e.connect("web", "127.0.0.3", pC) {
		t.Fatal("kernel state before the panel is not as granted")
	}

	panelURL := e.startPanel()
	base := strings.SplitN(panelURL, "/?", 2)[0]

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chrome), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.UserDataDir(t.TempDir()))
	actx, cancelA := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelA()
	bctx, cancelB := chromedp.NewContext(actx)
	defer cancelB()
	// Start the browser on bctx itself: a first action under a step's
	// timeout would tie the browser's life to that step.
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("start %s: %v", chrome, err)
	}
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, cancel := context.WithTimeout(bctx, 15*time.Second)
		defer cancel()
		if err := chromedp.Do(sctx, steps...); err != nil {
			html, _ := chromedp.Run(bctx, chromedp.OuterHTML(chromedp.CSS("body")))
			t.Fatalf("%s: %v\npage:\n%s", what, err, html)
		}
	}
	// SHINKEN_PANEL_SHOTS=DIR keeps a screenshot of each page, for a look.
	shot := func(name string) {
		if dir := os.Getenv("SHINKEN_PANEL_SHOTS"); dir != "" {
			if b, err := chromedp.Run(bctx, chromedp.FullScreenshot(100)); err == nil {
				os.WriteFile(filepath.Join(dir, name+".png"), b, 0o644)
			}
		}
	}
	text := func(sel string) string {
		t.Helper()
		sctx, cancel := context.WithTimeout(bctx, 15*time.Second)
		defer cancel()
		s, err := chromedp.Run(sctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return s
	}

	// Sessions: the token buys a cookie, then the page.
	do("open the panel URL", chromedp.Navigate(panelURL), chromedp.WaitVisible(chromedp.CSS(`tr[data-session="web"]`)))
	var sv struct{ UID *uint32 }
	e.ctlJSON(&sv, "session", "show", "web")
	if sv.UID == nil || *sv.UID == 0 {
		t.Fatalf("the API shows no uid for the session: %+v", sv)
	}
	if row := text(`tr[data-session="web"]`); !strings.Contains(row, filepath.Join(e.cgroupDir, "web")) || !strings.Contains(row, "net.egress: revocable in-kernel") ||
		!strings.Contains(row, strconv.Itoa(int(*sv.UID))) {
		t.Errorf("session row (uid %d): %q", *sv.UID, row)
	}
	shot("sessions")
	if u, _ := chromedp.Run(bctx, chromedp.Location()); strings.Contains(u, "token") {
		t.Errorf("the token stayed in the address bar: %s", u)
	}
	if c, _ := chromedp.Run(bctx, chromedp.Evaluate[string](`document.cookie`)); c != "" {
		t.Errorf("the panel cookie is readable from JavaScript: %q", c)
	}

	// Grants: the attenuated child under its parent.
	do("grants page", chromedp.Navigate(base+"/grants"),
		chromedp.WaitVisible(chromedp.CSS(`li[data-grant="`+parent.ID+`"] li[data-grant="`+child.ID+`"]`)))
	shot("grants")

	// Cards: approve for the session; the kernel lets the connection through.
	do("approve the card", chromedp.Navigate(base+"/cards"), chromedp.WaitVisible(chromedp.CSS(`article[data-card="`+card+`"]`)))
	shot("cards")
	if c := text(`article[data-card="` + card + `"]`); !strings.Contains(c, "127.0.0.3/32") || !strings.Contains(c, "UseCapability") || !strings.Contains(c, "tier:ask") || !strings.Contains(c, "first-party") {
		t.Errorf("card shows: %q", c)
	}
	do("click approve", chromedp.Click(chromedp.CSS(`article[data-card="`+card+`"] button[data-action="approve-session"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#no-cards`)))
	var cards []cardRow
	e.ctlJSON(&cards, "cards", "-all")
	for _, c := range cards {
		if c.ID == card && c.Status != "approved" {
			t.Errorf("card %s is %s after the click", card, c.Status)
		}
	}
	if !e.connect("web", "127.0.0.3", pC) {
		t.Error("the card approved in the panel did not open the connection")
	}

	// Revoke the parent with its switch: the subtree dies in the kernel.
	do("revoke with the switch", chromedp.Navigate(base+"/grants"),
		chromedp.WaitVisible(chromedp.CSS(`li[data-grant="`+parent.ID+`"]`)),
		chromedp.Click(chromedp.CSS(`input.revoke[data-grant="`+parent.ID+`"]`)),
		chromedp.WaitNotPresent(chromedp.CSS(`li[data-grant="`+parent.ID+`"]`)))
	if e.connect("web", "127.0.0.2", pA) { // connect fails the test unless the failure is EPERM
		t.Fatal("the grant revoked in the panel still connects")
	}
	var grants []grantRow
	e.ctlJSON(&grants, "grants", "web")
	for _, g := range grants {
		if (g.ID == parent.ID || g.ID == child.ID) && g.Phase != "revoked" {
			t.Errorf("grant %s is %s after the switch", g.ID, g.Phase)
		}
	}

	// The live denial stream: a new denial appears without a reload.
	do("denial stream", chromedp.Navigate(base+"/events"), chromedp.WaitVisible(chromedp.CSS(`#stream-state`)))
	for i := 0; i < 50 && !strings.Contains(text(`#stream-state`), "live"); i++ {
		time.Sleep(100 * time.Millisecond)
	}
	if e.connect("web", "127.0.0.2", pA) {
		t.Fatal("revoked grant connects")
	}
	do("a denial arrives live", chromedp.WaitVisible(chromedp.CSS(`#denials tr.fresh`)))
	shot("denials")
	if row := text(`#denials tr.fresh`); !strings.Contains(row, "dst=127.0.0.2:"+strconv.Itoa(pA)) || !strings.Contains(row, "web") || !strings.Contains(row, "kernel.deny") {
		t.Errorf("live denial row: %q", row)
	}
	do("enforcement page", chromedp.Navigate(base+"/enforcement"), chromedp.WaitVisible(chromedp.CSS(`tr[data-class="net.egress"]`)))
	if lv := text(`tr[data-class="net.egress"] td.level`); lv != "revocable in-kernel" {
		t.Errorf("net.egress level in the panel: %q", lv)
	}
	shot("enforcement")
	do("audit page", chromedp.Navigate(base+"/audit"), chromedp.WaitVisible(chromedp.CSS(`#audit-result`)))
	if a := text(`#audit-result`); !strings.Contains(a, "verified") {
		t.Errorf("audit verify in the panel: %q", a)
	}
	shot("audit")

	// Without the token (or its cookie): 403. With the cookie but from
	// another origin: 403, and nothing is revoked.
	for _, p := range []string{"/", "/grants", "/cards", "/events/stream", panelURL[len(base):]} {
		resp, err := http.Get(base + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("GET %s without the token: %d", p, resp.StatusCode)
		}
	}
	ck, err := chromedp.Call(bctx, network.GetCookies, network.GetCookiesParams{URLs: []string{base + "/"}})
	if err != nil || len(ck.Cookies) != 1 || !ck.Cookies[0].HTTPOnly {
		t.Fatalf("browser cookies: %+v %v", ck, err)
	}
	req, _ := http.NewRequest("POST", base+"/api/cards/"+card+"/deny", strings.NewReader("{}"))
	req.Header.Set("Cookie", ck.Cookies[0].Name+"="+ck.Cookies[0].Value)
	req.Header.Set("Origin", "http://evil.example")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("cross-origin POST with the cookie: %d", resp.StatusCode)
	}
}
