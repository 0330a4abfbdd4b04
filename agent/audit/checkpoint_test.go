package audit

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// reCRC recomputes the CRC of both slots of a checkpoint file, as someone
// editing it would.
func reCRC(data []byte) []byte {
	out := append([]byte(nil), data...)
	for i := 0; i+slotSize <= len(out); i += slotSize {
		s := out[i : i+slotSize]
		copy(s, fmt.Sprintf("%08x", crc32.Checksum(s[9:], castagnoli)))
	}
	return out
}

// appendN makes a log in a new directory with n single appends.
func appendN(t *testing.T, n int) (dir, logPath, cpPath string, pub ed25519.PublicKey) {
	t.Helper()
	dir = t.TempDir()
	l := openLog(t, dir)
	for i := 0; i < n; i++ {
		mustAppend(t, l, Event{Type: EventRequest})
		// The checkpoint trails the append: wait for it, so each append
		// has its own (the writer would otherwise coalesce them).
		if err := l.Checkpointed(); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	logPath = filepath.Join(dir, LogFile)
	return dir, logPath, CheckpointPath(logPath), l.PublicKey()
}

// slotSeqs reads both slots' seqs (-1: not valid).
func slotSeqs(t *testing.T, cpPath string, pub ed25519.PublicKey) [2]int64 {
	t.Helper()
	data, err := os.ReadFile(cpPath)
	if err != nil || len(data) != cpSize {
		t.Fatalf("checkpoint file: %d bytes, %v", len(data), err)
	}
	var seqs [2]int64
	for i := range seqs {
		seqs[i] = -1
		one := make([]byte, cpSize)
		copy(one, data[i*slotSize:(i+1)*slotSize])
		if st, err := readCheckpoint(writeTemp(t, one), pub); err == nil {
			seqs[i] = int64(st.cp.Seq)
		}
	}
	return seqs
}

func writeTemp(t *testing.T, data []byte) string {
	p := filepath.Join(t.TempDir(), "cp")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// tearNewest damages the slot holding the newest checkpoint as a crash
// while writing it could leave it: tear(newest, older) changes the newest
// slot's bytes in place.
func tearNewest(t *testing.T, cpPath string, pub ed25519.PublicKey, tear func(newest, older []byte)) {
	t.Helper()
	st, err := readCheckpoint(cpPath, pub)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(cpPath)
	o := 1 - st.slot
	tear(data[st.slot*slotSize:(st.slot+1)*slotSize], data[o*slotSize:(o+1)*slotSize])
	os.WriteFile(cpPath, data, 0o600)
}

// zeroTail: the write reached the disk only up to byte 40.
func zeroTail(newest, _ []byte) { copy(newest[40:], make([]byte, slotSize-40)) }

// TestCheckpointSlots: appends alternate between the two slots; both hold
// valid checkpoints, the newest vouches for the head, and the reader takes
// the highest seq wherever it is.
func TestCheckpointSlots(t *testing.T) {
	_, logPath, cpPath, pub := appendN(t, 5)
	seqs := slotSeqs(t, cpPath, pub)
	if !(seqs == [2]int64{4, 5} || seqs == [2]int64{5, 4}) {
		t.Fatalf("slot seqs %v, want 4 and 5", seqs)
	}
	data, _ := os.ReadFile(cpPath)
	swapped := append(append([]byte(nil), data[slotSize:]...), data[:slotSize]...)
	for _, d := range [][]byte{data, swapped} {
		os.WriteFile(cpPath, d, 0o600)
		st, err := readCheckpoint(cpPath, pub)
		if err != nil || st.cp.Seq != 5 || st.otherSeq != 4 || st.torn {
			t.Fatalf("read %+v, %v: want seq 5 (other 4)", st, err)
		}
		rep, err := Verify(logPath, pub)
		if err != nil || len(rep.Notes) != 0 {
			t.Fatalf("verify: %v, notes %v", err, rep.Notes)
		}
	}
}

// TestTornNewerSlot: a crash while writing a slot leaves the older slot,
// which covers every acknowledged record; Verify accepts it (with a note
// when the slot is recognisably torn) and Open catches the checkpoint up.
func TestTornNewerSlot(t *testing.T) {
	cases := []struct {
		name string
		tear func(newest, older []byte)
		note string
	}{
		{"zeros after byte 40", zeroTail, "slot is torn"},
		{"nothing written", func(n, _ []byte) { copy(n, make([]byte, slotSize)) }, "behind"},
		{"new CRC, older bytes after it", func(n, o []byte) { copy(n[20:], o[20:]) }, "slot is torn"},
		{"older CRC, new bytes after it", func(n, o []byte) { copy(n[:8], o[:8]) }, "slot is torn"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir, logPath, cpPath, pub := appendN(t, 5)
			tearNewest(t, cpPath, pub, tc.tear)
			rep, err := Verify(logPath, pub)
			if err != nil || rep.Head != 5 || !strings.Contains(strings.Join(rep.Notes, "\n"), tc.note) {
				t.Fatalf("verify: %v, %+v: want OK with a note saying %q", err, rep, tc.note)
			}
			l := openLog(t, dir)
			if head, _ := l.Head(); head != 5 {
				t.Fatalf("head %d after open, want 5", head)
			}
			mustAppend(t, l, Event{Type: EventAgentStart})
			l.Close()
			if rep := mustVerify(t, dir); rep.Head != 6 || len(rep.Notes) != 0 {
				t.Errorf("after open and append: %+v, want head 6 and no notes", rep)
			}
			if seqs := slotSeqs(t, cpPath, pub); !(seqs == [2]int64{5, 6} || seqs == [2]int64{6, 5}) {
				t.Errorf("slot seqs %v, want 5 and 6", seqs)
			}
		})
	}
}

// TestCutTail: records cut back to the older slot's seq are found, whether
// the newer slot is intact or was made to look torn.
func TestCutTail(t *testing.T) {
	for _, tear := range []bool{false, true} {
		t.Run(fmt.Sprintf("torn=%v", tear), func(t *testing.T) {
			dir, logPath, cpPath, pub := appendN(t, 5)
			if tear {
				tearNewest(t, cpPath, pub, zeroTail)
			}
			lines := readLines(t, logPath)
			os.WriteFile(logPath, bytes.Join(lines[:4], nil), 0o600)
			rep, err := Verify(logPath, pub)
			if !errors.Is(err, ErrTampered) || rep.Problems[0].Kind != ProblemTruncated {
				t.Fatalf("verify: %v; want the cut tail reported as truncated", err)
			}
			t.Log(rep.Problems[0])
			if l, err := Open(Config{Dir: dir}); !errors.Is(err, ErrCorrupt) {
				if err == nil {
					l.Close()
				}
				t.Fatalf("open: %v, want ErrCorrupt", err)
			}
		})
	}
}

// TestBadCheckpointFile: what no crash leaves is refused.
func TestBadCheckpointFile(t *testing.T) {
	cases := []struct {
		name   string
		damage func(data []byte) []byte
		want   string
	}{
		{"both slots torn", func(d []byte) []byte { return make([]byte, len(d)) }, "neither slot"},
		{"short", func(d []byte) []byte { return d[:slotSize] }, "not the"},
		{"slot edited, CRC kept", func(d []byte) []byte {
			return reCRC(bytes.Replace(d, []byte(`"seq":5`), []byte(`"seq":9`), 1))
		}, "signature"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir, logPath, cpPath, pub := appendN(t, 5)
			data, _ := os.ReadFile(cpPath)
			os.WriteFile(cpPath, tc.damage(data), 0o600)
			rep, err := Verify(logPath, pub)
			if !errors.Is(err, ErrTampered) || rep.Problems[0].Kind != ProblemCheckpoint || !strings.Contains(rep.Problems[0].Detail, tc.want) {
				t.Fatalf("verify: %v; want a checkpoint problem saying %q", err, tc.want)
			}
			if l, err := Open(Config{Dir: dir}); !errors.Is(err, ErrCorrupt) {
				if err == nil {
					l.Close()
				}
				t.Fatalf("open: %v, want ErrCorrupt", err)
			}
		})
	}
}

