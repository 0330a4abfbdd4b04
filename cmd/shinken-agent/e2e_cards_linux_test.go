package main

// End-to-end: approval cards through shinkenctl and the raw API (moved from
// e2e_linux_test.go).

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/audit"
)

// TestCards: sibling Ask requests share one card; approve-pattern answers the
// same request later without a card; cancel is a dismissal (not a denial);
// deny is recorded as one; a card nobody answers times out and never runs.
func TestCards(t *testing.T) {
	e := newEnv(t)
	e.config = filepath.Join(e.dir, "agent.json")
	if err := os.WriteFile(e.config, []byte(`{"approval_timeout": "2s", "breaker_consecutive": 100, "breaker_total": 100}`), 0o644); err != nil {
		t.Fatal(err)
	}
	e.startAgent()
	e.mustCtl("session", "create", "c1", "-image", "e2e")
	port := listen(t, "127.0.0.3:0")

	// Two Ask siblings and one Auto request in one call: the Auto one is
	// granted, the two Ask ones share one card.
	body := fmt.Sprintf(`{"requests":[
		{"session":"c1","capability":{"class":"net.egress","net_egress":{"cidrs":["127.0.0.3/32"],"ports":[{"lo":%d,"hi":%d}]}},"lifecycle":"session"},
		{"session":"c1","capability":{"class":"net.egress","net_egress":{"domains":["a.shinken.test"],"cidrs":["127.0.0.4/32"]}},"lifecycle":"session"},
		{"session":"c1","capability":{"class":"net.egress","net_egress":{"cidrs":["127.0.0.2/32"],"ports":[{"lo":80,"hi":80}]}},"lifecycle":"session"}]}`, port, port)
	code, out := rawAPI(t, e.socket, "POST", "/v1/requests", body)
	var res []reqResult
	if err := json.Unmarshal([]byte(out), &res); err != nil || code != 200 || len(res) != 3 {
		t.Fatalf("batch: %d %s", code, out)
	}
	if res[0].Outcome != "pending" || res[1].Outcome != "pending" || res[0].Card == "" || res[0].Card != res[1].Card || res[2].Outcome != "granted" {
		t.Fatalf("batch outcomes: %+v", res)
	}
	card := res[0].Card
	var cards []struct {
		ID    string `json:"id"`
		Items []struct {
			Actor, Action, Resource, Rule, Tier string
		} `json:"items"`
	}
	e.ctlJSON(&cards, "cards")
	if len(cards) != 1 || cards[0].ID != card || len(cards[0].Items) != 2 {
		t.Fatalf("cards: %+v", cards)
	}
	for _, it := range cards[0].Items {
		if it.Actor == "" || it.Action != "UseCapability" || it.Resource != "net.egress" || it.Tier != "ask" || it.Rule == "" {
			t.Errorf("card item lacks context: %+v", it)
		}
	}

	// Approve as a pattern: both granted, and the same request later needs
	// no card.
	e.mustCtl("approve", card, "--pattern")
	if !e.connect("c1", "127.0.0.3", port) {
		t.Fatal("approved grant does not connect")
	}
	e.ctlJSON(&res, "request", "c1", "net.egress", "-cidr", "127.0.0.3/32", "-port", strconv.Itoa(port))
	if len(res) != 1 || res[0].Outcome != "granted" || !strings.Contains(res[0].Reason, "pattern") {
		t.Fatalf("request matching an approved pattern: %+v", res)
	}

	// Cancel is a dismissal, deny an explicit no; neither runs.
	breaker := func() float64 {
		var v map[string]any
		e.ctlJSON(&v, "session", "show", "c1")
		b, _ := v["breaker"].(map[string]any)
		n, _ := b["total"].(float64)
		return n
	}
	e.ctlJSON(&res, "request", "c1", "net.egress", "-cidr", "127.0.0.5/32")
	c2 := res[0].Card
	before := breaker()
	e.mustCtl("cancel", c2)
	if after := breaker(); after != before {
		t.Errorf("cancel counted as a denial: breaker %v -> %v", before, after)
	}
	e.ctlJSON(&res, "request", "c1", "net.egress", "-cidr", "127.0.0.6/32")
	c3 := res[0].Card
	e.mustCtl("deny", c3)
	if after := breaker(); after != before+1 {
		t.Errorf("deny not counted as a denial: breaker %v -> %v", before, after)
	}
	if out, err := e.ctl("approve", c3, "--once"); err == nil || !strings.Contains(out, "HTTP 409") {
		t.Errorf("approving a denied card: err=%v %s", err, out)
	}

	// Nobody answers: the card times out and the request never runs.
	e.ctlJSON(&res, "request", "c1", "net.egress", "-cidr", "127.0.0.7/32", "-port", "9")
	c4 := res[0].Card
	var all []struct{ ID, Status string }
	deadline := time.Now().Add(10 * time.Second)
	status := ""
	for time.Now().Before(deadline) && status != "timed_out" {
		time.Sleep(500 * time.Millisecond)
		e.ctlJSON(&all, "cards", "-all")
		for _, c := range all {
			if c.ID == c4 {
				status = c.Status
			}
		}
	}
	if status != "timed_out" {
		t.Fatalf("unanswered card: status %q, want timed_out", status)
	}
	if out, err := e.ctl("approve", c4, "--once"); err == nil {
		t.Errorf("approving a timed-out card worked: %s", out)
	}
	var grants []grantRow
	e.ctlJSON(&grants, "grants", "c1")
	for _, g := range grants {
		for _, c := range g.Cap.Egress.CIDRs {
			if (c == "127.0.0.5/32" || c == "127.0.0.6/32" || c == "127.0.0.7/32") && g.Phase == "live" {
				t.Errorf("a cancelled, denied or timed-out request was granted: %+v", g)
			}
		}
	}
	logData, _ := os.ReadFile(filepath.Join(e.dir, "state", audit.LogFile))
	for _, want := range []string{`"approved_pattern"`, `"cancelled"`, `"denied"`, `"timed_out"`} {
		if !strings.Contains(string(logData), want) {
			t.Errorf("audit log lacks %s", want)
		}
	}
}
