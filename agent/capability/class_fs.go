package capability

// fs.scope: the paths a session may read and write, and the host UNIX
// sockets it may connect to.

import (
	"slices"
	"strings"

	"github.com/shinken-agent/shinken/agent/backend"
)

// FSScope is the scope of fs.scope: absolute, clean path prefixes. Write and
// Delete (unlink, rmdir, rename away) imply neither read nor each other in
// the grammar and the Delta (each its own access bit); what a host can hold
// apart is its backend's to say (the Linux mount view cannot: a delete root
// without write is refused there, and write lets delete). Nesting is
// narrowest-wins inside one grant, axis by axis (class_fs_nest.go: write
// /repo, deny /repo/a, write /repo/a/b), and across grants the rights add
// up (backend.FileRightsAt). One path both given and denied by one grant
// is refused as contradictory.
type FSScope struct {
	Read   []string `json:"read,omitempty"`
	Write  []string `json:"write,omitempty"`
	Delete []string `json:"delete,omitempty"`
	Deny   []string `json:"deny,omitempty"`
	// Connect names host UNIX sockets, each exactly (a socket is no
	// tree), below /run: the session's /run is its own and empty, and a
	// connect entry puts the host's socket back at its path. Container
	// runtime sockets are Block tier.
	Connect []string `json:"connect,omitempty"`
}

func init() {
	register(spec{
		class: ClassFSScope,
		keys: []key{
			listKey("read", func(c *Capability) *[]string { return &c.FS.Read }),
			listKey("write", func(c *Capability) *[]string { return &c.FS.Write }),
			listKey("delete", func(c *Capability) *[]string { return &c.FS.Delete }),
			listKey("deny", func(c *Capability) *[]string { return &c.FS.Deny }),
			listKey("connect", func(c *Capability) *[]string { return &c.FS.Connect }),
		},
		ops: []string{"read", "write", "delete", "connect"},
		fill: func(c *Capability) {
			if c.FS == nil {
				c.FS = &FSScope{}
			}
		},
		has: func(c *Capability) bool { return c.FS != nil },
		normalize: func(c *Capability) {
			c.FS = &FSScope{Read: sortedUnique(c.FS.Read), Write: sortedUnique(c.FS.Write), Delete: sortedUnique(c.FS.Delete), Deny: sortedUnique(c.FS.Deny), Connect: sortedUnique(c.FS.Connect)}
		},
		validate: func(c Capability) error {
			for _, l := range [][]string{c.FS.Read, c.FS.Write, c.FS.Delete, c.FS.Deny, c.FS.Connect} {
				if err := validatePaths(l); err != nil {
					return err
				}
			}
			// Nesting inside one grant is narrowest-wins (class_fs_nest.go):
			// only one path both given and denied is contradictory.
			return validateFSNesting(c.FS)
		},
		isEmpty: func(c Capability) bool {
			return len(c.FS.Read) == 0 && len(c.FS.Write) == 0 && len(c.FS.Delete) == 0 && len(c.FS.Connect) == 0
		},
		within: func(c, bound Capability, widen func(string, ...any) error) error {
			if op, p, ok := fsWithin(c.FS, bound.FS); !ok {
				return widen("%s %q", op, p)
			}
			return nil
		},
		allows: func(c Capability, r UseRequest) bool {
			return r.Path != "" && fsGivesAt(c.FS, r.Op, r.Path)
		},
		// "read=/a,/b write=/c ...": the manifest line without its class.
		summary: func(c Capability) string {
			return strings.TrimPrefix(c.String(), string(ClassFSScope)+" ")
		},
		// One file entry per path, under the grant's handle: the
		// backend's view gives what the grant's entries give, narrowest
		// wins among them (backend.FileRightsAt).
		compile: func(c Capability, ref backend.HandleRef) backend.Delta {
			var d backend.Delta
			for _, l := range []struct {
				paths []string
				a     backend.FileAccess
			}{{c.FS.Read, backend.FileRead}, {c.FS.Write, backend.FileWrite}, {c.FS.Delete, backend.FileDelete}, {c.FS.Deny, backend.FileDeny}, {c.FS.Connect, backend.FileConnect}} {
				for _, p := range l.paths {
					d.Files = append(d.Files, backend.FileEntry{Path: p, Access: l.a, Handle: ref})
				}
			}
			return d
		},
		// Read inside the workspace: auto; writes and deletes inside it: notify;
		// anything outside it: ask.
		tier: func(c Capability, tc TierContext) Tier {
			// A host socket: ask, a container runtime's: block (root on
			// the host; the backend refuses it whatever the grant).
			for _, p := range c.FS.Connect {
				if underAny(p, backend.ContainerRuntimeSockets) {
					return TierBlock
				}
			}
			if len(c.FS.Connect) > 0 {
				return TierAsk
			}
			t := TierAuto
			for _, p := range c.FS.Read {
				if !tc.inWorkspace(p) {
					return TierAsk
				}
			}
			for _, p := range append(slices.Clip(c.FS.Write), c.FS.Delete...) {
				if !tc.inWorkspace(p) {
					return TierAsk
				}
				t = TierNotify
			}
			return t
		},
	})
}

// validatePaths checks every path of l (ValidatePath).
func validatePaths(l []string) error {
	for _, p := range l {
		if err := ValidatePath(p); err != nil {
			return err
		}
	}
	return nil
}
