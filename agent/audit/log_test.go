package audit

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

const childEnv = "SHINKEN_AUDIT_CHILD_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(childEnv); dir != "" {
		childAppend(dir)
	}
	os.Exit(m.Run())
}

// childAppend appends until killed, printing each acknowledged seq.
func childAppend(dir string) {
	l, err := Open(Config{Dir: dir})
	if err != nil {
		fmt.Println("err", err)
		os.Exit(1)
	}
	out := bufio.NewWriter(os.Stdout)
	for i := 0; ; i++ {
		r, err := l.Append(Event{Type: EventKernelDenial, Session: "s1", Reason: "no_rule", Resource: "10.0.0.1:443", Count: uint64(i)})
		if err != nil {
			fmt.Println("err", err)
			os.Exit(1)
		}
		fmt.Fprintln(out, r.Seq)
		out.Flush()
	}
}

func openLog(t *testing.T, dir string) *Log {
	t.Helper()
	l, err := Open(Config{Dir: dir})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func mustAppend(t *testing.T, l *Log, ev Event) Record {
	t.Helper()
	r, err := l.Append(ev)
	if err != nil {
		t.Fatalf("append %s: %v", ev.Type, err)
	}
	return r
}

// mustCheckpoint waits for l's checkpoint to cover every acknowledged
// record (the checkpoint trails the log).
func mustCheckpoint(t *testing.T, l *Log) {
	t.Helper()
	if err := l.Checkpointed(); err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
}

func mustVerify(t *testing.T, dir string) *Report {
	t.Helper()
	pub, err := LoadPublicKey(filepath.Join(dir, PubFile))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Verify(filepath.Join(dir, LogFile), pub)
	if err != nil {
		t.Fatalf("verify: %v", err)
	}
	return rep
}

func readLines(t *testing.T, path string) [][]byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.SplitAfter(data, []byte("\n"))
	if len(lines) > 0 && len(lines[len(lines)-1]) == 0 {
		lines = lines[:len(lines)-1]
	}
	return lines
}

// sampleEvents is one of each lifecycle step.
func sampleEvents() []Event {
	exp := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	base := Event{Human: "uid:1000", AgentID: "agent-7", Model: "claude-opus-4-1@2025-08-05", Session: "s1"}
	with := func(f func(*Event)) Event { e := base; f(&e); return e }
	return []Event{
		with(func(e *Event) {
			e.Type, e.Tool, e.CallID, e.Params = EventRequest, "net.egress", "req-1", []byte(`{"domains":["api.github.com"]}`)
			e.Provenance = "external"
		}),
		with(func(e *Event) { e.Type, e.RuleID, e.Tier, e.Outcome = EventDecision, "ask-new-domain", "ask", "ask" }),
		with(func(e *Event) { e.Type, e.Card, e.Outcome = EventApproval, "card-1", "approved_session" }),
		with(func(e *Event) {
			e.Type, e.Scope, e.Lifetime, e.Expires, e.Handle = EventGrant, "net.egress api.github.com:443/tcp", "session", exp, "12.1"
		}),
		with(func(e *Event) {
			e.Type, e.Handle, e.Parent, e.Scope = EventAttenuate, "13.1", "12.1", "net.egress api.github.com:443/tcp"
		}),
		with(func(e *Event) {
			e.Type, e.Resource, e.Reason, e.Count = EventKernelDenial, "10.0.0.1:443", "no_rule", 3
		}),
		with(func(e *Event) { e.Type, e.Card, e.Outcome = EventTimeout, "card-2", "timed_out" }),
		with(func(e *Event) { e.Type, e.Handle, e.Outcome = EventRevoke, "12.1", "revoked" }),
	}
}

