package main

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/shinken-agent/shinken/agent/api/wire"
)

// TestPanelTerminal drives the panel's terminal in headless Chromium: a
// shell starts in the session, a typed command runs there (as the
// session's uid) and its output appears; the shell is a process of the
// session (shinkenctl ps); the relay refuses a WebSocket from another
// origin even with the panel's cookie.
func TestPanelTerminal(t *testing.T) {
	chrome := findChromium(t)
	e := newEnv(t)
	e.startAgent()
	e.mustCtl("session", "create", "tt", "-image", "e2e")
	panelURL := e.startPanel()
	base := strings.SplitN(panelURL, "/?", 2)[0]

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chrome), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.UserDataDir(t.TempDir()))
	actx, cancelA := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelA()
	bctx, cancelB := chromedp.NewContext(actx)
	defer cancelB()
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
	waitText := func(sel, want string) string {
		t.Helper()
		var s string
		for i := 0; i < 150; i++ {
			s, _ = chromedp.Run(bctx, chromedp.Text(chromedp.CSS(sel)))
			if strings.Contains(s, want) {
				return s
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Fatalf("%s never showed %q: %q", sel, want, s)
		return s
	}
	do("open the panel URL", chromedp.Navigate(panelURL), chromedp.WaitVisible(chromedp.CSS(`tr[data-session="tt"] a.terminal`)))
	do("open the terminal", chromedp.Click(chromedp.CSS(`tr[data-session="tt"] a.terminal`)), chromedp.WaitVisible(chromedp.CSS(`#term`)))
	waitText("#term-state", "connected")
	do("type a command", chromedp.Click(chromedp.CSS(`#term`)), chromedp.SendKeys(chromedp.CSS(`#term`), "echo hello-$((6*7)) from $(id -u)\n"))
	var sv struct{ UID *uint32 }
	e.ctlJSON(&sv, "session", "show", "tt")
	out := waitText("#term", "hello-42 from ")
	if sv.UID == nil || !strings.Contains(out, "hello-42 from "+strconv.Itoa(int(*sv.UID))) {
		t.Errorf("terminal (session uid %v): %q", sv.UID, out)
	}
	var ps []wire.Process
	e.ctlJSON(&ps, "ps", "tt")
	if len(ps) != 1 || ps[0].State != wire.ProcRunning || !ps[0].TTY || ps[0].Argv[0] != "/bin/bash" {
		t.Errorf("the panel's shell as a process: %+v", ps)
	}
	do("exit the shell", chromedp.SendKeys(chromedp.CSS(`#term`), "exit 0\n"))
	waitText("#term-state", "the shell ended: exit 0")

	// The relay checks the Origin of the upgrade, cookie or not.
	ck, err := chromedp.Call(bctx, network.GetCookies, network.GetCookiesParams{URLs: []string{base + "/"}})
	if err != nil || len(ck.Cookies) != 1 {
		t.Fatalf("browser cookies: %+v %v", ck, err)
	}
	req, _ := http.NewRequest("GET", base+"/api/sessions/tt/processes/"+ps[0].ID+"/attach", nil)
	for k, v := range map[string]string{"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
		"Origin": "http://evil.example", "Cookie": ck.Cookies[0].Name + "=" + ck.Cookies[0].Value} {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("cross-origin WebSocket to the panel with its cookie: %d", resp.StatusCode)
	}
}
