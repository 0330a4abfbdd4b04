// Command shinken-agent is the Shinken node agent daemon. On embedded
// defaults it keeps state under /var/lib/shinken, serves the operator API on
// /run/shinken/agent.sock, Prometheus metrics on 127.0.0.1:9464, reads admin
// policy from /etc/shinken/policy.d and image manifests from
// /etc/shinken/manifests (an embedded default manifest otherwise), and runs
// the allowlisting DNS resolver every session's DNS is redirected to. Each is
// overridable by /etc/shinken/agent.json and by flags (-h lists them).
//
// Graceful shutdown leaves enforcement pinned in the kernel; start-up adopts
// it with no gap and no duplicate attach.
package main

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"os/user"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/shinken-agent/shinken/agent"
	"github.com/shinken-agent/shinken/agent/api"
	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/backend/host"
	"github.com/shinken-agent/shinken/agent/procs"
	"github.com/shinken-agent/shinken/dnsresolver"
)

//go:embed default.manifest
var defaultManifest []byte

func main() {
	host.Main()                // the session launcher re-executes this binary
	procs.ShimMain(host.Start) // and so does each session process's shim
	procs.CloseInheritedFDs()  // nothing the agent's parent left open reaches what it starts
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	err := run(log)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return // -h: the usage is the answer
	case err != nil:
		log.Error("shinken-agent", "err", err)
		os.Exit(1)
	}
}

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }

func splitComma(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func run(log *slog.Logger) error {
	cfg, uninstall, err := load(os.Args[1:])
	if err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return errors.New("must run as root (it loads BPF programs and manages cgroups)")
	}
	if uninstall {
		if err := host.Remove(cfg.backendConfig()); err != nil {
			return fmt.Errorf("uninstall: %w", err)
		}
		log.Info("uninstalled", "cgroup_parent", cfg.CgroupParent, "pins", cfg.PinPath)
		return nil
	}
	opGID := -1
	if cfg.OperatorGroup != "" && cfg.OperatorGroup != "-" {
		if g, err := user.LookupGroup(cfg.OperatorGroup); err == nil {
			opGID, _ = strconv.Atoi(g.Gid)
		} else {
			log.Warn("operator group not found: the API admits root only", "group", cfg.OperatorGroup)
		}
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}

	d, err := newDaemon(cfg, log)
	if err != nil {
		return err
	}
	defer d.close()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// SIGHUP re-reads the policy directory through the permissiveness gate:
	// a widening (or unproven) edit is refused and the previous set stays.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for range hup {
			rep, err := d.ag.ReloadPolicies(agent.ReloadOptions{})
			if err != nil {
				log.Error("policy reload refused; the previous set stays in force", "err", err)
				continue
			}
			log.Info("policy reloaded", "check", rep.Summary())
		}
	}()
	return d.serve(ctx, opGID)
}

type daemon struct {
	cfg      Config
	log      *slog.Logger
	dp       backend.Backend
	ag       *agent.Agent
	hub      *api.Hub
	resolver *dnsresolver.Resolver
	procs    *procs.Manager
	srv      *api.Server
	sink     *eventSink
	events   backend.EventReader
	audit    *auditState
	metrics  *metricsState
	wg       sync.WaitGroup
	// stopHosts ends the watch of the host's addresses (startResolver).
	stopHosts context.CancelFunc
	// slice keeps the agent's threads on a short CPU slice (slice_linux.go).
	slice *sliceKeeper
	// cpu is the agent's autogroup's weight (cpugroup_linux.go).
	cpu *cpuGroup
	// goProcs is GOMAXPROCS, raised by the goroutines parked in blocking
	// system calls (gomaxprocs.go).
	goProcs procsRaise
}

// eventSink receives the agent's lifecycle events: the event stream, and the
// audit log when one is attached.
type eventSink struct {
	hub          *api.Hub
	audit        func(agent.Event) error
	kernelDenial func(session string, ev backend.Event)      // aggregated for the audit log
	observe      func(agent.Event)                           // latencies for the metrics
	sessionEnded atomic.Pointer[func(session string)]        // the session runtime forgets its processes
	commit       func(then func() error) error               // the audit log's Commit, when one is attached
	commitBeside func(then func(uint64, string) error) error // its CommitBeside, when one is attached
	recordHash   func(seq uint64) (string, bool, error)      // its RecordHash, when one is attached
}

