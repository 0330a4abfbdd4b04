package capability

// process: the programs a session may execute and how many processes it
// may have (ProcessGrant of the seeds: exec allowlist, max_processes).

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/shinken-agent/shinken/agent/backend"
)

// ProcessScope is the scope of process. Exec lists programs by absolute
// path; a backend resolves each to the file it names when the grant is
// applied (a symlink such as /usr/bin/python3 -> python3.11 grants the file
// python3.11), and a program runs only if the file executed is one of them:
// a copy, a hard link to a neighbour or a memfd is another file. Granting
// an interpreter (/bin/sh, python3) grants whatever it interprets: the list
// bounds programs, not code. A script runs only if it and its interpreter
// are both listed. MaxProcesses bounds the session's processes (threads
// count) while the grant lives; 0: the host's bound.
type ProcessScope struct {
	Exec         []string `json:"exec,omitempty"`
	MaxProcesses uint32   `json:"max_processes,omitempty"`
}

// MaxProcessesLimit bounds max_processes (the kernel's PID_MAX_LIMIT).
const MaxProcessesLimit = 1 << 22

func init() {
	register(spec{
		class: ClassProcess,
		keys: []key{
			listKey("exec", func(c *Capability) *[]string { return &c.Process.Exec }),
			{name: "max_processes",
				parse: func(c *Capability, v string) error {
					n, err := strconv.ParseUint(v, 10, 32)
					if err != nil {
						return fmt.Errorf("max_processes=%q: want a count", v)
					}
					c.Process.MaxProcesses = uint32(n)
					return nil
				},
				render: func(c *Capability) string {
					if c.Process.MaxProcesses == 0 {
						return ""
					}
					return strconv.FormatUint(uint64(c.Process.MaxProcesses), 10)
				},
			},
		},
		ops: []string{"exec"},
		fill: func(c *Capability) {
			if c.Process == nil {
				c.Process = &ProcessScope{}
			}
		},
		has: func(c *Capability) bool { return c.Process != nil },
		normalize: func(c *Capability) {
			c.Process = &ProcessScope{Exec: sortedUnique(c.Process.Exec), MaxProcesses: c.Process.MaxProcesses}
		},
		validate: func(c Capability) error {
			if err := validatePaths(c.Process.Exec); err != nil {
				return err
			}
			for _, p := range c.Process.Exec {
				if len(p) > backend.MaxFilePath {
					return fmt.Errorf("%w: exec %q longer than %d bytes", ErrInvalidCapability, p, backend.MaxFilePath)
				}
			}
			if c.Process.MaxProcesses > MaxProcessesLimit {
				return fmt.Errorf("%w: max_processes %d over %d", ErrInvalidCapability, c.Process.MaxProcesses, MaxProcessesLimit)
			}
			return nil
		},
		isEmpty: func(c Capability) bool { return len(c.Process.Exec) == 0 && c.Process.MaxProcesses == 0 },
		within: func(c, bound Capability, widen func(string, ...any) error) error {
			for _, p := range c.Process.Exec {
				if !slices.Contains(bound.Process.Exec, p) {
					return widen("exec %q", p)
				}
			}
			// A bound's max_processes caps the grant's; 0 is the host's
			// bound, the most.
			if b := bound.Process.MaxProcesses; b != 0 && (c.Process.MaxProcesses == 0 || c.Process.MaxProcesses > b) {
				return widen("max_processes %d (bound %d)", c.Process.MaxProcesses, b)
			}
			return nil
		},
		// A program by its exact path: a directory grants nothing.
		allows: func(c Capability, r UseRequest) bool {
			return r.Op == "exec" && r.Path != "" && slices.Contains(c.Process.Exec, r.Path)
		},
		compile: func(c Capability, ref backend.HandleRef) backend.Delta {
			var d backend.Delta
			for _, p := range c.Process.Exec {
				d.Process = append(d.Process, backend.ProcessEntry{Exec: p, Handle: ref})
			}
			if c.Process.MaxProcesses != 0 {
				d.Process = append(d.Process, backend.ProcessEntry{MaxProcesses: c.Process.MaxProcesses, Handle: ref})
			}
			return d
		},
		// Executing programs crosses the session's own boundary (the
		// seed: exec lifts the tier): ask; a bound alone: notify.
		tier: func(c Capability, _ TierContext) Tier {
			if len(c.Process.Exec) > 0 {
				return TierAsk
			}
			return TierNotify
		},
	})
}
