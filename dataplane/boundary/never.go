package boundary

import (
	"bufio"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// HomeCredentials are the credential directories, relative to a home,
// that no session's view opens.
var HomeCredentials = []string{".ssh", ".aws", ".config/gcloud", ".gnupg", ".kube", ".docker"}

// DefaultFileNever is the credential locations of this host: root's home,
// the shadow files, the container runtimes' sockets, the credential
// directories of every home named in /etc/passwd, and extra (the agent's
// state and policy directories, its API socket's directory; those not
// absolute are skipped); each resolved through
// symbolic links where it exists, cleaned, sorted.
func DefaultFileNever(extra ...string) []string {
	out := []string{"/root", "/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-", "/etc/sudoers", "/etc/sudoers.d",
		"/run/docker.sock", "/run/containerd", "/run/podman", "/run/crio", "/run/user"}
	if f, err := os.Open("/etc/passwd"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fs := strings.Split(sc.Text(), ":")
			if len(fs) < 6 || !filepath.IsAbs(fs[5]) || filepath.Clean(fs[5]) == "/" {
				continue
			}
			for _, c := range HomeCredentials {
				out = append(out, filepath.Join(fs[5], c))
			}
		}
		f.Close()
	}
	return resolveNever(append(out, FixedFileNever(extra...)...))
}

// FixedFileNever is extra as DefaultFileNever has it (absolute paths
// only, resolved, cleaned, sorted): the agent's own locations, which no
// admin override lifts (Config.FileNeverFixed).
func FixedFileNever(extra ...string) []string {
	var out []string
	for _, p := range extra {
		if filepath.IsAbs(p) {
			out = append(out, p)
		}
	}
	return resolveNever(out)
}

// resolveNever resolves each path through symbolic links where it exists,
// cleans and sorts them.
func resolveNever(out []string) []string {
	for i, p := range out {
		p = filepath.Clean(p)
		if r, err := filepath.EvalSymlinks(p); err == nil {
			p = r
		}
		out[i] = p
	}
	slices.Sort(out)
	return slices.Compact(out)
}