// CommitBeside makes the audit records of deferred events durable while
// then runs, given the seq and hash of the last of them
// (agent.BesideCommitter).
func (s *eventSink) CommitBeside(then func(seq uint64, hash string) error) error {
	if s.commitBeside != nil {
		return s.commitBeside(then)
	}
	if then != nil {
		return then(0, "")
	}
	return nil
}

// HasRecord says whether the audit log holds the record at seq with hash
// (the mark a live record written beside its commit names); attached
// false with no audit log (agent.BesideCommitter).
func (s *eventSink) HasRecord(seq uint64, hash string) (held, attached bool, err error) {
	if s.recordHash == nil {
		return false, false, nil
	}
	h, ok, err := s.recordHash(seq)
	if err != nil {
		return false, true, err
	}
	return ok && h == hash, true, nil
}

// Commit makes the audit records of deferred events durable, then runs then
// (agent.Committer).
func (s *eventSink) Commit(then func() error) error {
	if s.commit != nil {
		return s.commit(then)
	}
	if then != nil {
		return then()
	}
	return nil
}

func (s *eventSink) Emit(e agent.Event) error {
	if f := s.sessionEnded.Load(); f != nil && e.Kind == "session.end" {
		go (*f)(e.Session) // not under the agent's lock: it talks to shims
	}
	switch e.Kind {
	case agent.EventDNSDeny:
		// The stream's record as it has always been (not an audit record).
		s.hub.Publish("dns", "dns.deny", e.Detail)
		return nil
	case agent.EventRequestDecided, agent.EventRevokeDone:
		// Latencies: for the metrics only.
		if s.observe != nil {
			s.observe(e)
		}
		return nil
	}
	if e.Kind == agent.EventKernelDeny && e.Denial != nil {
		// The stream's record as it has always been; the audit log gets
		// the denials aggregated per second (flushDenials).
		ev := *e.Denial
		s.hub.Publish("kernel", "kernel.deny", map[string]any{"session": e.Session, "pid": ev.PID, "comm": ev.Comm, "reason": ev.Reason.String(),
			"proto": ev.Proto.String(), "dst": ev.Dst.String(), "time": ev.Time})
		if s.kernelDenial != nil {
			s.kernelDenial(e.Session, ev)
		}
		return nil
	}
	if e.Card != nil {
		// Card notices: the stream carries the card, under the source it
		// has always had; a decision is audited (who decided, and how).
		if s.audit != nil {
			if err := s.audit(e); err != nil {
				return err
			}
		}
		s.hub.Publish("api", e.Kind, e.Card)
		return nil
	}
	if s.audit != nil {
		if err := s.audit(e); err != nil {
			return err
		}
	}
	s.hub.Publish("agent", e.Kind, e)
	return nil
}

func newDaemon(cfg Config, log *slog.Logger) (*daemon, error) {
	// First, so that the threads that serve sessions have it from the start
	// (the ticker in serve sets it on threads made later).
	d := &daemon{cfg: cfg, log: log, hub: api.NewHub(4096), slice: newSliceKeeper(cfg.AgentCPUSliceUS), cpu: newCPUGroup(cfg.AgentAutogroupNice)}
	var err error
	d.dp, err = host.Open(cfg.backendConfig())
	if err != nil {
		return nil, err
	}
	d.sink = &eventSink{hub: d.hub}
	d.sink.observe = d.observeCall
	if err := d.openAudit(); err != nil {
		d.close()
		return nil, err
	}
	acfg := agent.Config{
		StateDir:        cfg.StateDir,
		Kernel:          d.dp,
		Events:          d.sink,
		Logger:          log,
		ApprovalTimeout: cfg.ApprovalTimeout.Duration,
		Breaker:         agent.BreakerConfig{Consecutive: cfg.BreakerConsec, Total: cfg.BreakerTotal},

		AcceptPolicyWidening: cfg.AcceptPolicyWidening,
		NeverList:            listenerNever(cfg.MetricsAddr),
		WorkspaceProtected:   cfg.WorkspaceProtected,
	}
	if st, err := os.Stat(cfg.PolicyDir); err == nil && st.IsDir() {
		acfg.PolicyDir = cfg.PolicyDir
	}
	if m, _ := filepath.Glob(filepath.Join(cfg.ManifestDir, "*.manifest")); len(m) > 0 {
		acfg.ManifestDir = cfg.ManifestDir
	} else {
		ms, err := agent.ParseManifests("embedded default.manifest", defaultManifest)
		if err != nil {
			d.close()
			return nil, err
		}
		acfg.Manifests = map[string]*agent.Manifest{}
		for _, m := range ms {
			acfg.Manifests[m.Image] = m
		}
	}
	d.ag, err = agent.Open(acfg)
	if err != nil {
		d.close()
		return nil, err
	}
	if err := d.startResolver(); err != nil {
		d.close()
		return nil, err
	}
	if err := d.openProcs(); err != nil {
		d.close()
		return nil, err
	}
	return d, nil
}

