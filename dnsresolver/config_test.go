package dnsresolver

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// Configuration checks, the resolv.conf default, start and close.

func TestConfigValidate(t *testing.T) {
	dp := newFakeDataplane()
	up := []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:53")}
	for _, tc := range []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"minimal", Config{Dataplane: dp, SessionName: dp.SessionByIndex, Upstreams: up}, true},
		{"no dataplane", Config{Upstreams: up, SessionName: dp.SessionByIndex}, false},
		{"no SessionName", Config{Dataplane: dp, Upstreams: up}, false},
		{"listen on loopback", Config{Dataplane: dp, SessionName: dp.SessionByIndex, Upstreams: up, ListenAddr: netip.MustParseAddrPort("127.0.0.1:53")}, false},
		{"listen v6", Config{Dataplane: dp, SessionName: dp.SessionByIndex, Upstreams: up, ListenAddr: netip.MustParseAddrPort("[::]:53")}, false},
		{"upstream port 0", Config{Dataplane: dp, SessionName: dp.SessionByIndex, Upstreams: []netip.AddrPort{netip.MustParseAddrPort("1.1.1.1:0")}}, false},
		{"upstream is a session", Config{Dataplane: dp, SessionName: dp.SessionByIndex, Upstreams: []netip.AddrPort{netip.MustParseAddrPort("127.128.0.1:53")}}, false},
		{"min > max", Config{Dataplane: dp, SessionName: dp.SessionByIndex, Upstreams: up, MinTTL: time.Hour, MaxTTL: time.Minute}, false},
		{"min < 1s", Config{Dataplane: dp, SessionName: dp.SessionByIndex, Upstreams: up, MinTTL: time.Millisecond}, false},
		{"rcode servfail", Config{Dataplane: dp, SessionName: dp.SessionByIndex, Upstreams: up, DenyRcode: dns.RcodeServerFailure}, false},
		{"nxdomain", Config{Dataplane: dp, SessionName: dp.SessionByIndex, Upstreams: up, DenyRcode: dns.RcodeNameError}, true},
		{"passthrough ANY", Config{Dataplane: dp, SessionName: dp.SessionByIndex, Upstreams: up, PassthroughTypes: []uint16{dns.TypeANY}}, false},
		{"passthrough HTTPS", Config{Dataplane: dp, SessionName: dp.SessionByIndex, Upstreams: up, PassthroughTypes: []uint16{dns.TypeHTTPS}}, false},
		{"passthrough MX", Config{Dataplane: dp, SessionName: dp.SessionByIndex, Upstreams: up, PassthroughTypes: []uint16{dns.TypeMX}}, true},
		{"chain 100", Config{Dataplane: dp, SessionName: dp.SessionByIndex, Upstreams: up, MaxCNAMEChain: 100}, false},
		{"busy poll off", Config{Dataplane: dp, SessionName: dp.SessionByIndex, Upstreams: up, UDPBusyPoll: -1}, true},
		{"busy poll 2ms", Config{Dataplane: dp, SessionName: dp.SessionByIndex, Upstreams: up, UDPBusyPoll: 2 * time.Millisecond}, false},
		{"bad resolv.conf", Config{Dataplane: dp, SessionName: dp.SessionByIndex, ResolvConf: "/nonexistent"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := New(tc.cfg)
			if tc.ok != (err == nil) {
				t.Fatalf("New: %v", err)
			}
			if err == nil {
				r.Close()
			}
		})
	}
}

func TestResolvConfDefault(t *testing.T) {
	f := t.TempDir() + "/resolv.conf"
	if err := writeFile(f, "# test\nnameserver 127.0.0.53\nnameserver ::1\nnameserver 127.128.0.5\noptions edns0\n"); err != nil {
		t.Fatal(err)
	}
	r, err := New(Config{Dataplane: newFakeDataplane(), SessionName: newFakeDataplane().SessionByIndex, ResolvConf: f})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	got := r.Upstreams()
	want := []netip.AddrPort{netip.MustParseAddrPort("127.0.0.53:53"), netip.MustParseAddrPort("[::1]:53")}
	if !slices.Equal(got, want) {
		t.Fatalf("upstreams %v, want %v", got, want)
	}
}

func TestStartClose(t *testing.T) {
	e := newTestEnv(t, nil)
	if err := e.r.Start(); err == nil {
		t.Fatal("second Start succeeded")
	}
	port := e.r.Port()
	if err := e.r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.r.Start(); err == nil {
		t.Fatal("Start after Close succeeded")
	}
	// Nothing listens any more: the query fails, it is not answered.
	c := &dns.Client{Net: "tcp", Timeout: time.Second}
	m := new(dns.Msg)
	m.SetQuestion("allowed.test.", dns.TypeA)
	if _, _, err := c.Exchange(m, netip.AddrPortFrom(SessionAddr(1), port).String()); err == nil {
		t.Fatal("answered after Close")
	}
}
