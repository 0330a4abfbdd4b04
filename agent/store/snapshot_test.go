package store

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/capability"
)

// TestEncodeStateIsMarshal: the fold's streaming encoder writes exactly
// json.Marshal(st)'s bytes: a state with every kind of record, keys that
// JSON escapes, Through set and not, the omitempty maps empty and not, and
// maps left nil; writeSnapshot's file holds those bytes and reads back.
func TestEncodeStateIsMarshal(t *testing.T) {
	at := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	full := newState()
	full.Through = 42
	for i := range 300 {
		id := fmt.Sprintf("s%d", i)
		if i%50 == 0 {
			id = fmt.Sprintf("<s&%d>\u2028é\"", i)
		}
		full.Sessions[id] = &SessionRecord{Spec: capability.SessionSpec{ID: id, Image: "py"}, Phase: SessionActive, Created: at.Add(time.Duration(i))}
		ref := backend.HandleRef{Slot: uint32(i), Generation: 7}
		gid := fmt.Sprintf("g%03d", i)
		full.Grants[gid] = &GrantRecord{ID: gid, Session: id, Capability: capability.Capability{Class: capability.ClassNetEgress,
			Egress: &capability.EgressScope{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, Ports: []capability.PortRange{{Lo: 443, Hi: 443}}}},
			Tier: capability.TierAuto, Lifecycle: capability.LifecycleSession, Kernel: ref, Phase: capability.PhaseLive, Created: at,
			Delta: backend.DeltaOf([]backend.EgressRule{{Prefix: netip.MustParsePrefix("10.0.0.0/8"), Proto: backend.ProtoTCP, Ports: backend.PortRange{Lo: 443, Hi: 443}, Handle: ref}})}
	}
	full.Approvals["ap1"] = &ApprovalRecord{ID: "ap1", Request: capability.GrantRequest{Session: "s1", Capability: capability.Capability{Class: capability.ClassClipboard,
		Clipboard: &capability.ClipboardScope{CopyOut: true}}, Lifecycle: capability.LifecycleOnce}, Tier: capability.TierAsk, Created: at, Expires: at.Add(time.Minute)}
	full.Cards["c1"] = &capability.Card{ID: "c1", Session: "s1", Tier: capability.TierAsk, Created: at, Expires: at.Add(time.Minute), Status: capability.CardApproved}
	full.Patterns["c1/0"] = &Pattern{Card: "c1", Session: "s1", Decider: "bob", Created: at}
	empty := newState()
	nilMaps := &State{Version: stateVersion}
	for name, st := range map[string]*State{"full": full, "empty": empty, "nil maps": nilMaps} {
		want, err := json.Marshal(st)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		w := bufio.NewWriter(&b)
		if err := encodeState(w, st); err != nil {
			t.Fatal(err)
		}
		w.Flush()
		if !bytes.Equal(b.Bytes(), want) {
			t.Fatalf("%s: encodeState wrote\n%.400s\njson.Marshal\n%.400s", name, b.Bytes(), want)
		}
		path := filepath.Join(t.TempDir(), "state.json")
		n, err := writeSnapshot(path, st)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil || !bytes.Equal(got, want) || n != int64(len(want)) {
			t.Fatalf("%s: the snapshot file (%d bytes, size said %d, %v) is not json.Marshal's %d bytes", name, len(got), n, err, len(want))
		}
		back, _, err := readSnapshot(path)
		if err != nil || len(back.Sessions) != len(st.Sessions) || len(back.Grants) != len(st.Grants) || back.Through != st.Through {
			t.Fatalf("%s: read back: %v", name, err)
		}
	}
}