func (d *daemon) startResolver() error {
	listen, err := netip.ParseAddrPort(d.cfg.DNSListen)
	if err != nil {
		return fmt.Errorf("dns_listen %q: %w", d.cfg.DNSListen, err)
	}
	var ups []netip.AddrPort
	for _, u := range d.cfg.DNSUpstreams {
		ap, err := netip.ParseAddrPort(u)
		if err != nil {
			return fmt.Errorf("dns upstream %q: %w", u, err)
		}
		ups = append(ups, ap)
	}
	// The host's own addresses: stripped from answers by the resolver and
	// never-listed for sessions by the agent (unless a grant names one
	// exactly), both kept current by one netlink address watch.
	hosts := &dnsresolver.HostAddrs{}
	hosts.OnChange(func(addrs []netip.Addr) {
		if err := d.ag.SetHostAddrs(addrs); err != nil {
			d.log.Error("host addresses on the never-list", "err", err)
		}
	})
	ctx, stop := context.WithCancel(context.Background())
	d.stopHosts = stop
	if err := dnsresolver.WatchHostAddrs(ctx, hosts); err != nil {
		return err
	}
	r, err := dnsresolver.New(dnsresolver.Config{
		HostAddrs:   hosts,
		Dataplane:   d.dp,
		SessionName: d.ag.SessionName,
		ListenAddr:  listen,
		Upstreams:   ups,
		OnDenial:    d.ag.DNSDenial,
	})
	if err != nil {
		return err
	}
	if err := r.Start(); err != nil {
		return err
	}
	d.resolver = r
	d.ag.AttachDNS(r) // the agent keeps the resolver's policies in step with the grants
	if err := d.dp.SetDNSRedirect(r.Port()); err != nil {
		return err
	}
	// The never-list (the agent owns it): metadata and link-local
	// addresses, the agent's own listeners (agent.Config.NeverList), and the
	// resolver's port, reached only through the redirect, which comes first
	// in the kernel.
	return d.ag.SetNeverList(portEverywhere(r.Port()))
}

// listenerNever is the never-list entry of a TCP listener: its address, or
// the port on every address when it listens on all of them (sessions share
// the host's network namespace, so any host address reaches it).
func listenerNever(addr string) []backend.NeverEntry {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || addr == "off" {
		return nil
	}
	if ap.Addr().IsUnspecified() {
		return portEverywhere(ap.Port())
	}
	return []backend.NeverEntry{{Prefix: netip.PrefixFrom(ap.Addr().Unmap(), ap.Addr().Unmap().BitLen()), Port: ap.Port()}}
}

func portEverywhere(port uint16) []backend.NeverEntry {
	return []backend.NeverEntry{{Prefix: netip.MustParsePrefix("0.0.0.0/0"), Port: port}, {Prefix: netip.MustParsePrefix("::/0"), Port: port}}
}

