package procs

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/api/wire"
)

// seqByte is the byte at offset o of the output of `seq 1 N` (N large
// enough): every line differs, so a byte read at the wrong offset shows.
func seqByte(o uint64) byte {
	first, count, width := uint64(1), uint64(9), uint64(2) // numbers of width-1 digits
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

// TestUnheldReadsExact: readers that hold nothing back (logs without -f,
// and an attach whose hold has not reached the shim yet) read a 4 KiB ring
// that a fast writer laps many times over, always from its oldest bytes
// (those the writer overwrites next). Every byte returned is the byte at
// its offset; whatever was overwritten is reported as dropped, never
// returned as if it were the old bytes.
func TestUnheldReadsExact(t *testing.T) {
	for o, want := range []byte("1\n2\n") {
		if seqByte(uint64(o)) != want {
			t.Fatalf("seqByte(%d) = %q", o, seqByte(uint64(o)))
		}
	}
	if seqByte(9*2) != '1' || seqByte(9*2+1) != '0' || seqByte(9*2+2) != '\n' || seqByte(9*2+90*3+1) != '0' {
		t.Fatal("seqByte wrong past one digit")
	}
	r := newRig(t, 4096)
	p := r.start(t, wire.ProcessStart{Argv: []string{"/usr/bin/seq", "1", "1000000000"}})
	defer p.Kill()
	buf := make([]byte, 4096)
	var checked, checkedF, dropped, reads, follows int
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if p.Done() {
			t.Fatalf("the writer ended: %+v", p.View())
		}
		end := p.end(0)
		from := uint64(0)
		if end > 4096 {
			from = end - 4096
		}
		var f *Follower
		if reads%2 == 1 { // an attach: its hold is on its way to the shim
			f = p.Follow([2]uint64{from, 0})
			follows++
		}
		c, err := p.ReadInto(0, from, buf)
		if f != nil {
			f.Release()
		}
		if err != nil {
			t.Fatal(err)
		}
		reads++
		if c.Offset < from || c.Dropped != c.Offset-from {
			t.Fatalf("read from %d: chunk at %d, dropped %d", from, c.Offset, c.Dropped)
		}
		dropped += int(c.Dropped)
		for i, b := range c.Data {
			if o := c.Offset + uint64(i); b != seqByte(o) {
				t.Fatalf("read %d from %d: byte at offset %d is %q, the stream has %q there (chunk of %d at %d: %q)",
					reads, from, o, b, seqByte(o), len(c.Data), c.Offset, c.Data[max(0, i-16):min(len(c.Data), i+16)])
			}
		}
		checked += len(c.Data)
		if f != nil {
			checkedF += len(c.Data)
		}
	}
	t.Logf("%d reads (%d as new followers), %d bytes checked (%d by new followers), %d reported dropped, stream at %d", reads, follows, checked, checkedF, dropped, p.end(0))
	if checked < 1<<20 || checkedF < 64<<10 || p.end(0) < 100*4096 {
		t.Errorf("too little read (%d bytes, %d by new followers) or written (%d) to tell", checked, checkedF, p.end(0))
	}
}

// TestHoldReachesAnIdlePump: a process fills its 4 KiB ring past a wrap and
// waits (its shim waits for the pipe); an attach then follows from the
// ring's oldest byte and the process writes 25 times the ring before the
// follower reads: the hold, arrived while the shim waited, holds back the
// very next write, so the follower gets every byte from where it began,
// none dropped.
func TestHoldReachesAnIdlePump(t *testing.T) {
	r := newRig(t, 4096)
	p := r.start(t, wire.ProcessStart{Argv: []string{"/bin/sh", "-c", "head -c 5000 /dev/zero | tr '\\0' a; read x; seq 1 20000"}, Interactive: true})
	for i := 0; p.end(0) < 5000; i++ {
		if i == 500 {
			t.Fatalf("the first 5000 bytes did not come: %+v", p.View())
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // the shim back waiting for the pipe
	from := uint64(5000 - 4096)
	f := p.Follow([2]uint64{from, 0})
	defer f.Release()
	p.Stdin([]byte("go\n"))
	time.Sleep(300 * time.Millisecond) // the process writes before the follower reads
	got := readFollowed(t, f, from, func(ctx context.Context, off uint64) (Chunk, bool, error) {
		return p.Next(ctx, 0, off, 1000)
	})
	var want strings.Builder
	want.WriteString(strings.Repeat("a", 5000-int(from)))
	for i := 1; i <= 20000; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	if string(got) != want.String() {
		t.Fatalf("got %d bytes, want %d", len(got), want.Len())
	}
}

// TestLostAfterWrapExact: a shim killed while no agent ran (its process
// had filled its 4 KiB ring three times over) leaves a lost process whose
// end is the index's, not the ring file's size: a read from 0 is told the
// bytes the ring dropped and gets the stream's last 4 KiB at their offsets.
func TestLostAfterWrapExact(t *testing.T) {
	r := newRig(t, 4096)
	p := r.start(t, wire.ProcessStart{Argv: []string{"/bin/sh", "-c", "seq 1 3000; exec sleep 100"}})
	var want strings.Builder
	for i := 1; i <= 3000; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	total := uint64(want.Len())
	for i := 0; p.end(0) < total; i++ {
		if i == 500 {
			t.Fatalf("the output did not come: %+v", p.View())
		}
		time.Sleep(10 * time.Millisecond)
	}
	shim := shimPID(t, p)
	r.m.Close()
	syscall.Kill(shim, syscall.SIGKILL) // our child: the test started it
	time.Sleep(300 * time.Millisecond)  // its socket closed with it
	q := reopen(t, r, p, func(s string) bool { return s == r.session })
	if v := wait(t, q); v.State != wire.ProcLost || v.Stdout != total {
		t.Fatalf("lost process: %+v, want stdout end %d", v, total)
	}
	out, c := readAll(t, q, 0, 0, 5*time.Second)
	if c.Offset != total-4096 || c.Dropped != total-4096 || out != want.String()[total-4096:] {
		t.Errorf("read from 0: at %d, dropped %d, %d bytes (match %v)", c.Offset, c.Dropped, len(out), out == want.String()[total-4096:])
	}
}

// shimPID is the pid of p's shim: its process's parent.
func shimPID(t *testing.T, p *Proc) int {
	t.Helper()
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(p.started.HostPID) + "/status")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "PPid:"); ok {
			if pid, _ := strconv.Atoi(strings.TrimSpace(v)); pid > 1 && pid != os.Getpid() {
				return pid
			}
		}
	}
	t.Fatalf("no shim pid for %s", p.ID())
	return 0
}
