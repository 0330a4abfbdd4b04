package audit

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"os"
	"strconv"
	"time"

	"github.com/shinken-agent/shinken/agent/internal/atomicfile"
)

// checkpoint is the signed head of the log: the seq and hash of its last
// durable record (seq 0 and the genesis hash for an empty log).
type checkpoint struct {
	Seq  uint64 `json:"seq"`
	Hash string `json:"hash"`
	Time string `json:"time"`
	Sig  string `json:"sig,omitempty"`
}

func (c checkpoint) canonical() ([]byte, error) {
	c.Sig = ""
	return json.Marshal(c)
}

// The checkpoint file holds two slots of slotSize bytes, each in its own
// file-system block, written in place alternately (pwrite + fdatasync), so
// a durable append costs no temp file, rename or directory fsync. A slot is
//
//	<crc32c of the rest, 8 hex> ' ' <signed checkpoint JSON> <spaces> '\n'
//
// A slot whose CRC does not match is torn (a crash while writing it) or
// was never written (all zeros); one whose CRC matches but whose JSON or
// signature does not verify was edited. The reader takes the valid slot
// with the highest seq. Only the slot being written can tear; the other
// slot still vouches for every record up to its seq (the records after it
// are the trailing checkpoint's window: see the package doc).
const (
	slotSize = 4096
	cpSize   = 2 * slotSize
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// cpState is what readCheckpoint found.
type cpState struct {
	cp       checkpoint // the newest valid checkpoint
	slot     int        // the slot holding it; -1: an old single-record file
	torn     bool       // the other slot is torn (neither empty nor valid)
	otherSeq uint64     // the other slot's seq when it is valid too
}

// signCheckpoint returns the checkpoint's JSON, signed.
func signCheckpoint(priv ed25519.PrivateKey, seq uint64, hash string, now time.Time) ([]byte, error) {
	c := checkpoint{Seq: seq, Hash: hash, Time: now.UTC().Format(timeFormat)}
	canon, err := c.canonical()
	if err != nil {
		return nil, err
	}
	c.Sig = base64.StdEncoding.EncodeToString(ed25519.Sign(priv, signMsg(checkpointDomain, canon)))
	return json.Marshal(c)
}

// encodeSlot lays out one slot around a signed checkpoint.
func encodeSlot(data []byte) ([]byte, error) {
	if len(data) > slotSize-10 {
		return nil, fmt.Errorf("checkpoint of %d bytes does not fit a slot", len(data))
	}
	s := bytes.Repeat([]byte{' '}, slotSize)
	copy(s[9:], data)
	s[slotSize-1] = '\n'
	copy(s, fmt.Sprintf("%08x", crc32.Checksum(s[9:], castagnoli)))
	return s, nil
}

// createCheckpoint makes a new checkpoint file whose slot 0 vouches for
// seq and hash (slot 1 empty), atomically (atomicfile.Write: temp file,
// fsync, rename, fsync of the directory). It is used for a new log and to
// migrate the single-record file of earlier versions.
func createCheckpoint(path string, priv ed25519.PrivateKey, seq uint64, hash string, now time.Time) error {
	data, err := signCheckpoint(priv, seq, hash, now)
	if err != nil {
		return err
	}
	s, err := encodeSlot(data)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(path, append(s, make([]byte, slotSize)...), 0o600); err != nil {
		return fmt.Errorf("write checkpoint: %w", err)
	}
	return nil
}

// writeSlot writes a checkpoint for seq and hash into slot of the open
// checkpoint file f and makes it durable (fdatasync: the file's size never
// changes, so no metadata is needed to read the slot back).
func writeSlot(f *os.File, slot int, priv ed25519.PrivateKey, seq uint64, hash string, now time.Time) error {
	data, err := signCheckpoint(priv, seq, hash, now)
	if err != nil {
		return err
	}
	s, err := encodeSlot(data)
	if err != nil {
		return err
	}
	if _, err := f.WriteAt(s, int64(slot)*slotSize); err != nil {
		return fmt.Errorf("write checkpoint: %w", err)
	}
	if err := fdatasync(f); err != nil {
		return fmt.Errorf("sync checkpoint: %w", err)
	}
	return nil
}

// readCheckpoint reads and verifies the checkpoint at path, in either
// format. The error wraps fs.ErrNotExist when there is none.
func readCheckpoint(path string, pub ed25519.PublicKey) (cpState, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return cpState{}, err
	}
	if len(data) > 0 && data[0] == '{' {
		// The single record, replaced by rename, of earlier versions.
		if data[len(data)-1] != '\n' {
			return cpState{}, fmt.Errorf("checkpoint %s: incomplete", path)
		}
		c, err := parseCheckpoint(data[:len(data)-1], pub)
		if err != nil {
			return cpState{}, fmt.Errorf("checkpoint %s: %w", path, err)
		}
		return cpState{cp: c, slot: -1}, nil
	}
	if len(data) != cpSize {
		return cpState{}, fmt.Errorf("checkpoint %s: %d bytes, not the %d of two slots", path, len(data), cpSize)
	}
	var (
		cps  [2]checkpoint
		ok   [2]bool
		torn [2]bool
	)
	for i := range cps {
		s := data[i*slotSize : (i+1)*slotSize]
		want, perr := strconv.ParseUint(string(s[:8]), 16, 32)
		if perr != nil || s[8] != ' ' || uint32(want) != crc32.Checksum(s[9:], castagnoli) {
			torn[i] = !allZero(s)
			continue
		}
		c, err := parseCheckpoint(bytes.TrimRight(s[9:], " \n"), pub)
		if err != nil {
			return cpState{}, fmt.Errorf("checkpoint %s: slot %d: %w", path, i, err)
		}
		cps[i], ok[i] = c, true
	}
	switch {
	case !ok[0] && !ok[1]:
		return cpState{}, fmt.Errorf("checkpoint %s: neither slot holds a complete checkpoint", path)
	case ok[0] && ok[1] && cps[0].Seq == cps[1].Seq:
		if cps[0].Hash != cps[1].Hash {
			return cpState{}, fmt.Errorf("checkpoint %s: both slots vouch for seq %d with different hashes", path, cps[0].Seq)
		}
		return cpState{cp: cps[0], slot: 0, otherSeq: cps[1].Seq}, nil
	}
	n := 0
	if !ok[0] || (ok[1] && cps[1].Seq > cps[0].Seq) {
		n = 1
	}
	st := cpState{cp: cps[n], slot: n, torn: torn[1-n]}
	if ok[1-n] {
		st.otherSeq = cps[1-n].Seq
	}
	return st, nil
}

