package dataplane

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/cgroups/v3/cgroup2"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// FindCgroup2Mount returns the mount point of the cgroup2 hierarchy, read from
// the mount table (/proc/thread-self/mountinfo) with moby/sys/mountinfo:
// unified hosts mount it at /sys/fs/cgroup, hybrid hosts somewhere below,
// such as /sys/fs/cgroup/unified. The first cgroup2 mount listed wins.
func FindCgroup2Mount() (string, error) {
	mounts, err := mountinfo.GetMounts(firstCgroup2)
	return cgroup2MountOf(mounts, err)
}

// cgroup2MountFrom is FindCgroup2Mount on a mountinfo text (tests).
func cgroup2MountFrom(r io.Reader) (string, error) {
	mounts, err := mountinfo.GetMountsFromReader(r, firstCgroup2)
	return cgroup2MountOf(mounts, err)
}

// firstCgroup2 keeps the first cgroup2 mount and stops there.
func firstCgroup2(m *mountinfo.Info) (skip, stop bool) {
	if m.FSType != "cgroup2" {
		return true, false
	}
	return false, true
}

func cgroup2MountOf(mounts []*mountinfo.Info, err error) (string, error) {
	if err != nil {
		return "", fmt.Errorf("find cgroup2 mount: %w", err)
	}
	if len(mounts) == 0 {
		return "", fmt.Errorf("find cgroup2 mount: %w: no cgroup2 hierarchy is mounted", ErrNotSupported)
	}
	return mounts[0].Mountpoint, nil
}

// loadCgroup returns the containerd cgroup2 manager of the cgroup2 directory
// path below the mount point root. It creates nothing.
func loadCgroup(root, path string) (*cgroup2.Manager, error) {
	rel, err := filepath.Rel(root, path)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return nil, fmt.Errorf("%s is not below the cgroup2 root %s", path, root)
	}
	m, err := cgroup2.Load(filepath.Join("/", rel), cgroup2.WithMountpoint(root))
	if err != nil {
		return nil, fmt.Errorf("cgroup %s: %w", path, err)
	}
	return m, nil
}

// cgroupID returns the id the kernel uses for the cgroup2 directory at path
// (what bpf_get_current_cgroup_id() and friends return): its kernfs node id,
// which is the directory's inode number.
func cgroupID(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("cgroup id of %s: %w", path, err)
	}
	return st.Ino, nil
}

// cgroupLevel is the depth of path below the cgroup2 root (the root is 0).
func cgroupLevel(root, path string) (int, error) {
	rel, err := filepath.Rel(root, path)
	if err != nil || strings.HasPrefix(rel, "..") {
		return 0, fmt.Errorf("%s is not below the cgroup2 root %s", path, root)
	}
	if rel == "." {
		return 0, nil
	}
	return len(strings.Split(rel, string(filepath.Separator))), nil
}

// killCgroup kills every process of the cgroup at path, below the cgroup2
// mount point root (cgroup.kill, Linux 5.14+, through the containerd cgroup2
// manager), waits until it is empty, then removes the directory. Only ever
// called on cgroups this package created.
func killCgroup(root, path string) error {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	// Manager.Kill falls back to freezing and signalling each process when
	// it cannot write cgroup.kill; a kernel without cgroup.kill (before 5.14)
	// gets no kill here, as before, and the removal below fails while
	// processes remain.
	if _, err := os.Stat(filepath.Join(path, "cgroup.kill")); err == nil {
		m, err := loadCgroup(root, path)
		if err != nil {
			return err
		}
		if err := m.Kill(); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("kill processes of %s: %w", path, err)
		}
	}
	var err error
	for i := 0; i < 2000; i++ { // up to ~10 s
		// The cgroups of runs (package boundary) go first: a cgroup with
		// children cannot be removed. The kill above reached them too.
		if ents, _ := os.ReadDir(path); len(ents) > 0 {
			for _, e := range ents {
				if e.IsDir() {
					_ = unix.Rmdir(filepath.Join(path, e.Name()))
				}
			}
		}
		if err = unix.Rmdir(path); err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			break
		}
		sleepBriefly(i)
	}
	return fmt.Errorf("remove cgroup %s: %w", path, err)
}

// ensureBPFFS makes sure dir is on a bpf filesystem, mounting one at dir when
// it is a plain directory (hosts without systemd leave /sys/fs/bpf unmounted).
func ensureBPFFS(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		if !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("statfs %s: %w", dir, err)
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("create %s: %w", dir, err)
		}
		if err := unix.Statfs(dir, &st); err != nil {
			return fmt.Errorf("statfs %s: %w", dir, err)
		}
	}
	if st.Type == unix.BPF_FS_MAGIC {
		return nil
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpffs at %s: %w", dir, err)
	}
	return nil
}
