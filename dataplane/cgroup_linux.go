package dataplane

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// FindCgroup2Mount returns the mount point of the cgroup2 hierarchy, read from
// /proc/self/mountinfo (unified hosts mount it at /sys/fs/cgroup, hybrid hosts
// somewhere below, such as /sys/fs/cgroup/unified).
func FindCgroup2Mount() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", fmt.Errorf("find cgroup2 mount: %w", err)
	}
	defer f.Close()
	return parseCgroup2Mount(f)
}

func parseCgroup2Mount(f interface{ Read([]byte) (int, error) }) (string, error) {
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		// 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if sep < 5 || sep+1 >= len(fields) {
			continue
		}
		if fields[sep+1] == "cgroup2" {
			return unescapeMountPath(fields[4]), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("find cgroup2 mount: %w", err)
	}
	return "", fmt.Errorf("find cgroup2 mount: %w: no cgroup2 hierarchy is mounted", ErrNotSupported)
}

// unescapeMountPath undoes the octal escapes (\040 for space, ...) of mountinfo.
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }

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

// killCgroup kills every process of the cgroup (cgroup.kill, Linux 5.14+) and
// waits until it is empty, then removes the directory. Only ever called on
// cgroups this package created.
func killCgroup(path string) error {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := os.WriteFile(filepath.Join(path, "cgroup.kill"), []byte("1"), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("kill processes of %s: %w", path, err)
	}
	var err error
	for i := 0; i < 2000; i++ { // up to ~10 s
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
