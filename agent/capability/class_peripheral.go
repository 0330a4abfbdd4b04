package capability

// peripheral: camera, microphone, USB devices and input injection.

import "slices"

// PeripheralScope is the scope of peripheral.
type PeripheralScope struct {
	Camera      bool     `json:"camera,omitempty"`
	Mic         bool     `json:"mic,omitempty"`
	USB         []string `json:"usb,omitempty"`
	InputInject bool     `json:"input_inject,omitempty"`
}

func init() {
	register(spec{
		class: ClassPeripheral,
		keys: []key{
			boolKey("camera", func(c *Capability) *bool { return &c.Peripheral.Camera }),
			boolKey("mic", func(c *Capability) *bool { return &c.Peripheral.Mic }),
			listKey("usb", func(c *Capability) *[]string { return &c.Peripheral.USB }),
			boolKey("input_inject", func(c *Capability) *bool { return &c.Peripheral.InputInject }),
		},
		ops: []string{"camera", "mic", "usb", "input_inject"},
		fill: func(c *Capability) {
			if c.Peripheral == nil {
				c.Peripheral = &PeripheralScope{}
			}
		},
		has: func(c *Capability) bool { return c.Peripheral != nil },
		normalize: func(c *Capability) {
			v := *c.Peripheral
			v.USB = sortedUnique(v.USB)
			c.Peripheral = &v
		},
		validate: func(c Capability) error {
			for _, u := range c.Peripheral.USB {
				if err := ValidateToken("usb id", u); err != nil {
					return err
				}
			}
			return nil
		},
		isEmpty: func(c Capability) bool {
			p := c.Peripheral
			return !p.Camera && !p.Mic && !p.InputInject && len(p.USB) == 0
		},
		within: func(c, bound Capability, widen func(string, ...any) error) error {
			in, out := c.Peripheral, bound.Peripheral
			switch {
			case in.Camera && !out.Camera:
				return widen("camera")
			case in.Mic && !out.Mic:
				return widen("mic")
			case in.InputInject && !out.InputInject:
				return widen("input_inject")
			}
			for _, u := range in.USB {
				if !slices.Contains(out.USB, u) {
					return widen("usb %q", u)
				}
			}
			return nil
		},
		allows: func(c Capability, r UseRequest) bool {
			p := c.Peripheral
			switch r.Op {
			case "camera":
				return p.Camera
			case "mic":
				return p.Mic
			case "input_inject":
				return p.InputInject
			case "usb":
				return slices.Contains(p.USB, r.Item)
			}
			return false
		},
		// camera, mic, usb: ask; input_inject: block.
		tier: func(c Capability, _ TierContext) Tier {
			if c.Peripheral.InputInject {
				return TierBlock
			}
			return TierAsk
		},
	})
}
