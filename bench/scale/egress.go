//go:build linux

package main

// The connect rounds, by make bench-egress's method and code
// (bench/internal/connrounds: one
// worker process started through the session launcher, moved before each
// round into the contender's cgroup and pinned to CPU 0, the accept server
// on CPU 1; short interleaved rounds in rotating order after the same idle
// pause; the figure is the median of per-round ratios, with a twin of the
// baseline as the method's floor). Here the Shinken contender is one of
// the daemon's own sessions (s0, granted net.egress to the server through
// the API), and the worker starts through the same launcher in a session
// of the bench's own (its own cgroup outside the daemon's parent, its uid,
// namespaces, seccomp filter and Landlock), as bench-egress's worker does
// in its dataplane's session. The sessions carry no egress entries but
// s0's grant (bench-egress loads 100 per session).

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"

	"github.com/shinken-agent/shinken/agent"
	"github.com/shinken-agent/shinken/agent/api"
	"github.com/shinken-agent/shinken/bench/internal/connrounds"
	"github.com/shinken-agent/shinken/dataplane/boundary"
)

type egress struct {
	b              *bench
	probeDir       string
	bnd            *boundary.Boundary
	wDir           string // the worker session's cgroup parent (the bench's)
	baseCg, twinCg string
	srv            *connrounds.Server
	w              *connrounds.Worker
	srvCPU         int
	tid            int // the worker's command thread, host tid
	granted        bool
}

func newEgress(b *bench) (*egress, error) {
	root, err := findCgroupRoot()
	if err != nil {
		return nil, err
	}
	e := &egress{b: b}
	fail := func(err error) (*egress, error) { e.close(); return nil, err }
	if e.probeDir, err = connrounds.CopyProbe("shinken-bench-scale-"); err != nil {
		return fail(err)
	}
	if e.baseCg, e.twinCg, err = connrounds.Baseline(root, "shinken-bench-scale", b.tag, true); err != nil {
		return fail(err)
	}
	e.wDir = filepath.Join(root, "shinken-bench-scale-worker-"+b.tag)
	if err := os.MkdirAll(filepath.Join(e.wDir, "w"), 0o755); err != nil {
		return fail(err)
	}
	abs, _ := filepath.Abs(filepath.Join(*flagBin, boundary.LauncherName))
	if e.bnd, err = boundary.New(boundary.Config{Launcher: abs}, 1<<20); err != nil {
		return fail(err)
	}
	// A uid index above every index of the daemon's (its uids are the
	// same default range).
	if err := e.bnd.Create("w", filepath.Join(e.wDir, "w"), uint32(b.maxSessions+1000)); err != nil {
		return fail(err)
	}
	e.srvCPU = connrounds.ServerCPU(*flagPin)
	if e.srv, err = connrounds.AcceptAndClose(netip.MustParseAddrPort("127.0.0.2:0"), e.srvCPU); err != nil {
		return fail(err)
	}
	launch := func(cmd *exec.Cmd) error { return e.bnd.Launch("w", cmd, boundary.LaunchOptions{}, false) }
	if e.w, err = connrounds.StartWorker(filepath.Join(e.probeDir, "probe"), "/", launch); err != nil {
		return fail(fmt.Errorf("start the worker through the launcher: %w", err))
	}
	if e.tid, err = e.w.TID(); err != nil {
		return fail(err)
	}
	fmt.Printf("connect worker: %s\n", e.bnd.Launcher())
	return e, nil
}

// grant gives s0 net.egress to the accept server through the API, after
// checking that s0 refuses it before.
func (e *egress) grant() error {
	s0 := filepath.Join(cgroupRoot, e.b.parent, "s0")
	if err := e.w.MoveTo(s0); err != nil {
		return err
	}
	addr := e.srv.Addr
	port := strconv.Itoa(int(addr.Port()))
	if got := e.w.Do("tcp " + addr.String()); got != "err EPERM" {
		return fmt.Errorf("s0 before its grant: connect %s: %s, want err EPERM", addr, got)
	}
	req := agent.GrantRequest{Session: "s0", Lifecycle: agent.LifecycleSession, Capability: agent.Capability{
		Class: agent.ClassNetEgress,
		Egress: &agent.EgressScope{CIDRs: []netip.Prefix{netip.PrefixFrom(addr.Addr(), 32)},
			Ports: []agent.PortRange{{Lo: addr.Port(), Hi: addr.Port()}}},
	}}
	var res []api.RequestResult
	code, err := post(e.b.hc, "/v1/requests", api.RequestBody{Requests: []agent.GrantRequest{req}}, &res)
	if err != nil {
		return err
	}
	if len(res) != 1 || res[0].Outcome != "granted" || code != http.StatusCreated {
		return fmt.Errorf("grant net.egress %s to s0: HTTP %d: %+v", addr, code, res)
	}
	if got := e.w.Do("tcp " + addr.String()); got != "ok" {
		return fmt.Errorf("s0 after its grant: connect %s: %s, want ok", addr, got)
	}
	if got := e.w.Do("tcp 127.0.0.3:" + port); got != "err EPERM" {
		return fmt.Errorf("s0 after its grant: connect 127.0.0.3:%s: %s, want err EPERM (the session is not enforced)", port, got)
	}
	e.granted = true
	return nil
}