// parseCheckpoint checks one checkpoint's canonical form and signature.
func parseCheckpoint(data []byte, pub ed25519.PublicKey) (checkpoint, error) {
	var c checkpoint
	if err := json.Unmarshal(data, &c); err != nil {
		return c, err
	}
	if again, err := json.Marshal(c); err != nil || string(again) != string(data) {
		return c, errNotCanonical
	}
	canon, err := c.canonical()
	if err != nil {
		return c, err
	}
	if err := checkSig(pub, checkpointDomain, canon, c.Sig); err != nil {
		return c, err
	}
	return c, nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// checkpoint hands the writer a new durable head (seq and its hash); it
// starts the writer when none runs. The writer coalesces: whatever became
// durable while it wrote one checkpoint is covered by its next one.
func (l *Log) checkpoint(seq uint64, hash string) {
	l.cpMu.Lock()
	defer l.cpMu.Unlock()
	if seq <= l.cpWant || l.cpClosed {
		return
	}
	l.cpWant, l.cpHash = seq, hash
	if !l.cpBusy && l.cpErr == nil {
		l.cpBusy = true
		go l.cpLoop()
	}
}

// cpLoop writes checkpoints until the newest one covers the newest durable
// head, each into the slot that does not hold the newest checkpoint, so a
// slot is only ever written once the log is durable past the other slot's
// seq. A failed write fails the Log (a torn slot may be on the disk: no
// more are written) and stops the writer.
func (l *Log) cpLoop() {
	l.cpMu.Lock()
	for l.cpErr == nil && l.cpWant > l.cpDone {
		seq, hash, slot := l.cpWant, l.cpHash, l.cpNext
		l.cpMu.Unlock()
		if l.cfg.cpHook != nil {
			l.cfg.cpHook(seq)
		}
		err := writeSlot(l.cpFile, slot, l.priv, seq, hash, l.cfg.now())
		if err != nil {
			l.fail(err)
			l.cfg.Logger.Error("audit: checkpoint failed: the log refuses further records until it is reopened",
				"checkpoint", l.cpPath, "seq", seq, "err", err)
		}
		l.cpMu.Lock()
		if err != nil {
			l.cpErr = err
		} else {
			l.cpDone, l.cpNext = seq, 1-slot
		}
		l.cpCond.Broadcast()
	}
	l.cpBusy = false
	l.cpCond.Broadcast()
	l.cpMu.Unlock()
}

// Checkpointed waits until the checkpoint vouches for every record that
// was durable when it was called (every record whose Append, AppendBatch,
// Commit or CommitBeside had returned). It returns nil, or ErrFailed with
// the error of a checkpoint write that failed (the Log has failed then).
func (l *Log) Checkpointed() error {
	l.cpMu.Lock()
	defer l.cpMu.Unlock()
	want := l.cpWant
	for l.cpErr == nil && l.cpDone < want {
		l.cpCond.Wait()
	}
	if l.cpErr != nil {
		return fmt.Errorf("%w: %w", ErrFailed, l.cpErr)
	}
	return nil
}

// stopCheckpoints waits for the writer to finish (it covers every durable
// record then, unless a write failed) and starts no other: Close.
func (l *Log) stopCheckpoints() error {
	l.cpMu.Lock()
	defer l.cpMu.Unlock()
	for l.cpBusy {
		l.cpCond.Wait()
	}
	l.cpClosed = true
	if l.cpErr != nil {
		return fmt.Errorf("%w: %w", ErrFailed, l.cpErr)
	}
	return nil
}
