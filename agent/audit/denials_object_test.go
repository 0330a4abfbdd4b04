package audit

import (
	"testing"
	"time"
)

// TestDenialsObjects: kernel denials of a class without destinations (the
// process class's refused execs) aggregate per file: one record per
// program with its count, its class as the record's Action and the file
// as its Resource; a session's files past MaxKeys fold into one record.
func TestDenialsObjects(t *testing.T) {
	d := NewDenials(DenialsConfig{MaxKeys: 4, BytesPerMinute: 1 << 30})
	exec := func(obj string) Denial {
		return Denial{Session: "s", Type: EventKernelDenial, Class: "process", Reason: "exec_denied", Object: obj}
	}
	for range 3 {
		d.Add(exec("exec /usr/bin/id (dev 0:1 ino 2)"))
	}
	d.Add(exec("exec /tmp/x (dev 0:1 ino 3)"))
	evs := d.Flush(time.Now())
	if len(evs) != 2 {
		t.Fatalf("records %+v, want 2", evs)
	}
	want := map[string]uint64{"exec /usr/bin/id (dev 0:1 ino 2)": 3, "exec /tmp/x (dev 0:1 ino 3)": 1}
	for _, e := range evs {
		if e.Action != "process" || e.Reason != "exec_denied" || want[e.Resource] != e.Count {
			t.Errorf("record %+v", e)
		}
	}
	for i := range 10 {
		d.Add(exec(string(rune('a' + i))))
	}
	evs = d.Flush(time.Now())
	var n uint64
	for _, e := range evs {
		n += e.Count
	}
	if len(evs) != 5 || n != 10 {
		t.Errorf("10 files past MaxKeys 4: %d records holding %d denials, want 5 and 10: %+v", len(evs), n, evs)
	}
}
