package backendtest

import (
	"errors"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
)

var levels = []backend.Level{backend.RevocableInKernel, backend.RevocableAtNextUse, backend.FixedAtExec, backend.Unavailable}

// testProbe: the report names the backend and every class of the grammar
// exactly once, each with a known level and a mechanism; an unavailable
// class says why; an enforceable one names a mechanism. The boundary rows
// obey the same rules.
func testProbe(t *testing.T, s *suite) {
	b := s.backend(t)
	r := b.Probe()
	if r.OS == "" || r.Backend == "" {
		t.Fatalf("report without OS or backend name: %+v", r)
	}
	check := func(what string, st backend.Strength) {
		t.Helper()
		if !slices.Contains(levels, st.Level) {
			t.Errorf("%s %s: level %q is none of %v", what, st.Class, st.Level, levels)
		}
		if st.Mechanism == "" {
			t.Errorf("%s %s: no mechanism", what, st.Class)
		}
		if st.Level == backend.Unavailable && st.Reason == "" {
			t.Errorf("%s %s: unavailable without a reason", what, st.Class)
		}
		if st.Level.Enforceable() && st.Mechanism == "none" {
			t.Errorf("%s %s: %s by mechanism \"none\"", what, st.Class, st.Level)
		}
	}
	for _, c := range backend.Classes {
		n := 0
		for _, st := range r.Classes {
			if st.Class == c {
				n++
				check("class", st)
			}
		}
		if n != 1 {
			t.Errorf("class %s reported %d times, want once", c, n)
		}
	}
	for _, st := range r.Classes {
		if !slices.Contains(backend.Classes, st.Class) {
			t.Errorf("report names %q, no class of the grammar", st.Class)
		}
	}
	for _, st := range r.Boundary {
		check("boundary", st)
	}
	// The report is what the backend found when it opened: asking again
	// gives the same answer.
	again := b.Probe()
	for i, st := range again.Classes {
		if i < len(r.Classes) && st != r.Classes[i] {
			t.Errorf("probe changed between calls: %+v, then %+v", r.Classes[i], st)
		}
	}
}

// testSessions: create, look up by name and index, list, destroy.
func testSessions(t *testing.T, s *suite) {
	b := s.backend(t)
	if ss, err := b.Sessions(); err != nil || len(ss) != 0 {
		t.Fatalf("a fresh backend lists sessions %v (%v)", ss, err)
	}
	a := mustSession(t, b, "alpha")
	c := mustSession(t, b, "beta")
	if a.Name != "alpha" || c.Name != "beta" || a.Index == 0 || c.Index == 0 || a.Index == c.Index {
		t.Fatalf("sessions %+v and %+v: want their names and two distinct non-zero indexes", a, c)
	}
	for _, want := range []backend.Session{a, c} {
		got, err := b.Session(want.Name)
		if err != nil || got != want {
			t.Fatalf("Session(%s) = %+v, %v; want %+v", want.Name, got, err, want)
		}
		got, err = b.SessionByIndex(want.Index)
		if err != nil || got != want {
			t.Fatalf("SessionByIndex(%d) = %+v, %v; want %+v", want.Index, got, err, want)
		}
	}
	ss, err := b.Sessions()
	if err != nil || len(ss) != 2 || !slices.Contains(ss, a) || !slices.Contains(ss, c) {
		t.Fatalf("Sessions() = %v, %v; want %v and %v", ss, err, a, c)
	}
	_, err = b.CreateSession("alpha", backend.Limits{})
	wantErr(t, "create alpha twice", err, backend.ErrSessionExists)
	if got, err := b.Session("alpha"); err != nil || got != a {
		t.Fatalf("a refused duplicate changed alpha: %+v, %v", got, err)
	}
	_, err = b.Session("gamma")
	wantErr(t, "Session(gamma)", err, backend.ErrSessionNotFound)

	if err := b.DestroySession("alpha"); err != nil {
		t.Fatal(err)
	}
	_, err = b.Session("alpha")
	wantErr(t, "Session after destroy", err, backend.ErrSessionNotFound)
	_, err = b.SessionByIndex(a.Index)
	wantErr(t, "SessionByIndex after destroy", err, backend.ErrSessionNotFound)
	wantErr(t, "destroy twice", b.DestroySession("alpha"), backend.ErrSessionNotFound)
	if ss, _ := b.Sessions(); len(ss) != 1 || ss[0] != c {
		t.Fatalf("Sessions() after destroying alpha = %v", ss)
	}
	// The name is free again.
	a2 := mustSession(t, b, "alpha")
	if a2.Index == 0 || a2.Index == c.Index {
		t.Fatalf("alpha again: %+v", a2)
	}
}

