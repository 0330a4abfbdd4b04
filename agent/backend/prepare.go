package backend

import "os"

// Preparer is an optional role of a Launcher: it makes a launch ready
// without starting it, so that another process (the session runtime's
// per-process shim, outside the agent) starts it and is its parent. The
// shim then holds the process's stdio and reaps its exit status, so the
// process and its output outlive the agent. The shim starts it with the
// backend's StartFunc (linked into the shim's binary).
type Preparer interface {
	PrepareLaunch(session string, p LaunchSpec, opts LaunchOptions) (*PreparedLaunch, error)
}

// LaunchSpec is what a prepared launch runs: argv (argv[0] resolved inside
// the session), environment and working directory inside the session.
type LaunchSpec struct {
	Argv []string
	Env  []string
	Dir  string
}

// PreparedLaunch is a launch made ready by the backend but not started.
// Args and Files go to the starting process unchanged (Files as its
// descriptors 3, 4, ...); Close closes the caller's copies of Files and,
// when the launch was never started, removes what Prepare made.
type PreparedLaunch struct {
	Args  []string
	Files []*os.File
	// Tree is the cgroup directory holding the process and everything it
	// forks (cgroup.kill ends them all); "" when the backend has none.
	Tree string
	// Close releases the caller's descriptors; abandon also removes Tree.
	Close func(abandon bool)
}

// StartRequest is what a starter passes to a StartFunc: the prepared
// launch as it received it, and the process's stdio (nil with TTY: the
// StartFunc opens a terminal where the session's processes can reach it,
// and no other).
type StartRequest struct {
	Args                  []string
	Files                 []*os.File
	Stdin, Stdout, Stderr *os.File
	TTY                   bool
	Rows, Cols            uint16
}

// Started is a process a StartFunc started: the caller's child.
type Started struct {
	Process *os.Process
	// PTY is the terminal's master end (TTY only).
	PTY *os.File
}

// StartFunc starts a prepared launch from the calling process.
type StartFunc func(StartRequest) (Started, error)

// Freezer is an optional role: a backend that can stop every process of a
// session at once and let them go on later (Linux: cgroup v2
// cgroup.freeze).
type Freezer interface {
	// Freeze freezes (true) or thaws (false) session and returns once the
	// kernel reports it done, or an error after a bounded wait.
	Freeze(session string, frozen bool) error
	// Frozen says whether session is frozen.
	Frozen(session string) (bool, error)
}

// The session's user as its own processes see it: every session runs as a
// uid of its own, which its view names SessionUser (its /etc/passwd and
// /etc/group), with SessionHome, a directory of its own in its private
// /tmp, as home (where the backend has a session view; the Linux
// boundary's, dataplane/boundary/identity_linux.go).
const (
	SessionUser = "user"
	SessionHome = "/tmp/home"
)

// DefaultEnv is a process's environment in session when its request names
// none (the API's run and processes, the CLI, the panel's terminal).
func DefaultEnv(session string) []string {
	return []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + SessionHome,
		"USER=" + SessionUser, "LOGNAME=" + SessionUser, "SHINKEN_SESSION=" + session}
}
