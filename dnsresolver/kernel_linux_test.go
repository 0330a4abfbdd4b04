package dnsresolver

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/shinken-agent/shinken/dataplane"
	"github.com/shinken-agent/shinken/dataplane/kerneltest"
	"github.com/shinken-agent/shinken/dataplane/probe"
	"golang.org/x/sys/unix"
)

// The tier-3 tests: a real dataplane (BPF programs attached to a private
// parent cgroup), a process inside a real session, real sockets on loopback.

const sessionProcEnv = "SHINKEN_DNS_SESSION_PROC"

func TestMain(m *testing.M) { kerneltest.Main(m, map[string]func(){sessionProcEnv: sessionProcMain}) }

// sessionProcMain is the process run inside the session. It reads commands
// on stdin and answers one line each:
//
//	tcp ADDR                       connect(2), raw syscall: "ok" or "err ERRNO"
//	dns MODE SERVER NAME TYPE      one DNS query with a plain socket to SERVER
//	                               (no getaddrinfo): "ok RCODE SRC a,b,c" or "err ..."
//	lookup SERVER NAME             Go's stub resolver (A and AAAA in parallel,
//	                               as an application does) against SERVER
func sessionProcMain() {
	in := bufio.NewScanner(os.Stdin)
	out := bufio.NewWriter(os.Stdout)
	for in.Scan() {
		f := strings.Fields(in.Text())
		var res string
		switch {
		case len(f) == 2 && f[0] == "tcp":
			res = rawConnect(f[1])
		case len(f) == 5 && f[0] == "dns":
			res = sessionQuery(f[1], f[2], f[3], f[4])
		case len(f) == 3 && f[0] == "lookup":
			res = stubLookup(f[1], f[2])
		default:
			res = "err bad command"
		}
		fmt.Fprintln(out, res)
		out.Flush()
	}
	os.Exit(0)
}

func rawConnect(addr string) string {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return "err " + err.Error()
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return "err " + err.Error()
	}
	defer unix.Close(fd)
	if err := unix.Connect(fd, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}); err != nil {
		if en, ok := err.(unix.Errno); ok {
			return "err " + unix.ErrnoName(en)
		}
		return "err " + err.Error()
	}
	return "ok"
}

// sessionQuery sends one query to server and reports the rcode, the address
// the reply appears to come from (as the application sees it) and the
// answer's addresses: "ok RCODE FROM a,b,-". mode is udp (unconnected AF_INET
// socket, sendto/recvfrom), cudp (connected UDP, as glibc does) or tcp.
// Plain sockets, no getaddrinfo.
func sessionQuery(mode, server, name, qtype string) string {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), dns.StringToType[qtype])
	fail := func(err error) string { return "err " + strings.ReplaceAll(err.Error(), " ", "_") }
	var (
		resp *dns.Msg
		from string
	)
	switch mode {
	case "udp":
		to, err := netip.ParseAddrPort(server)
		if err != nil {
			return fail(err)
		}
		c, err := net.ListenUDP("udp4", nil)
		if err != nil {
			return fail(err)
		}
		defer c.Close()
		b, _ := m.Pack()
		if _, err := c.WriteToUDPAddrPort(b, to); err != nil {
			return fail(err)
		}
		c.SetReadDeadline(time.Now().Add(3 * time.Second))
		buf := make([]byte, 4096)
		n, src, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			return fail(err)
		}
		resp = new(dns.Msg)
		if err := resp.Unpack(buf[:n]); err != nil {
			return fail(err)
		}
		from = src.String()
	case "cudp", "tcp":
		network := "udp"
		if mode == "tcp" {
			network = "tcp"
		}
		c := &dns.Client{Net: network, Timeout: 3 * time.Second}
		conn, err := c.Dial(server)
		if err != nil {
			return fail(err)
		}
		defer conn.Close()
		if resp, _, err = c.ExchangeWithConn(m, conn); err != nil {
			return fail(err)
		}
		from = conn.RemoteAddr().String()
	default:
		return "err bad mode"
	}
	var addrs []string
	for _, rr := range resp.Answer {
		switch v := rr.(type) {
		case *dns.A:
			addrs = append(addrs, v.A.String())
		case *dns.AAAA:
			addrs = append(addrs, v.AAAA.String())
		}
	}
	return fmt.Sprintf("ok %s %s %s", dns.RcodeToString[resp.Rcode], from, strings.Join(append(addrs, "-"), ","))
}

