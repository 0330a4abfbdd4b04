package boundary

// The user namespaces that idmapped mounts are made with (mounts_linux.go):
// one per (owner, group, session uid), made by a catatonit started in a new
// user namespace and kept open in a small cache, so that a grant or a
// workspace does not start a process each time.

import (
	"fmt"
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"
)

// idmapCacheSize bounds the namespaces kept open. Every fork the agent
// makes copies its descriptors (see holder), so the cache is small: a
// miss costs one catatonit start (about a millisecond), a kept entry
// one descriptor.
const idmapCacheSize = 64

type idmapKey struct{ owner, group, sess uint32 }

// idmapCache holds open user namespace descriptors, oldest evicted first.
// Guarded by Boundary.idmapMu.
type idmapCache struct {
	fds   map[idmapKey]int
	order []idmapKey
}

// idmapNS returns a descriptor (the caller's, to close) of a user
// namespace whose one mapping is owner -> sess (uid) and group -> sess
// (gid): the idmapping of a session's view of a directory owned by
// owner:group. A namespace holds only its mapping, so one made for an
// earlier session of the same uid is the same mapping.
func (b *Boundary) idmapNS(owner, group, sess uint32) (int, error) {
	k := idmapKey{owner, group, sess}
	b.idmapMu.Lock()
	defer b.idmapMu.Unlock()
	if fd, ok := b.idmaps.fds[k]; ok {
		return unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	}
	fd, err := b.newIdmapNS(owner, group, sess)
	if err != nil {
		return -1, err
	}
	if b.idmaps.fds == nil {
		b.idmaps.fds = map[idmapKey]int{}
	}
	if len(b.idmaps.order) >= idmapCacheSize {
		old := b.idmaps.order[0]
		b.idmaps.order = b.idmaps.order[1:]
		unix.Close(b.idmaps.fds[old])
		delete(b.idmaps.fds, old)
	}
	b.idmaps.fds[k] = fd
	b.idmaps.order = append(b.idmaps.order, k)
	return unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
}

// newIdmapNS makes the namespace: held by a catatonit started in it, which
// is killed and reaped once its namespace is open.
func (b *Boundary) newIdmapNS(owner, group, sess uint32) (int, error) {
	cmd := &exec.Cmd{Path: b.cfg.Catatonit, Args: []string{"catatonit", "-P"}, Env: []string{}}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: int(owner), HostID: int(sess), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: int(group), HostID: int(sess), Size: 1}},
		Pdeathsig:   unix.SIGKILL,
	}
	// Start returns once the maps are written and catatonit executes.
	if err := cmd.Start(); err != nil {
		return -1, fmt.Errorf("idmap user namespace: %w", err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	ns, err := unix.Open(fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("idmap user namespace: %w", err)
	}
	return ns, nil
}

func (b *Boundary) closeIdmaps() {
	b.idmapMu.Lock()
	defer b.idmapMu.Unlock()
	for _, fd := range b.idmaps.fds {
		unix.Close(fd)
	}
	b.idmaps = idmapCache{}
}
