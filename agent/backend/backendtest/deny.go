package backendtest

import (
	"fmt"
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
)

// denyWriter is what a backend that counts its deny-table writes offers
// (both backends of the tree do).
type denyWriter interface{ DenyWrites() uint64 }

func setDeny(t *testing.T, b backend.Backend, entries ...backend.DenyEntry) {
	t.Helper()
	if err := b.SetDenyList(entries); err != nil {
		t.Fatalf("set deny list %v: %v", entries, err)
	}
}

func deny(prefix string, lo, hi uint16) backend.DenyEntry {
	return backend.DenyEntry{Prefix: prefixOf(prefix), Lo: lo, Hi: hi}
}

// testUseDenyList: the deny table refuses what it names whatever the
// grants cover, before the never-list and its exceptions (ReasonForbidden);
// a shorter entry's ports hold under a longer one; it is replaced as a
// whole, writing only the entries that change; bad input changes nothing.
// SetNeverOK makes a rule an exception to the never-list and takes it back.
func testUseDenyList(t *testing.T, s *suite) {
	b, u := s.user(t)
	mustSession(t, b, "s1")
	list := append(append([]backend.NeverEntry{}, backend.DefaultNeverList...), backend.NeverEntry{Prefix: prefixOf("127.0.0.9")})
	if err := b.SetNeverList(list); err != nil {
		t.Fatal(err)
	}
	wide := mustHandle(t, b, backend.HandleRef{})
	mustApply(t, b, "s1", backend.Delta{Egress: []backend.EgressRule{egress("0.0.0.0/0", 0, wide), egress("::/0", 0, wide)}})
	ex := mustHandle(t, b, backend.HandleRef{})
	r := egress("127.0.0.9", 40001, ex)
	r.NeverOK = true
	mustApply(t, b, "s1", backend.Delta{Egress: []backend.EgressRule{r}})
	wantUse(t, u, "s1", "127.0.0.9:40001", backend.ProtoTCP, backend.ReasonNone)

	setDeny(t, b,
		deny("127.0.0.0/24", 40001, 40001),
		deny("127.0.0.64/26", 0, 0xffff),
		deny("127.0.0.0/8", 40003, 40003),
		deny("127.0.0.8/29", 40004, 40005),
		deny("::1/128", 40006, 40006))
	wantUse(t, u, "s1", "127.0.0.8:40001", backend.ProtoTCP, backend.ReasonForbidden)
	wantUse(t, u, "s1", "127.0.0.8:40001", backend.ProtoUDP, backend.ReasonForbidden)
	wantUse(t, u, "s1", "127.0.0.8:40002", backend.ProtoTCP, backend.ReasonNone)
	wantUse(t, u, "s1", "127.0.0.9:40001", backend.ProtoTCP, backend.ReasonForbidden) // before the exception
	wantUse(t, u, "s1", "127.0.0.70:40002", backend.ProtoTCP, backend.ReasonForbidden)
	wantUse(t, u, "s1", "127.0.0.8:40003", backend.ProtoTCP, backend.ReasonForbidden) // the /8's port under the /29
	wantUse(t, u, "s1", "127.0.0.8:40005", backend.ProtoTCP, backend.ReasonForbidden)
	wantUse(t, u, "s1", "127.0.0.16:40005", backend.ProtoTCP, backend.ReasonNone)
	wantUse(t, u, "s1", "127.1.0.1:40003", backend.ProtoTCP, backend.ReasonForbidden)
	wantUse(t, u, "s1", "127.1.0.1:40001", backend.ProtoTCP, backend.ReasonNone)
	wantUse(t, u, "s1", "[::1]:40006", backend.ProtoTCP, backend.ReasonForbidden)
	wantUse(t, u, "s1", "[::1]:40001", backend.ProtoTCP, backend.ReasonNone)

	// Bad input changes nothing.
	wantErr(t, "an invalid deny entry", b.SetDenyList([]backend.DenyEntry{{}}), backend.ErrInvalidPrefix)
	wantErr(t, "host bits", b.SetDenyList([]backend.DenyEntry{deny("127.0.0.1/8", 1, 1)}), backend.ErrInvalidPrefix)
	wantErr(t, "an empty range", b.SetDenyList([]backend.DenyEntry{deny("127.0.0.0/8", 2, 1)}), backend.ErrInvalidPorts)
	var many []backend.DenyEntry
	for i := range backend.MaxDenyEntries + 1 {
		many = append(many, deny(fmt.Sprintf("10.%d.%d.0/24", i>>8, i&255), 1, 1))
	}
	wantErr(t, "too many prefixes", b.SetDenyList(many), backend.ErrMapFull)
	wantUse(t, u, "s1", "127.0.0.8:40001", backend.ProtoTCP, backend.ReasonForbidden)

	// Only what changes is written: one entry's ranges.
	dw, counts := b.(denyWriter)
	var before uint64
	if counts {
		before = dw.DenyWrites()
	}
	setDeny(t, b,
		deny("127.0.0.0/24", 40001, 40001),
		deny("127.0.0.64/26", 0, 0xffff),
		deny("127.0.0.0/8", 40003, 40003),
		deny("127.0.0.8/29", 40004, 40004),
		deny("::1/128", 40006, 40006))
	if counts {
		if got := dw.DenyWrites() - before; got != 1 {
			t.Errorf("one entry's ranges changed: %d writes, want 1", got)
		}
	}
	wantUse(t, u, "s1", "127.0.0.8:40005", backend.ProtoTCP, backend.ReasonNone)

	// Many ranges under one prefix (a bitmap of ports in the kernel).
	var ranges []backend.DenyEntry
	for i := range 40 {
		ranges = append(ranges, deny("127.0.0.0/8", uint16(1000+2*i), uint16(1000+2*i)))
	}
	if err := b.SetDenyList(append(ranges, deny("127.0.0.0/24", 40001, 40001))); err != nil {
		t.Fatal(err)
	}
	wantUse(t, u, "s1", "127.0.0.8:1078", backend.ProtoTCP, backend.ReasonForbidden)
	wantUse(t, u, "s1", "127.0.0.8:1079", backend.ProtoTCP, backend.ReasonNone)

	// Emptied: the grants and the exception reach again.
	setDeny(t, b)
	wantUse(t, u, "s1", "127.0.0.8:40001", backend.ProtoTCP, backend.ReasonNone)
	wantUse(t, u, "s1", "127.0.0.9:40001", backend.ProtoTCP, backend.ReasonNone)

	// The exception taken back and given again, the rule staying.
	back := r
	back.NeverOK = false
	if err := b.SetNeverOK("s1", back); err != nil {
		t.Fatal(err)
	}
	wantUse(t, u, "s1", "127.0.0.9:40001", backend.ProtoTCP, backend.ReasonNoRule)
	if err := b.SetNeverOK("s1", r); err != nil {
		t.Fatal(err)
	}
	wantUse(t, u, "s1", "127.0.0.9:40001", backend.ProtoTCP, backend.ReasonNone)
	snap, err := b.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if d := (backend.Delta{Egress: []backend.EgressRule{r}}).Missing(snap.Deltas["s1"]); d != "" {
		t.Errorf("after SetNeverOK the snapshot lacks %s", d)
	}
	other := egress("127.0.0.11", 40001, ex)
	other.NeverOK = true
	wantErr(t, "a rule the session does not hold", b.SetNeverOK("s1", other), backend.ErrRuleNotFound)
	wide9 := egress("127.0.0.0/24", 0, wide)
	wide9.NeverOK = true
	wantErr(t, "an exception on a prefix", b.SetNeverOK("s1", wide9), backend.ErrInvalidPrefix)
}
