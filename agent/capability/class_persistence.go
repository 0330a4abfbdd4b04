package capability

// persistence: paths whose writes outlive the session's scratch space.

import (
	"strings"

	"github.com/shinken-agent/shinken/agent/backend"
)

// PersistenceScope is the scope of persistence.
type PersistenceScope struct {
	Paths           []string `json:"paths,omitempty"`
	SurvivesSession bool     `json:"survives_session,omitempty"`
}

// systemPaths are the roots whose persistence is Block tier.
var systemPaths = []string{"/bin", "/boot", "/etc", "/lib", "/lib32", "/lib64", "/opt", "/root", "/sbin", "/sys", "/proc", "/usr", "/var/lib", "/var/spool", "/dev"}

func init() {
	register(spec{
		class: ClassPersistence,
		keys: []key{
			listKey("paths", func(c *Capability) *[]string { return &c.Persistence.Paths }),
			boolKey("survives_session", func(c *Capability) *bool { return &c.Persistence.SurvivesSession }),
		},
		ops: []string{"persist"},
		fill: func(c *Capability) {
			if c.Persistence == nil {
				c.Persistence = &PersistenceScope{}
			}
		},
		has: func(c *Capability) bool { return c.Persistence != nil },
		normalize: func(c *Capability) {
			c.Persistence = &PersistenceScope{Paths: sortedUnique(c.Persistence.Paths), SurvivesSession: c.Persistence.SurvivesSession}
		},
		validate: func(c Capability) error { return validatePaths(c.Persistence.Paths) },
		isEmpty:  func(c Capability) bool { return len(c.Persistence.Paths) == 0 },
		within: func(c, bound Capability, widen func(string, ...any) error) error {
			for _, p := range c.Persistence.Paths {
				if !underAny(p, bound.Persistence.Paths) {
					return widen("path %q", p)
				}
			}
			if c.Persistence.SurvivesSession && !bound.Persistence.SurvivesSession {
				return widen("survives_session")
			}
			return nil
		},
		allows: func(c Capability, r UseRequest) bool {
			return r.Op == "persist" && r.Path != "" && underAny(r.Path, c.Persistence.Paths)
		},
		summary: func(c Capability) string {
			return strings.TrimPrefix(c.String(), string(ClassPersistence)+" ")
		},
		// One file entry per path: the backend gives the session name
		// its own directory there (kept across sessions of that name
		// with survives_session, else for this session only).
		compile: func(c Capability, ref backend.HandleRef) backend.Delta {
			a := backend.FilePersistSession
			if c.Persistence.SurvivesSession {
				a = backend.FilePersist
			}
			var d backend.Delta
			for _, p := range c.Persistence.Paths {
				d.Files = append(d.Files, backend.FileEntry{Path: p, Access: a, Handle: ref})
			}
			return d
		},
		// System paths: block; else (the workspace included): ask.
		tier: func(c Capability, _ TierContext) Tier {
			for _, p := range c.Persistence.Paths {
				for _, s := range systemPaths {
					if pathUnder(p, s) || pathUnder(s, p) {
						return TierBlock
					}
				}
			}
			return TierAsk
		},
	})
}
