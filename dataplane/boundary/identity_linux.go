package boundary

// A session's user has a name and a home in its own view: sessions run as
// a uid of their own (the uid range), which the host's /etc/passwd does not
// name, so `whoami`, `id -un`, Python's getpass, ssh and a shell's prompt
// failed, and HOME pointed nowhere (pip, npm, go and git keep their caches
// and settings there). The holder's mount namespace gets, at its start:
//   - /etc/passwd and /etc/group: the host's (as they are at the holder's
//     start), less any entry named SessionUser or with the session's id,
//     plus the session's own entry (SessionUser, its uid and gid, home
//     SessionHome); read-only bind mounts of files on a small tmpfs of
//     their own, so the host's files are never written;
//   - SessionHome: a directory of the session's own in its private /tmp
//     (bounded with it by Config.TmpfsBytes), mode 0700.
// A host without a regular /etc/passwd (or /etc/group) keeps its view of
// that file: nothing is mounted over a link or a missing path.

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/shinken-agent/shinken/agent/backend"
	"golang.org/x/sys/unix"
)

// identitySource names the tmpfs the identity files live on in the mount
// table.
const identitySource = "shinken-identity"

// identityStage is where the identity tmpfs is attached for the moment on
// a kernel that clones no path of a detached mount (before Linux 6.15).
const identityStage = "/tmp/.shinken-identity"

// sessionIdentity lays out the session user's name and home in the current
// thread's mount namespace (the session's): see above.
func sessionIdentity(uid uint32) error {
	shell := "/bin/sh"
	if fi, err := os.Stat("/bin/bash"); err == nil && fi.Mode().IsRegular() {
		shell = "/bin/bash"
	}
	id := strconv.FormatUint(uint64(uid), 10)
	files := map[string]string{
		"/etc/passwd": fmt.Sprintf("%s:x:%s:%s:Shinken session user:%s:%s\n", backend.SessionUser, id, id, backend.SessionHome, shell),
		"/etc/group":  fmt.Sprintf("%s:x:%s:\n", backend.SessionUser, id),
	}
	// What the host's files hold now, and room for them: a host with a
	// large /etc/passwd (thousands of users) must not leave every session
	// without a start.
	host := map[string][]byte{}
	size := int64(1 << 20)
	for p := range files {
		fi, err := os.Lstat(p)
		if err != nil || !fi.Mode().IsRegular() {
			continue // a link or nothing: left as the host has it
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return fmt.Errorf("session identity: %w", err)
		}
		host[p] = data
		size += int64(len(data)) + int64(len(files[p])) + 4096
	}
	if len(host) == 0 {
		return sessionHome(uid)
	}
	fs, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("session identity: fsopen tmpfs: %w", err)
	}
	defer unix.Close(fs)
	for k, v := range map[string]string{"source": identitySource, "mode": "0755", "size": strconv.FormatInt(size, 10), "nr_inodes": "16"} {
		if err := unix.FsconfigSetString(fs, k, v); err != nil {
			return fmt.Errorf("session identity: tmpfs %s: %w", k, err)
		}
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return fmt.Errorf("session identity: tmpfs: %w", err)
	}
	mnt, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return fmt.Errorf("session identity: fsmount tmpfs: %w", err)
	}
	defer unix.Close(mnt)
	// Each file is cloned from the tmpfs as a mount of its own. Linux 6.15
	// and later clone a path of a detached mount (open_tree); before, that
	// is EINVAL, and the tmpfs is attached for the moment below the
	// session's own /tmp (a fresh tmpfs of its namespace: nothing of the
	// session's runs yet) and detached once the files are bound: one more
	// unmount, and so one more expedited RCU grace period, which
	// interrupts every CPU of the host.
	dir, at := mnt, ""
	staged := false
	defer func() {
		if staged {
			unix.Unmount(identityStage, unix.MNT_DETACH)
			unix.Rmdir(identityStage)
		}
	}()
	for _, p := range []string{"/etc/passwd", "/etc/group"} {
		if _, ok := host[p]; !ok {
			continue
		}
		data := withoutEntry(host[p], backend.SessionUser, id)
		data = append(data, files[p]...)
		name := p[len("/etc/"):]
		fd, err := unix.Openat(mnt, name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
		if err != nil {
			return fmt.Errorf("session identity: %s: %w", name, err)
		}
		_, werr := unix.Write(fd, data)
		unix.Close(fd)
		if werr != nil {
			return fmt.Errorf("session identity: write %s: %w", name, werr)
		}
		const clone = unix.OPEN_TREE_CLONE | unix.OPEN_TREE_CLOEXEC | unix.AT_SYMLINK_NOFOLLOW
		t, err := unix.OpenTree(dir, at+name, clone)
		if errors.Is(err, unix.EINVAL) && !staged {
			if err := unix.Mkdir(identityStage, 0o700); err != nil {
				return fmt.Errorf("session identity: %w", err)
			}
			if err := unix.MoveMount(mnt, "", unix.AT_FDCWD, identityStage, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
				unix.Rmdir(identityStage)
				return fmt.Errorf("session identity: attach tmpfs: %w", err)
			}
			staged, dir, at = true, unix.AT_FDCWD, identityStage+"/"
			t, err = unix.OpenTree(dir, at+name, clone)
		}
		if err != nil {
			return fmt.Errorf("session identity: clone %s: %w", name, err)
		}
		attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}
		if err := unix.MountSetattr(t, "", unix.AT_EMPTY_PATH, &attr); err != nil {
			unix.Close(t)
			return fmt.Errorf("session identity: make %s read-only: %w", name, err)
		}
		err = unix.MoveMount(t, "", unix.AT_FDCWD, p, unix.MOVE_MOUNT_F_EMPTY_PATH)
		unix.Close(t)
		if err != nil {
			return fmt.Errorf("session identity: mount %s: %w", p, err)
		}
	}
	return sessionHome(uid)
}

