package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/backend/host"
)

// Config is the daemon's configuration: embedded defaults, then the config
// file (JSON), then flags.
type Config struct {
	StateDir        string   `json:"state_dir"`
	Socket          string   `json:"socket"`
	MetricsAddr     string   `json:"metrics_addr"`
	PolicyDir       string   `json:"policy_dir"`
	ManifestDir     string   `json:"manifest_dir"`
	OperatorGroup   string   `json:"operator_group"`
	CgroupParent    string   `json:"cgroup_parent"`
	PinPath         string   `json:"pin_path"`
	FlowMode        string   `json:"flow_mode"`
	DNSListen       string   `json:"dns_listen"`
	DNSUpstreams    []string `json:"dns_upstreams"`
	ApprovalTimeout duration `json:"approval_timeout"`
	BreakerConsec   int      `json:"breaker_consecutive"`
	BreakerTotal    int      `json:"breaker_total"`
	// MaxSessions is the most sessions live at once (0: the default,
	// 65536). It sizes the pinned per-session kernel tables: a new value
	// takes effect after `shinken-agent -uninstall` (the pinned tables of
	// the old size are refused, not resized). Each live session also
	// holds a process and its namespaces: see README, "Limits".
	MaxSessions uint32 `json:"max_sessions"`
	// The session boundary: the sessions' uid range (0: the default,
	// 1879048192 + 2^20), whether sessions may make user namespaces, and
	// the boundary mechanisms whose absence the operator accepts.
	SessionUIDBase      uint32 `json:"session_uid_base"`
	SessionUIDCount     uint32 `json:"session_uid_count"`
	SessionAllowUserNS  bool   `json:"session_allow_userns"`
	SessionAllowIOURing bool   `json:"session_allow_io_uring"`
	// Each session's /tmp and /dev/shm size, and its RLIMIT_NPROC (0: the
	// boundary's defaults, 256 MiB and 4096).
	SessionTmpfsBytes uint64 `json:"session_tmpfs_bytes"`
	SessionMaxProcs   uint32 `json:"session_max_procs"`
	// SessionMaxDNSEntries caps each session's DNS-derived kernel entries
	// (0: the default, 4096); past it the resolver refuses the answer with
	// a dns.deny event, reason entry_cap.
	SessionMaxDNSEntries uint32 `json:"session_max_dns_entries"`
	// SessionMaxSockets and SessionMaxPorts cap each session's open inet
	// sockets and the local ports they hold (0: the defaults, 4096 and
	// 1024); past them the call fails with EPERM and the kernel counts a
	// socket_limit or port_limit denial.
	SessionMaxSockets uint32 `json:"session_max_sockets"`
	SessionMaxPorts   uint32 `json:"session_max_ports"`
	// SessionDenialEventsPerSecond and SessionDenialEventBurst are each
	// session's in-kernel budget of denial events sent to the agent (0: the
	// defaults, 100 a second and 500 at once); past it the denials are
	// still counted in shinken_denials_total, the events not sent in
	// shinken_denial_events_suppressed_total and the audit log.
	SessionDenialEventsPerSecond uint32 `json:"session_denial_events_per_second"`
	SessionDenialEventBurst      uint32 `json:"session_denial_event_burst"`
	// AuditDenialBytesPerMinute is each session's ceiling on denial records
	// in the audit log (0: 256 KiB); past it they are held back and counted
	// in audit_suppressed records.
	AuditDenialBytesPerMinute int      `json:"audit_denial_bytes_per_minute"`
	BoundaryAccept            []string `json:"boundary_accept"`
	// The session runtime: what each process's output ring keeps per
	// stream (0: 1 MiB), and how long one API call waits on a process
	// (run) — the request's deadline, not the process's.
	ProcessRingBytes uint64   `json:"process_ring_bytes"`
	RequestTimeout   duration `json:"request_timeout"`
	// WorkspaceProtected: paths relative to a session's workspace kept
	// read-only in its view besides .git/hooks and .git/config.
	WorkspaceProtected []string `json:"workspace_protected"`
	// AgentCPUSliceUS is the EEVDF slice, in µs, the agent's own threads ask
	// the kernel for (Linux 6.12+; slice_linux.go): 0 is the default, 100
	// (the kernel's minimum: the agent preempts a busy session's tasks on
	// wakeup), -1 leaves the kernel's default; 100 to 100000 otherwise.
	// GET /v1/status says what was set (agent_cpu_slice).
	AgentCPUSliceUS int `json:"agent_cpu_slice_us"`
	// AgentAutogroupNice is the nice of the agent's autogroup, -20 to 19
	// (default -10; 0 leaves the kernel's default weight), written only
	// where autogroups share the CPU and the agent leads its own session
	// (cpugroup_linux.go). GET /v1/status says what holds (agent_cpu_group).
	AgentAutogroupNice int `json:"agent_autogroup_nice"`
	// DebugPprof serves the Go runtime's profiles on the API socket under
	// /debug/pprof/ (heap, goroutine, allocs, profile?seconds=N ...), to
	// root callers only; off by default.
	DebugPprof bool `json:"debug_pprof"`
	// AcceptPolicyWidening (flag only, never in the file): start even if
	// the policy directory is wider than the last applied set (audited).
	AcceptPolicyWidening bool `json:"-"`
}