func TestAppendAndVerify(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, dir)
	evs := sampleEvents()
	var recs []Record
	for _, ev := range evs {
		recs = append(recs, mustAppend(t, l, ev))
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	rep := mustVerify(t, dir)
	if rep.Records != len(evs) || rep.Head != uint64(len(evs)) || len(rep.Notes) != 0 {
		t.Fatalf("report %+v, want %d records, head %d, no notes", rep, len(evs), len(evs))
	}
	lines := readLines(t, filepath.Join(dir, LogFile))
	for i, line := range lines {
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatalf("line %d: %v", i+1, err)
		}
		if m["seq"] != float64(i+1) || m["event.name"] != string(evs[i].Type) || m["sig"] == nil || m["prev_hash"] == nil {
			t.Errorf("line %d: %s", i+1, line)
		}
		if m["gen_ai.agent.id"] != "agent-7" || m["gen_ai.request.model"] != "claude-opus-4-1@2025-08-05" || m["user.id"] != "uid:1000" || m["session.id"] != "s1" {
			t.Errorf("line %d lacks the triple identity: %s", i+1, line)
		}
	}
	// The parameters are hashed, never stored.
	if bytes.Contains(bytes.Join(lines, nil), []byte("api.github.com\"]")) {
		t.Error("raw parameters reached the log")
	}
	if sum := sha256.Sum256(evs[0].Params); recs[0].ParamsSHA256 != hex.EncodeToString(sum[:]) {
		t.Errorf("params hash %q, want SHA-256 of the raw parameters", recs[0].ParamsSHA256)
	}
	// Each record's prev_hash is the previous record's hash.
	for i := 1; i < len(recs); i++ {
		h, _ := recs[i-1].Hash()
		if recs[i].PrevHash != h {
			t.Errorf("record %d prev_hash %s, want %s", i+1, recs[i].PrevHash, h)
		}
	}
	if recs[0].PrevHash != GenesisHash(l.PublicKey()) {
		t.Errorf("first prev_hash %s is not the genesis hash", recs[0].PrevHash)
	}
}

// TestSecretInScopeNeverReachesDisk: a secret a caller wrongly puts into a
// free-text field is redacted before anything is written or hashed.
func TestSecretInScopeNeverReachesDisk(t *testing.T) {
	secrets := []string{"sk-proj-Zx9Yw8Vu7Ts6Rq5Po4Nm", "AKIAIOSFODNN7EXAMPLE", "hunter2hunter2", "eyJhbGciOiJIUzI1NiJ9.payload.sig"}
	dir := t.TempDir()
	l := openLog(t, dir)
	r := mustAppend(t, l, Event{
		Type:     EventGrant,
		Scope:    "net.egress api.openai.com:443 with header Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig key sk-proj-Zx9Yw8Vu7Ts6Rq5Po4Nm",
		Reason:   "aws AKIAIOSFODNN7EXAMPLE password=hunter2hunter2",
		Resource: "api.openai.com:443",
		Params:   []byte(`{"api_key":"sk-proj-Zx9Yw8Vu7Ts6Rq5Po4Nm"}`),
	})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(r.Redacted) != "[shinken.reason shinken.scope]" {
		t.Errorf("redacted fields %v, want reason and scope", r.Redacted)
	}
	if !strings.Contains(r.Scope, "api.openai.com:443") || !strings.Contains(r.Scope, Redacted) {
		t.Errorf("scope %q: want the domain kept and the secret redacted", r.Scope)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range secrets {
			if bytes.Contains(data, []byte(s)) {
				t.Errorf("%s contains the secret %q", e.Name(), s)
			}
		}
	}
	mustVerify(t, dir)
}

func TestKeyFiles(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, dir)
	mustAppend(t, l, Event{Type: EventAgentStart})
	pub := l.PublicKey()
	l.Close()
	for name, want := range map[string]os.FileMode{KeyFile: 0o600, PubFile: 0o644, LogFile: 0o600} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != want {
			t.Errorf("%s has mode %v, want %v", name, st.Mode().Perm(), want)
		}
	}
	got, err := LoadPublicKey(filepath.Join(dir, PubFile))
	if err != nil || !got.Equal(pub) {
		t.Fatalf("audit.pub %x (%v), want %x", got, err, pub)
	}
	// Reopening keeps the key and continues the chain.
	l2 := openLog(t, dir)
	if !l2.PublicKey().Equal(pub) {
		t.Fatal("a reopened log made a new key")
	}
	if r := mustAppend(t, l2, Event{Type: EventAgentStop}); r.Seq != 2 {
		t.Errorf("seq after reopen %d, want 2", r.Seq)
	}
	l2.Close()
	mustVerify(t, dir)
}