// sessionHome makes the session user's home in the session's own /tmp (a
// fresh tmpfs: nothing of the session's is there yet to race with).
func sessionHome(uid uint32) error {
	if err := unix.Mkdirat(unix.AT_FDCWD, backend.SessionHome, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("session identity: home: %w", err)
	}
	if err := unix.Fchownat(unix.AT_FDCWD, backend.SessionHome, int(uid), int(uid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("session identity: home: %w", err)
	}
	return nil
}

// withoutEntry returns a passwd or group file's lines less those whose name
// is name or whose id (third field) is id.
func withoutEntry(file []byte, name, id string) []byte {
	out := make([]byte, 0, len(file)+1)
	for line := range bytes.Lines(file) {
		line = bytes.TrimSuffix(bytes.TrimSuffix(line, []byte("\n")), []byte("\r"))
		f := bytes.SplitN(line, []byte(":"), 4)
		if len(f) >= 3 && (string(f[0]) == name || string(f[2]) == id) {
			continue
		}
		out = append(append(out, line...), '\n')
	}
	return out
}

// startDir is where a process of session name starts when its request
// names no directory: its workspace where its view has one, else the
// session user's home where its holder h made one (a holder an older agent
// made has none), else /. Without the session's own namespaces, /.
func (b *Boundary) startDir(name string, h *holder) string {
	if !b.useNS {
		return "/"
	}
	b.mu.Lock()
	var ws string
	if s := b.specs[name]; s != nil && s.Workspace != nil {
		ws = s.Workspace.Dir
	}
	b.mu.Unlock()
	if ws != "" {
		return ws
	}
	// Lstat: the session owns its home and may replace it by a link, which
	// the agent (root, resolving from the host's root) must not follow: a
	// followed link would tell the session which host paths are
	// directories.
	if fi, err := os.Lstat(fmt.Sprintf("/proc/%d/root%s", h.pid, backend.SessionHome)); err == nil && fi.IsDir() {
		return backend.SessionHome
	}
	return "/"
}
