package store

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shinken-agent/shinken/agent/internal/atomicfile"
)

// Rotation and the background fold.
//
// A write that would take the journal past max(1 MiB, twice the snapshot)
// first rotates it: the journal is fsynced (its unsynced intents become
// durable, so an fsync still covers every earlier line), a fresh one is
// created as state.journal.next, the journal is renamed to the next
// segment, state.journal.N, the fresh one to state.journal, and the
// directory is fsynced; then the write appends to the fresh journal as any
// other. A goroutine then folds the snapshot and every segment up to N into
// a new snapshot saying "through": N, read from the files alone (the
// segments never change once renamed), and removes those segments. At most
// one fold runs; while it runs the journal is not rotated again.
//
// Open reads the snapshot, replays every segment above its "through" in
// order, then the journal; segments at or below it (a fold that ended
// between its snapshot and their removal) are removed, as is a
// state.journal.next left by a rotation cut short.
//
// Failures: a rotation that cannot begin (its sync, the fresh file, the
// first rename) leaves the journal where it was and the write goes on, the
// fold simply later (OnFold hears of it); one whose second rename fails
// puts the journal back. A directory sync that fails leaves the store
// dirty: no write is acknowledged until a sync of the directory succeeds.
// A fold that fails leaves its segments (Open replays them); the next
// rotation's fold folds them too.

// Fold is what OnFold hears: a background fold done or failed, or a
// rotation that could not be made (Through 0).
type Fold struct {
	Through uint64        // the highest segment folded
	Bytes   int64         // the new snapshot's size
	Took    time.Duration // the fold's time (encoding, writing, syncing)
	Err     error         // nil when done
}

const segPrefix = "state.journal."

func (s *Store) segPath(n uint64) string {
	return filepath.Join(s.dir, segPrefix+strconv.FormatUint(n, 10))
}

func (s *Store) nextPath() string { return filepath.Join(s.dir, "state.journal.next") }

// segments lists the segment numbers in dir, ascending.
func segments(dir string) ([]uint64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrState, err)
	}
	var out []uint64
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), segPrefix)
		if !ok {
			continue
		}
		if n, err := strconv.ParseUint(rest, 10, 64); err == nil && n > 0 {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out, nil
}

// replaySegments applies the segments above st.Through in order, removes
// those at or below it and a rotation's leftover, and sets s.seg.
func (s *Store) replaySegments(st *State) error {
	segs, err := segments(s.dir)
	if err != nil {
		return err
	}
	s.seg = st.Through
	if err := os.Remove(s.nextPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: %w", ErrState, err)
	}
	for _, n := range segs {
		if n <= st.Through {
			if err := os.Remove(s.segPath(n)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("%w: %w", ErrState, err)
			}
			continue
		}
		if err := replayFile(s.segPath(n), st.apply); err != nil {
			return err
		}
		s.seg = n
	}
	return nil
}

// replayFile applies one segment's lines (to a State, or to the fold's
// rawState). A torn last line is dropped as the journal's is (a segment is
// synced before it is renamed, so it has none unless the disk lost it).
func replayFile(path string, apply func(journalLine) error) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrState, err)
	}
	defer f.Close()
	_, err = replayLines(f, apply, path)
	return err
}

// replayLines applies the journal lines read from r, one at a time, and
// returns how many bytes of whole lines it applied: a torn last line (no
// newline, or one that does not parse) is left out; a corrupt line
// anywhere else is an error wrapping ErrState.
func replayLines(r io.Reader, apply func(journalLine) error, name string) (int64, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var good int64
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) { // a line longer than the buffer
			line = bytes.Clone(line)
			for errors.Is(err, bufio.ErrBufferFull) {
				var more []byte
				more, err = br.ReadSlice('\n')
				line = append(line, more...)
			}
		}
		if errors.Is(err, io.EOF) {
			return good, nil // what is left has no newline: torn, never acknowledged
		}
		if err != nil {
			return 0, fmt.Errorf("%w: %s: %w", ErrState, name, err)
		}
		var jl journalLine
		if err := json.Unmarshal(line, &jl); err != nil {
			if _, perr := br.Peek(1); errors.Is(perr, io.EOF) {
				return good, nil // torn last line
			}
			return 0, fmt.Errorf("%w: %s: corrupt line at byte %d: %w", ErrState, name, good, err)
		}
		if err := apply(jl); err != nil {
			return 0, fmt.Errorf("%w: %s: byte %d: %w", ErrState, name, good, err)
		}
		good += int64(len(line))
	}
}

// removeSegments removes the segments of segs (as segments lists them)
// up to n.
func (s *Store) removeSegments(segs []uint64, n uint64) error {
	for _, k := range segs {
		if k > n {
			break
		}
		if err := os.Remove(s.segPath(k)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%w: %w", ErrState, err)
		}
	}
	return nil
}

