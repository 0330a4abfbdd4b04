package main

import (
	"path/filepath"

	"github.com/shinken-agent/shinken/agent/procs"
)

// openProcs opens the session runtime: the processes under
// STATE_DIR/procs, each held by a shim (shinken-shim next to this binary,
// or this binary re-executed), adopted again when the agent restarts; those
// of sessions that no longer exist are forgotten.
func (d *daemon) openProcs() error {
	shim, why := shimBinary()
	d.log.Info("session runtime", "shim", shim, "why", why)
	m, err := procs.Open(procs.Config{Dir: filepath.Join(d.cfg.StateDir, "procs"), Door: d.ag, RingBytes: d.cfg.ProcessRingBytes, Shim: shim},
		func(s string) bool { _, ok := d.ag.Session(s); return ok })
	if err != nil {
		return err
	}
	for _, e := range m.Unadopted() {
		d.log.Warn("session runtime: a process is not adopted (not listed; its shim keeps running)", "err", e)
	}
	d.procs = m
	remove := m.Remove
	d.sink.sessionEnded.Store(&remove) // however it ends (API, breaker, expiry)
	return nil
}
