package kerneltest

import (
	"fmt"
	"testing"
)

// recorder is a testing.TB that records Fatalf and Skipf instead of
// stopping.
type recorder struct {
	testing.TB
	fatal, skip string
}

func (r *recorder) Helper()                      {}
func (r *recorder) Fatalf(f string, args ...any) { r.fatal = fmt.Sprintf(f, args...) }
func (r *recorder) Skipf(f string, args ...any)  { r.skip = fmt.Sprintf(f, args...) }

// TestRequirePrograms: a missing program skips the test outside CI, and
// fails it under CI or where ProgramsEnv names it (the VM of .ci/vmtest),
// so a test cannot quietly stop running where its programs are promised.
func TestRequirePrograms(t *testing.T) {
	const absent = "shinken-no-such-program"
	for _, c := range []struct {
		what, ci, promised, name string
		fatal, skip              bool
	}{
		{"present", "", "", "sh", false, false},
		{"missing, not promised", "", "", absent, false, true},
		{"missing, another promised", "", "git,gcc", absent, false, true},
		{"missing, promised", "", "git," + absent, absent, true, true},
		{"missing under CI", "1", "", absent, true, true},
	} {
		t.Run(c.what, func(t *testing.T) {
			t.Setenv("CI", c.ci)
			t.Setenv(ProgramsEnv, c.promised)
			r := &recorder{TB: t}
			RequirePrograms(r, c.name)
			if (r.fatal != "") != c.fatal || (r.skip != "") != c.skip {
				t.Errorf("RequirePrograms(%s): fatal %q, skip %q; want fatal %v, skip %v", c.name, r.fatal, r.skip, c.fatal, c.skip)
			}
			r = &recorder{TB: t}
			if have := HaveProgram(r, c.name); have != (c.name == "sh") || (r.fatal != "") != c.fatal {
				t.Errorf("HaveProgram(%s) = %v, fatal %q; want fatal %v", c.name, have, r.fatal, c.fatal)
			}
		})
	}
}
