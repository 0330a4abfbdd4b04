package dnsresolver

import "github.com/shinken-agent/shinken/dataplane"

// The real dataplane is a Dataplane and a SessionIndexer as it is.
var (
	_ Dataplane      = (*dataplane.Dataplane)(nil)
	_ SessionIndexer = (*dataplane.Dataplane)(nil)
)
