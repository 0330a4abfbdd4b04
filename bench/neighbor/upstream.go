//go:build linux

package main

// The DNS upstream: a miekg/dns server on 127.0.0.1 (UDP and TCP on one
// port), in a process of its own so that its CPU is nobody's under test. The
// machine has no network: the agent's resolver forwards here.
//
//   - NAME.long.neighbor.test: one A record in 127.64.0.0/16, TTL 3600
//   - NAME.short.neighbor.test: one A record in 127.64.0.0/16, TTL 1
//   - NAME.big.neighbor.test: bigRecords A records in 127.65.0.0/16, TTL
//     3600 (over UDP truncated with TC set, so the resolver asks again over
//     TCP)
//   - anything else: NXDOMAIN

import (
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/miekg/dns"
)

const (
	upstreamEnv = "SHINKEN_BENCH_NEIGHBOR_UPSTREAM"
	bigRecords  = 3500 // about 56 KB over TCP (name compression), under 64 KiB
	echoAddr    = "127.64.0.1:443"
)

// upstreamMain serves until stdin closes; it prints "PORT\n" first and the
// number of queries answered last.
func upstreamMain() {
	var pc net.PacketConn
	var ln net.Listener
	var err error
	for try := 0; ; try++ {
		if pc, err = net.ListenPacket("udp4", "127.0.0.1:0"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if ln, err = net.Listen("tcp4", pc.LocalAddr().String()); err == nil {
			break
		}
		pc.Close()
		if try == 20 {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	var n atomic.Uint64
	h := dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		n.Add(1)
		w.WriteMsg(answer(req, w.LocalAddr().Network() == "udp"))
	})
	srv := []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: ln, Handler: h}}
	var wg sync.WaitGroup
	for _, s := range srv {
		wg.Add(1)
		s.NotifyStartedFunc = wg.Done
		go s.ActivateAndServe()
	}
	wg.Wait()
	// The control: a UDP echo server on 127.64.0.1:443 (B's grant reaches
	// it; no agent on its path), for B's probe to time beside its queries.
	echo, err := net.ListenPacket("udp4", echoAddr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	go func() {
		buf := make([]byte, 4096)
		for {
			n, from, err := echo.ReadFrom(buf)
			if err != nil {
				return
			}
			echo.WriteTo(buf[:n], from)
		}
	}()
	fmt.Println(pc.LocalAddr().(*net.UDPAddr).Port)
	io.Copy(io.Discard, os.Stdin)
	for _, s := range srv {
		s.Shutdown()
	}
	echo.Close()
	fmt.Println(n.Load())
	os.Exit(0)
}

func answer(req *dns.Msg, udp bool) *dns.Msg {
	m := new(dns.Msg)
	m.SetReply(req)
	if len(req.Question) != 1 {
		m.Rcode = dns.RcodeFormatError
		return m
	}
	q := req.Question[0]
	name := strings.ToLower(q.Name)
	hf := fnv.New32a()
	hf.Write([]byte(name))
	h := hf.Sum32()
	a := func(ip net.IP, ttl uint32) dns.RR {
		return &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: ttl}, A: ip}
	}
	switch {
	case q.Qtype != dns.TypeA:
		// NOERROR, no data
	case strings.HasSuffix(name, ".long.neighbor.test."):
		m.Answer = []dns.RR{a(net.IPv4(127, 64, byte(h>>8), byte(h)), 3600)}
	case strings.HasSuffix(name, ".short.neighbor.test."):
		m.Answer = []dns.RR{a(net.IPv4(127, 64, byte(h>>8), byte(h)), 1)}
	case strings.HasSuffix(name, ".big.neighbor.test."):
		for i := 0; i < bigRecords; i++ {
			m.Answer = append(m.Answer, a(net.IPv4(127, 65, byte(i>>8), byte(i)), 3600))
		}
		m.Compress = true
		if udp {
			size := dns.MinMsgSize
			if o := req.IsEdns0(); o != nil {
				size = int(o.UDPSize())
			}
			m.Truncate(size)
		}
	default:
		m.Rcode = dns.RcodeNameError
	}
	return m
}
