package audit

import (
	"bufio"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// ProblemKind classifies what Verify found wrong.
type ProblemKind string

const (
	ProblemMalformed  ProblemKind = "malformed"  // not a record, or not in canonical form
	ProblemSignature  ProblemKind = "signature"  // the record's signature does not verify: edited or forged
	ProblemWrongKey   ProblemKind = "wrong_key"  // no signature verifies: not this log's key
	ProblemSeq        ProblemKind = "seq"        // a gap or a step back in seq: dropped, inserted or reordered
	ProblemChain      ProblemKind = "chain"      // prev_hash is not the previous record's hash
	ProblemTorn       ProblemKind = "torn"       // the file ends in an incomplete line
	ProblemTruncated  ProblemKind = "truncated"  // the log ends before the head its checkpoint vouches for
	ProblemCheckpoint ProblemKind = "checkpoint" // the checkpoint is missing, unsigned or disagrees with the log
)

// Problem is one thing wrong with the log. Record is the 1-based line
// number; Seq is what that line claims (0 when it could not be read).
type Problem struct {
	Record int
	Seq    uint64
	Kind   ProblemKind
	Detail string
}

func (p Problem) String() string {
	if p.Record == 0 {
		return p.Detail
	}
	return fmt.Sprintf("record %d (seq %d): %s", p.Record, p.Seq, p.Detail)
}

// Report is what Verify found.
type Report struct {
	Records  int    // lines read (with VerifyFrom: in the whole log)
	Head     uint64 // seq of the last record
	HeadHash string
	// Mark is where the last record read ends: give it to VerifyFrom to
	// verify only what is appended after it (keep it only from a report
	// that is OK).
	Mark     Mark
	Problems []Problem
	// Notes are facts that are not tampering: an audit_recovered record
	// (a repaired crash), a checkpoint behind the log (it trails the
	// log's syncs: an open log, or a crash before it caught up).
	Notes []string
}

// OK reports whether the log verified.
func (r *Report) OK() bool { return len(r.Problems) == 0 }

// Verify reads the log at path and its checkpoint (CheckpointPath(path))
// and checks every record against pub: canonical form, signature, seq
// continuity and the hash chain, then the tail against the checkpoint. It
// finds any edited, dropped, inserted, reordered or forged record and a cut
// tail, and names each. The error is nil when the log verifies, wraps
// ErrTampered (with the first problem) when it does not, and is something
// else when the log cannot be read; the Report is returned in the first two
// cases.
func Verify(path string, pub ed25519.PublicKey) (*Report, error) {
	return verify(path, pub, Mark{})
}

// Mark is a point of the log a verification reached: the last record read,
// where it starts and ends in the file, its line, seq and hash.
type Mark struct {
	Start, End int64
	Records    int
	Seq        uint64
	Hash       string
}

// VerifyFrom is Verify of what was appended after m (the Mark of an earlier
// report that was OK): it first reads the record at m again and checks it
// still hashes to m.Hash at m.Seq (when it does not, the log was rewritten
// or cut before m, and VerifyFrom verifies the whole log, which names what
// changed), then checks every later record and the checkpoint as Verify
// does. Its
// cost follows what was appended, not the log's size. It cannot see an
// edit before m: a full Verify can, and stays the reference. A zero m is a
// full Verify.
func VerifyFrom(path string, pub ed25519.PublicKey, m Mark) (*Report, error) {
	return verify(path, pub, m)
}

func verify(path string, pub ed25519.PublicKey, m Mark) (*Report, error) {
	if len(pub) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("%w: public key of %d bytes", ErrKey, len(pub))
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("audit verify: %w", err)
	}
	defer f.Close()

	rep := &Report{}
	add := func(rec int, seq uint64, kind ProblemKind, format string, a ...any) {
		rep.Problems = append(rep.Problems, Problem{Record: rec, Seq: seq, Kind: kind, Detail: fmt.Sprintf(format, a...)})
	}
	var (
		high      uint64 // the highest seq so far, and its line
		highLine  int
		prevHash  = GenesisHash(pub)
		prevLine  int
		sigOK     int
		sigFailed []int  // indexes into rep.Problems
		cpHash    string // the log's hash at the checkpoint's seq
	)
	cpSt, cpErr := readCheckpoint(CheckpointPath(path), pub)
	cp := cpSt.cp
	var offset int64 // where the next line starts
	first := 1
	if m.End > 0 {
		if err := checkMark(f, m); err != nil {
			// The log changed before the mark: verify all of it, which
			// names what changed.
			f.Close()
			full, ferr := verify(path, pub, Mark{})
			if full != nil {
				full.Notes = append(full.Notes, fmt.Sprintf("the record verified earlier at seq %d (record %d) is no longer where it was (%v): verified in full", m.Seq, m.Records, err))
				if full.OK() {
					full.Problems = append(full.Problems, Problem{Record: m.Records, Seq: m.Seq, Kind: ProblemChain,
						Detail: fmt.Sprintf("the record verified earlier here is no longer there (%v): the log was rewritten", err)})
					ferr = fmt.Errorf("%w: %s: %s", ErrTampered, path, full.Problems[0])
				}
			}
			return full, ferr
		}
		offset, first = m.End, m.Records+1
		high, highLine, prevHash, prevLine, sigOK = m.Seq, m.Records, m.Hash, m.Records, 1
		rep.Records, rep.Head, rep.HeadHash, rep.Mark = m.Records, m.Seq, m.Hash, m
		if cpErr == nil && cp.Seq == m.Seq {
			cpHash = m.Hash
		}
		if cpErr == nil && cp.Seq < m.Seq {
			// Verified before; this pass cannot read the record again.
			cpHash = cp.Hash
			rep.Notes = append(rep.Notes, fmt.Sprintf("the checkpoint (seq %d) is before the verified mark (seq %d): its hash is checked by a full verify only", cp.Seq, m.Seq))
		}
	}
	// The hashes of the last records, to say where a broken link points.
	const window = 256
	recent := make(map[string]int, window)
	var order []string
	remember := func(h string, line int) {
		recent[h] = line
		order = append(order, h)
		if len(order) > window {
			delete(recent, order[0])
			order = order[1:]
		}
	}
	rd := bufio.NewReaderSize(f, 64<<10)
	for n := first; ; n++ {
		line, err := readLine(rd)
		if errors.Is(err, io.EOF) && len(line) == 0 {
			break
		}
		start := offset
		offset += int64(len(line)) + 1
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("audit verify: read %s: %w", path, err)
		}
		rep.Records = n
		if errors.Is(err, io.EOF) { // bytes after the last newline
			add(n, 0, ProblemTorn, "incomplete last line of %d bytes (torn write; opening the log moves it aside)", len(line))
			break
		}
		r, canon, hash, perr := parseLine(line)
		if perr != nil {
			add(n, r.Seq, ProblemMalformed, "%v", perr)
			// Let it hold the seq it claims, or the next one when it cannot
			// be read, so the following record is judged on its own.
			prevLine, prevHash = n, ""
			if r.Seq == 0 {
				r.Seq = high + 1
			}
			if r.Seq > high {
				high, highLine = r.Seq, n
			}
			continue
		}
		if err := checkSig(pub, recordDomain, canon, r.Sig); err != nil {
			sigFailed = append(sigFailed, len(rep.Problems))
			add(n, r.Seq, ProblemSignature, "%v: record edited or forged", err)
		} else {
			sigOK++
		}
		switch want := high + 1; {
		case r.Seq == want:
		case r.Seq > want && prevLine == 0:
			add(n, r.Seq, ProblemSeq, "seq gap: the log starts at seq %d: %s missing", r.Seq, seqRange(want, r.Seq-1))
		case r.Seq > want:
			add(n, r.Seq, ProblemSeq, "seq gap: expected seq %d after record %d: %s missing", want, prevLine, seqRange(want, r.Seq-1))
		default:
			add(n, r.Seq, ProblemSeq, "seq %d out of order after seq %d of record %d: records reordered or inserted", r.Seq, high, highLine)
		}
		if r.PrevHash != prevHash && prevHash != "" {
			where := fmt.Sprintf("record %d", prevLine)
			if prevLine == 0 {
				where = "the genesis hash of this key"
			}
			if m, ok := recent[r.PrevHash]; ok {
				add(n, r.Seq, ProblemChain, "hash chain broken: prev_hash does not match %s (it is the hash of record %d)", where, m)
			} else {
				add(n, r.Seq, ProblemChain, "hash chain broken: prev_hash does not match %s", where)
			}
		}
		if r.Event == string(EventRecovered) {
			rep.Notes = append(rep.Notes, fmt.Sprintf("record %d (seq %d): %s", n, r.Seq, r.Reason))
		}
		if cpErr == nil && r.Seq == cp.Seq {
			cpHash = hash
		}
		prevHash, prevLine = hash, n
		if r.Seq > high {
			high, highLine = r.Seq, n
		}
		remember(hash, n)
		rep.Head, rep.HeadHash = r.Seq, hash
		rep.Mark = Mark{Start: start, End: offset, Records: n, Seq: r.Seq, Hash: hash}
	}

	// Not a single good signature: the key is wrong, not every record.
	if sigOK == 0 && len(sigFailed) > 0 {
		kept := rep.Problems[:0]
		first := rep.Problems[sigFailed[0]]
		for i, p := range rep.Problems {
			if p.Kind != ProblemSignature || !contains(sigFailed, i) {
				kept = append(kept, p)
			}
		}
		rep.Problems = append([]Problem{{Record: first.Record, Seq: first.Seq, Kind: ProblemWrongKey,
			Detail: fmt.Sprintf("none of the %d records verifies with this public key: wrong key, or every record forged", len(sigFailed))}}, kept...)
	}

	switch {
	case errors.Is(cpErr, fs.ErrNotExist):
		add(0, 0, ProblemCheckpoint, "checkpoint %s is missing: a cut tail cannot be ruled out", CheckpointPath(path))
	case cpErr != nil:
		add(0, 0, ProblemCheckpoint, "%v", cpErr)
	case cp.Seq > rep.Head:
		add(0, 0, ProblemTruncated, "log ends at seq %d (record %d) but the checkpoint vouches for seq %d: %s cut from the tail",
			rep.Head, rep.Records, cp.Seq, seqRange(rep.Head+1, cp.Seq))
	case cp.Seq == 0 && cp.Hash != GenesisHash(pub), cp.Seq > 0 && cpHash != cp.Hash:
		add(0, 0, ProblemCheckpoint, "the checkpoint vouches for a different record at seq %d than the log holds", cp.Seq)
	case cpSt.torn && cp.Seq == rep.Head:
		add(0, 0, ProblemTruncated, "the newer checkpoint slot is unreadable and the log ends at seq %d, where the older slot vouches: a crash cannot leave this (that slot is written only after the log holds a later record); records may have been cut from the tail", rep.Head)
	case cp.Seq < rep.Head:
		if cpSt.torn {
			rep.Notes = append(rep.Notes, fmt.Sprintf("the newer checkpoint slot is torn (a crash while writing it, or an edit); the older one vouches for seq %d", cp.Seq))
		}
		rep.Notes = append(rep.Notes, fmt.Sprintf("checkpoint at seq %d is behind the log head %d (the checkpoint trails the log: a crash before it caught up, or a log still open; the next open updates it)", cp.Seq, rep.Head))
	}

	if cpErr == nil && cpSt.slot < 0 {
		rep.Notes = append(rep.Notes, "the checkpoint is in the single-record format of an earlier version (the next open rewrites it as two slots)")
	}
	if len(rep.Problems) > 0 {
		more := ""
		if n := len(rep.Problems); n > 1 {
			more = fmt.Sprintf(" (and %d more)", n-1)
		}
		return rep, fmt.Errorf("%w: %s: %s%s", ErrTampered, path, rep.Problems[0], more)
	}
	return rep, nil
}

