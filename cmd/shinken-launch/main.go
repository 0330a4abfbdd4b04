// Command shinken-launch is the session launcher of shinken-agent: the
// agent re-executes it, from the session's namespaces and cgroup, for the
// init of every session (its mounts, then catatonit as the session's pid 1)
// and for every process it starts in a session (privileges dropped,
// Landlock scoping, the seccomp filter, then the target). It links only
// package dataplane/boundary/child, so that its start-up is short. The
// agent looks for it next to its own executable. It does nothing when run
// by hand.
package main

import (
	"fmt"
	"os"

	"github.com/shinken-agent/shinken/dataplane/boundary/child"
)

func main() {
	child.Main()
	fmt.Fprintln(os.Stderr, "shinken-launch: started by shinken-agent only (the session launcher)")
	os.Exit(2)
}
