package dataplane

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestSocketQuota: one session cannot take more than its limit of the host's
// sockets or local ports (bpf/quota.bpf.h) while another session still gets
// its own; closing gives back; the ways around it a session could try (dup,
// AF_UNIX, socketpair, connect() to many destinations) are tried and
// measured.
func TestSocketQuota(t *testing.T) { forModes(t, testSocketQuota) }

func testSocketQuota(t *testing.T, mode FlowMode) {
	const maxSocks, maxPorts = 32, 8
	cfg := modeConfig(t, mode)
	cfg.MaxSocketsPerSession, cfg.MaxPortsPerSession = maxSocks, maxPorts
	d := newDataplane(t, cfg)
	a, err := d.CreateSession("qa", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := d.CreateSession("qb", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	pa := startProbe(t, a, ProcOptions{})
	pb := startProbe(t, b, ProcOptions{})
	const eperm = "err operation not permitted"
	want := func(t *testing.T, p interface{ Do(string) string }, cmd, wantOut string) {
		t.Helper()
		if got := p.Do(cmd); got != wantOut {
			t.Fatalf("%s: %q, want %q", cmd, got, wantOut)
		}
	}
	use := func(t *testing.T, s string) SocketUse {
		t.Helper()
		u, err := d.SocketUse(s)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	denials := func(t *testing.T, s Session, r Reason) uint64 {
		t.Helper()
		c, err := d.Counters(s.Index)
		if err != nil {
			t.Fatal(err)
		}
		return c[r]
	}

	t.Run("sockets", func(t *testing.T) {
		base := use(t, "qa").Sockets
		want(t, pa, fmt.Sprintf("nsock s %d udp", maxSocks+8), fmt.Sprintf("ok %d %s", maxSocks-int(base), eperm))
		if u := use(t, "qa"); u.Sockets != maxSocks {
			t.Errorf("session qa counts %d sockets, want %d", u.Sockets, maxSocks)
		}
		if n := denials(t, a, ReasonSocketLimit); n != 1 {
			t.Errorf("socket_limit denials %d, want 1", n)
		}
		// The other session is not held back by the first one's limit.
		want(t, pb, "nsock s 5 tcp", "ok 5")
		// dup and close of the dups: the socket lives on, still counted.
		want(t, pa, "dupclose s", fmt.Sprintf("ok %d", maxSocks-int(base)))
		want(t, pa, "nsock t 1 tcp", "ok 0 "+eperm)
		// Closing one lets exactly one new one in.
		want(t, pa, "closen s 1", "ok 1")
		want(t, pa, "nsock t 2 tcp", "ok 1 "+eperm)
		// AF_UNIX sockets and socketpairs: cgroup/sock_create does not run
		// for them (bounded by RLIMIT_NOFILE and the process bound only).
		want(t, pa, "nsock u 8 unix", "ok 8")
		want(t, pa, "nsock u 4 pair", "ok 4")
		want(t, pa, "closen s 1000", fmt.Sprintf("ok %d", maxSocks-int(base)-1))
		want(t, pa, "closen t 1000", "ok 1")
		want(t, pa, "closen u 1000", "ok 16")
		want(t, pb, "closen s 1000", "ok 5")
		if u := use(t, "qa"); u.Sockets != base {
			t.Errorf("after closing every socket, session qa counts %d sockets, want %d", u.Sockets, base)
		}
	})

	t.Run("ports", func(t *testing.T) {
		if mode != FlowSweep {
			t.Skip("port holds exist in sweep mode only; packet mode bounds a session's ports by its socket limit alone")
		}
		want(t, pa, fmt.Sprintf("nbind p %d 127.0.0.1", maxPorts+4), fmt.Sprintf("ok %d %s", maxPorts, eperm))
		if u := use(t, "qa"); u.Ports != maxPorts {
			t.Errorf("session qa holds %d ports, want %d", u.Ports, maxPorts)
		}
		if n := denials(t, a, ReasonPortLimit); n != 1 {
			t.Errorf("port_limit denials %d, want 1", n)
		}
		want(t, pb, "nbind p 3 127.0.0.1", "ok 3")
		// A listen on an autobound port cannot be refused (sockops): its
		// hold is taken past the limit, so it is still checked (no inbound
		// grant: nothing connects).
		port := pa.Do("alisten l 4")
		if !strings.HasPrefix(port, "ok ") {
			t.Fatalf("alisten: %s", port)
		}
		if u := use(t, "qa"); u.Ports != maxPorts+1 {
			t.Errorf("after a listen past the limit, session qa holds %d ports, want %d", u.Ports, maxPorts+1)
		}
		dl := net.Dialer{Timeout: 300 * time.Millisecond}
		if c, err := dl.Dial("tcp", "127.0.0.1:"+strings.TrimPrefix(port, "ok ")); err == nil {
			c.Close()
			t.Error("a listener past the port limit was reached with no inbound grant")
		}
		want(t, pa, "close l", "ok")
		want(t, pa, "closen p 1", "ok 1")
		want(t, pa, "nbind q 2 127.0.0.1", "ok 1 "+eperm)
		want(t, pa, "closen p 1000", fmt.Sprintf("ok %d", maxPorts-1))
		want(t, pa, "closen q 1000", "ok 1")
		want(t, pb, "closen p 1000", "ok 3")
		if u := use(t, "qa"); u.Ports != 0 {
			t.Errorf("after closing, session qa holds %d ports, want 0", u.Ports)
		}
	})

	t.Run("ephemeral range", func(t *testing.T) {
		// connect() to many destinations: each UDP socket takes its own
		// local port, and the socket limit bounds how many.
		mustAllow(t, d, "qa", EgressRule{Prefix: pfx("127.0.0.0/8"), Proto: ProtoUDP, Handle: mustHandle(t, d, HandleRef{}, time.Time{})})
		lo, hi := ephemeralRange(t)
		before := ephemeralInUse(t, lo, hi)
		n := maxSocks - int(use(t, "qa").Sockets)
		got := pa.Do("nconn c 200 127.1.0.1 9")
		if want := fmt.Sprintf("ok %d %s", n, eperm); got != want {
			t.Errorf("nconn: %q, want %q", got, want)
		}
		after := ephemeralInUse(t, lo, hi)
		t.Logf("host ephemeral ports %d-%d: %d left before, %d left with the session at its limit", lo, hi, hi-lo+1-before, hi-lo+1-after)
		if after-before > maxSocks {
			t.Errorf("the session took %d local ports, more than its %d sockets", after-before, maxSocks)
		}
		want(t, pa, "closen c 1000", fmt.Sprintf("ok %d", n))
	})
}

// ephemeralRange is the host's ip_local_port_range.
func ephemeralRange(t *testing.T) (int, int) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	lo, _ := strconv.Atoi(f[0])
	hi, _ := strconv.Atoi(f[1])
	return lo, hi
}

// ephemeralInUse counts the distinct UDP local ports in [lo, hi] in use in
// this network namespace.
func ephemeralInUse(t *testing.T, lo, hi int) int {
	ports := map[int]bool{}
	for _, name := range []string{"/proc/net/udp", "/proc/net/udp6"} {
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // header
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) < 2 {
				continue
			}
			_, hexPort, _ := strings.Cut(fs[1], ":")
			p, err := strconv.ParseInt(hexPort, 16, 32)
			if err == nil && int(p) >= lo && int(p) <= hi {
				ports[int(p)] = true
			}
		}
		f.Close()
	}
	return len(ports)
}
