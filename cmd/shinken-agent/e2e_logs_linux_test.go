package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// seqByte is the byte at offset o of the output of `seq 1 N`.
func seqByte(o uint64) byte {
	first, count, width := uint64(1), uint64(9), uint64(2)
	for o >= count*width {
		o -= count * width
		first, count, width = first*10, count*10, width+1
	}
	n, k := first+o/width, o%width
	if k == width-1 {
		return '\n'
	}
	for i := width - 2; i > k; i-- {
		n /= 10
	}
	return byte('0' + n%10)
}

// TestLogsGapsReported: `shinkenctl logs -f` of a process that laps its
// 4 KiB ring many times over while it is read (nothing holds it back):
// every byte printed is the stream's byte at its offset, and every stretch
// skipped is said on stderr with its offset and length, whether the ring
// had dropped it before a request or the process overwrote it while it was
// sent; the output ends at the stream's end.
func TestLogsGapsReported(t *testing.T) {
	e := newEnv(t)
	e.config = filepath.Join(e.dir, "agent.json")
	if err := os.WriteFile(e.config, []byte(`{"process_ring_bytes": 4096}`), 0o644); err != nil {
		t.Fatal(err)
	}
	e.startAgent()
	e.mustCtl("session", "create", "l1", "-image", "e2e")
	const n = 2000000
	total := uint64(0)
	for i := 1; i <= n; i++ {
		total += uint64(len(fmt.Sprint(i))) + 1
	}
	id := strings.TrimSpace(e.mustCtl("start", "l1", "--", "seq", "1", fmt.Sprint(n)))
	out, notes, code := e.ctlSplit("-socket", e.socket, "logs", "-f", "l1", id)
	if code != 0 {
		t.Fatalf("logs: exit %d: %s", code, notes)
	}
	var pos, used uint64 // the stream offset of stdout's byte used
	check := func(to uint64) {
		if to < pos || used+(to-pos) > uint64(len(out)) {
			t.Fatalf("a note says offset %d, after %d bytes printed from %d (of %d)", to, used, pos, len(out))
		}
		for ; pos < to; pos, used = pos+1, used+1 {
			if out[used] != seqByte(pos) {
				t.Fatalf("printed byte %d is %q, the stream has %q at its offset %d", used, out[used], seqByte(pos), pos)
			}
		}
	}
	skipped, gaps := uint64(0), 0
	for _, l := range strings.Split(strings.TrimSpace(notes), "\n") {
		var g, at uint64
		switch {
		case l == "":
		case strings.HasSuffix(l, "no longer kept"):
			if _, err := fmt.Sscanf(l, "shinkenctl: %d bytes before offset %d are no longer kept", &g, &at); err != nil {
				t.Fatalf("%q: %v", l, err)
			}
			if at < pos {
				t.Fatalf("%q: behind %d", l, pos)
			}
			skipped += at - pos
			pos = at
		case strings.HasSuffix(l, "before they were sent"):
			if _, err := fmt.Sscanf(l, "shinkenctl: %d bytes at offset %d were overwritten before they were sent", &g, &at); err != nil {
				t.Fatalf("%q: %v", l, err)
			}
			check(at)
			skipped += g
			pos += g
			gaps++
		default:
			t.Fatalf("unexpected on stderr: %q", l)
		}
	}
	check(pos + uint64(len(out)) - used)
	if pos != total {
		t.Errorf("the output ends at offset %d, the stream at %d", pos, total)
	}
	t.Logf("%d bytes printed, %d skipped (%d gaps while sent)", len(out), skipped, gaps)
}
