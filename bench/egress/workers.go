//go:build linux

package main

import (
	"os/exec"
	"path/filepath"

	"github.com/shinken-agent/shinken/bench/internal/connrounds"
	"github.com/shinken-agent/shinken/dataplane"
)

// Workers: probe processes inside a session, driven line by line
// (connrounds.Worker), stopped by the bench's cleanup.

func (b *bench) worker(s dataplane.Session) (*connrounds.Worker, error) {
	w, err := connrounds.StartWorker(filepath.Join(b.probeDir, "probe"), "", func(cmd *exec.Cmd) error { return b.start(s, cmd) })
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	b.procs = append(b.procs, w)
	b.mu.Unlock()
	return w, nil
}
