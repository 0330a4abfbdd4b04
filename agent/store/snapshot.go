package store

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"

	"github.com/shinken-agent/shinken/agent/internal/atomicfile"
)

// writeSnapshot replaces the snapshot at path with st, encoded one record
// at a time into the file: the bytes are json.Marshal(st)'s, but no buffer
// holds them whole (at 100,000 sessions json.Marshal built a 32 MiB buffer
// by doubling, 64 MiB of garbage per fold, beside the decoded state the
// fold works on). It returns the snapshot's size.
func writeSnapshot(path string, st *State) (int64, error) {
	return writeSnapshotWith(path, func(w *bufio.Writer) error { return encodeState(w, st) })
}

// writeSnapshotWith replaces the snapshot at path with what encode writes
// (through a 256 KiB buffer) and returns its size.
func writeSnapshotWith(path string, encode func(*bufio.Writer) error) (int64, error) {
	var n int64
	err := atomicfile.WriteWith(path, 0o600, func(f io.Writer) error {
		c := &countWriter{w: f}
		bw := bufio.NewWriterSize(c, 256<<10)
		if err := encode(bw); err != nil {
			return err
		}
		err := bw.Flush()
		n = c.n
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrState, err)
	}
	return n, nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// encodeState writes what json.Marshal(st) would, byte for byte (State's
// fields in order, omitempty as tagged, map keys sorted, each record
// marshalled on its own), so the snapshot format is State's JSON encoding
// and readSnapshot decodes it with json.Unmarshal
// (TestEncodeStateIsMarshal keeps the two the same).
func encodeState(w *bufio.Writer, st *State) error {
	encodeHeader(w, st.Version, st.Through)
	if err := encodeMap(w, "sessions", st.Sessions, false); err != nil {
		return err
	}
	if err := encodeMap(w, "grants", st.Grants, false); err != nil {
		return err
	}
	if err := encodeMap(w, "approvals", st.Approvals, false); err != nil {
		return err
	}
	if err := encodeMap(w, "cards", st.Cards, true); err != nil {
		return err
	}
	if err := encodeMap(w, "patterns", st.Patterns, true); err != nil {
		return err
	}
	return w.WriteByte('}')
}

// encodeHeader opens State's object with its version and, when set, through.
func encodeHeader(w *bufio.Writer, version int, through uint64) {
	w.WriteString(`{"version":` + strconv.Itoa(version))
	if through != 0 {
		w.WriteString(`,"through":` + strconv.FormatUint(through, 10))
	}
}

// encodeMap writes one of State's record maps, keys sorted, each record
// marshalled on its own (a json.RawMessage as it is: the fold's records are
// the bytes they were written as).
func encodeMap[V any](w *bufio.Writer, name string, m map[string]V, omitEmpty bool) error {
	if omitEmpty && len(m) == 0 {
		return nil
	}
	w.WriteString(`,"` + name + `":`)
	if m == nil {
		_, err := w.WriteString("null")
		return err
	}
	w.WriteByte('{')
	for i, k := range slices.Sorted(maps.Keys(m)) {
		if i > 0 {
			w.WriteByte(',')
		}
		kb, err := json.Marshal(k)
		if err != nil {
			return err
		}
		var vb []byte
		if raw, ok := any(m[k]).(json.RawMessage); ok {
			vb = raw
		} else if vb, err = json.Marshal(m[k]); err != nil {
			return fmt.Errorf("encode %s %q: %w", name, k, err)
		}
		w.Write(kb)
		w.WriteByte(':')
		w.Write(vb)
	}
	_, err := w.WriteString("}")
	return err
}
