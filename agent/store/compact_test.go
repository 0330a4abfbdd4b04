package store

import (
	"fmt"
	"io"
)

// compact folds st, the whole state, into a fresh snapshot at once (after
// any running fold), then removes the segments and empties the journal.
// Writes never fold inline (they rotate, and a goroutine folds:
// rotate.go); tests do, to pin the compacted format and to time what the
// rotation replaced (BenchmarkCrossingWrite).
func (s *Store) compact(st *State) error {
	s.waitFold()
	st.Through = s.seg
	if err := s.faultAt(FaultSnapshot); err != nil {
		return fmt.Errorf("%w: snapshot: %w", ErrState, err)
	}
	size, err := writeSnapshot(s.path(), st)
	if err != nil {
		return err
	}
	s.sbytes.Store(size)
	segs, err := segments(s.dir)
	if err != nil {
		return err
	}
	if err := s.removeSegments(segs, s.seg); err != nil {
		return err
	}
	if err := s.journal.Truncate(0); err != nil {
		return fmt.Errorf("%w: journal: %w", ErrState, err)
	}
	if _, err := s.journal.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("%w: journal: %w", ErrState, err)
	}
	if err := s.journal.Sync(); err != nil {
		return fmt.Errorf("%w: journal: %w", ErrState, err)
	}
	s.jbytes = 0
	return nil
}
