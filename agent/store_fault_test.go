package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"syscall"
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/backend/memory"
	"github.com/shinken-agent/shinken/agent/store"
)

// Fault injection on the store: every write the store makes during a grant,
// a revoke, a session create and a session remove fails in turn, with
// ENOSPC (a full disk) and EIO (a failing device). Each time the call must
// fail with an error that says so, leave memory, journal and backend as
// they were or in the state a retry completes, and the same call must
// succeed once the disk works again, leaving the journal equal to memory
// and the backend agreeing with both. testStoreFaults runs against any
// backend (the memory backend without root, the Linux dataplane as root).

const faultManifest = "image py\nallow net.egress cidrs=127.0.0.0/24,::1/128\n"

type faultSink struct{}

func (faultSink) Emit(Event) error { return nil }

// faultOp is one state-changing call, set up on a fresh agent.
type faultOp struct {
	name  string
	setup func(t *testing.T, a *Agent) string // returns what do needs (a token)
	do    func(a *Agent, arg string) error
}

var faultOps = []faultOp{
	{"grant", func(t *testing.T, a *Agent) string { return "" }, func(a *Agent, _ string) error {
		_, err := a.Grant(context.Background(), GrantRequest{Session: "s1", Lifecycle: LifecycleSession, Capability: Capability{Class: ClassNetEgress,
			Egress: &EgressScope{CIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.7/32")}, Ports: []PortRange{{Lo: 443, Hi: 443}, {Lo: 8443, Hi: 8443}}}}})
		return err
	}},
	{"revoke", func(t *testing.T, a *Agent) string {
		g, err := a.Grant(context.Background(), GrantRequest{Session: "s1", Lifecycle: LifecycleSession, Capability: Capability{Class: ClassNetEgress,
			Egress: &EgressScope{CIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.8/32")}}}})
		if err != nil {
			t.Fatal(err)
		}
		// A descendant: the membrane's records are written too.
		if _, err := a.Attenuate(context.Background(), g.Handle, GrantRequest{Session: "s1", Lifecycle: LifecycleSession, Capability: Capability{Class: ClassNetEgress,
			Egress: &EgressScope{CIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.8/32")}, Ports: []PortRange{{Lo: 80, Hi: 80}}}}}); err != nil {
			t.Fatal(err)
		}
		return g.Handle
	}, func(a *Agent, token string) error { return a.Revoke(context.Background(), token) }},
	{"session-create", func(t *testing.T, a *Agent) string { return "" }, func(a *Agent, _ string) error {
		return a.CreateSession(SessionSpec{ID: "s2", Image: "py"})
	}},
	{"session-remove", func(t *testing.T, a *Agent) string {
		if _, err := a.Grant(context.Background(), GrantRequest{Session: "s1", Lifecycle: LifecycleSession, Capability: Capability{Class: ClassNetEgress,
			Egress: &EgressScope{CIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.9/32")}}}}); err != nil {
			t.Fatal(err)
		}
		return ""
	}, func(a *Agent, _ string) error { return a.EndSession("s1") }},
}

func testStoreFaults(t *testing.T, newKernel func(t *testing.T) Kernel) {
	testStoreFaultsWith(t, newKernel, func(t *testing.T) EventSink { return faultSink{} })
}

// testStoreFaultsWith is testStoreFaults with the event sink newSink makes
// (an audit log, a Committer, for the grant's commit path).
func testStoreFaultsWith(t *testing.T, newKernel func(t *testing.T) Kernel, newSink func(t *testing.T) EventSink) {
	ms, err := ParseManifests("fault.manifest", []byte(faultManifest))
	if err != nil {
		t.Fatal(err)
	}
	open := func(t *testing.T) *Agent {
		a, err := Open(Config{StateDir: t.TempDir(), Kernel: newKernel(t), Manifests: map[string]*Manifest{"py": ms[0]},
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Events: newSink(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close() })
		if err := a.CreateSession(SessionSpec{ID: "s1", Image: "py"}); err != nil {
			t.Fatal(err)
		}
		return a
	}
	for _, op := range faultOps {
		// How many writes does the call make when nothing fails?
		a := open(t)
		arg := op.setup(t, a)
		writes := 0
		a.store.Fault = func(string) error { writes++; return nil }
		if err := op.do(a, arg); err != nil {
			t.Fatalf("%s without faults: %v", op.name, err)
		}
		if writes == 0 {
			t.Fatalf("%s writes nothing to the store", op.name)
		}
		for _, errno := range []syscall.Errno{syscall.ENOSPC, syscall.EIO} {
			for n := 1; n <= writes; n++ {
				t.Run(fmt.Sprintf("%s/%s/write%d", op.name, errno, n), func(t *testing.T) {
					a := open(t)
					arg := op.setup(t, a)
					before := faultView(t, a)
					seen := 0
					var failedAt string
					a.store.Fault = func(what string) error {
						if seen++; seen == n {
							failedAt = what
							return errno
						}
						return nil
					}
					err := op.do(a, arg)
					if failedAt == "" {
						t.Fatalf("write %d was never reached", n)
					}
					if !errors.Is(err, ErrState) || !errors.Is(err, errno) {
						t.Fatalf("%s with write %d (%s) failing: err %v, want ErrState wrapping %v", op.name, n, failedAt, err, errno)
					}
					mid := faultView(t, a)
					mid.checkNoNewAuthority(t, before)
					// The first write is the call's first durable step: when it
					// fails nothing has happened yet, in memory or anywhere
					// (a revoke has flipped the kernel bit already: fail closed).
					if n == 1 && op.name != "revoke" && mid.memory != before.memory {
						t.Errorf("%s failed at its first write but memory changed:\nbefore %s\nafter  %s", op.name, before.memory, mid.memory)
					}
					if op.name == "session-remove" && mid.memSessions["s1"] {
						if _, ok := a.Session("s1"); !ok && n == 1 {
							t.Errorf("the session is recorded but hidden (session show would answer 404)")
						}
					}
					// The disk works again: the same call succeeds.
					a.store.Fault = nil
					if err := op.do(a, arg); err != nil {
						t.Fatalf("%s retried once the disk works: %v", op.name, err)
					}
					after := faultView(t, a)
					after.checkAgree(t)
					if op.name == "session-create" && !after.memSessions["s2"] || op.name == "session-remove" && after.memSessions["s1"] {
						t.Fatalf("%s: retry did not take effect: sessions %v", op.name, after.memSessions)
					}
				})
			}
		}
	}
}

// faultSnap is memory, journal and backend as one test sees them.
type faultSnap struct {
	memory, journal string // the records, encoded
	memSessions     map[string]bool
	liveGrants      map[backend.HandleRef]bool // live grants' handles, in memory
	liveJournal     int
	kernelLive      map[backend.HandleRef]bool
	kernelRules     int
	kernelSessions  map[string]bool
}

func faultView(t *testing.T, a *Agent) faultSnap {
	t.Helper()
	a.mu.Lock()
	mem, _ := json.Marshal(a.st)
	v := faultSnap{memory: string(mem), memSessions: map[string]bool{}, liveGrants: map[backend.HandleRef]bool{},
		kernelLive: map[backend.HandleRef]bool{}, kernelSessions: map[string]bool{}}
	for id := range a.st.Sessions {
		v.memSessions[id] = true
	}
	for _, g := range a.st.Grants {
		if g.Phase == PhaseLive {
			v.liveGrants[g.Kernel] = true
		}
	}
	a.mu.Unlock()
	s, err := store.Open(a.cfg.StateDir)
	if err != nil {
		t.Fatalf("journal unreadable: %v", err)
	}
	st := s.State()
	s.Close()
	for _, g := range st.Grants {
		g.LegacyRules = nil
		if g.Phase == PhaseLive {
			v.liveJournal++
		}
	}
	j, _ := json.Marshal(st)
	v.journal = string(j)
	snap, err := a.kernel.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range snap.Handles {
		if h.State.Alive() {
			v.kernelLive[h.Ref] = true
		}
	}
	for _, s := range snap.Sessions {
		v.kernelSessions[s.Name] = true
	}
	for _, d := range snap.Deltas {
		v.kernelRules += len(d.AddressRules())
	}
	return v
}

// checkNoNewAuthority: after a failed call nothing grants more than before:
// no kernel handle is live that was not, no rule was added, the journal
// names no more live grants, and every live kernel handle is a live grant's.
func (v faultSnap) checkNoNewAuthority(t *testing.T, before faultSnap) {
	t.Helper()
	for h := range v.kernelLive {
		if !before.kernelLive[h] {
			t.Errorf("a failed call left kernel handle %s live", h)
		}
		if !v.liveGrants[h] {
			t.Errorf("kernel handle %s is live but no live grant in memory holds it", h)
		}
	}
	if v.kernelRules > before.kernelRules {
		t.Errorf("a failed call left %d kernel rules, %d before", v.kernelRules, before.kernelRules)
	}
	if v.liveJournal > before.liveJournal {
		t.Errorf("a failed call recorded %d live grants, %d before", v.liveJournal, before.liveJournal)
	}
	for s := range v.kernelSessions {
		if !v.memSessions[s] {
			t.Errorf("kernel session %s has no record in memory", s)
		}
	}
}

// checkAgree: the journal holds what memory holds, and the backend holds
// exactly the live grants' handles and the recorded sessions.
func (v faultSnap) checkAgree(t *testing.T) {
	t.Helper()
	if v.memory != v.journal {
		t.Errorf("journal and memory differ after the retry:\nmemory  %s\njournal %s", v.memory, v.journal)
	}
	for h := range v.liveGrants {
		if !v.kernelLive[h] {
			t.Errorf("live grant's handle %s is not live in the backend", h)
		}
	}
	for h := range v.kernelLive {
		if !v.liveGrants[h] {
			t.Errorf("backend handle %s is live without a live grant", h)
		}
	}
	for s := range v.memSessions {
		if !v.kernelSessions[s] {
			t.Errorf("session %s is recorded but not in the backend", s)
		}
	}
	for s := range v.kernelSessions {
		if !v.memSessions[s] {
			t.Errorf("backend session %s is not recorded", s)
		}
	}
}

// TestStoreFaultsMemory runs the store's fault injection on the memory
// backend, without root.
func TestStoreFaultsMemory(t *testing.T) {
	testStoreFaults(t, func(t *testing.T) Kernel {
		b, err := memory.New(memory.Config{})
		if err != nil {
			t.Fatal(err)
		}
		return b
	})
}
