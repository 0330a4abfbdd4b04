package memory_test

import (
	"errors"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/backend/backendtest"
	"github.com/shinken-agent/shinken/agent/backend/memory"
)

// TestConformance runs the seam's suite on the memory backend, its use
// checks included (the backend is its own backendtest.User).
func TestConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) backend.Backend {
		b, err := memory.New(memory.Config{MaxSessions: 256, MaxHandles: 1024})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Uninstall() })
		return b
	})
}

var (
	tcp   = backend.ProtoTCP
	never time.Time
)

func open(t *testing.T) *memory.Backend {
	t.Helper()
	b, err := memory.New(memory.Config{MaxSessions: 16, MaxHandles: 64})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func handle(t *testing.T, b *memory.Backend, parent backend.HandleRef) backend.HandleRef {
	t.Helper()
	h, err := b.NewHandle(parent, never)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func rule(p string, port uint16, h backend.HandleRef) backend.EgressRule {
	return backend.EgressRule{Prefix: netip.MustParsePrefix(p), Ports: backend.Port(port), Handle: h}
}

func connect(t *testing.T, b *memory.Backend, s, dst string, want backend.Reason) {
	t.Helper()
	got, err := b.Connect(s, netip.MustParseAddrPort(dst), tcp)
	if err != nil || got != want {
		t.Fatalf("connect %s to %s: %s, %v; want %s", s, dst, got, err, want)
	}
}

// TestProbeIsHonest: the report names the memory backend and says, in
// every class row it fills, that it enforces nothing on the host.
func TestProbeIsHonest(t *testing.T) {
	r := open(t).Probe()
	if r.Backend != "memory" || !strings.Contains(r.Facts["enforces"], "nothing") {
		t.Fatalf("report %+v", r)
	}
	for _, c := range r.Classes {
		if c.Level.Enforceable() && (!strings.HasPrefix(c.Mechanism, memory.Mechanism) || c.Reason == "") {
			t.Errorf("class %s: %s by %q (%q): a row the model fills must name the test double and say why", c.Class, c.Level, c.Mechanism, c.Reason)
		}
	}
	b := memory.MustNew(memory.Config{Classes: []backend.Strength{{Class: backend.ClassNetEgress, Level: backend.Unavailable, Mechanism: "none", Reason: "test"}}})
	if got := b.Probe().Class(backend.ClassNetEgress); got.Level != backend.Unavailable {
		t.Fatalf("Config.Classes not in the report: %+v", got)
	}
}

// TestLimitsRecorded: quotas are accepted and recorded, or refused for the
// controllers the modelled host lacks, leaving nothing.
func TestLimitsRecorded(t *testing.T) {
	b := open(t)
	l := backend.Limits{MemoryBytes: 1 << 30, Pids: 10}
	if _, err := b.CreateSession("q", l); err != nil {
		t.Fatal(err)
	}
	if got, err := b.SessionLimits("q"); err != nil || got != l {
		t.Fatalf("limits %+v, %v", got, err)
	}
	h := memory.MustNew(memory.Config{RefuseControllers: []string{"pids"}})
	if _, err := h.CreateSession("q", l); !errors.Is(err, backend.ErrLimitsUnsupported) {
		t.Fatalf("a refused controller: %v", err)
	}
	if ss, _ := h.Sessions(); len(ss) != 0 {
		t.Fatalf("sessions left: %v", ss)
	}
	if err := b.Launch("q", nil, backend.LaunchOptions{}); !errors.Is(err, backend.ErrNotSupported) {
		t.Fatalf("launch: %v", err)
	}
}

// TestFailNext: the chosen call fails with the injected error and changes
// nothing; the calls around it run.
func TestFailNext(t *testing.T) {
	b := open(t)
	enospc := errors.New("no space left on device")
	b.FailNext(memory.OpCreateSession, 2, enospc)
	if _, err := b.CreateSession("a", backend.Limits{}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.CreateSession("b", backend.Limits{}); !errors.Is(err, enospc) {
		t.Fatalf("second create: %v", err)
	}
	if _, err := b.Session("b"); !errors.Is(err, backend.ErrSessionNotFound) {
		t.Fatalf("a failed create left b: %v", err)
	}
	if _, err := b.CreateSession("b", backend.Limits{}); err != nil {
		t.Fatalf("retry: %v", err)
	}
	h := handle(t, b, backend.HandleRef{})
	d := backend.Delta{Egress: []backend.EgressRule{rule("127.0.0.2/32", 80, h)}}
	for _, op := range []memory.Op{memory.OpApply, memory.OpRelease, memory.OpRevoke, memory.OpNewHandle, memory.OpDestroySession, memory.OpSnapshot} {
		b.FailNext(op, 1, enospc)
	}
	if err := b.Apply("a", d); !errors.Is(err, enospc) {
		t.Fatalf("apply: %v", err)
	}
	if err := b.Revoke(h); !errors.Is(err, enospc) {
		t.Fatalf("revoke: %v", err)
	}
	if err := b.Release("a", h, d); !errors.Is(err, enospc) {
		t.Fatalf("release: %v", err)
	}
	if _, err := b.NewOnceHandle(backend.HandleRef{}, never); !errors.Is(err, enospc) {
		t.Fatalf("new handle: %v", err)
	}
	if err := b.DestroySession("a"); !errors.Is(err, enospc) {
		t.Fatalf("destroy: %v", err)
	}
	if _, err := b.Snapshot(); !errors.Is(err, enospc) {
		t.Fatalf("snapshot: %v", err)
	}
	snap, err := b.Snapshot()
	if err != nil || len(snap.Sessions) != 2 || len(snap.Handles) != 1 || len(snap.Deltas) != 0 || snap.Handles[0].State != backend.HandleLive {
		t.Fatalf("after the failed calls: %+v, %v", snap, err)
	}
	if err := b.Apply("a", d); err != nil {
		t.Fatalf("apply after the fault: %v", err)
	}
}

type crashed struct{}

// crash runs f and reports whether it panicked with crashed{}.
func crash(f func()) (hit bool) {
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(crashed); !ok {
				panic(r)
			}
			hit = true
		}
	}()
	f()
	return false
}

// TestCrashAfter: a crash inside Apply or Release leaves the entries done
// before it, and the backend usable.
func TestCrashAfter(t *testing.T) {
	b := open(t)
	b.CreateSession("s1", backend.Limits{})
	h := handle(t, b, backend.HandleRef{})
	d := backend.Delta{Egress: []backend.EgressRule{rule("127.0.0.2/32", 80, h), rule("127.0.0.3/32", 80, h), rule("127.0.0.4/32", 80, h)}}
	b.CrashAfter(memory.OpApply, 2, crashed{})
	if crash(func() { b.Apply("s1", backend.Delta{}) }) {
		t.Fatal("an empty Apply crashed")
	}
	if !crash(func() { b.Apply("s1", d) }) {
		t.Fatal("Apply did not crash")
	}
	snap, _ := b.Snapshot()
	if got := snap.Deltas["s1"].Egress; len(got) != 2 {
		t.Fatalf("after a crash at 2 of 3: %v", got)
	}
	connect(t, b, "s1", "127.0.0.3:80", backend.ReasonNone)
	connect(t, b, "s1", "127.0.0.4:80", backend.ReasonNoRule)
	if err := b.Apply("s1", d); err != nil {
		t.Fatalf("apply again after the crash: %v", err)
	}
	if err := b.Revoke(h); err != nil {
		t.Fatal(err)
	}
	b.CrashAfter(memory.OpRelease, 5, crashed{}) // after every entry, before the slot
	if !crash(func() { b.Release("s1", h, d) }) {
		t.Fatal("Release did not crash")
	}
	if st, _ := b.HandleState(h); st != backend.HandleRevoked {
		t.Fatalf("slot after a crash before it was freed: %s", st)
	}
	if err := b.Release("s1", h, d); err != nil {
		t.Fatal(err)
	}
	if st, _ := b.HandleState(h); st != backend.HandleFree {
		t.Fatalf("slot after release: %s", st)
	}
}

// TestApplyUndoAndRelease: what a failing Apply and a refused Release
// leave (the Linux backend was first found to break both; both backends now
// keep the seam's "a call that fails changes nothing").
func TestApplyUndoAndRelease(t *testing.T) {
	b := open(t)
	b.CreateSession("s1", backend.Limits{})
	h0, h1 := handle(t, b, backend.HandleRef{}), handle(t, b, backend.HandleRef{})
	r0, r1 := rule("127.0.0.2/32", 1, h0), rule("127.0.0.4/32", 1, h1)
	bad := rule("127.0.0.3/32", 1, backend.HandleRef{Slot: h1.Slot, Generation: 99})
	entries := func() int { snap, _ := b.Snapshot(); return len(snap.Deltas["s1"].Egress) }
	b.Apply("s1", backend.Delta{Egress: []backend.EgressRule{r0}})
	if err := b.Apply("s1", backend.Delta{Egress: []backend.EgressRule{r0, bad}}); !errors.Is(err, backend.ErrHandleNotLive) || entries() != 1 {
		t.Fatalf("a failed Apply repeating an entry: %v, %d entries left, want the entry kept", err, entries())
	}
	if err := b.Apply("s1", backend.Delta{Egress: []backend.EgressRule{r1, r1, bad}}); !errors.Is(err, backend.ErrInvalidPrefix) || entries() != 1 {
		t.Fatalf("an Apply naming an entry twice: %v, %d entries, want refused with nothing changed", err, entries())
	}
	if err := b.Release("s1", h0, backend.Delta{Egress: []backend.EgressRule{r0}}); !errors.Is(err, backend.ErrHandleLive) || entries() != 1 {
		t.Fatalf("Release of a live handle: %v, %d entries left, want refused with nothing removed", err, entries())
	}
	if st, _ := b.HandleState(h0); st != backend.HandleLive {
		t.Fatalf("the refused handle is %s", st)
	}
}

// TestConnectDetails: what Connect and Accept model beyond the suite:
// unspecified and v4-mapped destinations, DNS redirection, unknown
// sessions, inbound rules and UDP replies.
func TestConnectDetails(t *testing.T) {
	b := open(t)
	b.CreateSession("s1", backend.Limits{})
	h := handle(t, b, backend.HandleRef{})
	b.Apply("s1", backend.Delta{
		Egress:  []backend.EgressRule{rule("127.0.0.1/32", 80, h), rule("::1/128", 80, h), {Prefix: netip.MustParsePrefix("192.0.2.0/24"), Proto: backend.ProtoUDP, Handle: h}},
		Inbound: []backend.EgressRule{{Prefix: netip.MustParsePrefix("198.51.100.0/24"), Ports: backend.Port(8080), Handle: h, Inbound: true}},
	})
	connect(t, b, "s1", "0.0.0.0:80", backend.ReasonNone)
	connect(t, b, "s1", "[::]:80", backend.ReasonNone)
	connect(t, b, "s1", "[::ffff:127.0.0.1]:80", backend.ReasonNone)
	connect(t, b, "s1", "[::ffff:0.0.0.0]:80", backend.ReasonNone)
	connect(t, b, "s1", "9.9.9.9:53", backend.ReasonNoRule)
	b.SetDNSRedirect(5300)
	connect(t, b, "s1", "9.9.9.9:53", backend.ReasonNone)
	connect(t, b, "nosuch", "127.0.0.1:80", backend.ReasonUnknownSession)
	if c, _ := b.Counters(0); c[backend.ReasonUnknownSession] != 1 {
		t.Fatalf("index 0 counters: %v", c)
	}
	accept := func(peer string, port uint16, proto backend.Proto, want backend.Reason) {
		t.Helper()
		if got, err := b.Accept("s1", netip.MustParseAddrPort(peer), port, proto); err != nil || got != want {
			t.Fatalf("accept %s to :%d: %s, %v; want %s", peer, port, got, err, want)
		}
	}
	accept("198.51.100.7:5555", 8080, tcp, backend.ReasonNone)
	accept("198.51.100.7:5555", 8081, tcp, backend.ReasonNoInbound)
	accept("127.0.0.1:80", 9000, tcp, backend.ReasonNoInbound)         // egress rules admit no peer
	accept("192.0.2.9:53", 9000, backend.ProtoUDP, backend.ReasonNone) // a reply to where it may send
	if err := b.Revoke(h); err != nil {
		t.Fatal(err)
	}
	accept("198.51.100.7:5555", 8080, tcp, backend.ReasonNoInbound)
	s1, _ := b.Session("s1")
	if c, _ := b.Counters(s1.Index); c[backend.ReasonNoInbound] != 3 || c[backend.ReasonNoRule] != 1 {
		t.Fatalf("s1 counters: %v", c)
	}
}

// TestOnceRace: of many concurrent uses of one approve-once grant, exactly
// one passes (run with -race).
func TestOnceRace(t *testing.T) {
	b := open(t)
	b.CreateSession("s1", backend.Limits{})
	o, err := b.NewOnceHandle(backend.HandleRef{}, never)
	if err != nil {
		t.Fatal(err)
	}
	b.Apply("s1", backend.Delta{Egress: []backend.EgressRule{rule("127.0.0.2/32", 80, o)}})
	var wg sync.WaitGroup
	var passed atomic.Int32
	for i := 0; i < 32; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r, _ := b.Connect("s1", netip.MustParseAddrPort("127.0.0.2:80"), tcp); r == backend.ReasonNone {
				passed.Add(1)
			}
		}()
	}
	wg.Wait()
	if n := passed.Load(); n != 1 {
		t.Fatalf("%d uses passed, want 1", n)
	}
}