// stubLookup resolves name with Go's own stub resolver, its DNS server
// forced to server (not /etc/resolv.conf: the host's nameserver is not on
// loopback, and a test never sends to any other address).
func stubLookup(server, name string) string {
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, server)
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	addrs, err := r.LookupHost(ctx, name)
	if err != nil {
		var de *net.DNSError
		if errors.As(err, &de) {
			// Go reports REFUSED as "server misbehaving".
			return "err " + strings.ReplaceAll(de.Err, " ", "_")
		}
		return "err " + strings.ReplaceAll(err.Error(), " ", "_")
	}
	slices.Sort(addrs)
	return "ok " + strings.Join(addrs, ",")
}

// startSessionProc starts this test binary inside session s, serving the
// protocol of sessionProcMain.
func startSessionProc(t testing.TB, s dataplane.Session) *probe.Proc {
	t.Helper()
	return probe.StartEnv(t, []string{sessionProcEnv + "=1"}, func(c *exec.Cmd) error { return dataplane.StartIn(s, c, dataplane.ProcOptions{}) })
}

// kernelEnv is a real dataplane with one session, a handle, a fake upstream
// and a resolver writing into the dataplane.
type kernelEnv struct {
	mu    sync.Mutex
	names map[uint32]string // what Config.SessionName answers

	dp   *dataplane.Dataplane
	sess dataplane.Session
	h    dataplane.HandleRef
	up   *fakeUpstream
	r    *Resolver
}

// kernelZone resolves names to loopback addresses only: connections to them
// never leave the host.
var kernelZone = []string{
	"svc.kernel.test. 1 IN A 127.0.0.77",
	"www.kernel.test. 300 IN CNAME edge.kernel-cdn.test.",
	"edge.kernel-cdn.test. 300 IN A 127.0.0.78",
	"rebind.kernel.test. 300 IN A 127.0.0.79",
	"denied.kernel.test. 300 IN A 127.0.0.80",
}