func TestInvalidEvent(t *testing.T) {
	l := openLog(t, t.TempDir())
	if _, err := l.Append(Event{Type: "made_up"}); !errors.Is(err, ErrInvalidEvent) {
		t.Errorf("unknown type: %v, want ErrInvalidEvent", err)
	}
	r := mustAppend(t, l, Event{Type: EventRequest, Reason: strings.Repeat("é", MaxField)})
	if len(r.Reason) > MaxField || !strings.HasSuffix(r.Reason, "[truncated]") {
		t.Errorf("a long field is %d bytes ending %q", len(r.Reason), r.Reason[len(r.Reason)-20:])
	}
	l.Close()
	if _, err := l.Append(Event{Type: EventRequest}); !errors.Is(err, ErrClosed) {
		t.Errorf("append after close: %v, want ErrClosed", err)
	}
}

// TestConcurrentAppend: appends from many goroutines make one unbroken chain.
func TestConcurrentAppend(t *testing.T) {
	const workers, each = 8, 100
	dir := t.TempDir()
	l := openLog(t, dir)
	var wg sync.WaitGroup
	seen := make(chan uint64, workers*each)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				r, err := l.Append(Event{Type: EventKernelDenial, Session: fmt.Sprintf("w%d", w), Count: uint64(i)})
				if err != nil {
					t.Error(err)
					return
				}
				seen <- r.Seq
			}
		}()
	}
	wg.Wait()
	close(seen)
	got := map[uint64]bool{}
	for s := range seen {
		got[s] = true
	}
	if len(got) != workers*each {
		t.Fatalf("%d distinct seqs, want %d", len(got), workers*each)
	}
	l.Close()
	if rep := mustVerify(t, dir); rep.Head != workers*each {
		t.Errorf("head %d, want %d", rep.Head, workers*each)
	}
}

// TestAppendBatch: a batch lands in order on the chain, durable and
// checkpointed when AppendBatch returns (verify sees every record and a
// checkpoint at the head), between single appends.
func TestAppendBatch(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, dir)
	if _, err := l.Append(Event{Type: EventAgentStart}); err != nil {
		t.Fatal(err)
	}
	var evs []Event
	for i := 0; i < 50; i++ {
		evs = append(evs, Event{Type: EventDecision, Session: fmt.Sprintf("s%d", i), Outcome: "denied", Count: uint64(i + 1)})
	}
	if err := l.AppendBatch(evs); err != nil {
		t.Fatal(err)
	}
	if err := l.AppendBatch(nil); err != nil {
		t.Fatal(err)
	}
	if seq, _ := l.Head(); seq != 51 {
		t.Fatalf("head %d after a batch of 50, want 51", seq)
	}
	// durable before Close, checkpointed once the writer is done: verify
	// the files as they are
	mustCheckpoint(t, l)
	if rep := mustVerify(t, dir); rep.Head != 51 || len(rep.Notes) != 0 {
		t.Fatalf("verify before close: head %d, want 51 (%+v)", rep.Head, rep)
	}
	if _, err := l.Append(Event{Type: EventAgentStop}); err != nil {
		t.Fatal(err)
	}
	l.Close()
	if rep := mustVerify(t, dir); rep.Head != 52 {
		t.Errorf("head %d, want 52", rep.Head)
	}
}