// TestEventDrops: events beyond the buffer are dropped and counted; the
// counters still count them.
func TestEventDrops(t *testing.T) {
	b := memory.MustNew(memory.Config{EventBuffer: 2})
	s, _ := b.CreateSession("s1", backend.Limits{})
	for i := 0; i < 5; i++ {
		connect(t, b, "s1", "127.0.0.2:80", backend.ReasonNoRule)
	}
	if n, _ := b.RingbufDrops(); n != 3 {
		t.Fatalf("drops = %d, want 3", n)
	}
	if c, _ := b.Counters(s.Index); c[backend.ReasonNoRule] != 5 {
		t.Fatalf("counters: %v", c)
	}
	rd, _ := b.Events()
	if e, err := rd.Read(); err != nil || e.Session != s.Index || e.Reason != backend.ReasonNoRule {
		t.Fatalf("event %+v, %v", e, err)
	}
	b.Close()
	if _, err := rd.Read(); err != nil && !errors.Is(err, os.ErrClosed) {
		t.Fatalf("read after the backend closed: %v", err)
	}
}

// TestProcessBound: a gated session's bound is, per live grant, its
// max_processes (or the host's), the largest of them; none live: 0.
func TestProcessBound(t *testing.T) {
	b, err := memory.New(memory.Config{MaxProcs: 100})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.CreateSession("s", backend.Limits{}); err != nil {
		t.Fatal(err)
	}
	want := func(n uint32) {
		t.Helper()
		if got, err := b.ProcessBound("s"); err != nil || got != n {
			t.Fatalf("bound %d (%v), want %d", got, err, n)
		}
	}
	want(100) // not gated
	h1, _ := b.NewHandle(backend.HandleRef{}, time.Time{})
	if err := b.Apply("s", backend.Delta{Process: []backend.ProcessEntry{{Exec: "/bin/sh", Handle: h1}, {MaxProcesses: 10, Handle: h1}}}); err != nil {
		t.Fatal(err)
	}
	want(10)
	h2, _ := b.NewHandle(backend.HandleRef{}, time.Time{})
	if err := b.Apply("s", backend.Delta{Process: []backend.ProcessEntry{{MaxProcesses: 500, Handle: h2}}}); err != nil {
		t.Fatal(err)
	}
	want(100) // capped at the host's
	_ = b.Revoke(h2)
	want(10)
	_ = b.Revoke(h1)
	want(0)
}