func newKernelEnv(t *testing.T) *kernelEnv {
	t.Helper()
	parent, pin := kerneltest.Private("shinken-dnstest-")
	dp := kerneltest.Open(t, func() (*dataplane.Dataplane, error) {
		return dataplane.Open(dataplane.Config{Parent: parent, PinPath: pin, MaxSessions: 64, MaxHandles: 256, MaxEgress4: 1024, MaxEgress6: 1024})
	})
	sess, err := dp.CreateSession("dns1", dataplane.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	h, err := dp.NewHandle(dataplane.HandleRef{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	e := &kernelEnv{dp: dp, sess: sess, h: h, up: startFakeUpstream(t, kernelZone), names: map[uint32]string{sess.Index: sess.Name}}
	loop := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	r, err := New(Config{
		Dataplane: dp,
		SessionName: func(i uint32) (string, bool) {
			e.mu.Lock()
			defer e.mu.Unlock()
			n, ok := e.names[i]
			if real, ok2 := SessionNames(dp)(i); ok && (!ok2 || real != n) {
				t.Errorf("SessionNames(%d) = %q, %v; want %q", i, real, ok2, n)
			}
			return n, ok
		},
		ListenAddr: netip.MustParseAddrPort("0.0.0.0:0"),
		Upstreams:  []netip.AddrPort{e.up.addr},
		MinTTL:     time.Second,
		MaxTTL:     time.Hour,
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.SetPolicy(sess.Name, Policy{Grants: []Grant{
		{Pattern: "svc.kernel.test", Handle: h, Proto: dataplane.ProtoTCP, AllowNonPublic: loop},
		{Pattern: "www.kernel.test", Handle: h, Proto: dataplane.ProtoTCP, AllowNonPublic: loop},
		{Pattern: "rebind.kernel.test", Handle: h, Proto: dataplane.ProtoTCP}, // no AllowNonPublic: stripped
	}}); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	e.r = r
	return e
}

// listenLoopback accepts (and drops) TCP connections on addr.
func listenLoopback(t *testing.T, addr string) {
	t.Helper()
	ln, err := net.Listen("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
}

// TestKernelEntries: the resolver's answers become real kernel entries that a
// session process can use, with the TTL as the in-kernel expiry; refused and
// stripped names never do. The queries here go straight to the session
// address (what the kernel redirect produces), sent by the test process.
func TestKernelEntries(t *testing.T) {
	e := newKernelEnv(t)
	for _, a := range []string{"127.0.0.77:8080", "127.0.0.78:8080", "127.0.0.79:8080", "127.0.0.80:8080"} {
		listenLoopback(t, a)
	}
	p := startSessionProc(t, e.sess)
	server := netip.AddrPortFrom(SessionAddr(e.sess.Index), e.r.Port())
	ask := func(name string) *dns.Msg {
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeA)
		resp, _, err := (&dns.Client{Net: "udp", Timeout: 3 * time.Second}).Exchange(m, server.String())
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	steps := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"nothing reachable before resolving", func(t *testing.T) {
			for _, a := range []string{"127.0.0.77:8080", "127.0.0.78:8080", "127.0.0.79:8080", "127.0.0.80:8080"} {
				if got := p.Do("tcp " + a); got != "err EPERM" {
					t.Errorf("connect %s before resolving: %s", a, got)
				}
			}
		}},
		{"allowed name resolves then connects", func(t *testing.T) {
			resp := ask("svc.kernel.test.")
			if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
				t.Fatalf("%v", resp)
			}
			if got := p.Do("tcp 127.0.0.77:8080"); got != "ok" {
				t.Fatalf("connect after resolving: %s", got)
			}
			rules, err := e.dp.EgressRules(e.sess.Name)
			if err != nil {
				t.Fatal(err)
			}
			if len(rules) != 1 || rules[0].Prefix.String() != "127.0.0.77/32" || rules[0].Handle != e.h || rules[0].Expires.IsZero() {
				t.Fatalf("kernel rules %v", rules)
			}
			if d := time.Until(rules[0].Expires); d > 2*time.Second || d < -time.Second {
				t.Fatalf("kernel expiry in %v, want about 1s", d)
			}
		}},
		{"CNAME chain target reachable", func(t *testing.T) {
			resp := ask("www.kernel.test.")
			if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 2 {
				t.Fatalf("%v", resp)
			}
			if got := p.Do("tcp 127.0.0.78:8080"); got != "ok" {
				t.Fatalf("connect to chain target: %s", got)
			}
		}},
		{"rebinding answer stripped and unreachable", func(t *testing.T) {
			resp := ask("rebind.kernel.test.")
			if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 0 {
				t.Fatalf("%v", resp)
			}
			if got := p.Do("tcp 127.0.0.79:8080"); got != "err EPERM" {
				t.Fatalf("connect to stripped address: %s", got)
			}
		}},
		{"denied name refused, never asked, unreachable", func(t *testing.T) {
			if resp := ask("denied.kernel.test."); resp.Rcode != dns.RcodeRefused {
				t.Fatalf("%v", resp)
			}
			if e.up.askedFor("denied.kernel.test.") {
				t.Fatal("denied name forwarded")
			}
			if got := p.Do("tcp 127.0.0.80:8080"); got != "err EPERM" {
				t.Fatalf("connect to denied name's address: %s", got)
			}
		}},
		{"TTL expiry removes reachability", func(t *testing.T) {
			time.Sleep(2200 * time.Millisecond) // svc.kernel.test has TTL 1s
			if got := p.Do("tcp 127.0.0.77:8080"); got != "err EPERM" {
				t.Fatalf("connect after TTL expiry: %s", got)
			}
			if got := p.Do("tcp 127.0.0.78:8080"); got != "ok" {
				t.Fatalf("connect within TTL: %s", got)
			}
		}},
		{"revoking the handle cuts DNS-derived entries", func(t *testing.T) {
			if err := e.dp.Revoke(e.h); err != nil {
				t.Fatal(err)
			}
			if got := p.Do("tcp 127.0.0.78:8080"); got != "err EPERM" {
				t.Fatalf("connect after revoke: %s", got)
			}
			// And the resolver fails closed for the revoked grant.
			if resp := ask("svc.kernel.test."); resp.Rcode != dns.RcodeServerFailure {
				t.Fatalf("after revoke: %v", resp)
			}
		}},
	}
	for _, s := range steps {
		if !t.Run(s.name, s.run) {
			return
		}
	}
}

// TestRedirectedSession: a process inside a real session sends plain UDP
// (unconnected and connected) and TCP DNS queries to arbitrary loopback
// addresses on port 53, IPv4 and IPv6; the kernel redirects them to the
// resolver at the session's address, the resolver answers from its policy and
// writes real kernel entries, and the replies appear to come from the server
// the process asked.
func TestRedirectedSession(t *testing.T) {
	e := newKernelEnv(t)
	if err := e.dp.SetDNSRedirect(e.r.Port()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.dp.SetDNSRedirect(0) })
	listenLoopback(t, "127.0.0.77:8080")
	listenLoopback(t, "127.0.0.78:8080")
	listenLoopback(t, "127.0.0.80:8080")
	p := startSessionProc(t, e.sess)
	for _, tc := range []struct{ cmd, want string }{
		{"tcp 127.0.0.78:8080", "err EPERM"},
		{"dns udp 127.0.0.53:53 denied.kernel.test A", "ok REFUSED 127.0.0.53:53 -"},
		{"dns udp 127.0.0.53:53 svc.kernel.test A", "ok NOERROR 127.0.0.53:53 127.0.0.77,-"},
		{"dns cudp 127.9.8.7:53 www.kernel.test A", "ok NOERROR 127.9.8.7:53 127.0.0.78,-"},
		{"dns tcp 127.0.0.53:53 www.kernel.test A", "ok NOERROR 127.0.0.53:53 127.0.0.78,-"},
		{"dns cudp [::1]:53 www.kernel.test A", "ok NOERROR [::1]:53 127.0.0.78,-"},
		{"dns tcp [::1]:53 www.kernel.test A", "ok NOERROR [::1]:53 127.0.0.78,-"},
		{`dns cudp 127.0.0.53:53 x\000.svc.kernel.test A`, "ok REFUSED 127.0.0.53:53 -"},
		{"dns cudp 127.0.0.53:53 c2VjcmV0.exfil.kernel.test A", "ok REFUSED 127.0.0.53:53 -"},
		{"dns cudp 127.0.0.53:53 rebind.kernel.test A", "ok NOERROR 127.0.0.53:53 -"},
		{"dns cudp 127.0.0.53:53 svc.kernel.test ANY", "ok REFUSED 127.0.0.53:53 -"},
		{"lookup 127.0.0.53:53 www.kernel.test", "ok 127.0.0.78"},
		{"lookup [::1]:53 svc.kernel.test", "ok 127.0.0.77"},
		{"lookup 127.0.0.53:53 denied.kernel.test", "err server_misbehaving"},
		{"tcp 127.0.0.78:8080", "ok"},        // resolved through the redirect: reachable
		{"tcp 127.0.0.77:8080", "ok"},        // likewise
		{"tcp 127.0.0.80:8080", "err EPERM"}, // the denied name's address: never written
		{"tcp 127.0.0.79:8080", "err EPERM"}, // the stripped rebinding address
	} {
		t.Run(tc.cmd, func(t *testing.T) {
			if got := p.Do(tc.cmd); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
	// The system resolver path: glibc getaddrinfo (getent ahosts: A and
	// AAAA) reading a resolv.conf, inside the session. The process gets its
	// own user and mount namespaces with a resolv.conf naming 127.0.0.53
	// bind-mounted over /etc/resolv.conf, so nothing is ever sent to the
	// host's real nameserver; if the bind mount fails, getent never runs.
	t.Run("getaddrinfo", func(t *testing.T) {
		dir, err := os.MkdirTemp("", "shinken-dns-resolvconf-") // t.TempDir's parent is 0700: nobody could not read it
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		os.Chmod(dir, 0o755)
		rc := filepath.Join(dir, "resolv.conf")
		if err := os.WriteFile(rc, []byte("nameserver 127.0.0.53\noptions attempts:1 timeout:2\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		getent := func(name string) (string, error) {
			cmd := exec.Command("unshare", "--mount", "--user", "--map-root-user", "sh", "-ec",
				`mount --bind "$1" /etc/resolv.conf; exec getent ahosts "$2"`, "sh", rc, name)
			var out strings.Builder
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := dataplane.StartIn(e.sess, cmd, dataplane.ProcOptions{}); err != nil {
				t.Fatal(err)
			}
			err := cmd.Wait()
			return out.String(), err
		}
		if out, err := getent("www.kernel.test"); err != nil || !strings.Contains(out, "127.0.0.78 ") {
			t.Fatalf("getaddrinfo www.kernel.test: %v: %q", err, out)
		}
		if out, err := getent("denied.kernel.test"); err == nil || strings.Contains(out, "127.0.0.80") {
			t.Fatalf("getaddrinfo denied.kernel.test succeeded: %q", out)
		}
		if got := p.Do("tcp 127.0.0.78:8080"); got != "ok" {
			t.Fatalf("connect after getaddrinfo: %s", got)
		}
	})
	for _, n := range []string{"denied.kernel.test.", "c2VjcmV0.exfil.kernel.test."} {
		if e.up.askedFor(n) {
			t.Errorf("%s reached the upstream", n)
		}
	}
	st := e.r.Stats().Sessions[e.sess.Name]
	// not_allowed: two plain queries, and the stub resolver's A and AAAA
	// for denied.kernel.test (more if resolv.conf has search domains).
	if st.Denials[ReasonNotAllowed] < 4 || st.Denials[ReasonInvalidName] != 1 || st.Denials[ReasonQType] != 1 {
		t.Errorf("denial counters %+v", st.Denials)
	}

	// A second session, with no DNS policy: its queries arrive on its own
	// address, are refused, and write nothing, for it or for the first.
	s2, err := e.dp.CreateSession("dns2", dataplane.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	e.mu.Lock()
	e.names[s2.Index] = s2.Name
	e.mu.Unlock()
	before, _ := e.dp.EgressRules(e.sess.Name)
	p2 := startSessionProc(t, s2)
	if got := p2.Do("dns udp 127.0.0.53:53 svc.kernel.test A"); got != "ok REFUSED 127.0.0.53:53 -" {
		t.Fatalf("second session: %q", got)
	}
	if got := p2.Do("tcp 127.0.0.77:8080"); got != "err EPERM" {
		t.Fatalf("second session reaches the first one's entry: %q", got)
	}
	if r, _ := e.dp.EgressRules(s2.Name); len(r) != 0 {
		t.Fatalf("entries for the second session: %v", r)
	}
	if after, _ := e.dp.EgressRules(e.sess.Name); len(after) != len(before) {
		t.Fatalf("first session's entries changed: %v -> %v", before, after)
	}
	if d := e.r.Stats().Sessions[s2.Name].Denials[ReasonNotAllowed]; d != 1 {
		t.Fatalf("second session's denials: %d", d)
	}
}
