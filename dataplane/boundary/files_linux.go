package boundary

// Files in and out of a session's workspace (backend.SessionFiles), done by
// a thread of the agent that is, for the rest of its life, the session's:
// it joins the session's mount namespace (setns on the holder's pidfd)
// and takes the session's uid and gid with no supplementary group, on
// that thread alone (raw setresuid: Go's Setuid would change every
// thread). With every uid non-zero the kernel clears the thread's
// capabilities, so the thread reads and writes with exactly the access a
// session process has in exactly its view: the fs scope's live mounts,
// the read-only workspace, the protected paths' read-only binds, the
// masked credential paths, the idmapping that shows the workspace's files
// as the session's and keeps its new files the directory owner's on disk.
// Paths are opened with openat2 below the workspace's directory as opened
// in that view, RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS.
// The thread is never unlocked: Go ends it with its goroutine.
//
// Why a thread and not a process started through the launcher: a process
// needs a helper binary visible inside every session's view (the agent's
// binaries may be masked, and a test binary lives in the host's /tmp,
// which the session's own /tmp hides), and its data would cross a pipe.
// What the thread does not share with a session process: the seccomp
// filter and Landlock scoping (neither restricts files here), the
// session's cgroup (the page cache of a transfer is charged to the
// agent's), and the session's PID namespace (a session process cannot
// name the thread, and the thread is not dumpable once its credentials
// changed, so it cannot be traced).

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/shinken-agent/shinken/dataplane/boundary/child"
	"github.com/shinken-agent/shinken/dataplane/boundary/throwaway"

	"github.com/shinken-agent/shinken/agent/backend"
)

const beneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// asSession runs fn on a new locked thread in session name's mount
// namespace with the session's uid and gid and no capability.
func (b *Boundary) asSession(name string, fn func() error) error {
	if b.ready != nil {
		return b.ready
	}
	h, err := b.holderFor(name, true, true)
	if err != nil {
		return err
	}
	pidfd := -1
	if b.useNS {
		var err error
		if pidfd, err = h.open(); err != nil {
			return fmt.Errorf("boundary: files in %s: session holder: %w", name, err)
		}
		defer unix.Close(pidfd)
	}
	// The thread is the session's from here on.
	return throwaway.Run(func() error {
		if pidfd >= 0 {
			if err := unix.Unshare(unix.CLONE_FS); err != nil {
				return fmt.Errorf("boundary: unshare(CLONE_FS): %w", err)
			}
			if err := unix.Setns(pidfd, unix.CLONE_NEWNS); err != nil {
				return fmt.Errorf("boundary: join session mount namespace: %w", err)
			}
		}
		if err := dropToThread(h.uid, h.uid); err != nil {
			return fmt.Errorf("boundary: files in %s: %w", name, err)
		}
		return fn()
	})
}

// dropToThread gives the calling thread alone uid and gid, no
// supplementary group and (by the kernel's rule for a change to non-zero
// uids) no capability, and checks that none is left.
func dropToThread(uid, gid uint32) error {
	if err := child.SetThreadIDs(uid, gid); err != nil {
		return err
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	for _, d := range data {
		if d.Effective|d.Permitted != 0 {
			return errors.New("capabilities left after the change of uid")
		}
	}
	return nil
}

// openRoot opens root (the workspace's directory, as the session sees it)
// through no symbolic link.
func openRoot(root string) (int, error) {
	fd, err := unix.Openat2(unix.AT_FDCWD, root, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS})
	if err != nil {
		return -1, fileErr("workspace "+root, err)
	}
	return fd, nil
}

// checkRel refuses a rel that is not a clean relative path inside root
// (the kernel's RESOLVE_BENEATH refuses it too; this names the mistake).
func checkRel(rel string) error {
	if rel == "" || filepath.IsAbs(rel) || filepath.Clean(rel) != rel || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") {
		return fmt.Errorf("%w: %q", backend.ErrFileOutside, rel)
	}
	return nil
}