type duration struct{ time.Duration }

func (d *duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration: want a string such as \"10m\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	d.Duration = v
	return nil
}

func (d duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

func defaults() Config {
	return Config{
		StateDir:        "/var/lib/shinken",
		Socket:          "/run/shinken/agent.sock",
		MetricsAddr:     "127.0.0.1:9464",
		PolicyDir:       "/etc/shinken/policy.d",
		ManifestDir:     "/etc/shinken/manifests",
		OperatorGroup:   "shinken",
		CgroupParent:    "shinken",
		PinPath:         "/sys/fs/bpf/shinken",
		FlowMode:        "auto",
		DNSListen:       "0.0.0.0:53053",
		ApprovalTimeout: duration{10 * time.Minute},
		BreakerConsec:   3,
		BreakerTotal:    20,
		RequestTimeout:  duration{60 * time.Second},

		AgentAutogroupNice: defaultAutogroupNice,
	}
}

// load reads the config file (absent is fine unless it was named explicitly)
// and applies the flags that were set.
func load(args []string) (Config, bool, error) {
	cfg := defaults()
	fs := flag.NewFlagSet("shinken-agent", flag.ContinueOnError)
	file := fs.String("config", "/etc/shinken/agent.json", "config file (JSON); optional; \"\" for none")
	uninstall := fs.Bool("uninstall", false, "detach and remove everything (kills all session processes), then exit")
	var over Config
	fs.StringVar(&over.StateDir, "state-dir", "", "state directory (default "+cfg.StateDir+")")
	fs.StringVar(&over.Socket, "socket", "", "API socket (default "+cfg.Socket+")")
	fs.StringVar(&over.MetricsAddr, "metrics-addr", "", "Prometheus listen address, loopback (default "+cfg.MetricsAddr+"; \"off\" disables)")
	fs.StringVar(&over.PolicyDir, "policy-dir", "", "Cedar policy directory (default "+cfg.PolicyDir+")")
	fs.StringVar(&over.ManifestDir, "manifest-dir", "", "image manifest directory (default "+cfg.ManifestDir+")")
	fs.StringVar(&over.OperatorGroup, "operator-group", "", "group whose members may use the API besides root (default "+cfg.OperatorGroup+"; \"-\" for root only)")
	fs.StringVar(&over.CgroupParent, "cgroup-parent", "", "sessions' parent cgroup below the cgroup2 mount (default "+cfg.CgroupParent+")")
	fs.StringVar(&over.PinPath, "pin-path", "", "bpffs directory for pins (default "+cfg.PinPath+")")
	fs.StringVar(&over.FlowMode, "flow-mode", "", "how open flows are cut when their grant dies: auto, sweep (socket iterators, Linux 6.5+) or packet (per-packet cgroup_skb check) (default "+cfg.FlowMode+")")
	fs.StringVar(&over.DNSListen, "dns-listen", "", "resolver address, 0.0.0.0:PORT (default "+cfg.DNSListen+")")
	acceptWiden := fs.Bool("accept-policy-widening", false, "start even if the policy directory widens the last applied policy set (the acceptance and the counterexample are audited)")
	pprofOn := fs.Bool("debug-pprof", false, "serve the Go runtime's profiles on the API socket under /debug/pprof/, to root only (default off)")
	reqTimeout := fs.Duration("request-timeout", 0, "how long one API call waits on a process, e.g. run (default 60s); processes outlive it")
	maxSessions := fs.Uint("max-sessions", 0, "most sessions live at once, 2 to 8388608 (default 65536; sizes the pinned kernel tables)")
	upstreams := fs.String("dns-upstreams", "", "comma-separated upstream resolvers ip:port (default: /etc/resolv.conf)")
	agNice := fs.Int("autogroup-nice", 0, "nice of the agent's autogroup, -20 to 19; 0 leaves the kernel's default weight (default -10; written only when the agent leads its own session)")
	sliceUS := fs.Int("cpu-slice-us", 0, "the EEVDF slice in µs of the agent's own threads, 100 to 100000, -1 for the kernel's default (default 100)")
	if err := fs.Parse(args); err != nil {
		return cfg, false, err
	}
	explicit, agNiceSet := false, false
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "config":
			explicit = true
		case "autogroup-nice":
			agNiceSet = true
		}
	})
	if *file == "" {
		*file = "/nonexistent/shinken-agent.json"
		explicit = false
	}
	data, err := os.ReadFile(*file)
	switch {
	case err == nil:
		dec := json.NewDecoder(bytesReader(data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&cfg); err != nil {
			return cfg, false, fmt.Errorf("config %s: %w", *file, err)
		}
	case errors.Is(err, os.ErrNotExist) && !explicit:
	default:
		return cfg, false, fmt.Errorf("config: %w", err)
	}
	set := func(dst *string, v string) {
		if v != "" {
			*dst = v
		}
	}
	set(&cfg.StateDir, over.StateDir)
	set(&cfg.Socket, over.Socket)
	set(&cfg.MetricsAddr, over.MetricsAddr)
	set(&cfg.PolicyDir, over.PolicyDir)
	set(&cfg.ManifestDir, over.ManifestDir)
	set(&cfg.OperatorGroup, over.OperatorGroup)
	set(&cfg.CgroupParent, over.CgroupParent)
	set(&cfg.PinPath, over.PinPath)
	set(&cfg.DNSListen, over.DNSListen)
	set(&cfg.FlowMode, over.FlowMode)
	cfg.AcceptPolicyWidening = *acceptWiden
	if *pprofOn {
		cfg.DebugPprof = true
	}
	if *reqTimeout != 0 {
		cfg.RequestTimeout.Duration = *reqTimeout
	}
	if *sliceUS != 0 {
		cfg.AgentCPUSliceUS = *sliceUS
	}
	switch s := cfg.AgentCPUSliceUS; {
	case s == 0, s == -1, s >= 100 && s <= 100000:
	default:
		return cfg, false, fmt.Errorf("agent_cpu_slice_us %d: want 100 to 100000, or -1 for the kernel's default", s)
	}
	if agNiceSet {
		cfg.AgentAutogroupNice = *agNice
	}
	if n := cfg.AgentAutogroupNice; n < -20 || n > 19 {
		return cfg, false, fmt.Errorf("agent_autogroup_nice %d: want -20 to 19 (0: the kernel's default weight)", n)
	}
	if *maxSessions != 0 {
		if *maxSessions > 1<<23 {
			return cfg, false, fmt.Errorf("-max-sessions %d out of [2, 2^23]", *maxSessions)
		}
		cfg.MaxSessions = uint32(*maxSessions)
	}
	if cfg.RequestTimeout.Duration <= 0 {
		return cfg, false, fmt.Errorf("request_timeout %v: must be positive", cfg.RequestTimeout.Duration)
	}
	if err := host.CheckConfig(cfg.backendConfig()); err != nil {
		return cfg, false, err
	}
	if b := cfg.AuditDenialBytesPerMinute; b != 0 && (b < 4096 || b > 1<<30) {
		return cfg, false, fmt.Errorf("audit_denial_bytes_per_minute %d out of [4096, 2^30] (0: the default)", b)
	}
	if *upstreams != "" {
		cfg.DNSUpstreams = splitComma(*upstreams)
	}
	return cfg, *uninstall, nil
}

// backendConfig is the part of the configuration the OS backend opens with.
func (c Config) backendConfig() backend.Config {
	return backend.Config{CgroupParent: c.CgroupParent, PinPath: c.PinPath, FlowMode: c.FlowMode, MaxSessions: c.MaxSessions,
		SessionUIDBase: c.SessionUIDBase, SessionUIDCount: c.SessionUIDCount,
		SessionAllowUserNS: c.SessionAllowUserNS, SessionAllowIOURing: c.SessionAllowIOURing, AcceptWeaker: c.BoundaryAccept,
		SessionTmpfsBytes: c.SessionTmpfsBytes, SessionMaxProcs: c.SessionMaxProcs, SessionMaxDNSEntries: c.SessionMaxDNSEntries,
		SessionMaxSockets: c.SessionMaxSockets, SessionMaxPorts: c.SessionMaxPorts,
		SessionDenialEventRate: c.SessionDenialEventsPerSecond, SessionDenialEventBurst: c.SessionDenialEventBurst,
		// The agent's own files are credential locations to a session:
		// no file grant opens them.
		FileNeverExtra: []string{c.StateDir, c.PolicyDir, filepath.Dir(c.Socket)},
		PersistDir:     filepath.Join(c.StateDir, "persist")}
}
