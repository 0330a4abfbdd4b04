//go:build linux

package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shinken-agent/shinken/agent"
	"github.com/shinken-agent/shinken/dataplane"
	"github.com/shinken-agent/shinken/dnsresolver"
)

// The Shinken side: where the resolver's egress entries go (a real dataplane
// or memory), and the resolver under test.

type memSink struct {
	mu sync.Mutex
	m  map[netip.Prefix]dataplane.EgressRule
}

func (s *memSink) AllowEgress(_ string, r dataplane.EgressRule) error {
	if err := r.Validate(); err != nil {
		return err
	}
	s.mu.Lock()
	s.m[r.Prefix] = r
	s.mu.Unlock()
	return nil
}

type sink struct {
	dnsresolver.Dataplane
	desc    string
	session string
	index   uint32
	handle  dataplane.HandleRef
	count   func() int
	close   func()
	n       atomic.Uint64
	dp      *dataplane.Dataplane // nil for the in-memory sink
	sess    dataplane.Session
}

// AllowEgress counts and forwards.
func (s *sink) AllowEgress(session string, r dataplane.EgressRule) error {
	s.n.Add(1)
	return s.Dataplane.AllowEgress(session, r)
}

func (s *sink) writes() uint64 { return s.n.Load() }

// openSink opens a private dataplane (own parent cgroup and pin path,
// uninstalled at exit) with one session, or falls back to memory.
func openSink(mode string) (*sink, error) {
	if mode != "off" {
		b := make([]byte, 4)
		rand.Read(b)
		n := "shinken-benchdns-" + hex.EncodeToString(b)
		dp, err := dataplane.Open(dataplane.Config{Parent: n, PinPath: "/sys/fs/bpf/" + n, MaxSessions: 16, MaxHandles: 64, MaxEgress4: 1 << 16, MaxEgress6: 1 << 10,
			MaxDNSEntries: 1 << 16}) // the one session is the whole load: the per-session cap would measure itself (as QueryRate below)
		if err == nil {
			sess, err1 := dp.CreateSession("bench", dataplane.Limits{})
			h, err2 := dp.NewHandle(dataplane.HandleRef{}, time.Time{})
			if err := errors.Join(err1, err2); err != nil {
				dp.Uninstall()
				return nil, err
			}
			return &sink{
				Dataplane: dp, desc: "real dataplane (BPF LPM trie write, 3 bpf(2) calls, per written entry)",
				session: sess.Name, index: sess.Index, handle: h, dp: dp, sess: sess,
				count: func() int { r, _ := dp.EgressRules(sess.Name); return len(r) },
				close: func() {
					if err := dp.Uninstall(); err != nil {
						log.Printf("uninstall dataplane: %v", err)
					}
				},
			}, nil
		}
		if mode == "on" {
			return nil, fmt.Errorf("open dataplane: %w", err)
		}
		log.Printf("no dataplane (%v): entry writes go to an in-memory sink", err)
	}
	m := &memSink{m: map[netip.Prefix]dataplane.EgressRule{}}
	return &sink{
		Dataplane: m, desc: "in-memory sink (NOT a kernel map write)",
		session: "bench", index: 1, handle: dataplane.HandleRef{Slot: 1, Generation: 1},
		count: func() int { m.mu.Lock(); defer m.mu.Unlock(); return len(m.m) },
		close: func() {},
	}, nil
}

// startShinken starts one resolver instance writing into sk.
func startShinken(sk *sink, up netip.AddrPort, cacheSize int, alwaysWrite bool) (*dnsresolver.Resolver, netip.AddrPort, error) {
	res, err := dnsresolver.New(dnsresolver.Config{
		Dataplane: sk,
		SessionName: func(i uint32) (string, bool) {
			if i == sk.index {
				return sk.session, true
			}
			return "", false
		},
		ListenAddr:  netip.MustParseAddrPort("0.0.0.0:0"),
		Upstreams:   []netip.AddrPort{up},
		CacheSize:   cacheSize,
		AlwaysWrite: alwaysWrite,
		UDPWorkers:  *flagWorkers,
		// One session is the whole load here: its per-session buckets
		// (defaults 1000 queries and 500 entry writes a second) would
		// measure themselves, not the resolver.
		QueryRate: -1,
		WriteRate: -1,
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		return nil, netip.AddrPort{}, err
	}
	if err := res.SetPolicy(sk.session, dnsresolver.Policy{Grants: []dnsresolver.Grant{
		{Pattern: "**.allowed.bench", Handle: sk.handle, Proto: dataplane.ProtoTCP, Ports: dataplane.Port(443)},
	}}); err != nil {
		return nil, netip.AddrPort{}, err
	}
	if *flagDecide {
		decide, err := benchDecide(sk.session)
		if err != nil {
			return nil, netip.AddrPort{}, err
		}
		res.SetDecide(decide)
	}
	if err := res.Start(); err != nil {
		return nil, netip.AddrPort{}, err
	}
	return res, netip.AddrPortFrom(dnsresolver.SessionAddr(sk.index), res.Port()), nil
}

// benchDecide is the daemon's hook (agent.AttachDNS gives the resolver
// Agent.DecideUse) without the rest of the agent: a Cedar engine with the
// shipped policies (hard-deny forbids included) and session's grant of the
// policy's names on port 443.
func benchDecide(session string) (dnsresolver.DecideFunc, error) {
	eng, err := agent.NewEngine("")
	if err != nil {
		return nil, err
	}
	eng.PutSession(agent.SessionAttrs{ID: session, Image: "bench", TrustTier: "normal", Risk: "normal"})
	if err := eng.PutGrant(agent.GrantData{ID: "g1", Session: session, Capability: agent.Capability{
		Class: agent.ClassNetEgress, Egress: &agent.EgressScope{Domains: []string{"**.allowed.bench"}, Ports: []agent.PortRange{{Lo: 443, Hi: 443}}},
	}}); err != nil {
		return nil, err
	}
	return func(s, name string, port uint16) (bool, string) {
		d, err := eng.Decide(s, agent.UseRequest{Class: agent.ClassNetEgress, Op: "connect", Domain: name, Port: port}, time.Now())
		if err != nil {
			return false, err.Error()
		}
		return d.Allowed, fmt.Sprint(d.Reasons)
	}, nil
}
