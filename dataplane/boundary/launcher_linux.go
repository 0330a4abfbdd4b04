package boundary

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// openLauncher opens the dedicated launcher binary (path, or shinken-launch
// next to the running executable), or, when it is missing or unsafe, our
// own binary, which must have called Main; what says which, and why.
func openLauncher(path string) (*os.File, string, error) {
	if path == "" {
		self, err := os.Executable()
		if err != nil {
			return nil, "", fmt.Errorf("boundary: own executable: %w", err)
		}
		path = filepath.Join(filepath.Dir(self), LauncherName)
	}
	f, err := openBinary(path)
	if err == nil {
		return f, path + " (dedicated launcher binary)", nil
	}
	reason := fmt.Sprintf("launcher %s unusable (%v)", path, err)
	if !mainCalled {
		return nil, "", fmt.Errorf("boundary: %s, and this binary never called boundary.Main, so it cannot be re-executed instead", reason)
	}
	self, err := os.Open("/proc/self/exe")
	if err != nil {
		return nil, "", fmt.Errorf("boundary: %s; open own binary: %w", reason, err)
	}
	return self, "re-execution of the agent's own binary (slower: every launch runs its package initialisers): " + reason, nil
}

// openBinary opens path if it is an executable regular file that only root
// can write.
func openBinary(path string) (*os.File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err = unix.Fstat(int(f.Fd()), &st); err == nil {
		switch {
		case st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mode&0o111 == 0:
			err = errors.New("not an executable regular file")
		case st.Uid != 0 || st.Mode&0o022 != 0:
			err = fmt.Errorf("owned by uid %d, mode %o: only root may be able to write the launcher", st.Uid, st.Mode&0o7777)
		}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// openExec opens the C launcher (path, or shinken-exec next to the
// dedicated launcher, or next to the running executable); when it is
// missing or unsafe, launches use the Go launcher's launch mode. report
// says which binary does what, and why.
func openExec(path, launcher, initWhat string) (f *os.File, report string) {
	if path == "" {
		if launcher == "" {
			launcher, _ = os.Executable()
		}
		path = filepath.Join(filepath.Dir(launcher), ExecName)
	}
	f, err := openBinary(path)
	if err != nil {
		return nil, fmt.Sprintf("launches: the Go launcher's launch mode (slower: C launcher %s unusable: %v); session init: %s", path, err, initWhat)
	}
	return f, fmt.Sprintf("launches: %s (C launcher); session init: %s", path, initWhat)
}

// Launcher says which binaries are executed for session processes and
// sessions' inits, and why.
func (b *Boundary) Launcher() string { return b.launcher }
