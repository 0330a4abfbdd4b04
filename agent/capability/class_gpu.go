package capability

// gpu: devices the session may compute or render on.

import (
	"fmt"
	"slices"
)

// GPU modes. GPUModeRaw (raw device access) is an extension of the seed's
// compute|render: it exists so a manifest can name it, and it is Block tier.
const (
	GPUModeCompute = "compute"
	GPUModeRender  = "render"
	GPUModeRaw     = "raw"
)

// GPUScope is the scope of gpu.
type GPUScope struct {
	DeviceIDs []string `json:"device_ids,omitempty"`
	Mode      string   `json:"mode,omitempty"`
}

func init() {
	register(spec{
		class: ClassGPU,
		keys: []key{
			listKey("device_ids", func(c *Capability) *[]string { return &c.GPU.DeviceIDs }),
			wordKey("mode", func(c *Capability) *string { return &c.GPU.Mode }),
		},
		ops: []string{"use"},
		fill: func(c *Capability) {
			if c.GPU == nil {
				c.GPU = &GPUScope{}
			}
		},
		has:       func(c *Capability) bool { return c.GPU != nil },
		normalize: func(c *Capability) { c.GPU = &GPUScope{DeviceIDs: sortedUnique(c.GPU.DeviceIDs), Mode: c.GPU.Mode} },
		validate: func(c Capability) error {
			switch c.GPU.Mode {
			case GPUModeCompute, GPUModeRender, GPUModeRaw:
			case "":
				if len(c.GPU.DeviceIDs) > 0 {
					return fmt.Errorf("%w: gpu device_ids without a mode", ErrInvalidCapability)
				}
			default:
				return fmt.Errorf("%w: gpu mode %q (want compute, render or raw)", ErrInvalidCapability, c.GPU.Mode)
			}
			for _, id := range c.GPU.DeviceIDs {
				if err := ValidateToken("gpu device id", id); err != nil {
					return err
				}
			}
			return nil
		},
		isEmpty: func(c Capability) bool { return len(c.GPU.DeviceIDs) == 0 },
		within: func(c, bound Capability, widen func(string, ...any) error) error {
			for _, id := range c.GPU.DeviceIDs {
				if !slices.Contains(bound.GPU.DeviceIDs, id) {
					return widen("device %q", id)
				}
			}
			if len(c.GPU.DeviceIDs) > 0 && c.GPU.Mode != bound.GPU.Mode {
				return widen("mode %q (bound %q)", c.GPU.Mode, bound.GPU.Mode)
			}
			return nil
		},
		allows: func(c Capability, r UseRequest) bool {
			return r.Op == "use" && slices.Contains(c.GPU.DeviceIDs, r.Item) && r.Mode == c.GPU.Mode
		},
		// compute or render: ask; raw device: block.
		tier: func(c Capability, _ TierContext) Tier {
			if c.GPU.Mode == GPUModeRaw {
				return TierBlock
			}
			return TierAsk
		},
	})
}
