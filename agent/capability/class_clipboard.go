package capability

// clipboard: the session's access to the desktop clipboard.

// ClipboardScope is the scope of clipboard; both directions default to off.
type ClipboardScope struct {
	PasteIn bool `json:"paste_in,omitempty"`
	CopyOut bool `json:"copy_out,omitempty"`
}

func init() {
	register(spec{
		class: ClassClipboard,
		keys: []key{
			boolKey("paste_in", func(c *Capability) *bool { return &c.Clipboard.PasteIn }),
			boolKey("copy_out", func(c *Capability) *bool { return &c.Clipboard.CopyOut }),
		},
		ops: []string{"paste_in", "copy_out"},
		fill: func(c *Capability) {
			if c.Clipboard == nil {
				c.Clipboard = &ClipboardScope{}
			}
		},
		has:       func(c *Capability) bool { return c.Clipboard != nil },
		normalize: func(c *Capability) { v := *c.Clipboard; c.Clipboard = &v },
		isEmpty:   func(c Capability) bool { return !c.Clipboard.PasteIn && !c.Clipboard.CopyOut },
		within: func(c, bound Capability, widen func(string, ...any) error) error {
			if c.Clipboard.PasteIn && !bound.Clipboard.PasteIn {
				return widen("paste_in")
			}
			if c.Clipboard.CopyOut && !bound.Clipboard.CopyOut {
				return widen("copy_out")
			}
			return nil
		},
		allows: func(c Capability, r UseRequest) bool {
			return r.Op == "paste_in" && c.Clipboard.PasteIn || r.Op == "copy_out" && c.Clipboard.CopyOut
		},
		// paste_in only: auto; copy_out: ask.
		tier: func(c Capability, _ TierContext) Tier {
			if c.Clipboard.CopyOut {
				return TierAsk
			}
			return TierAuto
		},
		// copy_out is data leaving the session.
		ingredients: func(c Capability, i Ingredients) Ingredients {
			if c.Clipboard.CopyOut {
				i.ExternalCommunication = true
			}
			return i
		},
	})
}
