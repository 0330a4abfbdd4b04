package procs

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/shinken-agent/shinken/agent/api/wire"
)

// Proc is one process as the agent sees it: its records, the ends of its
// output rings as its shim reports them, and its control connection.
type Proc struct {
	dir     string
	meta    meta
	started startedRecord
	rings   [2]*os.File // read-only
	index   *ringIndex  // mapped read-only

	mu      sync.Mutex
	ends    [2]uint64
	exit    *exitRecord
	lost    bool
	conn    net.Conn
	changed chan struct{} // closed (and replaced) on every change

	sendMu    sync.Mutex // one control frame at a time
	holdMu    sync.Mutex // hold updates computed and sent in order
	followers map[*Follower]bool
	sentHold  [2]uint64
	holding   bool
}

func newProc(dir string, md meta) *Proc {
	return &Proc{dir: dir, meta: md, changed: make(chan struct{})}
}

// ID is the process's id.
func (p *Proc) ID() string { return p.meta.ID }

func (p *Proc) open() error {
	for i, name := range []string{outFile, errFile} {
		f, err := os.Open(filepath.Join(p.dir, name))
		if err != nil {
			return fmt.Errorf("procs: %s: %w", p.meta.ID, err)
		}
		p.rings[i] = f
	}
	x, err := openIndex(p.dir)
	if err != nil {
		return fmt.Errorf("procs: %s: %w", p.meta.ID, err)
	}
	p.index = x
	return nil
}

func (p *Proc) close() {
	p.mu.Lock()
	c := p.conn
	p.conn = nil
	p.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

func (p *Proc) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// adopt connects to the shim's control socket and follows it; a process
// whose shim is gone is read from its exit record (or, with none, is lost).
func (p *Proc) adopt() {
	var rec exitRecord
	if readJSON(filepath.Join(p.dir, exitFile), &rec) == nil {
		p.setExit(&rec)
		return
	}
	c, err := net.Dial("unix", filepath.Join(p.dir, ctlFile))
	if err != nil {
		// A shim closes its listener only after exit.json is written
		// (a spare shim then takes another job): read it again.
		if readJSON(filepath.Join(p.dir, exitFile), &rec) == nil {
			p.setExit(&rec)
			return
		}
		p.shimGone()
		return
	}
	p.mu.Lock()
	p.conn = c
	p.mu.Unlock()
	go p.follow(c)
}

func (p *Proc) follow(c net.Conn) {
	// Buffered: the frames the shim sent while this goroutine waited for
	// a CPU are read with one system call, not two each.
	r := bufio.NewReaderSize(c, 4096)
	for {
		typ, b, err := readFrame(r)
		if err != nil {
			break
		}
		switch typ {
		case ctlEnds:
			if len(b) == 16 {
				p.mu.Lock()
				p.ends = [2]uint64{binary.BigEndian.Uint64(b), binary.BigEndian.Uint64(b[8:])}
				p.notifyLocked()
				p.mu.Unlock()
			}
		case ctlExit:
			var rec exitRecord
			if json.Unmarshal(b, &rec) == nil {
				p.setExit(&rec)
			}
		}
	}
	p.mu.Lock()
	mine := p.conn == c
	p.mu.Unlock()
	c.Close()
	if mine { // not closed by us: the shim went away
		var rec exitRecord
		if readJSON(filepath.Join(p.dir, exitFile), &rec) == nil {
			p.setExit(&rec)
		} else {
			p.shimGone()
		}
	}
}

func (p *Proc) setExit(rec *exitRecord) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exit != nil {
		return
	}
	p.exit, p.ends = rec, [2]uint64{rec.Stdout, rec.Stderr}
	p.notifyLocked()
}

// shimGone: no shim and no exit record. The ends are the index's: every
// byte the shim wrote before it went.
func (p *Proc) shimGone() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exit != nil || p.lost {
		return
	}
	p.lost = true
	for i := range p.ends {
		p.ends[i] = max(p.ends[i], p.index.End(i))
	}
	p.notifyLocked()
}

