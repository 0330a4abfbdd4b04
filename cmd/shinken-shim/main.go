// Command shinken-shim holds one session process for the agent (package
// agent/procs): the agent starts it, one per process (and four spares ahead
// of need), next to its own binary; without it the agent re-executes
// itself as each shim, a larger binary that starts slower. It links the
// session runtime and the session boundary's prepared launches only
// (dataplane/boundary/prepared, on Linux; start_linux.go), never the
// agent, the rest of the boundary, the dataplane's BPF code, the policy
// engine or the resolver (TestShimImports), and make builds it without
// cgo (a static binary).
package main

import (
	"fmt"
	"os"

	"github.com/shinken-agent/shinken/agent/procs"
)

func main() {
	procs.ShimMain(start) // never returns when started as a shim
	fmt.Fprintln(os.Stderr, "shinken-shim: started by shinken-agent only, one per session process")
	os.Exit(2)
}
