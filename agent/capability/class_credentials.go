package capability

// credentials: broker scopes the credential broker may use on the
// session's behalf; the session never sees a secret.

import (
	"fmt"
	"slices"
)

// CredentialsScope is the scope of credentials. NeverRaw is an invariant: it
// must be true in every credentials capability (the model never sees a
// plaintext secret; the broker injects it).
type CredentialsScope struct {
	BrokerScopes []string `json:"broker_scopes,omitempty"`
	NeverRaw     bool     `json:"never_raw"`
}

func init() {
	register(spec{
		class: ClassCredentials,
		keys: []key{
			listKey("broker_scopes", func(c *Capability) *[]string { return &c.Credentials.BrokerScopes }),
			// never_raw may be given, as true; it never renders (it is
			// always true).
			{name: "never_raw",
				parse: func(c *Capability, v string) (err error) {
					if c.Credentials.NeverRaw, err = boolean("never_raw", v); err != nil {
						return err
					}
					if !c.Credentials.NeverRaw {
						return fmt.Errorf("never_raw=false: credentials are never handed to a session in plaintext (the invariant cannot be turned off)")
					}
					return nil
				},
				render: func(*Capability) string { return "" }},
		},
		ops: []string{"broker"},
		fill: func(c *Capability) {
			if c.Credentials == nil {
				c.Credentials = &CredentialsScope{NeverRaw: true}
			}
		},
		has: func(c *Capability) bool { return c.Credentials != nil },
		normalize: func(c *Capability) {
			c.Credentials = &CredentialsScope{BrokerScopes: sortedUnique(c.Credentials.BrokerScopes), NeverRaw: c.Credentials.NeverRaw}
		},
		validate: func(c Capability) error {
			if !c.Credentials.NeverRaw {
				return fmt.Errorf("%w: credentials never_raw must be true (a plaintext secret is never handed to a session)", ErrInvalidCapability)
			}
			for _, s := range c.Credentials.BrokerScopes {
				if err := ValidateToken("broker scope", s); err != nil {
					return err
				}
			}
			return nil
		},
		isEmpty: func(c Capability) bool { return len(c.Credentials.BrokerScopes) == 0 },
		within: func(c, bound Capability, widen func(string, ...any) error) error {
			for _, s := range c.Credentials.BrokerScopes {
				if !slices.Contains(bound.Credentials.BrokerScopes, s) {
					return widen("broker scope %q", s)
				}
			}
			if !c.Credentials.NeverRaw {
				return widen("never_raw=false")
			}
			return nil
		},
		allows: func(c Capability, r UseRequest) bool {
			return r.Op == "broker" && slices.Contains(c.Credentials.BrokerScopes, r.Item)
		},
		// Block: the broker is admin-only.
		tier: func(Capability, TierContext) Tier { return TierBlock },
		ingredients: func(c Capability, i Ingredients) Ingredients {
			if !c.IsEmpty() {
				i.CredentialAccess = true
			}
			return i
		},
	})
}
