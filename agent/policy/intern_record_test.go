package policy

import (
	"testing"

	"github.com/shinken-agent/shinken/agent/capability"
)

// TestSessionRecordInterned: sessions whose attributes are equal share one
// attribute record (the second costs no record of its own), and a session
// whose attributes differ in any one field, or whose fields would run
// together into the same string, gets its own record with its own values.
func TestSessionRecordInterned(t *testing.T) {
	base := capability.SessionAttrs{ID: "a", Image: "py", TrustTier: "standard", Risk: "low",
		Protected: []string{"/home/u/.ssh", "/home/u/.aws"}, PolicyStore: []string{"/var/lib/shinken"}}
	in := newInterner()
	want := in.sessionRecord(base)
	other := base
	other.ID = "b"
	if got := in.sessionRecord(other); !got.Equal(want) {
		t.Fatalf("equal attributes: %v, want %v", got, want)
	}
	if n := testing.AllocsPerRun(20, func() { in.sessionRecord(other) }); n > 2 {
		t.Fatalf("a session of known attributes allocates %.0f times, want at most 2", n)
	}
	variants := map[string]func(*capability.SessionAttrs){
		"image":        func(s *capability.SessionAttrs) { s.Image = "go" },
		"tier":         func(s *capability.SessionAttrs) { s.TrustTier = "trusted" },
		"risk":         func(s *capability.SessionAttrs) { s.Risk = "high" },
		"headless":     func(s *capability.SessionAttrs) { s.Headless = true },
		"tls":          func(s *capability.SessionAttrs) { s.TLSInspection = true },
		"protected":    func(s *capability.SessionAttrs) { s.Protected = []string{"/home/u/.ssh"} },
		"policy_store": func(s *capability.SessionAttrs) { s.PolicyStore = nil },
		// Fields that run together the same way without length prefixes.
		"image/tier": func(s *capability.SessionAttrs) { s.Image, s.TrustTier = "pys", "tandard" },
		"lists": func(s *capability.SessionAttrs) {
			s.Protected, s.PolicyStore = base.Protected[:1], append(base.Protected[1:2:2], base.PolicyStore...)
		},
	}
	for name, change := range variants {
		t.Run(name, func(t *testing.T) {
			s := base
			change(&s)
			got := in.sessionRecord(s)
			if got.Equal(want) {
				t.Fatalf("attributes %+v share the record of %+v", s, base)
			}
			if fresh := (*interner)(nil).sessionRecord(s); !got.Equal(fresh) {
				t.Fatalf("interned record %v, want %v", got, fresh)
			}
		})
	}
}
