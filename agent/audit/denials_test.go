package audit

import (
	"encoding/json"
	"net/netip"
	"os"
	"testing"
	"time"
)

func kernelDenial(session string, i int) Denial {
	// Distinct destinations across many /24s, as a scanning session makes.
	a := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
	return Denial{Session: session, Type: EventKernelDenial, Reason: "no_rule", Proto: "udp", Dst: netip.AddrPortFrom(a, uint16(1000+i%50000))}
}

// sumCounts adds the denials the records account for (written and held
// back) per session.
func sumCounts(evs []Event) map[string]uint64 {
	m := map[string]uint64{}
	for _, e := range evs {
		m[e.Session] += e.Count
	}
	return m
}

// TestDenialsAggregate: 100,000 denials to distinct destinations in one
// interval make at most MaxKeys + a few records for the session, every
// denial counted in one of them; another session's denials keep their own
// records, exact destination and all; repeats to one destination are one
// record with their count.
func TestDenialsAggregate(t *testing.T) {
	d := NewDenials(DenialsConfig{MaxKeys: 64, BytesPerMinute: 1 << 30})
	const n = 100000
	for i := range n {
		d.Add(kernelDenial("flood", i))
	}
	for range 5 {
		d.Add(Denial{Session: "quiet", Type: EventKernelDenial, Reason: "no_rule", Proto: "tcp", Dst: netip.MustParseAddrPort("192.0.2.7:443")})
	}
	d.Add(Denial{Session: "quiet", Type: EventDecision, Reason: "deny", Proto: "net.egress", RuleID: "forbid-1"})
	evs := d.Flush(time.Now())
	per := map[string]int{}
	for _, e := range evs {
		per[e.Session]++
	}
	if per["flood"] > 64+1 {
		t.Fatalf("flood session: %d records for %d denials, want at most 65", per["flood"], n)
	}
	if got := sumCounts(evs)["flood"]; got != n {
		t.Fatalf("flood records count %d denials, want %d", got, n)
	}
	var quiet []Event
	for _, e := range evs {
		if e.Session == "quiet" {
			quiet = append(quiet, e)
		}
	}
	if len(quiet) != 2 || quiet[0].Resource != "net.egress" || quiet[0].Count != 1 || quiet[1].Resource != "tcp 192.0.2.7:443" || quiet[1].Count != 5 {
		t.Fatalf("quiet session records: %+v", quiet)
	}
	if st := d.Stats(); st.Folded != n-64*256 {
		t.Fatalf("folded %d, want %d (64 keys of 256 destinations each kept their own)", st.Folded, n-64*256)
	}
	if evs := d.Flush(time.Now()); len(evs) != 0 {
		t.Fatalf("second flush with nothing new: %+v", evs)
	}
	// A session quiet for a minute is forgotten (the aggregator's memory
	// follows the sessions that deny, not every session ever seen).
	d.Flush(time.Now().Add(2 * time.Minute))
	d.mu.Lock()
	left := len(d.ses)
	d.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d sessions remembered after a quiet minute", left)
	}
}

// TestDenialsCeiling: a session flooding denials for two minutes (a flush
// a second, as the daemon does) grows the real log by at most its ceiling
// a minute plus one suppressed record per flush; every held-back record is
// accounted for in an audit_suppressed record (its denials counted), the
// log verifies, and a quiet session's records are all written.
func TestDenialsCeiling(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, dir)
	const ceiling = 32 << 10
	d := NewDenials(DenialsConfig{MaxKeys: 64, BytesPerMinute: ceiling})
	start := time.Now()
	st0, err := os.Stat(l.Path())
	if err != nil {
		t.Fatal(err)
	}
	var total uint64
	var written []Event
	suppressedRecs := 0
	for sec := range 120 {
		for i := range 2000 {
			d.Add(kernelDenial("flood", sec*2000+i))
			total++
		}
		d.Add(Denial{Session: "quiet", Type: EventKernelDenial, Reason: "no_rule", Proto: "tcp", Dst: netip.MustParseAddrPort("192.0.2.7:443")})
		evs := d.Flush(start.Add(time.Duration(sec) * time.Second))
		for _, e := range evs {
			if e.Type == EventSuppressed {
				suppressedRecs++
			}
		}
		written = append(written, evs...)
		if err := l.AppendBatch(evs); err != nil {
			t.Fatal(err)
		}
	}
	st1, err := os.Stat(l.Path())
	if err != nil {
		t.Fatal(err)
	}
	grew := st1.Size() - st0.Size()
	// Two minute windows of the ceiling, the quiet session's 120 records,
	// and the suppressed records (about 400 bytes each).
	bound := int64(2*ceiling + 120*600 + suppressedRecs*500)
	t.Logf("log grew %d bytes for %d denials in 120 s (bound %d); %d suppressed records", grew, total, bound, suppressedRecs)
	if grew > bound {
		t.Fatalf("log grew %d bytes, over %d", grew, bound)
	}
	if suppressedRecs == 0 {
		t.Fatal("the ceiling never held anything back: the test does not reach it")
	}
	counts := sumCounts(written)
	if counts["flood"] != total {
		t.Fatalf("records account for %d flood denials, want %d (written or held back, never lost)", counts["flood"], total)
	}
	if counts["quiet"] != 120 {
		t.Fatalf("quiet session: %d denials recorded, want 120", counts["quiet"])
	}
	// The estimate of a record's size is not below what the log writes.
	for _, e := range written[:3] {
		rec, err := l.Append(e)
		if err != nil {
			t.Fatal(err)
		}
		line, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		if est := eventSize(e); est < len(line) {
			t.Fatalf("size estimate %d below the record's %d bytes: %s", est, len(line), line)
		}
	}
	l.Close()
	if rep, err := Verify(l.Path(), l.PublicKey()); err != nil {
		t.Fatalf("verify: %v %+v", err, rep)
	}
}

// TestDenialsAddN: a count of denials added at once (the kernel's
// suppressed denial events of a session) is one record with that count,
// beside the session's own; a second count in the interval adds to it; a
// zero count makes no record.
func TestDenialsAddN(t *testing.T) {
	d := NewDenials(DenialsConfig{})
	sup := Denial{Session: "s", Type: EventKernelDenial, Reason: ReasonEventsSuppressed, Object: "past the budget"}
	d.AddN(sup, 0)
	if evs := d.Flush(time.Now()); len(evs) != 0 {
		t.Fatalf("a zero count made records: %+v", evs)
	}
	d.Add(kernelDenial("s", 1))
	d.AddN(sup, 2484)
	d.AddN(sup, 16)
	evs := d.Flush(time.Now())
	if len(evs) != 2 {
		t.Fatalf("records %+v, want the denial's and the suppressed count's", evs)
	}
	var got *Event
	for i := range evs {
		if evs[i].Reason == ReasonEventsSuppressed {
			got = &evs[i]
		}
	}
	if got == nil || got.Count != 2500 || got.Resource != "past the budget" || got.Type != EventKernelDenial || got.Session != "s" {
		t.Errorf("suppressed record %+v, want count 2500, resource the object", got)
	}
	if sumCounts(evs)["s"] != 2501 {
		t.Errorf("counts %v, want 2501", sumCounts(evs))
	}
}
