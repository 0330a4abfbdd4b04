package api

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"unsafe"

	"github.com/containerd/cgroups/v3/cgroup2"
	"golang.org/x/sys/unix"
)

// ConnContext is an http.Server ConnContext that records the peer's
// credentials for every Unix-socket connection.
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return ctx
	}
	creds, err := peerCreds(uc)
	if err != nil {
		return ctx
	}
	return context.WithValue(ctx, credsKey{}, &connCreds{creds: creds})
}

func peerCreds(c *net.UnixConn) (Creds, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return Creds{}, err
	}
	var (
		cr     *unix.Ucred
		groups []uint32
		opErr  error
	)
	err = raw.Control(func(fd uintptr) {
		cr, opErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		if opErr != nil {
			return
		}
		buf := make([]uint32, 256)
		n := uint32(len(buf) * 4)
		_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_SOCKET, unix.SO_PEERGROUPS,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
		if e == 0 {
			groups = buf[:n/4]
		}
	})
	if err != nil {
		return Creds{}, err
	}
	if opErr != nil {
		return Creds{}, opErr
	}
	return Creds{PID: cr.Pid, UID: cr.Uid, GID: cr.Gid, Groups: groups}, nil
}

// inCgroup reports whether pid's cgroup2 path (its "0::" line of
// /proc/PID/cgroup, read by containerd's cgroup2.PidGroupPath) is at or below
// dir. A process whose cgroup2 path cannot be read is treated as inside (fail
// closed).
func inCgroup(pid int32, dir string) bool {
	p, err := cgroup2.PidGroupPath(int(pid))
	if err != nil {
		return true
	}
	p = filepath.Clean(p)
	return p == dir || strings.HasPrefix(p, dir+"/")
}