// testSessionNames: names that cannot name a session are refused and
// leave nothing.
func testSessionNames(t *testing.T, s *suite) {
	b := s.backend(t)
	for _, name := range []string{"", ".hidden", "-dash", "a/b", "../up", "a b", "sp\x00ce", strings.Repeat("x", 65), "cgroup.procs", "memory.max", "cpu.weight"} {
		_, err := b.CreateSession(name, backend.Limits{})
		wantErr(t, "create "+strings.ToValidUTF8(name, "?"), err, backend.ErrInvalidSession)
	}
	if ss, err := b.Sessions(); err != nil || len(ss) != 0 {
		t.Fatalf("refused names left sessions %v (%v)", ss, err)
	}
	for _, name := range []string{"a", "A_1", "s.1-x", "_x", strings.Repeat("y", 64)} {
		mustSession(t, b, name)
	}
}

// testLimits: quotas are all or nothing; CheckLimits and CreateSession
// agree.
func testLimits(t *testing.T, s *suite) {
	b := s.backend(t)
	if err := b.CheckLimits(backend.Limits{}); err != nil {
		t.Fatalf("no quota refused: %v", err)
	}
	bad := backend.Limits{CPUPercent: 1 << 30}
	if err := b.CheckLimits(bad); err == nil {
		t.Fatalf("CheckLimits(%+v) accepted a CPU quota of 2^30 percent", bad)
	}
	if _, err := b.CreateSession("bad", bad); err == nil {
		t.Fatalf("CreateSession with %+v succeeded", bad)
	}
	if _, err := b.Session("bad"); !errors.Is(err, backend.ErrSessionNotFound) {
		t.Fatalf("a refused quota left session bad: %v", err)
	}
	l := backend.Limits{MemoryBytes: 64 << 20, Pids: 64, CPUPercent: 50}
	checkErr := b.CheckLimits(l)
	_, err := b.CreateSession("q", l)
	switch {
	case checkErr != nil:
		t.Logf("this host refuses %+v: %v", l, checkErr)
		if err == nil {
			t.Fatalf("CheckLimits refused %+v (%v) but CreateSession accepted it", l, checkErr)
		}
		if errors.Is(checkErr, backend.ErrLimitsUnsupported) && !errors.Is(err, backend.ErrLimitsUnsupported) {
			t.Fatalf("CreateSession with %+v: %v, want ErrLimitsUnsupported as CheckLimits said", l, err)
		}
		if _, err := b.Session("q"); !errors.Is(err, backend.ErrSessionNotFound) {
			t.Fatalf("a refused quota left session q: %v", err)
		}
	case err != nil:
		t.Fatalf("CheckLimits accepted %+v but CreateSession failed: %v", l, err)
	}
}

