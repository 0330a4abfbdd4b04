package metrics

import "github.com/shinken-agent/shinken/dataplane"

// The real dataplane (Linux only) is a Source.
var _ Source = (*dataplane.Dataplane)(nil)
