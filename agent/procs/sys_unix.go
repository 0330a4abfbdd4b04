//go:build unix

package procs

import (
	"os"
	"syscall"

	"github.com/creack/pty"
	"github.com/shinken-agent/shinken/agent/api/wire"
	"golang.org/x/sys/unix"
)

var signalNames = map[string]syscall.Signal{
	"HUP": unix.SIGHUP, "INT": unix.SIGINT, "QUIT": unix.SIGQUIT, "KILL": unix.SIGKILL,
	"USR1": unix.SIGUSR1, "USR2": unix.SIGUSR2, "TERM": unix.SIGTERM, "STOP": unix.SIGSTOP,
	"CONT": unix.SIGCONT, "WINCH": unix.SIGWINCH, "ALRM": unix.SIGALRM, "PIPE": unix.SIGPIPE,
	"TSTP": unix.SIGTSTP, "ABRT": unix.SIGABRT, "SEGV": unix.SIGSEGV,
}

// shimAttr starts a shim in a session of its own: nothing sent to the
// agent's process group or terminal reaches it.
func shimAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setsid: true} }

func setTermSize(f *os.File, ts wire.TermSize) error {
	return pty.Setsize(f, &pty.Winsize{Rows: ts.Rows, Cols: ts.Cols})
}

func rmdir(dir string) error { return unix.Rmdir(dir) }

var errBusy error = unix.EBUSY