// TestTornTail: a crash mid-write leaves half a line; Open reports it,
// keeps the bytes aside, records the repair on the chain and continues.
func TestTornTail(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, dir)
	for _, ev := range sampleEvents()[:5] {
		mustAppend(t, l, ev)
	}
	l.Close()
	logPath := filepath.Join(dir, LogFile)
	torn := []byte(`{"seq":6,"time":"2026-11-30T01:02:03Z","prev_hash":"ab`)
	f, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write(torn)
	f.Close()

	// Verify on the raw file names the torn line.
	pub, _ := LoadPublicKey(filepath.Join(dir, PubFile))
	rep, err := Verify(logPath, pub)
	if !errors.Is(err, ErrTampered) || rep.Problems[0].Kind != ProblemTorn || rep.Problems[0].Record != 6 {
		t.Fatalf("verify of a torn log: %v %+v", err, rep)
	}

	l2 := openLog(t, dir)
	rec := l2.Recovered()
	if rec == nil || rec.AfterSeq != 5 || rec.TornBytes != int64(len(torn)) {
		t.Fatalf("recovery %+v, want the %d torn bytes after seq 5 reported", rec, len(torn))
	}
	kept, err := os.ReadFile(rec.MovedTo)
	if err != nil || !bytes.Equal(kept, torn) {
		t.Fatalf("torn bytes kept at %s: %q (%v)", rec.MovedTo, kept, err)
	}
	if r := mustAppend(t, l2, Event{Type: EventAgentStart}); r.Seq != 7 {
		t.Errorf("next seq %d, want 7 (6 is the recovery record)", r.Seq)
	}
	l2.Close()
	rep = mustVerify(t, dir)
	if rep.Head != 7 || len(rep.Notes) != 1 || !strings.Contains(rep.Notes[0], "torn tail of") {
		t.Errorf("report %+v: want head 7 and the repair noted", rep)
	}
	lines := readLines(t, logPath)
	var r6 Record
	json.Unmarshal(lines[5], &r6)
	if r6.Event != string(EventRecovered) || r6.ParamsSHA256 != rec.TornSHA256 {
		t.Errorf("record 6 %+v: want audit_recovered with the torn bytes' hash", r6)
	}
}

// TestOpenRefuses: what a crash cannot produce, Open does not repair.
func TestOpenRefuses(t *testing.T) {
	cases := []struct {
		name   string
		damage func(t *testing.T, dir string)
		want   error
	}{
		{"tail cut", func(t *testing.T, dir string) {
			p := filepath.Join(dir, LogFile)
			lines := readLines(t, p)
			os.WriteFile(p, bytes.Join(lines[:len(lines)-2], nil), 0o600)
		}, ErrCorrupt},
		{"log emptied", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, LogFile), nil, 0o600)
		}, ErrCorrupt},
		{"checkpoint removed", func(t *testing.T, dir string) {
			os.Remove(CheckpointPath(filepath.Join(dir, LogFile)))
		}, ErrCorrupt},
		{"last record edited", func(t *testing.T, dir string) {
			p := filepath.Join(dir, LogFile)
			data, _ := os.ReadFile(p)
			os.WriteFile(p, bytes.Replace(data, []byte(`"shinken.outcome":"revoked"`), []byte(`"shinken.outcome":"refused"`), 1), 0o600)
		}, ErrCorrupt},
		{"key removed", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, KeyFile))
		}, ErrKey},
		{"key readable by others", func(t *testing.T, dir string) {
			os.Chmod(filepath.Join(dir, KeyFile), 0o644)
		}, ErrKey},
		{"public key replaced", func(t *testing.T, dir string) {
			other := t.TempDir()
			l, _ := Open(Config{Dir: other})
			l.Close()
			data, _ := os.ReadFile(filepath.Join(other, PubFile))
			os.WriteFile(filepath.Join(dir, PubFile), data, 0o644)
		}, ErrKey},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			l := openLog(t, dir)
			for _, ev := range sampleEvents() {
				mustAppend(t, l, ev)
			}
			l.Close()
			tc.damage(t, dir)
			l2, err := Open(Config{Dir: dir})
			if err == nil {
				l2.Close()
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("open: %v, want %v", err, tc.want)
			}
			t.Log(err)
		})
	}
}

