package dnsresolver

import "github.com/shinken-agent/shinken/dataplane"

// The real dataplane is a Dataplane as it is.
var _ Dataplane = (*dataplane.Dataplane)(nil)
