package store

import (
	"encoding/json"
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
	data, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("%w: encode: %w", ErrState, err)
	}
	if err := s.faultAt(FaultSnapshot); err != nil {
		return fmt.Errorf("%w: snapshot: %w", ErrState, err)
	}
	if err := writeFileAtomic(s.path(), data, 0o600); err != nil {
		return err
	}
	s.sbytes.Store(int64(len(data)))
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