func (d *daemon) serve(ctx context.Context, opGID int) error {
	srv, err := api.NewServer(api.Config{
		Agent: d.ag, Backend: d.dp, Hub: d.hub, Logger: d.log,
		Auth:      api.Authorizer{OperatorGID: opGID, SessionsCgroup: "/" + d.cfg.CgroupParent},
		Verify:    d.verifyAudit,
		Processes: d.procs, RequestTimeout: d.cfg.RequestTimeout.Duration, Pprof: d.cfg.DebugPprof,
		Status: func() map[string]any {
			facts := d.dp.Probe().Facts
			st := map[string]any{"state_dir": d.cfg.StateDir, "socket": d.cfg.Socket, "metrics_addr": d.cfg.MetricsAddr,
				"flow_mode": facts["flow_mode"], "flow_mode_means": facts["flow_mode_means"], "agent_cpu_slice": d.slice.fact(), "agent_cpu_group": d.cpu.fact(), "agent_go_procs": d.goProcs.fact()}
			if d.resolver != nil {
				st["dns_resolver"] = fmt.Sprintf("0.0.0.0:%d", d.resolver.Port())
				st["dns_upstreams"] = d.resolver.Upstreams()
			}
			return st
		},
		ObserveDecision: d.observeDecision,
	})
	if err != nil {
		return err
	}
	d.srv = srv
	ln, err := api.Listen(d.cfg.Socket, opGID)
	if err != nil {
		return err
	}
	front := api.NewFront(srv, ln, &http.Server{ReadHeaderTimeout: 10 * time.Second}, d.log)
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		if err := front.Serve(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.Error("api", "err", err)
		}
	}()
	var ms *http.Server
	if d.cfg.MetricsAddr != "" && d.cfg.MetricsAddr != "off" {
		ms, err = d.serveMetrics()
		if err != nil {
			return err
		}
	}
	parked := 0
	if d.readKernelEvents() {
		parked++
	}
	if d.resolver != nil {
		parked += d.resolver.ParkedWorkers()
	}
	d.goProcs = raiseProcs(parked)
	d.log.Info("go scheduler", "procs", d.goProcs.fact())
	// What the start decoded and read (the journal's records, the kernel
	// tables, every session adopted) is garbage now, and the runtime's
	// scavenger gives such memory back to the host over minutes: a daemon
	// restarted at 100,000 sessions held 816 MiB where it had held 579
	// before (bench/README.md, bench-scale). One collection that returns
	// it, beside the API, not before it.
	go debug.FreeOSMemory()
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		gc := newGCTuner(gcFloorBytes)
		gc.tune()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if err := d.ag.Sweep(ctx); err != nil { // expiries, timeouts, cards
					d.log.Warn("sweep", "err", err)
				}
				d.flushDenials()
				gc.tune()
				d.slice.keep()
			}
		}
	}()
	sessions := d.ag.Sessions()
	facts := d.dp.Probe().Facts
	d.log.Info("shinken-agent ready", "adopted", facts["adopted"], "sessions", len(sessions), "socket", d.cfg.Socket,
		"metrics", d.cfg.MetricsAddr, "dns", d.cfg.DNSListen, "cgroup", facts["cgroup_parent"], "pins", d.cfg.PinPath)
	d.log.Info("open flows", "flow_mode", facts["flow_mode"], "means", facts["flow_mode_means"])
	d.log.Info("agent cpu slice", "slice", d.slice.fact())
	d.log.Info("agent cpu group", "autogroup", d.cpu.fact())
	if b, ok := facts["denial_event_budget"]; ok {
		d.log.Info("denial events", "budget", b)
	}
	for _, e := range d.ag.Enforcement() {
		d.log.Info("enforcement", "class", e.Class, "grantable", e.Grantable, "level", e.Level, "mechanism", e.Mechanism, "reason", e.Reason)
	}
	for _, b := range d.dp.Probe().Boundary {
		d.log.Info("session boundary", "mechanism", b.Class, "level", b.Level, "how", b.Mechanism, "reason", b.Reason)
	}
	<-ctx.Done()
	d.log.Info("stopping; enforcement stays pinned in the kernel")
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	front.Shutdown(sctx)
	if ms != nil {
		ms.Shutdown(sctx)
	}
	return nil
}

// readKernelEvents starts the kernel event reader, and says whether it did
// (its goroutine waits in epoll_wait(2): gomaxprocs.go).
func (d *daemon) readKernelEvents() bool {
	rd, err := d.dp.Events()
	if err != nil {
		d.log.Error("kernel events", "err", err)
		return false
	}
	d.events = rd
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		for {
			ev, err := rd.Read()
			if err != nil {
				return
			}
			// The agent records it (the sink publishes and aggregates it)
			// and decides on escalation.
			if err := d.ag.KernelDenial(context.Background(), ev); err != nil {
				d.log.Warn("escalation", "pid", ev.PID, "dst", ev.Dst, "err", err)
			}
		}
	}()
	return true
}

func (d *daemon) close() {
	if d.events != nil {
		d.events.Close()
	}
	if d.resolver != nil {
		d.resolver.Close()
	}
	if d.stopHosts != nil {
		d.stopHosts()
	}
	d.wg.Wait()
	if d.procs != nil {
		d.procs.Close() // the processes and their shims run on
	}
	if d.ag != nil {
		d.ag.Close()
	}
	d.closeAudit()
	if d.dp != nil {
		d.dp.Close()
	}
}

var _ net.Listener = nil
