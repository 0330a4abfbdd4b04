//go:build linux

package main

import (
	"fmt"
	"io"
	"log"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
)

// The fake upstream: answers every allowed name, in a process of its own.

const upstreamEnv = "SHINKEN_BENCH_DNS_UPSTREAM"

// upstreamMain runs the fake upstream in its own process (so its CPU is
// nobody's under test): it prints "PORT\n", serves until stdin closes, then
// prints the number of queries it answered.
func upstreamMain() {
	u, err := startUpstream(*flagUpstream)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(u.addr.Port())
	io.Copy(io.Discard, os.Stdin)
	u.close()
	fmt.Println(u.n.Load())
}

type upstream struct {
	addr  netip.AddrPort
	delay time.Duration
	n     atomic.Uint64
	srv   []*dns.Server
}

func startUpstream(delay time.Duration) (*upstream, error) {
	var (
		pc   net.PacketConn
		ln   net.Listener
		port int
	)
	for try := 0; ; try++ {
		var err error
		if pc, err = net.ListenPacket("udp4", "127.0.0.1:0"); err != nil {
			return nil, err
		}
		port = pc.LocalAddr().(*net.UDPAddr).Port
		if ln, err = net.Listen("tcp4", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			break
		}
		pc.Close()
		if try == 20 {
			return nil, err
		}
	}
	u := &upstream{addr: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port)), delay: delay}
	u.srv = []*dns.Server{{PacketConn: pc, Handler: u}, {Listener: ln, Handler: u}}
	var wg sync.WaitGroup
	for _, s := range u.srv {
		wg.Add(1)
		s.NotifyStartedFunc = wg.Done
		go s.ActivateAndServe()
	}
	wg.Wait()
	return u, nil
}

// ServeDNS answers every nK.allowed.bench with one public A record (never
// contacted: it only becomes a map entry), TTL 300; anything else NXDOMAIN.
func (u *upstream) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	u.n.Add(1)
	if u.delay > 0 {
		time.Sleep(u.delay)
	}
	m := new(dns.Msg)
	m.SetReply(req)
	q := req.Question[0]
	var k int
	if _, err := fmt.Sscanf(strings.ToLower(q.Name), "n%d.allowed.bench.", &k); err == nil && q.Qtype == dns.TypeA {
		m.Answer = []dns.RR{&dns.A{
			Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300},
			A:   net.IPv4(93, 184, byte(k>>8), byte(k)),
		}}
	} else {
		m.Rcode = dns.RcodeNameError
	}
	w.WriteMsg(m)
}

func (u *upstream) close() {
	for _, s := range u.srv {
		s.Shutdown()
	}
}
