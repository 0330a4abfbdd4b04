package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
)

// Creds are the kernel's account of who is on the other end of a connection.
type Creds struct {
	PID    int32
	UID    uint32
	GID    uint32
	Groups []uint32
}

type credsKey struct{}

// connCreds are one connection's credentials and the Authorizer's verdict
// on them, reached once per connection (the first request): the kernel
// fixed the credentials at connect(2), and the verdict's one changing input,
// the cgroup of the process that connected, changes only if root moves that
// process (nothing else can move a process into a session's cgroup). Reading
// /proc/PID/cgroup on every request cost more than the decision itself.
type connCreds struct {
	creds Creds
	once  sync.Once
	err   error
}

// CredsFrom returns the peer credentials ConnContext stored.
func CredsFrom(ctx context.Context) (Creds, bool) {
	c, ok := ctx.Value(credsKey{}).(*connCreds)
	if !ok {
		return Creds{}, false
	}
	return c.creds, true
}

// checkConn is a.Check of the connection's credentials, decided at the
// connection's first request and kept for the rest.
func (a Authorizer) checkConn(ctx context.Context) error {
	c, ok := ctx.Value(credsKey{}).(*connCreds)
	if !ok {
		return errNoCreds
	}
	c.once.Do(func() { c.err = a.Check(c.creds) })
	return c.err
}

var errNoCreds = errors.New("permission denied: no peer credentials (the API is served on a Unix socket only)")

// Authorizer decides who may use the API.
type Authorizer struct {
	// OperatorGID, when >= 0, admits members of that group besides root.
	OperatorGID int
	// SessionsCgroup is the sessions' parent cgroup, relative to the
	// cgroup2 root (e.g. "/shinken"): a process inside it is refused.
	SessionsCgroup string
}

// ErrNotOperator is returned for callers that are neither root nor operators.
var ErrNotOperator = errors.New("permission denied: the Shinken API is for root and the operator group")

// Check admits or refuses a caller.
func (a Authorizer) Check(c Creds) error {
	if a.SessionsCgroup != "" && inCgroup(c.PID, a.SessionsCgroup) {
		return fmt.Errorf("%w (caller pid %d runs inside a session)", ErrNotOperator, c.PID)
	}
	if c.UID == 0 {
		return nil
	}
	if a.OperatorGID >= 0 {
		if c.GID == uint32(a.OperatorGID) {
			return nil
		}
		for _, g := range c.Groups {
			if g == uint32(a.OperatorGID) {
				return nil
			}
		}
	}
	return fmt.Errorf("%w (uid %d)", ErrNotOperator, c.UID)
}

// Listen makes the API socket, 0660, owned by root and the operator group
// (when set), replacing a stale socket. Its directory is made 0750 with
// the same owners when it is the socket's own: missing (made here) or
// holding nothing but the socket's name (the default /run/shinken, an
// earlier agent's). A directory that holds anything else is shared (-socket
// /tmp/x.sock, /run/x.sock): its owner and mode are the host's and are
// left as they are (making /tmp or /run 0750 root would lock every other
// user out of them), and the socket's own mode is what guards it; a
// shared directory that others may write to without the sticky bit is
// refused, since anyone could put their own socket at the path for
// operators to talk to.
func Listen(path string, operatorGID int) (net.Listener, error) {
	dir := filepath.Dir(path)
	gid := 0
	if operatorGID >= 0 {
		gid = operatorGID
	}
	own, err := socketDirOwn(dir, filepath.Base(path))
	if err != nil {
		return nil, fmt.Errorf("api socket dir: %w", err)
	}
	if own {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, fmt.Errorf("api socket dir: %w", err)
		}
		if err := os.Chown(dir, 0, gid); err != nil {
			return nil, fmt.Errorf("api socket dir: %w", err)
		}
		if err := os.Chmod(dir, 0o750); err != nil {
			return nil, fmt.Errorf("api socket dir: %w", err)
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale api socket: %w", err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("api socket: %w", err)
	}
	if err := os.Chown(path, 0, gid); err == nil {
		err = os.Chmod(path, 0o660)
	}
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("api socket permissions: %w", err)
	}
	return ln, nil
}

// socketDirOwn reports whether dir is the API socket's own directory:
// missing, or holding no entry but name. A shared directory writable by
// group or others without the sticky bit is an error.
func socketDirOwn(dir, name string) (bool, error) {
	fi, err := os.Stat(dir)
	if errors.Is(err, os.ErrNotExist) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	if !fi.IsDir() {
		return false, fmt.Errorf("%s is not a directory", dir)
	}
	f, err := os.Open(dir)
	if err != nil {
		return false, err
	}
	names, err := f.Readdirnames(2)
	f.Close()
	if err != nil && !errors.Is(err, io.EOF) {
		return false, err
	}
	if len(names) == 0 || (len(names) == 1 && names[0] == name) {
		return true, nil
	}
	if m := fi.Mode(); m&0o022 != 0 && m&os.ModeSticky == 0 {
		return false, fmt.Errorf("%s is shared and writable by others without the sticky bit (%v): anyone could put a socket of their own at the API's path; give the socket a directory of its own", dir, m)
	}
	return false, nil
}
