package boundary

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/shinken-agent/shinken/agent/backend"
)

// Where BPF LSM is active the exec allowlist is the dataplane's (its
// lsm/bprm_check_security program, bpf/exec.bpf.c, keyed by the session's
// cgroup): the boundary resolves the granted programs in the session's
// view (ProgramFiles) and keeps the bound (BoundProcess); no fanotify
// mark, no memfd_noexec, no static launcher needed.

// ProgramFile is a granted program resolved in a session's view: the
// kernel's identity of the file (dev as the kernel's s_dev, major<<20 |
// minor, the encoding an LSM program reads).
type ProgramFile struct {
	Path string
	Dev  uint32
	Ino  uint64
	OK   bool // false: it did not resolve (lenient)
}

// Filesystems whose stat answers another device or inode number than the
// kernel's inode has: an exec entry there would never match.
var inodeMismatch = map[int64]string{0x9123683e: "btrfs", 0x794c7630: "overlayfs"}

// ProgramFiles resolves programs in session name's view (its root:
// symlinks followed inside it), one ProgramFile per program; with lenient
// a program that does not resolve has OK false instead of failing the
// call. Each must be an executable regular file on a filesystem whose
// stat numbers are the kernel inode's.
func (b *Boundary) ProgramFiles(name string, programs []string, lenient bool) ([]ProgramFile, error) {
	h, err := b.holderOf(name)
	if err != nil {
		return nil, err
	}
	root, err := unix.Open(fmt.Sprintf("/proc/%d/root", h.pid), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("session view: %w", err)
	}
	defer unix.Close(root)
	out := make([]ProgramFile, len(programs))
	for i, p := range programs {
		out[i] = ProgramFile{Path: p}
		dev, ino, err := programFile(root, p)
		if err != nil {
			if lenient {
				continue
			}
			return nil, fmt.Errorf("%w: exec %s: %w", backend.ErrInvalidProcessEntry, p, err)
		}
		out[i].Dev, out[i].Ino, out[i].OK = dev, ino, true
	}
	return out, nil
}

func programFile(root int, p string) (uint32, uint64, error) {
	fd, err := unix.Openat2(root, strings.TrimPrefix(p, "/"), &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS})
	if err != nil {
		return 0, 0, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, 0, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mode&0o111 == 0 {
		return 0, 0, errors.New("not an executable regular file")
	}
	var sf unix.Statfs_t
	if err := unix.Fstatfs(fd, &sf); err != nil {
		return 0, 0, err
	}
	if n, bad := inodeMismatch[int64(sf.Type)]; bad {
		return 0, 0, fmt.Errorf("on %s, whose stat numbers are not the kernel inode's: the LSM could not match it", n)
	}
	return unix.Major(st.Dev)<<20 | unix.Minor(st.Dev), st.Ino, nil
}

// BoundProcess marks session name gated (for its life: its launches get
// the bound, ProcessBound says gated) and bounds its processes: RLIMIT_NPROC
// of its uid, on its running processes and each launch, and pids.max of its
// cgroup where pids is on cgroup v2. The exec allowlist is the caller's.
func (b *Boundary) BoundProcess(name string, bound uint32) error {
	h, err := b.holderFor(name, false, false) // the cgroup and uid alone
	if err != nil {
		return err
	}
	b.exec.mu.Lock()
	defer b.exec.mu.Unlock()
	if b.exec.sessions == nil {
		b.exec.sessions = map[string]*procState{}
	}
	s := b.exec.sessions[name]
	if s == nil {
		s = &procState{}
		b.exec.sessions[name] = s
	}
	return s.setBound(h, bound)
}

// setBound sets s's bound on holder h's session; b.exec.mu held.
func (s *procState) setBound(h *holder, bound uint32) error {
	s.bound = bound
	return errors.Join(setNProc(h.cgroup, h.uid, bound), setPidsMax(h.cgroup, bound))
}
