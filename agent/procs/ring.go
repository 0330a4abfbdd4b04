package procs

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
)

// A ring is one output stream of a process on disk: a file of Cap bytes in
// which the byte at stream offset o sits at file position o mod Cap. The
// shim is its only writer and knows its end (the offset of the next byte);
// readers (the agent, from the same file) get that end from the shim and
// read what the ring still holds. A reader that reads while the writer
// wraps checks the end again afterwards and drops what was overwritten.

// ringWriter appends to a ring file.
type ringWriter struct {
	f   *os.File
	cap uint64
	end uint64
}

func (w *ringWriter) write(p []byte) error {
	if uint64(len(p)) > w.cap { // only the last cap bytes can be kept
		w.end += uint64(len(p)) - w.cap
		p = p[uint64(len(p))-w.cap:]
	}
	for len(p) > 0 {
		pos := w.end % w.cap
		n := min(uint64(len(p)), w.cap-pos)
		if _, err := w.f.WriteAt(p[:n], int64(pos)); err != nil {
			return err
		}
		p = p[n:]
		w.end += n
	}
	return nil
}

// readRing reads up to max bytes of the ring f (capacity cp) from stream
// offset off, the writer's end being end. It returns the bytes and the
// offset of the first (start > off: the bytes between are gone). endNow
// gives the writer's end after the read: bytes it has overwritten since are
// dropped from the front.
func readRing(f *os.File, cp, off, end uint64, max int, endNow func() uint64) ([]byte, uint64, error) {
	start := off
	if end > cp && start < end-cp {
		start = end - cp
	}
	if start >= end {
		return nil, start, nil
	}
	n := min(end-start, uint64(max))
	buf := make([]byte, n)
	for got := uint64(0); got < n; {
		pos := (start + got) % cp
		k := min(n-got, cp-pos)
		if _, err := f.ReadAt(buf[got:got+k], int64(pos)); err != nil && !errors.Is(err, io.EOF) {
			return nil, start, err
		}
		got += k
	}
	if e := endNow(); e > cp && e-cp > start {
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
