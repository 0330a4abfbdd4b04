package dataplane

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/dataplane/kerneltest"
)

// TestDeniedMarker: the programs mark a session on its first denial (and
// only it), CountersOf then reads its exact counts, a session that denies
// only after a read is in the next one, the exec gate's user-space count
// marks too, and a new session at a reused index starts unmarked with
// zero counters.
func TestDeniedMarker(t *testing.T) {
	d := newDataplane(t, testConfig(t))
	a, err := d.CreateSession("mark-a", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := d.CreateSession("mark-b", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := d.CreateSession("mark-c", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	idx := []uint32{a.Index, b.Index, c.Index}
	wantMarks := func(want ...bool) {
		t.Helper()
		got, err := d.deniedOf(idx)
		if err != nil {
			t.Fatal(err)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("marks of a, b, c: %v, want %v", got, want)
			}
		}
	}
	// readAgrees reads a, b and c with CountersOf and checks each against
	// Counters (every slot read), and returns the no_rule counts.
	readAgrees := func() []uint64 {
		t.Helper()
		got, err := d.CountersOf(idx)
		if err != nil {
			t.Fatal(err)
		}
		var out []uint64
		for i, x := range idx {
			want, err := d.Counters(x)
			if err != nil {
				t.Fatal(err)
			}
			if got[i] != want {
				t.Fatalf("index %d: CountersOf %v, Counters %v", x, got[i], want)
			}
			out = append(out, got[i][ReasonNoRule])
		}
		return out
	}
	wantMarks(false, false, false)
	readAgrees()

	pa := startProbe(t, a, ProcOptions{})
	n := flood(t, pa, 2, 50, "127.5.0.1")
	wantMarks(true, false, false)
	if got := readAgrees(); got[0] != uint64(n) || got[1] != 0 || got[2] != 0 {
		t.Fatalf("no_rule of a, b, c: %v, want [%d 0 0]", got, n)
	}

	// b denies after that read: the next read has it.
	pb := startProbe(t, b, ProcOptions{})
	if got := pb.Do("tcp 127.5.0.2:4242"); got != "err EPERM" {
		t.Fatalf("connect without a grant: %q, want err EPERM", got)
	}
	wantMarks(true, true, false)
	if got := readAgrees(); got[0] != uint64(n) || got[1] != 1 || got[2] != 0 {
		t.Fatalf("no_rule of a, b, c: %v, want [%d 1 0]", got, n)
	}

	// The exec gate's denials are counted by user space: they mark too.
	d.countExec(c.Index)
	wantMarks(true, true, true)
	got, err := d.CountersOf([]uint32{c.Index})
	if err != nil {
		t.Fatal(err)
	}
	if got[0][backend.ReasonExecDenied] != 1 {
		t.Fatalf("c's exec_denied %d, want 1", got[0][backend.ReasonExecDenied])
	}

	// a ends; a new session takes its index, unmarked and at zero.
	pa.Stop()
	if err := d.DestroySession(a.Name); err != nil {
		t.Fatal(err)
	}
	a2, err := d.CreateSession("mark-a2", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if a2.Index != a.Index {
		t.Fatalf("the new session has index %d, not the freed %d: the reuse case is not exercised", a2.Index, a.Index)
	}
	wantMarks(false, true, true)
	if got := readAgrees(); got[0] != 0 || got[1] != 1 {
		t.Fatalf("no_rule of a2, b, c: %v, want [0 1 0]", got)
	}
}

// TestDeniedMarkerAdopted: an agent that adopts counters from one that kept
// no marker (its pinned maps have no shk_denied) marks every index, so the
// counts the older agent's programs made are read all the same; a session
// made after that starts unmarked.
func TestDeniedMarkerAdopted(t *testing.T) {
	kerneltest.RequireRoot(t)
	cfg := testConfig(t)
	d, err := Open(cfg)
	if err != nil {
		t.Fatalf("open dataplane: %v", err)
	}
	a, err := d.CreateSession("old-a", Limits{})
	if err != nil {
		d.Uninstall()
		t.Fatal(err)
	}
	pa := startProbe(t, a, ProcOptions{})
	if got := pa.Do("tcp 127.5.0.3:4242"); got != "err EPERM" {
		d.Uninstall()
		t.Fatalf("connect without a grant: %q, want err EPERM", got)
	}
	d.Close()
	// The older agent's state: no marker pinned.
	if err := os.Remove(filepath.Join(cfg.PinPath, "shk_denied")); err != nil {
		t.Fatal(err)
	}
	d2 := newDataplane(t, cfg)
	got, err := d2.CountersOf([]uint32{a.Index})
	if err != nil {
		t.Fatal(err)
	}
	if got[0][ReasonNoRule] != 1 {
		t.Fatalf("adopted session's no_rule %d, want the older agent's 1", got[0][ReasonNoRule])
	}
	b, err := d2.CreateSession("new-b", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := d2.deniedOf([]uint32{a.Index, b.Index}); err != nil || !m[0] || m[1] {
		t.Fatalf("marks of the adopted and the new session: %v, %v; want [true false]", m, err)
	}
}
