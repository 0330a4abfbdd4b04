package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/shinken-agent/shinken/agent"
	"github.com/shinken-agent/shinken/agent/api"
	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/backend/host"
)

// POST /v1/decide through the agent's Unix socket, as an enforcer asks it:
// an agent on the real backend (root: BPF, cgroups; its own cgroup parent
// and pin path, removed after), the API server on a socket, one keep-alive
// HTTP client. Sessions each hold one egress grant; requests alternate an
// allowed and a denied egress and a hard-denied write. Every answer is
// checked. Printed: decide_api_p99_us (goal < 200).
var (
	decideN        = flag.Int("decide-n", 20000, "decisions through the API socket (0: skip)")
	decideSessions = flag.Int("decide-sessions", 100, "sessions, one egress grant each, for the API decisions")
)

var decideP99 float64

func decideAPIBench() {
	if *decideN <= 0 {
		return
	}
	tmp, err := os.MkdirTemp("", "shinken-decide-bench")
	check(err)
	defer os.RemoveAll(tmp)
	bcfg := backend.Config{CgroupParent: fmt.Sprintf("shinken-bench-decide-%d", os.Getpid()), PinPath: filepath.Join("/sys/fs/bpf", fmt.Sprintf("shinken-bench-decide-%d", os.Getpid())), FlowMode: "auto"}
	be, err := host.Open(bcfg)
	check(err)
	defer host.Remove(bcfg)
	// check exits at once: remove what Open installed first.
	chk := func(err error) {
		if err != nil {
			host.Remove(bcfg)
			os.RemoveAll(tmp)
			check(err)
		}
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ms, err := agent.ParseManifests("bench.manifest", []byte("image py\nallow net.egress cidrs=10.0.0.0/8 ports=443 tier=auto\nallow fs.scope read=/work write=/work\n"))
	chk(err)
	man := map[string]*agent.Manifest{}
	for _, m := range ms {
		man[m.Image] = m
	}
	ag, err := agent.Open(agent.Config{StateDir: filepath.Join(tmp, "state"), Kernel: be, Manifests: man, Logger: quiet, Events: nopSink{}})
	chk(err)
	defer ag.Close()
	ctx := context.Background()
	for i := 0; i < *decideSessions; i++ {
		id := fmt.Sprintf("d%04d", i)
		chk(ag.CreateSession(agent.SessionSpec{ID: id, Image: "py", Home: "/home/" + id}))
		_, err := ag.Grant(ctx, agent.GrantRequest{Session: id, Lifecycle: agent.LifecycleSession, Capability: agent.Capability{Class: agent.ClassNetEgress,
			Egress: &agent.EgressScope{CIDRs: []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24)}, Ports: []agent.PortRange{{Lo: 443, Hi: 443}}}}})
		chk(err)
	}
	srv, err := api.NewServer(api.Config{Agent: ag, Backend: be, Hub: api.NewHub(16), Auth: api.Authorizer{OperatorGID: -1}, Logger: quiet})
	chk(err)
	sock := filepath.Join(tmp, "api.sock")
	ln, err := net.Listen("unix", sock)
	chk(err)
	hs := &http.Server{Handler: srv, ConnContext: api.ConnContext}
	go hs.Serve(ln)
	defer hs.Close()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	type q struct {
		body []byte
		want bool
	}
	var qs []q
	for i := 0; i < *decideN; i++ {
		s := i % *decideSessions
		id := fmt.Sprintf("d%04d", s)
		var r agent.UseRequest
		want := false
		switch i % 3 {
		case 0:
			r, want = agent.UseRequest{Class: agent.ClassNetEgress, Op: "connect", IP: netip.AddrFrom4([4]byte{10, byte(s >> 8), byte(s), 7}), Port: 443}, true
		case 1:
			r = agent.UseRequest{Class: agent.ClassNetEgress, Op: "connect", IP: netip.AddrFrom4([4]byte{10, byte(s >> 8), byte(s), 7}), Port: 80}
		case 2:
			r = agent.UseRequest{Class: agent.ClassFSScope, Op: "write", Path: "/home/" + id + "/.ssh/authorized_keys"}
		}
		b, _ := json.Marshal(api.DecideBody{Session: id, Request: r})
		qs = append(qs, q{b, want})
	}
	lat := make([]time.Duration, 0, len(qs))
	for i, x := range qs {
		start := time.Now()
		resp, err := hc.Post("http://shinken/v1/decide", "application/json", bytes.NewReader(x.body))
		chk(err)
		var d agent.UseDecision
		err = json.NewDecoder(resp.Body).Decode(&d)
		resp.Body.Close()
		lat = append(lat, time.Since(start))
		chk(err)
		if d.Allowed != x.want {
			fail("decide api %d: %s: allowed=%v want %v (%s)", i, x.body, d.Allowed, x.want, d.DecidedBy)
		}
	}
	slices.Sort(lat)
	us := func(d time.Duration) float64 { return float64(d) / 1e3 }
	fmt.Printf("decide API (POST /v1/decide on a Unix socket, keep-alive, %d sessions × 1 grant, n=%d): p50=%.1fµs p99=%.1fµs\n",
		*decideSessions, len(lat), us(lat[len(lat)/2]), us(lat[len(lat)*99/100]))
	decideP99 = us(lat[len(lat)*99/100])
}

type nopSink struct{}

func (nopSink) Emit(agent.Event) error { return nil }
