package procs

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"sync/atomic"
	"unsafe"
)

// A ring is one output stream of a process on disk: a file of Cap bytes in
// which the byte at stream offset o sits at file position o mod Cap. The
// shim is its only writer; readers (the agent) read the same file.
//
// What a reader may trust is said by the rings' index (indexFile), one page
// the shim maps read-write and the agent read-only, with two words per
// stream that the shim alone stores, atomically:
//
//   - limit: no byte at an offset at or past it has been written, nor is
//     being written. The shim raises it BEFORE each write (to the end plus
//     what the write may move), and lowers it to the end once the write is
//     done or moved nothing.
//   - end: every byte before it has been written.
//
// A reader reads file positions, then loads limit: a byte at offset o can
// have been overwritten (by offset o+Cap or later) only by a write that
// began after limit passed o+Cap, and that raise of limit is visible to any
// load that follows a read which saw the write's bytes (the shim's raise is
// a swap, XCHG on x86, ordered before its write's stores; the reader's load
// follows its read: on x86 TSO orders it after pread's loads; on weaker
// architectures this rests on the kernel's read path ending with fully
// ordered atomics, untested). A limit lowered again still covers all that
// was written. So the reader drops every byte before limit-Cap, and what it
// keeps is exact: lost bytes are reported, never returned as old ones. This
// holds for every reader, held back (Follower) or not, and costs the writer
// three atomic stores per write and the reader one load per read: no system
// call and no round trip to the shim. The index outlives the agent (a
// restarted agent maps it again) and the shim (the ends of a lost process's
// streams are exact).

// The index's layout: for stream i, end at 16*i and limit at 16*i+8,
// native byte order (only processes on one host share it).
const indexBytes = 4096

type ringIndex struct{ mem []byte }

func (x *ringIndex) word(i, k int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&x.mem[16*i+8*k]))
}

// End is stream i's end: every byte before it is written.
func (x *ringIndex) End(i int) uint64 {
	v := x.word(i, 0).Load()
	runtime.KeepAlive(x) // the mapping is unmapped when x is collected
	return v
}

// Limit is stream i's write limit: nothing at or past it has been written
// or is being written.
func (x *ringIndex) Limit(i int) uint64 {
	v := x.word(i, 1).Load()
	runtime.KeepAlive(x)
	return v
}

// ringWriter appends to a ring file and keeps its words in the index.
type ringWriter struct {
	f   *os.File
	cap uint64
	end uint64
	idx *ringIndex
	i   int // the stream
}

// intend raises (or lowers) the limit to end+n before a write of up to n
// bytes: n 0 once a write moved nothing.
// A swap, not a store: fully ordered (on arm64 too) before the write's own
// stores.
func (w *ringWriter) intend(n uint64) { w.idx.word(w.i, 1).Swap(w.end + n) }

// wrote records n bytes written at the end.
func (w *ringWriter) wrote(n uint64) {
	w.end += n
	w.idx.word(w.i, 0).Store(w.end)
	w.idx.word(w.i, 1).Store(w.end)
}

func (w *ringWriter) write(p []byte) error {
	w.intend(uint64(len(p)))
	if uint64(len(p)) > w.cap { // only the last cap bytes can be kept
		w.end += uint64(len(p)) - w.cap
		p = p[uint64(len(p))-w.cap:]
	}
	for len(p) > 0 {
		pos := w.end % w.cap
		n := min(uint64(len(p)), w.cap-pos)
		if _, err := w.f.WriteAt(p[:n], int64(pos)); err != nil {
			// Part of it may be written: the limit stays past all of p.
			return err
		}
		p = p[n:]
		w.end += n
	}
	w.wrote(0)
	return nil
}

// readRing reads up to len(buf) bytes of the ring f (capacity cp) into buf
// from stream offset off, the writer's end being end (or less). It returns
// the bytes (a slice of buf) and the offset of the first (start > off: the
// bytes between are gone). limit gives the writer's limit after the read:
// bytes it may have overwritten since are dropped from the front.
func readRing(f *os.File, cp, off, end uint64, buf []byte, limit func() uint64) ([]byte, uint64, error) {
	start := off
	if end > cp && start < end-cp {
		start = end - cp
	}
	if start >= end {
		return nil, start, nil
	}
	n := min(end-start, uint64(len(buf)))
	buf = buf[:n]
	for got := uint64(0); got < n; {
		pos := (start + got) % cp
		k := min(n-got, cp-pos)
		if _, err := f.ReadAt(buf[got:got+k], int64(pos)); err != nil && !errors.Is(err, io.EOF) {
			return nil, start, err
		}
		got += k
	}
	if e := limit(); e > cp && e-cp > start {
		lost := min(e-cp-start, n)
		buf, start = buf[lost:], start+lost
	}
	return buf, start, nil
}

// ---- the shim's control socket ----
//
// Frames both ways: one type byte, a 4-byte big-endian length, the payload.
const (
	// agent → shim
	ctlStdin      = 'i'
	ctlStdinClose = 'c'
	ctlResize     = 'r' // TermSize JSON
	ctlSignal     = 's' // 4-byte signal number
	ctlHold       = 'h' // two 8-byte offsets (stdout, stderr) a live reader still needs; empty: none
	// shim → agent
	ctlEnds = 'e' // two 8-byte ends: stdout, stderr
	ctlExit = 'x' // exitRecord JSON

	maxFrame = 1 << 20
)

func writeFrame(c net.Conn, typ byte, p []byte) error {
	var h [5]byte
	h[0] = typ
	binary.BigEndian.PutUint32(h[1:], uint32(len(p)))
	_, err := (&net.Buffers{h[:], p}).WriteTo(c)
	return err
}

func readFrame(r io.Reader) (byte, []byte, error) {
	var h [5]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(h[1:])
	if n > maxFrame {
		return 0, nil, errors.New("procs: control frame too large")
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(r, p); err != nil {
		return 0, nil, err
	}
	return h[0], p, nil
}
