//go:build !unix

package procs

import (
	"errors"
	"os"
	"syscall"

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
