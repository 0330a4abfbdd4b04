package boundary

import (
	"strings"

	"golang.org/x/sys/unix"
)

// adoptScan is what Adopt reads of a session cgroup an earlier agent
// made, in as few system calls as that takes (a restart pays it once per
// session, and with os.ReadFile and filepath.Glob's extra fcntl, epoll
// and fstat calls it was a third of a restart at 20,000 sessions; the
// directory is read only when its link count says it has child cgroups):
// it removes the empty run cgroups (run-*) left there, and returns
// cgroup.procs.
func adoptScan(cgroup string) (procs string, err error) {
	dfd, err := unix.Open(cgroup, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", err
	}
	defer unix.Close(dfd)
	buf := make([]byte, 4096)
	// A cgroup directory's link count is 2 plus its child cgroups: most
	// sessions have none, and their directory is not read.
	var st unix.Stat_t
	if err := unix.Fstat(dfd, &st); err != nil {
		return "", err
	}
	var runs []string
	if st.Nlink > 2 {
		rfd, err := unix.Openat(dfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", err
		}
		defer unix.Close(rfd)
		for {
			n, err := unix.ReadDirent(rfd, buf)
			if err != nil {
				return "", err
			}
			if n == 0 {
				break
			}
			_, _, names := unix.ParseDirent(buf[:n], -1, nil)
			for _, name := range names {
				if strings.HasPrefix(name, "run-") {
					runs = append(runs, name)
				}
			}
		}
	}
	// The processes of a run still going keep their cgroup (rmdir fails:
	// EBUSY); they end with the session.
	for _, r := range runs {
		_ = unix.Unlinkat(dfd, r, unix.AT_REMOVEDIR)
	}
	fd, err := unix.Openat(dfd, "cgroup.procs", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", err
	}
	defer unix.Close(fd)
	var b strings.Builder
	for {
		n, err := unix.Read(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return "", err
		}
		if n == 0 {
			return b.String(), nil
		}
		b.Write(buf[:n])
	}
}
