package backend

import (
	"errors"
	"fmt"
)

// Socket grants (FileConnect): a session's /run is its own, empty; a
// connect entry puts one host UNIX socket back at its path.

// SocketDirs are the directories whose host sockets a session reaches only
// through a connect entry (a session's view replaces them by its own).
// /var/run is the usual link to /run; where it is a directory of its own
// it is replaced too, and a connect entry names its socket as /var/run/...
var SocketDirs = []string{"/run", "/var/run"}

// ContainerRuntimeSockets are the container runtimes' sockets and
// directories: Block tier, no connect entry reaches them (root on the host
// through any of them).
var ContainerRuntimeSockets = []string{"/run/docker.sock", "/var/run/docker.sock", "/run/containerd", "/run/crio", "/run/podman", "/run/user"}

// ErrSocketBlocked is wrapped when a connect entry names a container
// runtime socket or a credential location.
var ErrSocketBlocked = errors.New("backend: socket is Block tier")

// CheckSocketEntry refuses a connect entry outside SocketDirs (the host's
// own permissions hold there: an entry would add nothing) and one under a
// container runtime socket or a credential location of never; other
// entries pass.
func CheckSocketEntry(e FileEntry, never []string) error {
	if e.Access != FileConnect {
		return nil
	}
	in := false
	for _, d := range SocketDirs {
		if e.Path != d && PathUnder(e.Path, d) {
			in = true
		}
	}
	if !in {
		return fmt.Errorf("%w: %s: a socket grant names a socket below %v (elsewhere the host's own permissions hold)", ErrInvalidFileEntry, e, SocketDirs)
	}
	for _, l := range [][]string{ContainerRuntimeSockets, never} {
		for _, n := range l {
			if PathUnder(e.Path, n) {
				return fmt.Errorf("%w: %s lies under %s (container runtime sockets and credential locations are never granted)", ErrSocketBlocked, e, n)
			}
		}
	}
	return nil
}