// oldCheckpoint writes the single-record checkpoint of earlier versions.
func oldCheckpoint(t *testing.T, dir string, seq uint64, hash string) {
	t.Helper()
	priv, err := loadOrCreateKey(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	data, err := signCheckpoint(priv, seq, hash, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(CheckpointPath(filepath.Join(dir, LogFile)), append(data, '\n'), 0o600)
}

// TestOldFormatMigrates: a state directory of an earlier version verifies
// and opens; the first open rewrites its checkpoint as two slots.
func TestOldFormatMigrates(t *testing.T) {
	for _, behind := range []bool{false, true} {
		t.Run(fmt.Sprintf("behind=%v", behind), func(t *testing.T) {
			dir, logPath, cpPath, pub := appendN(t, 5)
			seq, hash := uint64(5), ""
			if behind { // a crash of the old version between fsync and rename
				seq = 4
			}
			for _, line := range readLines(t, logPath) {
				r, _, h, err := parseLine(bytes.TrimSuffix(line, []byte("\n")))
				if err != nil {
					t.Fatal(err)
				}
				if r.Seq == seq {
					hash = h
				}
			}
			oldCheckpoint(t, dir, seq, hash)
			rep, err := Verify(logPath, pub)
			if err != nil || !strings.Contains(strings.Join(rep.Notes, "\n"), "earlier version") {
				t.Fatalf("verify of the old format: %v, notes %v", err, rep.Notes)
			}
			l := openLog(t, dir)
			l.Close()
			if st, err := readCheckpoint(cpPath, pub); err != nil || st.slot < 0 || st.cp.Seq != 5 {
				t.Fatalf("after open: %+v, %v: want the two-slot format at seq 5", st, err)
			}
			l = openLog(t, dir)
			mustAppend(t, l, Event{Type: EventAgentStart})
			l.Close()
			if rep := mustVerify(t, dir); rep.Head != 6 || len(rep.Notes) != 0 {
				t.Errorf("after migration: %+v", rep)
			}
		})
	}
	// An old-format checkpoint still finds a cut tail.
	dir, logPath, _, pub := appendN(t, 5)
	lines := readLines(t, logPath)
	_, _, h, _ := parseLine(bytes.TrimSuffix(lines[4], []byte("\n")))
	oldCheckpoint(t, dir, 5, h)
	os.WriteFile(logPath, bytes.Join(lines[:3], nil), 0o600)
	if rep, err := Verify(logPath, pub); !errors.Is(err, ErrTampered) || rep.Problems[0].Kind != ProblemTruncated {
		t.Fatalf("verify of a cut log with an old checkpoint: %v", err)
	}
	if l, err := Open(Config{Dir: dir}); !errors.Is(err, ErrCorrupt) {
		if err == nil {
			l.Close()
		}
		t.Fatalf("open: %v, want ErrCorrupt", err)
	}
}