// View is the process as listed.
func (p *Proc) View() wire.Process {
	p.mu.Lock()
	defer p.mu.Unlock()
	v := wire.Process{ID: p.meta.ID, Session: p.meta.Session, Argv: p.meta.Argv, PID: p.started.PID, State: wire.ProcRunning,
		TTY: p.meta.TTY != nil, Started: p.started.Started, Stdout: p.ends[0], Stderr: p.ends[1], RingBytes: p.meta.RingBytes, Deadline: p.meta.Deadline}
	switch {
	case p.exit != nil:
		v.State, v.ExitCode, v.Signal, v.Reason = wire.ProcExited, p.exit.ExitCode, p.exit.Signal, p.exit.Reason
		e := p.exit.Ended
		v.Ended = &e
	case p.lost:
		v.State = wire.ProcLost
	}
	return v
}

// Done says whether the process has ended (exited or lost).
func (p *Proc) Done() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exit != nil || p.lost
}

// Wait waits until the process has ended or ctx is done.
func (p *Proc) Wait(ctx context.Context) error {
	for {
		p.mu.Lock()
		done, ch := p.exit != nil || p.lost, p.changed
		p.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Chunk is output read from a ring: Data begins at stream offset Offset;
// Dropped bytes before it (from the offset asked for) are gone.
type Chunk struct {
	Data    []byte
	Offset  uint64
	Dropped uint64
}

// Read reads up to max bytes of stream (0 stdout, 1 stderr) from offset
// off, without waiting.
func (p *Proc) Read(stream int, off uint64, max int) (Chunk, error) {
	return p.ReadInto(stream, off, make([]byte, max))
}

// ReadInto is Read into buf: the chunk's Data is a slice of buf (a reader
// that follows a stream reuses one buffer instead of allocating one per
// read).
func (p *Proc) ReadInto(stream int, off uint64, buf []byte) (Chunk, error) {
	if stream != 0 && stream != 1 {
		return Chunk{}, fmt.Errorf("%w: stream %d", ErrInvalid, stream)
	}
	end := p.end(stream)
	if off > end {
		off = end
	}
	data, start, err := readRing(p.rings[stream], p.meta.RingBytes, off, end, buf, func() uint64 { return p.index.Limit(stream) })
	if err != nil {
		return Chunk{}, err
	}
	return Chunk{Data: data, Offset: start, Dropped: start - off}, nil
}

func (p *Proc) end(stream int) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.endLocked(stream)
}

// endLocked is stream's end as far as the agent can tell: the later of
// what the shim last said on its control connection and the ring index's
// end (every byte before it is in the ring, ring.go), so that a reader
// reads what the shim has written without waiting for the shim's
// notice to come through its connection (the first output of a process
// was read only once that notice came: bench/README.md, issue 20). p.mu
// held.
func (p *Proc) endLocked(stream int) uint64 {
	if p.index == nil {
		return p.ends[stream]
	}
	return max(p.ends[stream], p.index.End(stream))
}

// Next waits until stream has bytes past off or the process has ended (or
// ctx is done), and reads them. ok is false when the stream is complete
// (the process ended and off is its end).
func (p *Proc) Next(ctx context.Context, stream int, off uint64, max int) (c Chunk, ok bool, err error) {
	return p.next(ctx, stream, off, max, nil)
}

// NextInto is Next into buf (see ReadInto).
func (p *Proc) NextInto(ctx context.Context, stream int, off uint64, buf []byte) (c Chunk, ok bool, err error) {
	return p.next(ctx, stream, off, len(buf), buf)
}

func (p *Proc) next(ctx context.Context, stream int, off uint64, max int, buf []byte) (c Chunk, ok bool, err error) {
	for {
		p.mu.Lock()
		end, done, ch := p.endLocked(stream), p.exit != nil || p.lost, p.changed
		p.mu.Unlock()
		if off < end {
			if buf == nil {
				buf = make([]byte, min(uint64(max), end-off))
			}
			c, err := p.ReadInto(stream, off, buf)
			return c, err == nil, err
		}
		if done {
			return Chunk{Offset: off}, false, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return Chunk{Offset: off}, false, ctx.Err()
		}
	}
}

func (p *Proc) send(typ byte, b []byte) error {
	p.mu.Lock()
	c, done := p.conn, p.exit != nil || p.lost
	p.mu.Unlock()
	if done || c == nil {
		return fmt.Errorf("%w: %s", ErrNotActive, p.meta.ID)
	}
	p.sendMu.Lock()
	defer p.sendMu.Unlock()
	c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	return writeFrame(c, typ, b)
}

// Follower is a live reader that holds the process back: while it is
// registered, the shim reads no more of the process's output than the
// ring can keep past the follower's offsets, so a process writing faster
// than an attached client reads waits (as it would at a terminal) instead
// of its output being dropped. With no agent connected nothing holds it.
type Follower struct {
	p   *Proc
	off [2]uint64
}

// Follow registers a follower from the offsets from (stdout, stderr).
func (p *Proc) Follow(from [2]uint64) *Follower {
	f := &Follower{p: p, off: from}
	p.mu.Lock()
	if p.followers == nil {
		p.followers = map[*Follower]bool{}
	}
	p.followers[f] = true
	p.mu.Unlock()
	p.updateHold()
	return f
}

// Advance says the follower has read stream up to off.
func (f *Follower) Advance(stream int, off uint64) {
	f.p.mu.Lock()
	f.off[stream] = off
	f.p.mu.Unlock()
	f.p.updateHold()
}

// Release ends the follower's hold.
func (f *Follower) Release() {
	f.p.mu.Lock()
	delete(f.p.followers, f)
	f.p.mu.Unlock()
	f.p.updateHold()
}

// updateHold tells the shim the slowest follower's offsets (or that none
// holds) when they changed.
func (p *Proc) updateHold() {
	p.holdMu.Lock()
	defer p.holdMu.Unlock()
	p.mu.Lock()
	var min [2]uint64
	first := true
	for f := range p.followers {
		for i := range min {
			if first || f.off[i] < min[i] {
				min[i] = f.off[i]
			}
		}
		first = false
	}
	holding := len(p.followers) > 0
	// A hold that moved by less than an eighth of the ring is not sent:
	// the shim, reading no more than the room past the hold it knows,
	// still has at least 7/8 of the ring to fill when the followers have
	// read all it wrote, so it never waits for a hold that is not sent;
	// and one control frame per eighth of the ring, not per chunk read.
	step := p.meta.RingBytes / 8
	if holding == p.holding && (!holding || (min[0]-p.sentHold[0] < step && min[1]-p.sentHold[1] < step && min[0] >= p.sentHold[0] && min[1] >= p.sentHold[1])) {
		p.mu.Unlock()
		return
	}
	p.holding, p.sentHold = holding, min
	p.mu.Unlock()
	var b []byte
	if holding {
		b = make([]byte, 16)
		binary.BigEndian.PutUint64(b, min[0])
		binary.BigEndian.PutUint64(b[8:], min[1])
	}
	p.send(ctlHold, b)
}

// Stdin writes b to the process's stdin (its terminal, with a TTY).
func (p *Proc) Stdin(b []byte) error {
	for len(b) > 0 {
		n := min(len(b), maxFrame)
		if err := p.send(ctlStdin, b[:n]); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// CloseStdin ends the process's stdin (with a TTY: ^D at the terminal).
func (p *Proc) CloseStdin() error { return p.send(ctlStdinClose, nil) }

// Resize sets the terminal's size.
func (p *Proc) Resize(ts wire.TermSize) error {
	if p.meta.TTY == nil {
		return fmt.Errorf("%w: %s has no terminal", ErrInvalid, p.meta.ID)
	}
	if ts.Rows == 0 || ts.Cols == 0 || ts.Rows > 10000 || ts.Cols > 10000 {
		return fmt.Errorf("%w: size %dx%d", ErrInvalid, ts.Rows, ts.Cols)
	}
	b, _ := json.Marshal(ts)
	return p.send(ctlResize, b)
}

// Signal sends sig to the process (its first process, as started).
func (p *Proc) Signal(sig syscall.Signal) error {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], uint32(sig))
	return p.send(ctlSignal, b[:])
}

// Kill kills the process's whole tree: through the shim (which records
// reason "killed"), or by its cgroup when the shim does not do it within a
// second, cannot be reached, or is gone (a lost process may still run).
func (p *Proc) Kill() error {
	p.mu.Lock()
	exited := p.exit != nil
	p.mu.Unlock()
	if exited {
		return nil // nothing left: the shim removed the tree first
	}
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], killTreeSignal)
	if p.send(ctlSignal, b[:]) == nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if p.Wait(ctx) == nil {
			return nil
		}
	}
	if p.meta.Tree == "" {
		return fmt.Errorf("%w: %s: its shim did not kill it and it has no cgroup", ErrNotActive, p.meta.ID)
	}
	if err := os.WriteFile(filepath.Join(p.meta.Tree, "cgroup.kill"), []byte("1"), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("procs: kill %s: %w", p.meta.ID, err)
	}
	return nil
}