// checkMark reads the record at m again and checks it is the one verified,
// then leaves f at m.End.
func checkMark(f *os.File, m Mark) error {
	if m.Start < 0 || m.End <= m.Start || m.End-m.Start > maxLine+1 {
		return fmt.Errorf("mark [%d, %d) is not a record's place", m.Start, m.End)
	}
	buf := make([]byte, m.End-m.Start)
	if _, err := f.ReadAt(buf, m.Start); err != nil {
		return fmt.Errorf("read the record at %d: %w", m.Start, err)
	}
	if buf[len(buf)-1] != '\n' {
		return fmt.Errorf("no record ends at %d", m.End)
	}
	r, _, hash, err := parseLine(buf[:len(buf)-1])
	if err != nil {
		return err
	}
	if r.Seq != m.Seq || hash != m.Hash {
		return fmt.Errorf("seq %d hash %.12s, verified as seq %d hash %.12s", r.Seq, hash, m.Seq, m.Hash)
	}
	_, err = f.Seek(m.End, io.SeekStart)
	return err
}

func seqRange(lo, hi uint64) string {
	if lo == hi {
		return fmt.Sprintf("seq %d", lo)
	}
	return fmt.Sprintf("seq %d-%d", lo, hi)
}

func contains(xs []int, x int) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// readLine returns the next line without its newline; io.EOF with a non-empty
// line means the file ended without one.
func readLine(rd *bufio.Reader) ([]byte, error) {
	var buf []byte
	for {
		part, err := rd.ReadSlice('\n')
		buf = append(buf, part...)
		if len(buf) > maxLine+1 {
			return nil, fmt.Errorf("line longer than %d bytes", maxLine)
		}
		switch {
		case err == nil:
			return buf[:len(buf)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return buf, err
		}
	}
}
