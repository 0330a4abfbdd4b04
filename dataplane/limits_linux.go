package dataplane

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// CheckLimits says whether every quota in l can be enforced here, without
// changing anything.
func (d *Dataplane) CheckLimits(l Limits) error {
	if l.CPUPercent > 100*1024 {
		return fmt.Errorf("%w: cpu_percent %d", ErrInvalidSession, l.CPUPercent)
	}
	need := l.Controllers()
	if len(need) == 0 {
		return nil
	}
	data, err := os.ReadFile(filepath.Join(d.cfg.CgroupRoot, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("%w: %v", ErrLimitsUnsupported, err)
	}
	have := strings.Fields(string(data))
	var missing []string
	for _, c := range need {
		found := false
		for _, h := range have {
			found = found || h == c
		}
		if !found {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: the cgroup2 hierarchy at %s has no %s controller (controllers: %q); on a hybrid host they are on cgroup v1",
			ErrLimitsUnsupported, d.cfg.CgroupRoot, strings.Join(missing, ", "), strings.TrimSpace(string(data)))
	}
	return nil
}

// SetLimits enables the needed controllers down to the session and writes its
// quotas. On error the session's quotas may be partly set; the caller ends
// the session (fail closed).
func (d *Dataplane) SetLimits(session string, l Limits) error {
	if err := d.CheckLimits(l); err != nil {
		return err
	}
	s, err := d.Session(session)
	if err != nil {
		return err
	}
	need := l.Controllers()
	if len(need) == 0 {
		return nil
	}
	// Enable the controllers in every cgroup from the root down to the
	// parent (the root's and our parent's subtree_control).
	rel, _ := filepath.Rel(d.cfg.CgroupRoot, d.parent)
	dirs := []string{d.cfg.CgroupRoot}
	cur := d.cfg.CgroupRoot
	for _, part := range strings.Split(rel, string(filepath.Separator)) {
		cur = filepath.Join(cur, part)
		dirs = append(dirs, cur)
	}
	var plus []string
	for _, c := range need {
		plus = append(plus, "+"+c)
	}
	for _, dir := range dirs {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte(strings.Join(plus, " ")), 0); err != nil {
			return fmt.Errorf("%w: enable %v in %s: %v", ErrLimitsUnsupported, need, dir, err)
		}
	}
	write := func(file, val string) error {
		if err := os.WriteFile(filepath.Join(s.Path, file), []byte(val), 0); err != nil {
			return fmt.Errorf("set %s of %s: %w", file, session, err)
		}
		return nil
	}
	if l.MemoryBytes > 0 {
		if err := write("memory.max", strconv.FormatUint(l.MemoryBytes, 10)); err != nil {
			return err
		}
	}
	if l.Pids > 0 {
		if err := write("pids.max", strconv.FormatUint(l.Pids, 10)); err != nil {
			return err
		}
	}
	if l.CPUPercent > 0 {
		const period = 100000
		if err := write("cpu.max", fmt.Sprintf("%d %d", uint64(l.CPUPercent)*period/100, period)); err != nil {
			return err
		}
	}
	return nil
}
