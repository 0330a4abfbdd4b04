package api

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"unsafe"

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
	return context.WithValue(ctx, credsKey{}, creds)
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

// inCgroup reports whether pid's cgroup2 path is at or below dir. A process
// whose cgroup cannot be read is treated as inside (fail closed).
func inCgroup(pid int32, dir string) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return true
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "0::"); ok {
			rest = filepath.Clean(rest)
			return rest == dir || strings.HasPrefix(rest, dir+"/")
		}
	}
	return false
}
