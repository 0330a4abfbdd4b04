package dnsresolver

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// hugeZone is one name with n AAAA records (n*28 bytes of answer: over
// 64 KiB from n = 2341).
func hugeZone(name string, n int) []string {
	var zone []string
	for i := range n {
		zone = append(zone, fmt.Sprintf("%s 300 IN AAAA 2a00:1450:%x::%x", name, i/256+1, i%256+1))
	}
	return zone
}

// tcpExchange sends one query over TCP and reads exactly one framed reply;
// it fails if anything else follows the frame.
func tcpExchange(t *testing.T, to string, m *dns.Msg) *dns.Msg {
	t.Helper()
	c, err := net.DialTimeout("tcp4", to, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	q, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(q))), q...)); err != nil {
		t.Fatal(err)
	}
	var hdr [2]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, binary.BigEndian.Uint16(hdr[:]))
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatal(err)
	}
	// Nothing after the frame (a wrapped length leaves the rest unread).
	c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, err := c.Read(hdr[:1]); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("%d more bytes after the %d-byte frame (%v)", n, len(buf), err)
	}
	resp := new(dns.Msg)
	if err := resp.Unpack(buf); err != nil {
		t.Fatalf("reply of %d bytes does not unpack: %v", len(buf), err)
	}
	return resp
}

// TestTCPAnswerOver64K: an answer too big for a TCP frame (4,000 AAAA
// records, 112 KB) is sent truncated with TC set, its length right.
func TestTCPAnswerOver64K(t *testing.T) {
	zone := loadZone(t, hugeZone("huge.test.", 4000))
	e := newTestEnv(t, func(c *Config) { c.up = memExchanger{zone}; c.MaxAnswerRecords = 4000 })
	if err := e.r.SetPolicy("s1", Policy{Grants: []Grant{{Pattern: "huge.test", Handle: h1}}}); err != nil {
		t.Fatal(err)
	}
	m := new(dns.Msg)
	m.SetQuestion("huge.test.", dns.TypeAAAA)
	resp := tcpExchange(t, fmt.Sprintf("%s:%d", SessionAddr(1), e.r.Port()), m)
	if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) == 0 {
		t.Fatalf("rcode %s, %d answers", dns.RcodeToString[resp.Rcode], len(resp.Answer))
	}
	if !resp.Truncated && len(resp.Answer) != 4000 {
		t.Fatalf("%d answers without TC", len(resp.Answer))
	}
	t.Logf("TC=%v, %d answers", resp.Truncated, len(resp.Answer))
}

// TestAnswerBound: a name with 4,000 addresses is answered with the first
// MaxAnswerRecords of them, and only those are written; the cache keeps at
// most 4 × MaxAnswerRecords, so a repeat query builds no more. Another
// session's first query writes its own bounded set.
func TestAnswerBound(t *testing.T) {
	zone := loadZone(t, hugeZone("huge.test.", 4000))
	e := newTestEnv(t, func(c *Config) { c.up = memExchanger{zone} })
	pol := Policy{Grants: []Grant{{Pattern: "huge.test", Handle: h1}}}
	if err := e.r.SetPolicy("s1", pol); err != nil {
		t.Fatal(err)
	}
	if err := e.r.SetPolicy("s2", pol); err != nil {
		t.Fatal(err)
	}
	n := DefaultMaxAnswerRecords
	for i := range 50 {
		for _, tr := range []string{"udp", "tcp"} {
			resp := e.ask(t, 1, tr, "huge.test.", dns.TypeAAAA)
			if resp.Rcode != dns.RcodeSuccess || resp.Truncated || len(resp.Answer) != n {
				t.Fatalf("query %d over %s: rcode %s, TC %v, %d answers; want %d", i, tr, dns.RcodeToString[resp.Rcode], resp.Truncated, len(resp.Answer), n)
			}
			got := e.dp.take()
			if want := map[bool]int{true: n, false: 0}[i == 0 && tr == "udp"]; len(got) != want {
				t.Fatalf("query %d over %s wrote %d entries, want %d", i, tr, len(got), want)
			}
			// The answer's addresses are the first n of the zone, in order.
			for j, rr := range resp.Answer {
				if want := zone.rrs["huge.test."][j].(*dns.AAAA).AAAA; !rr.(*dns.AAAA).AAAA.Equal(want) {
					t.Fatalf("answer %d: %v, want %v", j, rr, want)
				}
			}
		}
	}
	if res := e.r.cache.get(cacheKey{"huge.test", dns.TypeAAAA}, time.Now()); res == nil || len(res.addrs) != 4*n {
		t.Fatalf("cached result: %v", res)
	}
	resp := e.ask(t, 300, "udp", "huge.test.", dns.TypeAAAA)
	if got := e.dp.take(); len(resp.Answer) != n || len(got) != n || got[0].Session != "s2" {
		t.Fatalf("second session: %d answers, %d entries", len(resp.Answer), len(got))
	}
	if st := e.r.Stats(); st.Total.EntriesWritten != uint64(2*n) {
		t.Fatalf("entries written %d, want %d", st.Total.EntriesWritten, 2*n)
	}
}
