//go:build !unix

package procs

import (
	"errors"
	"os"
	"os/exec"
	"syscall"

	"github.com/shinken-agent/shinken/agent/backend"

	"github.com/shinken-agent/shinken/agent/api/wire"
)

// Off Unix no backend prepares launches (backend.Preparer), so no shim
// runs; these keep the package building.

var signalNames = map[string]syscall.Signal{"INT": syscall.SIGINT, "KILL": syscall.SIGKILL, "TERM": syscall.SIGTERM}

func shimAttr() *syscall.SysProcAttr { return nil }

func setTermSize(*os.File, wire.TermSize) error { return errors.ErrUnsupported }

func rmdir(dir string) error { return os.Remove(dir) }

var errBusy = errors.New("busy")

func closeOnExecFrom(int) {}

func growPipe(*os.File, int) {}

// spliceToFile: no splice(2) here; the pump reads and writes.
func spliceToFile(*os.File, *os.File, int64, int, func(uint64) uint64) (int, error) {
	return 0, errors.ErrUnsupported
}

func createIndex(string) (*ringIndex, error) { return nil, errors.ErrUnsupported }
func openIndex(string) (*ringIndex, error)   { return nil, errors.ErrUnsupported }

// No spare shims (spare.go) either.
type spare struct{ cmd *exec.Cmd }

const spareDirPrefix = ".spare-"

func (m *Manager) takeSpare() *spare  { return nil }
func (m *Manager) refill()            {}
func (m *Manager) closeSpares()       {}
func (m *Manager) awaitReturn(*spare) {}

func (sp *spare) abandon()                                   {}
func (sp *spare) take(string) error                          { return errors.ErrUnsupported }
func (sp *spare) handJob(string, *os.File, []*os.File) error { return errors.ErrUnsupported }

func runSpare(backend.StartFunc) int { return 1 }

// awaitExit: Wait blocks (no pidfd here).
func awaitExit(int) {}

func taskStates(int) string { return "not read off Linux" }
