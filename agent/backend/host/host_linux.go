package host

import (
	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/dataplane"
	"github.com/shinken-agent/shinken/dataplane/boundary"
)

func dataplaneConfig(cfg backend.Config) (dataplane.Config, error) {
	mode, err := dataplane.ParseFlowMode(cfg.FlowMode)
	if err != nil {
		return dataplane.Config{}, err
	}
	// Every session gets the session boundary (own uid, namespaces, the
	// launcher).
	bc := &boundary.Config{UIDBase: cfg.SessionUIDBase, UIDCount: cfg.SessionUIDCount,
		AllowUserNS: cfg.SessionAllowUserNS, AllowIOURing: cfg.SessionAllowIOURing, Accept: cfg.AcceptWeaker,
		TmpfsBytes: cfg.SessionTmpfsBytes, MaxProcs: cfg.SessionMaxProcs,
		FileNever: boundary.DefaultFileNever(cfg.FileNeverExtra...), FileNeverFixed: boundary.FixedFileNever(cfg.FileNeverExtra...), PersistDir: cfg.PersistDir}
	dc := dataplane.Config{Parent: cfg.CgroupParent, PinPath: cfg.PinPath, FlowMode: mode, MaxSessions: cfg.MaxSessions, Boundary: bc, MaxDNSEntries: cfg.SessionMaxDNSEntries,
		MaxSocketsPerSession: cfg.SessionMaxSockets, MaxPortsPerSession: cfg.SessionMaxPorts,
		DenialEventRate: cfg.SessionDenialEventRate, DenialEventBurst: cfg.SessionDenialEventBurst}
	return dc, dc.Check()
}

// Open loads (or adopts) the Linux dataplane.
func Open(cfg backend.Config) (backend.Backend, error) {
	dc, err := dataplaneConfig(cfg)
	if err != nil {
		return nil, err
	}
	d, err := dataplane.Open(dc)
	if err != nil {
		return nil, err
	}
	return d, nil
}

// Remove uninstalls what Open installed (programs, pins, the empty session
// parent) without a running agent.
func Remove(cfg backend.Config) error {
	dc, err := dataplaneConfig(cfg)
	if err != nil {
		return err
	}
	return dataplane.Remove(dc)
}

// CheckConfig validates cfg without opening anything.
func CheckConfig(cfg backend.Config) error {
	_, err := dataplaneConfig(cfg)
	return err
}

// Main runs the session launcher's re-executed modes (package
// dataplane/boundary) and returns in any other process. The daemon calls it
// first thing.
func Main() { boundary.Main() }

// Start starts a launch the backend prepared (backend.Preparer), from the
// calling process: what the session runtime's shim calls.
var Start backend.StartFunc = dataplane.StartPrepared
