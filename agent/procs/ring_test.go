package procs

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/shinken-agent/shinken/agent/api/wire"
)

// TestRing: offsets are stream offsets; a reader gets what the ring still
// holds and is told what it lost, including bytes the writer overwrote
// while it read.
func TestRing(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "ring"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := &ringWriter{f: f, cap: 8, idx: &ringIndex{mem: make([]byte, indexBytes)}}
	var all []byte
	for _, s := range []string{"abc", "defgh", "ijklmnopq", "r"} {
		if err := w.write([]byte(s)); err != nil {
			t.Fatal(err)
		}
		all = append(all, s...)
	}
	if w.end != uint64(len(all)) {
		t.Fatalf("end %d", w.end)
	}
	if w.idx.End(0) != w.end || w.idx.Limit(0) != w.end {
		t.Fatalf("index: end %d limit %d, want %d", w.idx.End(0), w.idx.Limit(0), w.end)
	}
	limit := func() uint64 { return w.idx.Limit(0) }
	for _, tc := range []struct {
		off, max   uint64
		want       string
		wantOffset uint64
	}{
		{0, 100, "klmnopqr", 10}, // 10 bytes dropped
		{12, 100, "mnopqr", 12},
		{12, 3, "mno", 12},
		{18, 100, "", 18},
	} {
		got, start, err := readRing(f, 8, tc.off, w.end, make([]byte, tc.max), limit)
		if err != nil || string(got) != tc.want || start != tc.wantOffset {
			t.Errorf("read from %d: %q at %d (%v), want %q at %d", tc.off, got, start, err, tc.want, tc.wantOffset)
		}
	}
	// The writer laps the reader during its read (it announced a write of
	// 3 bytes, which may be under way): the front it may overwrite is
	// dropped, never returned as if it were the old bytes.
	w.intend(3)
	got, start, _ := readRing(f, 8, 12, w.end, make([]byte, 100), limit)
	if string(got) != "nopqr" || start != 13 { // 21-8: byte 12 may be overwritten
		t.Errorf("lapped read: %q at %d", got, start)
	}
	w.intend(0) // the write moved nothing: the limit is the end again
	if got, start, _ := readRing(f, 8, 12, w.end, make([]byte, 100), limit); string(got) != "mnopqr" || start != 12 {
		t.Errorf("after an empty write: %q at %d", got, start)
	}
	if !bytes.HasSuffix(all, got) {
		t.Errorf("%q not the tail of %q", got, all)
	}
}

// TestValidate: bad requests are refused before anything starts.
func TestValidate(t *testing.T) {
	in := string(make([]byte, maxFrame+1))
	for name, req := range map[string]wire.ProcessStart{
		"empty argv":   {},
		"gid only":     {Argv: []string{"x"}, GID: 5},
		"relative cwd": {Argv: []string{"x"}, Cwd: "tmp"},
		"deadline":     {Argv: []string{"x"}, DeadlineS: -1},
		"tty 0 rows":   {Argv: []string{"x"}, TTY: &wire.TermSize{Cols: 80}},
		"env":          {Argv: []string{"x"}, Env: []string{"NOEQUALS"}},
		"nul":          {Argv: []string{"x\x00y"}},
		"stdin":        {Argv: []string{"x"}, Stdin: &in},
	} {
		if err := validate(&req); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := validate(&wire.ProcessStart{Argv: []string{"/bin/true"}, TTY: &wire.TermSize{Rows: 24, Cols: 80}, DeadlineS: 5}); err != nil {
		t.Error(err)
	}
	for _, s := range []string{"TERM", "sigint", "9", "KILL"} {
		if _, err := ParseSignal(s); err != nil {
			t.Error(err)
		}
	}
	for _, s := range []string{"", "NOPE", "0", "65"} {
		if _, err := ParseSignal(s); err == nil {
			t.Errorf("signal %q accepted", s)
		}
	}
}