// stillGranted checks, after a restart of the daemon, that s0 still
// reaches the accept server and still refuses another address, and moves
// the worker back out of s0.
func (e *egress) stillGranted() error {
	if err := e.w.MoveTo(filepath.Join(cgroupRoot, e.b.parent, "s0")); err != nil {
		return err
	}
	addr := e.srv.Addr
	if got := e.w.Do("tcp " + addr.String()); got != "ok" {
		return fmt.Errorf("s0's grant: connect %s: %s, want ok", addr, got)
	}
	if got := e.w.Do("tcp 127.0.0.3:" + strconv.Itoa(int(addr.Port()))); got != "err EPERM" {
		return fmt.Errorf("s0: connect 127.0.0.3:%d: %s, want err EPERM (the session is not enforced)", addr.Port(), got)
	}
	return e.w.MoveTo(e.baseCg)
}

// rounds runs the interleaved connect rounds and returns the medians of
// the per-round ratios to the baseline: the session's and the twin's.
func (e *egress) rounds() (ratio, twin float64, err error) {
	if !e.granted {
		if err := e.grant(); err != nil {
			return 0, 0, err
		}
	}
	unpin, err := connrounds.Pin(e.tid, e.srvCPU)
	if err != nil {
		return 0, 0, err
	}
	defer unpin()
	cBase := &connrounds.Contender{Name: "baseline", Cgroup: e.baseCg}
	cShk := &connrounds.Contender{Name: "shinken", Cgroup: filepath.Join(cgroupRoot, e.b.parent, "s0")}
	cTwin := &connrounds.Contender{Name: "twin", Cgroup: e.twinCg}
	cs := []*connrounds.Contender{cBase, cShk, cTwin}
	rs := connrounds.Rounds{Worker: e.w, Server: e.srv, Rounds: *flagRounds, Secs: *flagSecs, Settle: *flagSettle}
	if err := rs.Run(cs); err != nil {
		return 0, 0, err
	}
	// Out of s0 between measurements: the processes counted in the session
	// cgroups are then the holders alone.
	if err := e.w.MoveTo(e.baseCg); err != nil {
		return 0, 0, err
	}
	connrounds.PrintRates("  ", *flagRounds, *flagSecs, cs)
	shk := connrounds.Compare("  ", "shinken/baseline", cShk, cBase)
	tw := connrounds.Compare("  ", "twin/baseline (the bench's floor: nothing differs)", cTwin, cBase)
	if len(shk) < *flagRounds/2 {
		return 0, 0, fmt.Errorf("only %d of %d connect rounds gave a rate", len(shk), *flagRounds)
	}
	return connrounds.Median(shk), connrounds.Median(tw), nil
}

// close stops the worker and the server and removes the bench's cgroups,
// its boundary session and the probe's copy.
func (e *egress) close() {
	if e.w != nil {
		e.w.Stop()
	}
	if e.srv != nil {
		e.srv.Close()
	}
	if e.bnd != nil {
		e.bnd.Release("w")
		e.bnd.Close()
	}
	if e.wDir != "" {
		connrounds.RmCgroup(filepath.Join(e.wDir, "w"))
		connrounds.RmCgroup(e.wDir)
	}
	connrounds.RmCgroup(e.baseCg)
	connrounds.RmCgroup(e.twinCg)
	if e.probeDir != "" {
		os.RemoveAll(e.probeDir)
	}
}

// post sends body as JSON to the daemon and decodes the answer into out.
func post(hc *http.Client, path string, body, out any) (int, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return 0, err
	}
	resp, err := hc.Post("http://shinken"+path, "application/json", bytes.NewReader(b))
	if err != nil {
		return 0, err
	}
	msg, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return resp.StatusCode, err
	}
	if err := json.Unmarshal(msg, out); err != nil {
		return resp.StatusCode, fmt.Errorf("%s: HTTP %d: %v: %s", path, resp.StatusCode, err, msg)
	}
	return resp.StatusCode, nil
}
