//go:build !linux

package main

import "errors"

// defaultAutogroupNice is agent_autogroup_nice's default (Linux only).
const defaultAutogroupNice = -10

// cpuGroup: autogroups are Linux's.
type cpuGroup struct{ err error }

func newCPUGroup(nice int) *cpuGroup {
	return &cpuGroup{err: errors.New("unavailable: autogroups are Linux's")}
}

func (g *cpuGroup) fact() string { return g.err.Error() }
