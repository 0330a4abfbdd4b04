package store

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// The fold's view of the state: records as the JSON bytes they were
// written as.
//
// A fold only carries records from the snapshot and the segments into a
// new snapshot; it never needs one decoded. Decoding them into a State and
// encoding that again held about three times the files' size in heap at
// once (the file read whole, every record decoded, the garbage of the
// segment's older versions): a 4.8 MB snapshot and a 5.7 MB segment of
// net.egress tombstones peaked 31 MiB over the heap before the fold, in the
// agent's background, beside whatever it was serving. rawState holds each
// record's bytes once, the snapshot is read one record at a time, and
// encodeMap writes the bytes back as they are. What Open decodes from the
// new snapshot is what it would have decoded from the files it replaced:
// only a grant written before Delta ("rules") is decoded, migrated and
// encoded again, as the typed fold did.

// rawKinds are State's record maps, in State's field order: the journal's
// kind letter, the snapshot's field name, and whether an empty map is
// left out (omitempty).
var rawKinds = [...]struct {
	letter, field string
	omitEmpty     bool
}{
	{"s", "sessions", false},
	{"g", "grants", false},
	{"a", "approvals", false},
	{"c", "cards", true},
	{"p", "patterns", true},
}

// rawState is a State whose records are undecoded.
type rawState struct {
	version int
	through uint64
	recs    [len(rawKinds)]map[string]json.RawMessage
}

func newRawState() *rawState {
	rs := &rawState{version: stateVersion}
	for i := range rs.recs {
		rs.recs[i] = map[string]json.RawMessage{}
	}
	return rs
}

// readRawSnapshot reads the snapshot at path (an empty state when there is
// none) one record at a time.
func readRawSnapshot(path string) (*rawState, error) {
	rs := newRawState()
	f, err := os.Open(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return rs, nil
	case err != nil:
		return nil, fmt.Errorf("%w: %w", ErrState, err)
	}
	defer f.Close()
	if err := rs.decode(json.NewDecoder(bufio.NewReaderSize(f, 64<<10))); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrState, path, err)
	}
	if rs.version != stateVersion {
		return nil, fmt.Errorf("%w: %s: version %d, want %d", ErrState, path, rs.version, stateVersion)
	}
	return rs, nil
}

// decode reads State's object: version, through and the record maps; other
// fields are skipped, as json.Unmarshal into State skips them.
func (rs *rawState) decode(dec *json.Decoder) error {
	if err := wantDelim(dec, '{'); err != nil {
		return err
	}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return err
		}
		switch key {
		case "version":
			err = dec.Decode(&rs.version)
		case "through":
			err = dec.Decode(&rs.through)
		default:
			err = rs.decodeMap(dec, key)
		}
		if err != nil {
			return fmt.Errorf("%v: %w", key, err)
		}
	}
	if err := wantDelim(dec, '}'); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("data after the state's object")
	}
	return nil
}

// decodeMap reads the value of field key: a record map (null is an empty
// one) or, for a field State does not have, any value, skipped.
func (rs *rawState) decodeMap(dec *json.Decoder, key json.Token) error {
	i := -1
	for k, rk := range rawKinds {
		if key == rk.field {
			i = k
		}
	}
	if i < 0 {
		var skip json.RawMessage
		return dec.Decode(&skip)
	}
	tok, err := dec.Token()
	if err != nil || tok == nil {
		return err
	}
	if tok != json.Delim('{') {
		return fmt.Errorf("want an object, have %v", tok)
	}
	m := rs.recs[i]
	for dec.More() {
		id, err := dec.Token()
		if err != nil {
			return err
		}
		var rec json.RawMessage
		if err := dec.Decode(&rec); err != nil {
			return err
		}
		m[id.(string)] = rec // an object's keys are strings
	}
	return wantDelim(dec, '}')
}

func wantDelim(dec *json.Decoder, d json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if tok != d {
		return fmt.Errorf("want %v, have %v", d, tok)
	}
	return nil
}

// rawKind is the index in rawKinds of the kind letter, -1 if none.
func rawKind(letter string) int {
	for i, rk := range rawKinds {
		if rk.letter == letter {
			return i
		}
	}
	return -1
}

// apply is State.apply for undecoded records.
func (rs *rawState) apply(jl journalLine) error {
	i := rawKind(jl.Kind)
	switch {
	case i < 0:
		return fmt.Errorf("unknown record kind %q", jl.Kind)
	case jl.Del:
		delete(rs.recs[i], jl.ID)
	default:
		rs.recs[i][jl.ID] = jl.Rec
	}
	return nil
}

// migrateLegacy is migrateLegacy for the grants that need it: those whose
// record has "rules".
func (rs *rawState) migrateLegacy() error {
	grants := rs.recs[rawKind("g")]
	for id, rec := range grants {
		if !bytes.Contains(rec, []byte(`"rules":`)) {
			continue
		}
		var g GrantRecord
		if err := json.Unmarshal(rec, &g); err != nil {
			return fmt.Errorf("%w: grant %q: %w", ErrState, id, err)
		}
		migrateGrant(&g)
		b, err := json.Marshal(&g)
		if err != nil {
			return fmt.Errorf("%w: grant %q: %w", ErrState, id, err)
		}
		grants[id] = b
	}
	return nil
}

// encode writes rs as encodeState writes a State.
func (rs *rawState) encode(w *bufio.Writer) error {
	encodeHeader(w, rs.version, rs.through)
	for i, rk := range rawKinds {
		if err := encodeMap(w, rk.field, rs.recs[i], rk.omitEmpty); err != nil {
			return err
		}
	}
	return w.WriteByte('}')
}