// fileErr names a failed open or rename in SessionFiles' terms.
func fileErr(what string, err error) error {
	switch {
	case errors.Is(err, unix.EXDEV), errors.Is(err, unix.ELOOP):
		return fmt.Errorf("%s: %w (%v)", what, backend.ErrFileOutside, err)
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR):
		return fmt.Errorf("%s: %w (%v)", what, backend.ErrFileNotFound, err)
	case errors.Is(err, unix.EROFS), errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM),
		errors.Is(err, unix.EBUSY), errors.Is(err, unix.EOVERFLOW):
		return fmt.Errorf("%s: %w (%v)", what, backend.ErrFileDenied, err)
	case errors.Is(err, unix.EISDIR):
		return fmt.Errorf("%s: %w (%v)", what, backend.ErrFileNotRegular, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// OpenFile opens root/rel for reading as session name (see backend.SessionFiles).
func (b *Boundary) OpenFile(name, root, rel string) (*os.File, error) {
	if err := checkRel(rel); err != nil {
		return nil, err
	}
	var f *os.File
	err := b.asSession(name, func() error {
		dir, err := openRoot(root)
		if err != nil {
			return err
		}
		defer unix.Close(dir)
		// O_NONBLOCK: a FIFO placed there does not hold the call.
		fd, err := unix.Openat2(dir, rel, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_NOCTTY | unix.O_NONBLOCK | unix.O_CLOEXEC, Resolve: beneath})
		if err != nil {
			return fileErr(rel, err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
			unix.Close(fd)
			if err != nil {
				return fileErr(rel, err)
			}
			return fmt.Errorf("%s: %w", rel, backend.ErrFileNotRegular)
		}
		f = os.NewFile(uintptr(fd), rel)
		return nil
	})
	return f, err
}

// WriteFile writes root/rel as session name (see backend.SessionFiles): a
// temporary name in rel's directory (O_EXCL), renamed over rel at the end,
// so that a failed or refused upload leaves nothing and a reader never
// sees half a file. The new file keeps the mode of the one it replaces
// (0644 for a new one).
func (b *Boundary) WriteFile(name, root, rel string, r io.Reader, max int64, commit func(int64) error) (int64, error) {
	if err := checkRel(rel); err != nil {
		return 0, err
	}
	var n int64
	err := b.asSession(name, func() error {
		rootfd, err := openRoot(root)
		if err != nil {
			return err
		}
		defer unix.Close(rootfd)
		dir := rootfd
		if d := filepath.Dir(rel); d != "." {
			if dir, err = unix.Openat2(rootfd, d, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: beneath}); err != nil {
				return fileErr(d, err)
			}
			defer unix.Close(dir)
		}
		base := filepath.Base(rel)
		mode := uint32(0o644)
		old, err := unix.Openat2(dir, base, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: beneath})
		switch {
		case err == nil:
			var st unix.Stat_t
			err = unix.Fstat(old, &st)
			unix.Close(old)
			if err != nil {
				return fileErr(rel, err)
			}
			if st.Mode&unix.S_IFMT != unix.S_IFREG {
				return fmt.Errorf("%s: %w", rel, backend.ErrFileNotRegular)
			}
			mode = st.Mode & 0o777
		case !errors.Is(err, unix.ENOENT):
			return fileErr(rel, err)
		}
		// A random temporary name, tried afresh if taken: the session can
		// see the directory and could plant the next name to stop uploads.
		var tmp string
		fd := -1
		for i := 0; fd < 0; i++ {
			var rnd [8]byte
			rand.Read(rnd[:])
			tmp = ".shinken-upload-" + hex.EncodeToString(rnd[:]) + "-" + base
			if len(tmp) > 255 {
				tmp = tmp[:255]
			}
			fd, err = unix.Openat(dir, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
			if err != nil && (!errors.Is(err, unix.EEXIST) || i == 7) {
				return fileErr(rel, err)
			}
		}
		f := os.NewFile(uintptr(fd), tmp)
		done := false
		defer func() {
			f.Close()
			if !done {
				unix.Unlinkat(dir, tmp, 0)
			}
		}()
		src := r
		if max > 0 {
			src = io.LimitReader(r, max+1)
		}
		if n, err = io.Copy(f, src); err != nil {
			return fileErr(rel, err)
		}
		if max > 0 && n > max {
			return fmt.Errorf("%s: %w (%d bytes)", rel, backend.ErrFileTooLarge, max)
		}
		if err := unix.Fchmod(fd, mode); err != nil {
			return fileErr(rel, err)
		}
		if err := f.Sync(); err != nil {
			return fileErr(rel, err)
		}
		// commit runs on another thread: the agent's own work (its
		// records) must never run with the session's view or identity.
		c := make(chan error, 1)
		go func() { c <- commit(n) }()
		if err := <-c; err != nil {
			return err
		}
		if err := unix.Renameat(dir, tmp, dir, base); err != nil {
			return fileErr(rel, err)
		}
		done = true
		return nil
	})
	return n, err
}
