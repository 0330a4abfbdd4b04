package main

// End-to-end: kill -9 of the daemon under load (moved from e2e_linux_test.go).

import (
	"bytes"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/dataplane"
	"github.com/shinken-agent/shinken/dataplane/probe"
)

// TestKill9UnderLoad: kill -9 of the daemon while requests and connections
// run; enforcement holds throughout, and after a restart the sessions, grants,
// cards and the audit chain are intact.
func TestKill9UnderLoad(t *testing.T) {
	e := newEnv(t)
	e.startAgent()
	pA := listen(t, "127.0.0.2:0")
	pB := listen(t, "127.0.0.3:0")
	e.mustCtl("session", "create", "k9", "-image", "e2e")
	var res []reqResult
	e.ctlJSON(&res, "request", "k9", "net.egress", "-cidr", "127.0.0.2/32", "-port", strconv.Itoa(pA))
	if res[0].Outcome != "granted" {
		t.Fatalf("%+v", res)
	}
	e.ctlJSON(&res, "request", "k9", "net.egress", "-cidr", "127.0.0.3/32", "-port", strconv.Itoa(pB))
	if res[0].Outcome != "pending" {
		t.Fatalf("%+v", res)
	}
	pendingCard := res[0].Card
	var grantsBefore []grantRow
	e.ctlJSON(&grantsBefore, "grants", "k9")

	// Load: hammer both destinations from inside the session, and keep the
	// API busy with requests, while the daemon is killed and restarted.
	sess := dataplane.Session{Name: "k9", Path: filepath.Join(e.cgroupDir, "k9")}
	hammer := func(addr string) chan string {
		ch := make(chan string, 1)
		cmd := exec.Command(filepath.Join(e.bin, "probe"))
		cmd.Env = []string{probe.EnvVar + "=1"}
		cmd.Stdin = strings.NewReader("hammer " + addr + " 4\n")
		var out bytes.Buffer
		cmd.Stdout = &out
		if err := dataplane.StartIn(sess, cmd, dataplane.ProcOptions{}); err != nil {
			t.Fatal(err)
		}
		go func() { cmd.Wait(); ch <- strings.TrimSpace(out.String()) }()
		return ch
	}
	hA := hammer(fmt.Sprintf("127.0.0.2:%d", pA))
	hB := hammer(fmt.Sprintf("127.0.0.3:%d", pB))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			e.ctl("request", "k9", "net.egress", "-cidr", "127.0.0.2/32", "-port", strconv.Itoa(1000+i%50))
		}
	}()
	time.Sleep(1 * time.Second)
	e.stopAgent(syscall.SIGKILL)
	time.Sleep(500 * time.Millisecond)
	e.startAgent()
	close(stop)
	wg.Wait()
	outA, outB := <-hA, <-hB
	var okA, failA, okB, failB int
	fmt.Sscanf(outA, "ok %d %d", &okA, &failA)
	fmt.Sscanf(outB, "ok %d %d", &okB, &failB)
	t.Logf("through kill -9 and restart: granted dst %d ok / %d refused; ungranted dst %d ok / %d refused", okA, failA, okB, failB)
	if okA == 0 || failA != 0 {
		t.Errorf("granted destination during the crash: %s", outA)
	}
	if okB != 0 || failB == 0 {
		t.Errorf("ungranted destination during the crash: %s", outB)
	}

	// State after restart.
	var sessions []map[string]any
	e.ctlJSON(&sessions, "session", "ls")
	if len(sessions) != 1 || sessions[0]["id"] != "k9" {
		t.Errorf("sessions after restart: %v", sessions)
	}
	var grantsAfter []grantRow
	e.ctlJSON(&grantsAfter, "grants", "k9")
	live := map[string]bool{}
	for _, g := range grantsAfter {
		if g.Phase == "live" {
			live[g.ID] = true
		}
	}
	for _, g := range grantsBefore {
		if g.Phase == "live" && !live[g.ID] {
			t.Errorf("grant %s lost in the crash", g.ID)
		}
	}
	var cards []cardRow
	e.ctlJSON(&cards, "cards")
	found := false
	for _, c := range cards {
		found = found || (c.ID == pendingCard && c.Status == "pending")
	}
	if !found {
		t.Errorf("pending card %s lost in the crash: %+v", pendingCard, cards)
	}
	if !e.connect("k9", "127.0.0.2", pA) || e.connect("k9", "127.0.0.3", pB) {
		t.Errorf("enforcement after restart differs")
	}
	if out := e.mustCtl("audit", "verify"); !strings.Contains(out, "OK") {
		t.Errorf("audit chain after kill -9: %s", out)
	}
}
