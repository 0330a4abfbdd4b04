package agent

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/shinken-agent/shinken/agent/backend/memory"
	"github.com/shinken-agent/shinken/dnsresolver"
)

// The resolver asks the agent's use-time decision: a real agent on the
// memory backend (no root), the real resolver attached as the daemon
// attaches it, writing its entries into that backend, real DNS packets over
// loopback, and a fake upstream that logs what reaches it. Linux only: the
// resolver serves UDP only there (IP_PKTINFO; each session asks at its own
// 127.128.0.0/9 address).

// forbidName is an admin policy forbidding net.egress to exactly name.
func forbidName(id, name string) string {
	return `@id("` + id + `")
forbid (principal, action == Shinken::Action::"use", resource == Shinken::Capability::"net.egress")
when { context.request.domain_keys.contains("` + name + `") };
`
}

// decideUpstream answers A queries for a few names and logs every question.
type decideUpstream struct {
	addr  netip.AddrPort
	srv   *dns.Server
	mu    sync.Mutex
	asked []string
}

var decideZone = map[string]string{
	"ok.example.com.":   "93.184.216.34",
	"evil.example.com.": "93.184.216.66",
}

func startDecideUpstream(t *testing.T) *decideUpstream {
	t.Helper()
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &decideUpstream{addr: pc.LocalAddr().(*net.UDPAddr).AddrPort()}
	started := make(chan struct{})
	u.srv = &dns.Server{PacketConn: pc, NotifyStartedFunc: func() { close(started) }, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		q := req.Question[0]
		name := strings.ToLower(q.Name)
		u.mu.Lock()
		u.asked = append(u.asked, name)
		u.mu.Unlock()
		m := new(dns.Msg)
		m.SetReply(req)
		if ip, ok := decideZone[name]; ok && q.Qtype == dns.TypeA {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300}, A: net.ParseIP(ip)})
		}
		w.WriteMsg(m)
	})}
	go u.srv.ActivateAndServe()
	<-started
	t.Cleanup(func() { u.srv.Shutdown() })
	return u
}

func (u *decideUpstream) askedFor(name string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, a := range u.asked {
		if a == name {
			return true
		}
	}
	return false
}

type denials struct {
	mu sync.Mutex
	d  []dnsresolver.Denial
}

func (l *denials) add(d dnsresolver.Denial) { l.mu.Lock(); l.d = append(l.d, d); l.mu.Unlock() }
func (l *denials) take() []dnsresolver.Denial {
	l.mu.Lock()
	defer l.mu.Unlock()
	d := l.d
	l.d = nil
	return d
}

type decideEnv struct {
	a   *Agent
	d   *memory.Backend
	r   *dnsresolver.Resolver
	up  *decideUpstream
	den *denials
	dir string
	to  string // the session's resolver address
}

