package capability

// install.privileged: package installs through a broker, or root.

import "fmt"

// Install scopes.
const (
	InstallPkg = "pkg"
	InstallAny = "any"
)

// InstallScope is the scope of install.privileged: "pkg" (package installs
// through a broker) or "any" (sudo; Block tier).
type InstallScope struct {
	Scope string `json:"scope,omitempty"`
}

// installRank orders the install scopes by authority.
var installRank = map[string]int{"": 0, InstallPkg: 1, InstallAny: 2}

func init() {
	register(spec{
		class: ClassInstall,
		keys: []key{
			wordKey("scope", func(c *Capability) *string { return &c.Install.Scope }),
		},
		ops: []string{"pkg", "any"},
		fill: func(c *Capability) {
			if c.Install == nil {
				c.Install = &InstallScope{}
			}
		},
		has:       func(c *Capability) bool { return c.Install != nil },
		normalize: func(c *Capability) { v := *c.Install; c.Install = &v },
		validate: func(c Capability) error {
			switch c.Install.Scope {
			case "", InstallPkg, InstallAny:
				return nil
			}
			return fmt.Errorf("%w: install.privileged scope %q (want pkg or any)", ErrInvalidCapability, c.Install.Scope)
		},
		isEmpty: func(c Capability) bool { return c.Install.Scope == "" },
		within: func(c, bound Capability, widen func(string, ...any) error) error {
			if installRank[c.Install.Scope] > installRank[bound.Install.Scope] {
				return widen("scope %q (bound %q)", c.Install.Scope, bound.Install.Scope)
			}
			return nil
		},
		allows: func(c Capability, r UseRequest) bool {
			return r.Op == InstallPkg && c.Install.Scope != "" || r.Op == InstallAny && c.Install.Scope == InstallAny
		},
		// pkg: ask; any (sudo/root): block.
		tier: func(c Capability, _ TierContext) Tier {
			if c.Install.Scope == InstallAny {
				return TierBlock
			}
			return TierAsk
		},
	})
}
