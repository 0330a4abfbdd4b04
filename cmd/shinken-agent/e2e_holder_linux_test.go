package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shinken-agent/shinken/agent/api/wire"
)

// TestSessionHolderShown (issue 21): through the real daemon, a created
// session has no holder and no process in its cgroup, `session show` and
// `session ls` say so; a `run` starts the holder, and both say it runs.
func TestSessionHolderShown(t *testing.T) {
	e := newEnv(t)
	e.startAgent()
	e.mustCtl("session", "create", "lazy", "-image", "e2e")
	procs, err := os.ReadFile(filepath.Join(e.cgroupDir, "lazy", "cgroup.procs"))
	if err != nil || strings.TrimSpace(string(procs)) != "" {
		t.Errorf("after create: cgroup.procs %q (%v), want no process", procs, err)
	}
	holder := func() string {
		var v wire.SessionView
		e.ctlJSON(&v, "session", "show", "lazy")
		if v.Holder == nil {
			return "absent"
		}
		return map[bool]string{true: "true", false: "false"}[*v.Holder]
	}
	if h := holder(); h != "false" {
		t.Errorf("session show after create: holder %s, want false", h)
	}
	if ls := e.mustCtl("session", "ls"); !strings.Contains(ls, "HOLDER") || !strings.Contains(ls, " none ") {
		t.Errorf("session ls after create, want HOLDER none:\n%s", ls)
	}
	e.mustCtl("run", "lazy", "--", "true")
	if h := holder(); h != "true" {
		t.Errorf("session show after a run: holder %s, want true", h)
	}
	if ls := e.mustCtl("session", "ls"); !strings.Contains(ls, " running ") {
		t.Errorf("session ls after a run, want HOLDER running:\n%s", ls)
	}
}