// TestCheckpointBehind: a crash between the log's fsync and the checkpoint
// leaves the checkpoint one batch behind; that verifies (with a note) and
// Open catches the checkpoint up.
func TestCheckpointBehind(t *testing.T) {
	dir := t.TempDir()
	cp := CheckpointPath(filepath.Join(dir, LogFile))
	l := openLog(t, dir)
	evs := sampleEvents()
	for _, ev := range evs[:3] {
		mustAppend(t, l, ev)
	}
	mustCheckpoint(t, l)
	old, _ := os.ReadFile(cp)
	for _, ev := range evs[3:] {
		mustAppend(t, l, ev)
	}
	l.Close()
	os.WriteFile(cp, old, 0o600)
	if rep := mustVerify(t, dir); len(rep.Notes) != 1 || !strings.Contains(rep.Notes[0], "behind") {
		t.Errorf("notes %v: want the lagging checkpoint noted", rep.Notes)
	}
	l2 := openLog(t, dir)
	l2.Close()
	if rep := mustVerify(t, dir); len(rep.Notes) != 0 {
		t.Errorf("after open: notes %v, want none", rep.Notes)
	}
}

// TestKill9: a process killed mid-append never loses an acknowledged record
// and leaves a log that opens, verifies and continues.
func TestKill9(t *testing.T) {
	dir := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 3; round++ {
		cmd := exec.Command(self, "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"="+dir)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(out)
		var acked uint64
		for i := 0; i < 50+round*37 && sc.Scan(); i++ {
			n, err := strconv.ParseUint(sc.Text(), 10, 64)
			if err != nil {
				t.Fatalf("child: %s", sc.Text())
			}
			acked = n
		}
		cmd.Process.Kill()
		cmd.Wait()
		l := openLog(t, dir)
		head, _ := l.Head()
		if head < acked {
			t.Fatalf("round %d: head %d after kill, but seq %d was acknowledged", round, head, acked)
		}
		l.Close()
		rep := mustVerify(t, dir)
		t.Logf("round %d: killed after ack of seq %d; log head %d, %d records, notes %v", round, acked, rep.Head, rep.Records, rep.Notes)
	}
}

// BenchmarkAppend: durable appends from 1 and 16 goroutines per CPU; with
// more appenders, more records share one fsync.
func BenchmarkAppend(b *testing.B) {
	for _, par := range []int{1, 16} {
		b.Run(fmt.Sprintf("par=%d", par), func(b *testing.B) { benchAppend(b, par) })
	}
}

func benchAppend(b *testing.B, par int) {
	l, err := Open(Config{Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	ev := sampleEvents()[3]
	b.SetParallelism(par)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := l.Append(ev); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// TestTornTailShapes: whatever a crash leaves after the last newline (part
// of the first record, a run of NULs from a size update that beat the data)
// is moved aside and the chain continues.
func TestTornTailShapes(t *testing.T) {
	cases := []struct {
		name   string
		before int // records written first
		torn   []byte
	}{
		{"first record torn", 0, []byte(`{"seq":1,"ti`)},
		{"NULs after record 3", 3, make([]byte, 4096)},
		{"all but the newline", 2, nil}, // filled in below: a whole record without its '\n'
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			l := openLog(t, dir)
			for _, ev := range sampleEvents()[:tc.before] {
				mustAppend(t, l, ev)
			}
			l.Close()
			logPath := filepath.Join(dir, LogFile)
			torn := tc.torn
			if torn == nil {
				lines := readLines(t, logPath)
				torn = bytes.TrimSuffix(lines[len(lines)-1], []byte("\n"))
			}
			f, _ := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND, 0)
			f.Write(torn)
			f.Close()
			l2 := openLog(t, dir)
			if r := l2.Recovered(); r == nil || r.TornBytes != int64(len(torn)) || r.AfterSeq != uint64(tc.before) {
				t.Fatalf("recovery %+v, want %d bytes after seq %d", r, len(torn), tc.before)
			}
			mustAppend(t, l2, Event{Type: EventAgentStart})
			l2.Close()
			if rep := mustVerify(t, dir); rep.Head != uint64(tc.before+2) {
				t.Errorf("head %d, want %d (recovery record and one more)", rep.Head, tc.before+2)
			}
		})
	}
}
