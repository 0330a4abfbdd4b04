//go:build linux

package main

// Session B's probe: this binary, started in B through the API
// (POST /v1/sessions/B/run), sends DNS queries at a fixed rate to port 53
// (the kernel redirects them to the agent's resolver at B's own address)
// and times each from its send to its reply. It prints one line per kind,
// "cached N1 N2 ..." and "fresh ..." (nanoseconds, answered queries only),
// and the counts "sent N", "lost_cached N", "lost_fresh N" (no reply within
// probeTimeout), "err_cached N", "err_fresh N" (a reply that is not NOERROR
// with an address), "late N" (sends more than one interval behind their
// schedule: the probe itself was held off the CPU).
//
// Beside each query it sends the same bytes to a UDP echo server on the
// host (echoAddr: loopback, B's grant, no agent on the path) and prints
// those round trips too ("echo ..."; "lost_echo N"): the control, what the
// kernel and the CPUs alone give B during the phase.
//
// Kinds: every freshEvery-th query is a name B has never asked
// (TAG-N.short.neighbor.test: the upstream and a kernel write); the others
// repeat one name (b.long.neighbor.test, answered from the cache).

import (
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"

	"github.com/shinken-agent/shinken/bench/internal/benchkit"
)

const probeTimeout = time.Second

func query(id uint16, name string) []byte {
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	m.Id = id
	b, err := m.Pack()
	if err != nil {
		panic(err)
	}
	return b
}

func probe(d time.Duration, rate, freshEvery int, tag string) error {
	n := int(d.Seconds() * float64(rate))
	if n < 1 || n > 65536 || freshEvery < 1 {
		return fmt.Errorf("probe: %d queries (1 to 65536), fresh every %d", n, freshEvery)
	}
	c, err := net.Dial("udp4", "127.0.0.1:53")
	if err != nil {
		return err
	}
	sent := make([]atomic.Int64, n)
	lat := make([]atomic.Int64, n) // 0: no reply yet; -1: a bad reply
	ec, err := net.Dial("udp4", echoAddr)
	if err != nil {
		return err
	}
	esent := make([]atomic.Int64, n)
	elat := make([]atomic.Int64, n)
	go func() {
		buf := make([]byte, 4096)
		for {
			k, err := ec.Read(buf)
			if err != nil {
				if strings.Contains(err.Error(), "use of closed") {
					return
				}
				continue
			}
			now := benchkit.MonoNS()
			if k < 12 {
				continue
			}
			if id := int(binary.BigEndian.Uint16(buf)); id < n && esent[id].Load() != 0 && elat[id].Load() == 0 {
				elat[id].Store(now - esent[id].Load())
			}
		}
	}()
	go func() {
		buf := make([]byte, 4096)
		for {
			k, err := c.Read(buf)
			if err != nil {
				if strings.Contains(err.Error(), "use of closed") {
					return
				}
				continue // ECONNREFUSED and the like: the query counts as lost
			}
			now := benchkit.MonoNS()
			if k < 12 {
				continue
			}
			id := int(binary.BigEndian.Uint16(buf))
			if id >= n || sent[id].Load() == 0 || lat[id].Load() != 0 {
				continue
			}
			rcode, ancount := buf[3]&0xf, binary.BigEndian.Uint16(buf[6:])
			if rcode != 0 || ancount == 0 {
				lat[id].Store(-1)
				continue
			}
			lat[id].Store(now - sent[id].Load())
		}
	}()
	fresh := func(i int) bool { return i%freshEvery == freshEvery-1 }
	interval := time.Second / time.Duration(rate)
	start := benchkit.MonoNS()
	late := 0
	for i := 0; i < n; i++ {
		at := start + int64(i)*int64(interval)
		if wait := time.Duration(at - benchkit.MonoNS()); wait > 0 {
			time.Sleep(wait)
		} else if -wait > interval {
			late++
		}
		name := "b.long.neighbor.test."
		if fresh(i) {
			name = fmt.Sprintf("%s-%d.short.neighbor.test.", tag, i)
		}
		q := query(uint16(i), name)
		sent[i].Store(benchkit.MonoNS())
		c.Write(q) // an error is a lost query
		esent[i].Store(benchkit.MonoNS())
		ec.Write(q)
	}
	time.Sleep(probeTimeout)
	c.Close()
	ec.Close()
	var echo []int64
	elost := 0
	for i := 0; i < n; i++ {
		if v := elat[i].Load(); v == 0 || v > int64(probeTimeout) {
			elost++
		} else {
			echo = append(echo, v)
		}
	}
	benchkit.Line("echo", echo)
	fmt.Printf("lost_echo %d\n", elost)
	var cached, freshL []int64
	lost, bad := [2]int{}, [2]int{}
	for i := 0; i < n; i++ {
		k := 0
		if fresh(i) {
			k = 1
		}
		switch v := lat[i].Load(); {
		case v == -1:
			bad[k]++
		case v == 0 || v > int64(probeTimeout):
			lost[k]++
		case k == 0:
			cached = append(cached, v)
		default:
			freshL = append(freshL, v)
		}
	}
	benchkit.Line("cached", cached)
	benchkit.Line("fresh", freshL)
	fmt.Printf("sent %d\nlost_cached %d\nlost_fresh %d\nerr_cached %d\nerr_fresh %d\nlate %d\n", n, lost[0], lost[1], bad[0], bad[1], late)
	return nil
}
