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
	e := newTestEnv(t, func(c *Config) { c.up = memExchanger{zone} })
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
