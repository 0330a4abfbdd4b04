//go:build !linux

package host

import (
	"fmt"
	"runtime"

	"github.com/shinken-agent/shinken/agent/backend"
)

// Open returns backend.Unsupported and an error: this build has no
// enforcement backend for the host's OS, and the agent refuses to pretend.
func Open(backend.Config) (backend.Backend, error) {
	return backend.Unsupported{}, fmt.Errorf("%w: no enforcement backend for %s in this build", backend.ErrNotSupported, runtime.GOOS)
}

// Remove has nothing to remove.
func Remove(backend.Config) error {
	return fmt.Errorf("%w: no enforcement backend for %s in this build", backend.ErrNotSupported, runtime.GOOS)
}

// CheckConfig accepts any configuration: nothing will be opened with it.
func CheckConfig(backend.Config) error { return nil }

// Main returns at once: no re-executed modes off Linux.
func Main() {}

// Start is nil: no backend here prepares launches.
var Start backend.StartFunc
