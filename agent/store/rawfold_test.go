package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/capability"
)

// foldFixture writes a snapshot through segment 2 (every kind of record,
// keys JSON escapes, a grant written before Delta, a field State does not
// have) and segments 1 (at or below "through"), 3, 4 (updates and
// deletions of every kind, another legacy grant, a torn last line) and 5
// (above the fold).
func foldFixture(t *testing.T, dir string) {
	t.Helper()
	at := time.Date(2026, 12, 5, 1, 0, 0, 0, time.UTC)
	grant := func(id, sess string, legacy bool) *GrantRecord {
		ref := backend.HandleRef{Slot: uint32(len(id)), Generation: 3}
		p := netip.MustParsePrefix("10.1.0.0/16")
		rules := []backend.EgressRule{{Prefix: p, Proto: backend.ProtoTCP, Ports: backend.PortRange{Lo: 443, Hi: 443}, Handle: ref}}
		g := &GrantRecord{ID: id, Session: sess, Capability: capability.Capability{Class: capability.ClassNetEgress,
			Egress: &capability.EgressScope{CIDRs: []netip.Prefix{p}, Ports: []capability.PortRange{{Lo: 443, Hi: 443}}}},
			Tier: capability.TierAuto, Lifecycle: capability.LifecycleSession, Kernel: ref, Phase: capability.PhaseLive, Created: at}
		if legacy {
			g.LegacyRules = rules
		} else {
			g.Delta = backend.DeltaOf(rules)
		}
		return g
	}
	st := newState()
	st.Through = 2
	for i := range 40 {
		id := fmt.Sprintf("s%02d", i)
		if i%10 == 0 {
			id = fmt.Sprintf("<s&%d>\u2028é\"", i)
		}
		st.Sessions[id] = &SessionRecord{Spec: capability.SessionSpec{ID: id, Image: "py"}, Phase: SessionActive, Created: at}
		st.Grants["g"+id] = grant("g"+id, id, i == 7)
	}
	st.Approvals["ap1"] = &ApprovalRecord{ID: "ap1", Request: capability.GrantRequest{Session: "s01", Capability: capability.Capability{Class: capability.ClassClipboard,
		Clipboard: &capability.ClipboardScope{CopyOut: true}}, Lifecycle: capability.LifecycleOnce}, Tier: capability.TierAsk, Created: at, Expires: at.Add(time.Minute)}
	st.Cards["c1"] = &capability.Card{ID: "c1", Session: "s01", Tier: capability.TierAsk, Created: at, Expires: at.Add(time.Minute), Status: capability.CardPending}
	snap, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	snap = bytes.Replace(snap, []byte(`{"version":1,`), []byte(`{"version":1,"future":{"x":[1,2]},`), 1)
	write := func(name string, data []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("state.json", snap)
	line := func(k, id string, v any) string {
		if v == nil {
			return fmt.Sprintf(`{"k":%q,"id":%q,"del":true}`+"\n", k, id)
		}
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		j, _ := json.Marshal(journalLine{Kind: k, ID: id, Rec: b})
		return string(j) + "\n"
	}
	ending := *st.Sessions["s03"]
	ending.Phase = SessionEnding
	revoked := *grant("gs04", "s04", false)
	revoked.Phase, revoked.Ended, revoked.EndReason = capability.PhaseRevoked, at.Add(time.Second), "revoked by operator"
	decided := *st.Cards["c1"]
	decided.Status = capability.CardApproved
	write("state.journal.1", []byte(line("s", "stale", &SessionRecord{Phase: SessionActive})))
	write("state.journal.3", []byte(line("s", "s03", &ending)+line("g", "gs04", &revoked)+line("s", "s05", nil)+line("g", "gs05", nil)+
		line("g", "new-legacy", grant("new-legacy", "s06", true))+line("a", "ap1", nil)+line("c", "c1", &decided)))
	write("state.journal.4", []byte(line("p", "c1/0", &Pattern{Card: "c1", Session: "s01", Decider: "bob", Created: at})+line("g", "gs04", nil)+
		line("s", "s06", &ending)+`{"k":"s","id":"torn","v":{"spec":`))
	write("state.journal.5", []byte(line("s", "above", &SessionRecord{Phase: SessionActive})))
}

// TestFoldIsTypedFold: the fold, carrying records as their bytes, writes
// the snapshot the typed fold wrote (decode the snapshot and the segments
// into a State, migrate, encode), byte for byte: updates and deletions of
// every kind applied in order, a segment at or below "through" and one
// above the fold left out, a torn last line dropped, legacy grants
// migrated, a field State does not have dropped. The segments it folded
// are removed, and the store opens on the result.
func TestFoldIsTypedFold(t *testing.T) {
	dir := t.TempDir()
	foldFixture(t, dir)
	st, _, err := readSnapshot(filepath.Join(dir, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"3", "4"} {
		if err := replayFile(filepath.Join(dir, "state.journal."+n), st.apply); err != nil {
			t.Fatal(err)
		}
	}
	migrateLegacy(st)
	st.Through = 4
	want, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	s := &Store{dir: dir}
	size, err := s.foldThrough(4)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) || size != int64(len(got)) {
		t.Fatalf("the fold wrote (%d bytes, size said %d)\n%s\nthe typed fold\n%s", len(got), size, got, want)
	}
	for _, must := range []string{`"new-legacy":`, `"s06":{"spec":{"id":"s03"`, `"patterns":{"c1/0":`, `"through":4`} {
		if !strings.Contains(string(got), must) {
			t.Errorf("the folded snapshot lacks %s", must)
		}
	}
	for _, mustNot := range []string{`"rules"`, `"gs04"`, `"s05"`, `"ap1"`, `"stale"`, `"above"`, `"torn"`, `"future"`} {
		if strings.Contains(string(got), mustNot) {
			t.Errorf("the folded snapshot holds %s", mustNot)
		}
	}
	if f := files(t, dir); !slices.Equal(f, []string{"state.journal.5", "state.json"}) {
		t.Fatalf("files after the fold: %v", f)
	}
	s2, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if g := s2.State().Grants["gs07"]; g == nil || len(g.Delta.Egress) != 1 || s2.State().Sessions["above"] == nil {
		t.Fatalf("reopened: legacy grant %+v, sessions %d", g, len(s2.State().Sessions))
	}
}

// TestFoldRefuses: a snapshot of another version, one that is not a
// State's object, and a corrupt line before a segment's last fail the fold
// with ErrState, and leave the snapshot and the segments as they were.
func TestFoldRefuses(t *testing.T) {
	for name, spoil := range map[string]func(dir string) error{
		"version": func(dir string) error {
			return os.WriteFile(filepath.Join(dir, "state.json"), []byte(`{"version":2,"sessions":{}}`), 0o600)
		},
		"not an object": func(dir string) error {
			return os.WriteFile(filepath.Join(dir, "state.json"), []byte(`{"version":1,"sessions":[1]}`), 0o600)
		},
		"trailing data": func(dir string) error {
			return os.WriteFile(filepath.Join(dir, "state.json"), []byte(`{"version":1,"sessions":{}} {}`), 0o600)
		},
		"corrupt segment line": func(dir string) error {
			return os.WriteFile(filepath.Join(dir, "state.journal.3"), []byte("{\"k\":\"s\",\"id\":\"x\",\"v\":{}}\n{not json}\n"+`{"k":"s","id":"y","v":{}}`+"\n"), 0o600)
		},
		"unknown kind": func(dir string) error {
			return os.WriteFile(filepath.Join(dir, "state.journal.3"), []byte(`{"k":"z","id":"x","v":{}}`+"\n"), 0o600)
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			foldFixture(t, dir)
			if err := spoil(dir); err != nil {
				t.Fatal(err)
			}
			before, _ := os.ReadFile(filepath.Join(dir, "state.json"))
			s := &Store{dir: dir}
			if _, err := s.foldThrough(4); !errors.Is(err, ErrState) {
				t.Fatalf("fold: %v, want ErrState", err)
			}
			after, _ := os.ReadFile(filepath.Join(dir, "state.json"))
			if !bytes.Equal(before, after) || !slices.Contains(files(t, dir), "state.journal.3") {
				t.Fatalf("a failed fold changed the snapshot or removed a segment: %v", files(t, dir))
			}
		})
	}
}