// newDecideEnv opens an agent with policyDir files, creates session s1 with
// a live grant of **.example.com on 443, and attaches a real resolver.
func newDecideEnv(t *testing.T, files map[string]string) *decideEnv {
	d := memKernel(t)
	e := &decideEnv{d: d, up: startDecideUpstream(t), den: &denials{}, dir: t.TempDir()}
	for name, text := range files {
		writeFile(t, filepath.Join(e.dir, name), text)
	}
	e.a = openAgent(t, d, t.TempDir(), func(c *Config) { c.PolicyDir = e.dir })
	mustSession(t, e.a, SessionSpec{ID: "s1"})
	c := Capability{Class: ClassNetEgress, Egress: &EgressScope{Domains: []string{"**.example.com"}, Ports: []PortRange{{Lo: 443, Hi: 443}}}}
	_, err := e.a.Grant(ctx, GrantRequest{Session: "s1", Capability: c, Lifecycle: LifecycleSession})
	var are *ApprovalRequiredError
	if errors.As(err, &are) {
		_, err = e.a.Approve(ctx, are.ID, "alice")
	}
	if err != nil {
		t.Fatal(err)
	}
	r, err := dnsresolver.New(dnsresolver.Config{
		Dataplane: d,
		SessionName: func(idx uint32) (string, bool) {
			s, err := d.SessionByIndex(idx)
			return s.Name, err == nil
		},
		ListenAddr: netip.MustParseAddrPort("0.0.0.0:0"),
		Upstreams:  []netip.AddrPort{e.up.addr},
		OnDenial:   e.den.add,
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	e.r = r
	e.a.AttachDNS(r)
	s, err := d.Session("s1")
	if err != nil {
		t.Fatal(err)
	}
	e.to = netip.AddrPortFrom(dnsresolver.SessionAddr(s.Index), r.Port()).String()
	return e
}

func (e *decideEnv) ask(t *testing.T, name string) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	resp, _, err := (&dns.Client{Net: "udp", Timeout: 3 * time.Second}).Exchange(m, e.to)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// entryFor reports whether the backend holds an egress entry of s1 for ip.
func (e *decideEnv) entryFor(t *testing.T, ip string) bool {
	t.Helper()
	for _, r := range kernelRules(t, e.d, "s1") {
		if r.Prefix == netip.MustParsePrefix(ip+"/32") {
			return true
		}
	}
	return false
}

// wantRefused checks that name is refused with a decision denial naming rule.
func (e *decideEnv) wantRefused(t *testing.T, name, rule string) {
	t.Helper()
	resp := e.ask(t, name)
	if resp.Rcode != dns.RcodeRefused || len(resp.Answer) != 0 {
		t.Fatalf("%s: want REFUSED (%s), got %v", name, rule, resp)
	}
	den := e.den.take()
	if len(den) != 1 || den[0].Reason != dnsresolver.ReasonDecision || den[0].Rule != rule {
		t.Fatalf("%s: denials %+v, want one decision denial naming %s", name, den, rule)
	}
}

func (e *decideEnv) wantResolves(t *testing.T, name, ip string) {
	t.Helper()
	resp := e.ask(t, name)
	if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 || resp.Answer[0].(*dns.A).A.String() != ip {
		t.Fatalf("%s: want %s, got %v (denials %+v)", name, ip, resp, e.den.take())
	}
	if !e.entryFor(t, ip) {
		t.Fatalf("%s: no backend entry for %s", name, ip)
	}
}

// TestDNSAsksDecision: an admin forbid on a name a live grant covers denies
// it at /v1/decide (DecideUse), and the resolver refuses it the same way,
// naming the rule: nothing reaches the upstream and no backend entry is
// written. A name the grant covers and no forbid names still resolves.
func TestDNSAsksDecision(t *testing.T) {
	e := newDecideEnv(t, map[string]string{"dns.cedar": forbidName("admin.no-evil", "evil.example.com")})
	dec, err := e.a.DecideUse("s1", UseRequest{Class: ClassNetEgress, Op: "connect", Domain: "evil.example.com", Port: 443})
	if err != nil || dec.Allowed || dec.DecidedBy != "admin.no-evil" {
		t.Fatalf("DecideUse: %+v, %v; want denied by admin.no-evil", dec, err)
	}
	e.wantRefused(t, "evil.example.com.", "admin.no-evil")
	if e.up.askedFor("evil.example.com.") {
		t.Fatal("the forbidden name was sent upstream")
	}
	if e.entryFor(t, "93.184.216.66") {
		t.Fatal("a backend entry was written for the forbidden name")
	}
	e.wantResolves(t, "ok.example.com.", "93.184.216.34")
}

// TestDNSPolicyGate: a forbid applied through the policy gate stops a name
// that resolved a moment ago (the prepared reply is not given again), and
// removing it lets the name resolve again; the same through a reload of the
// policy directory (SIGHUP).
func TestDNSPolicyGate(t *testing.T) {
	needZ3(t)
	e := newDecideEnv(t, map[string]string{"dns.cedar": forbidName("admin.no-evil", "evil.example.com")})
	for range 3 { // the second and third from the prepared reply
		e.wantResolves(t, "ok.example.com.", "93.184.216.34")
	}
	rep, err := e.a.ApplyPolicies(PolicyChange{Files: map[string]string{"ok.cedar": forbidName("admin.no-ok", "ok.example.com")}, Actor: "test"})
	if err != nil || !rep.Applied {
		t.Fatalf("apply the forbid: %+v, %v", rep, err)
	}
	e.wantRefused(t, "ok.example.com.", "admin.no-ok")
	e.wantRefused(t, "ok.example.com.", "admin.no-ok")

	// Removing the forbid widens: applied with AllowWidening.
	rep, err = e.a.ApplyPolicies(PolicyChange{Files: map[string]string{"ok.cedar": "// nothing forbidden\n"}, AllowWidening: true, Actor: "test"})
	if err != nil || !rep.Applied {
		t.Fatalf("apply the removal: %+v, %v", rep, err)
	}
	e.wantResolves(t, "ok.example.com.", "93.184.216.34")
	e.wantResolves(t, "ok.example.com.", "93.184.216.34")

	// The policy directory edited and reloaded (what SIGHUP does).
	writeFile(t, filepath.Join(e.dir, "ok.cedar"), forbidName("admin.no-ok-2", "ok.example.com"))
	if _, err := e.a.ReloadPolicies(ReloadOptions{}); err != nil {
		t.Fatalf("reload: %v", err)
	}
	e.wantRefused(t, "ok.example.com.", "admin.no-ok-2")
	if err := os.WriteFile(filepath.Join(e.dir, "ok.cedar"), []byte("// nothing forbidden\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := e.a.ReloadPolicies(ReloadOptions{AllowWiden: true}); err != nil {
		t.Fatalf("reload: %v", err)
	}
	e.wantResolves(t, "ok.example.com.", "93.184.216.34")
}
