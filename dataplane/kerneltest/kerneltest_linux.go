package kerneltest

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/shinken-agent/shinken/dataplane/probe"
)

// RequireRoot stops a kernel test that does not run as root: the kernel
// tests load BPF programs and make cgroups. Under CI (CI set, as .ci/run
// sets it) that is a failure, so a kernel test is never skipped there;
// elsewhere the test is skipped with the reason, so a developer without
// root runs every test that needs no kernel (the agent's on the memory
// backend) with a plain `go test ./...`.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	const why = "this test needs root (it loads BPF programs and makes cgroups); run the suite as root, as CI does"
	if os.Getenv("CI") != "" {
		t.Fatal(why)
	}
	t.Skip(why)
}

// Name is prefix followed by 8 random hex digits.
func Name(prefix string) string {
	b := make([]byte, 4)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// Private returns a parent cgroup name (relative to the cgroup2 root) and a
// pin path (/sys/fs/bpf/NAME) made from one Name(prefix): a dataplane
// configured with them touches no running agent's cgroups or pins, nor
// another test's.
func Private(prefix string) (parent, pinPath string) {
	n := Name(prefix)
	return n, "/sys/fs/bpf/" + n
}

// Dataplane is what Open needs of what it opens (a *dataplane.Dataplane).
type Dataplane interface{ Uninstall() error }

// Open checks for root, opens a dataplane with open (the test fails if that
// fails) and uninstalls it when the test ends: its programs, pins and session
// cgroups go, and an uninstall error fails the test.
func Open[D Dataplane](t testing.TB, open func() (D, error)) D {
	t.Helper()
	RequireRoot(t)
	d, err := open()
	if err != nil {
		t.Fatalf("open dataplane: %v", err)
	}
	t.Cleanup(func() {
		if err := d.Uninstall(); err != nil {
			t.Errorf("uninstall dataplane: %v", err)
		}
	})
	return d
}

// Run is the body of a TestMain for tests that re-execute their own binary:
// a process started with probe.EnvVar set serves the probe protocol, one
// started with a variable of modes set runs that mode's function (which
// must exit), and otherwise the tests run and the probe binary copy is
// removed. It returns the exit code for os.Exit.
func Run(m *testing.M, modes map[string]func()) int {
	if os.Getenv(probe.EnvVar) != "" {
		probe.Main()
	}
	for env, main := range modes {
		if os.Getenv(env) != "" {
			main()
			os.Exit(0)
		}
	}
	code := m.Run()
	probe.Cleanup()
	return code
}

// Main is Run followed by os.Exit.
func Main(m *testing.M, modes map[string]func()) { os.Exit(Run(m, modes)) }

// BinDirEnv names a directory of launchers built beforehand (shinken-launch
// and shinken-exec): .ci/vmtest sets it inside the VM, which has neither a
// Go toolchain nor a C compiler to build them with.
const BinDirEnv = "SHINKEN_TEST_BINDIR"

// Prebuilt returns the path of the program name in the directory BinDirEnv
// names, or "" when the variable is unset (the test then builds it). A
// variable that is set but names no such program is a failure, not a
// silent rebuild.
func Prebuilt(t testing.TB, name string) string {
	t.Helper()
	dir := os.Getenv(BinDirEnv)
	if dir == "" {
		return ""
	}
	p := filepath.Join(dir, name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s=%s: %v", BinDirEnv, dir, err)
	}
	return p
}

// ProgramsEnv names, separated by commas, the programs a test machine
// says it has: .ci/vmtest sets it inside the VM, whose disk of tools gives
// git, make, gcc and python3.
const ProgramsEnv = "SHINKEN_TEST_PROGRAMS"

// RequirePrograms skips a test whose commands need programs that are not
// on PATH, and says which. Under CI (CI set, as .ci/run sets it; its
// install-deps installs them), or where ProgramsEnv names a missing one
// (the VM of .ci/vmtest), that is a failure, so the test cannot quietly
// stop running there; elsewhere the test is skipped with the reason (a
// developer's host without gcc, say).
func RequirePrograms(t testing.TB, names ...string) {
	t.Helper()
	if missing := missingPrograms(t, names); len(missing) > 0 {
		t.Skipf("needs %s, not on PATH here (install them to run this test)", strings.Join(missing, ", "))
	}
}

// HaveProgram says whether program name is on PATH, for a test that
// leaves out (and logs) the cases that need it where it is missing; as
// RequirePrograms, it fails the test instead under CI or where
// ProgramsEnv names it.
func HaveProgram(t testing.TB, name string) bool {
	t.Helper()
	return len(missingPrograms(t, []string{name})) == 0
}

// missingPrograms returns those of names not on PATH, and fails the test
// if one of them must be there.
func missingPrograms(t testing.TB, names []string) []string {
	t.Helper()
	promised := strings.FieldsFunc(os.Getenv(ProgramsEnv), func(r rune) bool { return r == ',' || r == ' ' })
	var missing []string
	fail := os.Getenv("CI") != ""
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			missing = append(missing, n)
			fail = fail || slices.Contains(promised, n)
		}
	}
	if len(missing) > 0 && fail {
		t.Fatalf("needs %s, not on PATH here (CI=%q, %s=%q: this machine should have them)", strings.Join(missing, ", "), os.Getenv("CI"), ProgramsEnv, os.Getenv(ProgramsEnv))
	}
	return missing
}
