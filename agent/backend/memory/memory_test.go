package memory_test

import (
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/backend/backendtest"
	"github.com/shinken-agent/shinken/agent/backend/memory"
)

// TestConformance runs the seam's suite on the memory backend, its use
// checks included (the backend is its own backendtest.User).
func TestConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) backend.Backend {
		b, err := memory.New(memory.Config{MaxSessions: 256, MaxHandles: 1024})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Uninstall() })
		return b
	})
}
