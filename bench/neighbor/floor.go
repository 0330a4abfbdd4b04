//go:build linux

package main

// The grant floor beside B's grants (package grantfloor): a child of this
// binary (-grant-floor-serve) at the agent's CPU weight.

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/shinken-agent/shinken/bench/internal/grantfloor"
)

// serveFloor is the child: it serves until killed.
func serveFloor(sock string) error {
	return grantfloor.Serve(sock, *flagFloorAudit, *flagFloorJourn, nil)
}

// startFloor starts the child in dir (on the state directory's file
// system) at the CPU weight of the agent (agentPID), its records as long
// as the mean line of the daemon's audit log and state journal in
// stateDir.
func startFloor(dir, stateDir string, agentPID int) (*grantfloor.Floor, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	logLine, journal, err := grantfloor.Sizes(stateDir)
	if err != nil {
		return nil, err
	}
	sock := filepath.Join(dir, "floor.sock")
	f, err := grantfloor.Start(sock, agentPID, "-grant-floor-serve", sock, "-grant-floor-audit-bytes", fmt.Sprint(logLine), "-grant-floor-journal-bytes", fmt.Sprint(journal))
	if err != nil {
		return nil, err
	}
	fmt.Printf("grant floor: records of %d bytes (audit log) and %d (state journal), the daemon's mean lines; %s (the agent's CPU weight)\n", logLine, journal, f.Autogroup)
	return f, nil
}
