package dataplane

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/containerd/cgroups/v3/cgroup2"
)

// CheckLimits says whether every quota in l can be enforced here, without
// changing anything: the cgroup2 root must offer every controller the quotas
// need (a hybrid host keeps them on cgroup v1, which is never written).
func (d *Dataplane) CheckLimits(l Limits) error {
	if l.CPUPercent > 100*1024 {
		return fmt.Errorf("%w: cpu_percent %d", ErrInvalidSession, l.CPUPercent)
	}
	if l.MemoryBytes > math.MaxInt64 || l.Pids > math.MaxInt64 {
		return fmt.Errorf("%w: memory_bytes %d, pids %d: above 2^63-1", ErrInvalidSession, l.MemoryBytes, l.Pids)
	}
	if l.Workspace != nil {
		if err := d.checkWorkspace(*l.Workspace); err != nil {
			return err
		}
	}
	need := l.Controllers()
	if len(need) == 0 {
		return nil
	}
	root, err := cgroup2.Load("/", cgroup2.WithMountpoint(d.cfg.CgroupRoot))
	if err != nil {
		return fmt.Errorf("%w: %v", ErrLimitsUnsupported, err)
	}
	have, err := root.RootControllers()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrLimitsUnsupported, err)
	}
	var missing []string
	for _, c := range need {
		if !slices.Contains(have, c) {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: the cgroup2 hierarchy at %s has no %s controller (controllers: %q); on a hybrid host they are on cgroup v1",
			ErrLimitsUnsupported, d.cfg.CgroupRoot, strings.Join(missing, ", "), strings.Join(have, " "))
	}
	return nil
}

// setLimits enables the needed controllers down to the session and writes its
// quotas, through the containerd cgroup2 manager. On error the session's
// quotas may be partly set; CreateSession ends the session (fail closed).
func (d *Dataplane) setLimits(session string, l Limits) error {
	if err := d.CheckLimits(l); err != nil {
		return err
	}
	s, err := d.Session(session)
	if err != nil {
		return err
	}
	if l.IsZero() {
		return nil
	}
	var res cgroup2.Resources
	if l.MemoryBytes > 0 {
		max := int64(l.MemoryBytes)
		res.Memory = &cgroup2.Memory{Max: &max}
	}
	if l.Pids > 0 {
		res.Pids = &cgroup2.Pids{Max: int64(l.Pids)}
	}
	if l.CPUPercent > 0 {
		const period = 100000
		quota := int64(l.CPUPercent) * period / 100
		per := uint64(period)
		res.CPU = &cgroup2.CPU{Max: cgroup2.NewCPUMax(&quota, &per)}
	}
	m, err := loadCgroup(d.cfg.CgroupRoot, s.Path)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrLimitsUnsupported, err)
	}
	// Enable the controllers in every cgroup from the root down to the
	// sessions' parent (their cgroup.subtree_control), then write the
	// session's own files.
	if err := m.ToggleControllers(res.EnabledControllers(), cgroup2.Enable); err != nil {
		return fmt.Errorf("%w: enable %v for %s: %v", ErrLimitsUnsupported, l.Controllers(), session, err)
	}
	if err := m.Update(&res); err != nil {
		return fmt.Errorf("set quotas of %s: %w", session, err)
	}
	return nil
}