// testDestroySession: a destroyed session's entries go with it; handles
// are not the session's and stay; a session made again under the name
// starts empty.
func testDestroySession(t *testing.T, s *suite) {
	b := s.backend(t)
	mustSession(t, b, "s1")
	h := mustHandle(t, b, backend.HandleRef{})
	mustApply(t, b, "s1", backend.Delta{Egress: []backend.EgressRule{egress("127.0.0.2", 80, h)}, Inbound: []backend.EgressRule{inbound("127.0.0.0/24", 8080, h)}})
	if err := b.DestroySession("s1"); err != nil {
		t.Fatal(err)
	}
	snap := snapshot(t, b)
	if d, ok := snap.Deltas["s1"]; ok {
		t.Fatalf("destroyed session still holds %v", d)
	}
	if _, ok := handleIn(snap, h); !ok {
		t.Fatalf("destroying a session removed handle %s", h)
	}
	wantErr(t, "apply to a destroyed session", b.Apply("s1", backend.Delta{Egress: []backend.EgressRule{egress("127.0.0.3", 80, h)}}), backend.ErrSessionNotFound)
	wantErr(t, "allow egress in a destroyed session", b.AllowEgress("s1", egress("127.0.0.3", 80, h)), backend.ErrSessionNotFound)
	mustSession(t, b, "s1")
	if d := rulesOf(t, b, "s1"); !d.IsEmpty() {
		t.Fatalf("a session made again under the name holds %v", d)
	}
}

// testDNS: the resolver port is stored and read back; 0 turns it off.
func testDNS(t *testing.T, s *suite) {
	b := s.backend(t)
	for _, port := range []uint16{5300, 0, 53000} {
		if err := b.SetDNSRedirect(port); err != nil {
			t.Fatalf("set DNS redirect %d: %v", port, err)
		}
		if got, err := b.DNSRedirect(); err != nil || got != port {
			t.Fatalf("DNSRedirect() = %d, %v; want %d", got, err, port)
		}
	}
}

// testTelemetry: a fresh backend has counted nothing for a session; the
// event reader honours its deadline and its Close.
func testTelemetry(t *testing.T, s *suite) {
	b := s.backend(t)
	ss := mustSession(t, b, "s1")
	if c, err := b.Counters(ss.Index); err != nil || c != (backend.Denials{}) {
		t.Fatalf("counters of a new session: %v, %v", c, err)
	}
	if _, err := b.RingbufDrops(); err != nil {
		t.Fatalf("ring buffer drops: %v", err)
	}
	for _, o := range b.Occupancy() {
		if o.Entries < 0 || o.Map == "" {
			t.Errorf("occupancy row %+v", o)
		}
	}
	rd, err := b.Events()
	if err != nil {
		t.Fatalf("events: %v", err)
	}
	rd.SetDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := rd.Read(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read past the deadline with nothing denied: %v, want os.ErrDeadlineExceeded", err)
	}
	rd.SetDeadline(time.Time{})
	done := make(chan error, 1)
	go func() { _, err := rd.Read(); done <- err }()
	time.Sleep(20 * time.Millisecond)
	if err := rd.Close(); err != nil {
		t.Fatalf("close reader: %v", err)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a Read waiting when the reader closed returned no error")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a Read waiting when the reader closed did not return")
	}
}

// testLaunch: a process enters a session only through Launch, which knows
// no session it did not make; a backend that cannot start processes says
// so with ErrNotSupported.
func testLaunch(t *testing.T, s *suite) {
	b := s.backend(t)
	mk := s.cfg.launch
	if mk == nil {
		path, err := exec.LookPath("true")
		if err != nil {
			t.Skipf("no launch command given (WithLaunchCommand) and no \"true\" in PATH: %v", err)
		}
		mk = func() *exec.Cmd { return exec.Command(path) }
	}
	if err := b.Launch("nosuch", mk(), backend.LaunchOptions{}); err == nil {
		t.Fatal("Launch into a session that does not exist succeeded")
	}
	mustSession(t, b, "s1")
	cmd := mk()
	err := b.Launch("s1", cmd, backend.LaunchOptions{})
	if errors.Is(err, backend.ErrNotSupported) {
		t.Skipf("%T cannot start a process in a session: %v", b, err)
	}
	if err != nil {
		t.Fatalf("launch %v: %v", cmd.Args, err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("launched %v: %v", cmd.Args, err)
	}
}