// rotateIfDue rotates the journal when adding n bytes would take it past
// max(minCompact, twice the snapshot) and no fold is running, and starts
// the fold. Only a rotation left half made is an error.
func (s *Store) rotateIfDue(n int) error {
	if s.jbytes+int64(n) <= max(minCompact, 2*s.sbytes.Load()) || s.foldRunning() {
		return nil
	}
	if err := s.rotate(); err != nil {
		if errors.Is(err, errHalfRotated) {
			return err
		}
		s.report(Fold{Err: err})
		return nil
	}
	s.startFold(s.seg)
	return nil
}

// errHalfRotated marks a rotation that could not be undone.
var errHalfRotated = errors.New("journal rotation left half made")

// rotate renames the journal to segment s.seg+1 and opens a fresh one.
func (s *Store) rotate() error {
	if err := s.faultAt(FaultRotate); err != nil {
		return fmt.Errorf("%w: rotate journal: %w", ErrState, err)
	}
	if err := s.journal.Sync(); err != nil {
		return fmt.Errorf("%w: rotate journal: %w", ErrState, err)
	}
	fresh, err := os.OpenFile(s.nextPath(), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("%w: rotate journal: %w", ErrState, err)
	}
	n := s.seg + 1
	if err := os.Rename(s.journalPath(), s.segPath(n)); err != nil {
		fresh.Close()
		os.Remove(s.nextPath())
		return fmt.Errorf("%w: rotate journal: %w", ErrState, err)
	}
	if err := os.Rename(s.nextPath(), s.journalPath()); err != nil {
		fresh.Close()
		if berr := os.Rename(s.segPath(n), s.journalPath()); berr != nil {
			// The journal is segment n now and there is no state.journal:
			// keep appending to it (Open replays it as a segment), and
			// never fold it while it is written.
			s.seg, s.dirty = n, true
			return fmt.Errorf("%w: rotate journal: %w: %w (and back: %w)", ErrState, errHalfRotated, err, berr)
		}
		os.Remove(s.nextPath())
		return fmt.Errorf("%w: rotate journal: %w", ErrState, err)
	}
	s.journal.Close()
	s.journal, s.jbytes, s.seg = fresh, 0, n
	s.dirty = true
	return s.syncDirty()
}

// syncDirty makes the directory's entries durable after a rotation whose
// sync failed, before any write is acknowledged.
func (s *Store) syncDirty() error {
	if !s.dirty {
		return nil
	}
	if err := atomicfile.SyncDir(s.dir); err != nil {
		return fmt.Errorf("%w: sync state directory after rotation: %w", ErrState, err)
	}
	s.dirty = false
	return nil
}

func (s *Store) foldRunning() bool {
	if s.folding == nil {
		return false
	}
	select {
	case <-s.folding:
		return false
	default:
		return true
	}
}

// waitFold waits until no fold runs.
func (s *Store) waitFold() {
	if s.folding != nil {
		<-s.folding
	}
}

func (s *Store) report(f Fold) {
	if s.OnFold != nil {
		s.OnFold(f)
	}
}

// startFold folds the snapshot and the segments up to n on a goroutine,
// on a thread of its own at nice 19 on Linux (backgroundThread), so
// that a grant, a revoke or a DNS answer that wakes beside it takes the
// CPU from it rather than wait: at 10,000 sessions a fold is tens of
// milliseconds of decoding, encoding and collecting garbage on a 2-CPU
// host. Its snapshot goes out to the disk a step at a time
// (atomicfile.WriteWith), not all at its fsync.
func (s *Store) startFold(n uint64) {
	done := make(chan struct{})
	s.folding = done
	go func() {
		defer close(done)
		backgroundThread(func() {
			start := time.Now()
			size, err := s.foldThrough(n)
			if size > 0 {
				s.sbytes.Store(size) // written, even if a segment's removal failed
			}
			s.report(Fold{Through: n, Bytes: size, Took: time.Since(start), Err: err})
		})
	}()
}

// foldThrough writes the snapshot and segments up to n as one new snapshot
// (through n) and removes those segments. It reads files only, and keeps
// the records as their bytes (rawfold.go).
func (s *Store) foldThrough(n uint64) (int64, error) {
	rs, err := readRawSnapshot(s.path())
	if err != nil {
		return 0, err
	}
	segs, err := segments(s.dir)
	if err != nil {
		return 0, err
	}
	for _, k := range segs {
		if k <= rs.through || k > n {
			continue
		}
		if err := replayFile(s.segPath(k), rs.apply); err != nil {
			return 0, err
		}
	}
	if err := rs.migrateLegacy(); err != nil {
		return 0, err
	}
	rs.through = n
	if err := s.faultAt(FaultSnapshot); err != nil {
		return 0, fmt.Errorf("%w: snapshot: %w", ErrState, err)
	}
	size, err := writeSnapshotWith(s.path(), rs.encode)
	if err != nil {
		return 0, err
	}
	return size, s.removeSegments(segs, n) // listed above: every one up to n was renamed before the fold began
}
