package dnsresolver

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// ErrUpstream wraps every upstream failure; the client gets SERVFAIL.
var ErrUpstream = errors.New("dnsresolver: upstream failed")

// exchanger sends one query upstream. The network one is forwarder; tests and
// fuzzing substitute an in-process one.
type exchanger interface {
	exchange(ctx context.Context, m *dns.Msg) (*dns.Msg, error)
}

// forwarder asks a list of nameservers in order over UDP, retrying a
// truncated answer over TCP. UDP sockets are connected to one server, kept in
// a small pool and reused for at most maxUses queries each (a socket is
// bound to a random port when it is made, and every query has a random ID):
// a fresh socket per query cost about as much CPU as the rest of the miss.
// A socket that saw an error or a timeout is closed, never reused, so a late
// reply can never be taken for another query's; and the reply's ID and
// question must match the query.
type forwarder struct {
	servers []string
	pools   []*connPool
	udp     *dns.Client
	tcp     *dns.Client
}

const (
	poolIdle = 64  // idle sockets kept per server
	maxUses  = 256 // queries per socket before it is replaced
)

type pooledConn struct {
	*dns.Conn
	uses int
}

type connPool struct {
	mu   sync.Mutex
	addr string
	idle []*pooledConn
}

func (p *connPool) get(c *dns.Client) (*pooledConn, error) {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		pc := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		return pc, nil
	}
	p.mu.Unlock()
	conn, err := c.Dial(p.addr)
	if err != nil {
		return nil, err
	}
	return &pooledConn{Conn: conn}, nil
}

func (p *connPool) put(pc *pooledConn, ok bool) {
	pc.uses++
	if ok && pc.uses < maxUses {
		p.mu.Lock()
		if len(p.idle) < poolIdle {
			p.idle = append(p.idle, pc)
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
	}
	pc.Close()
}

func (p *connPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pc := range p.idle {
		pc.Close()
	}
	p.idle = nil
}

func newForwarder(servers []netip.AddrPort, timeout time.Duration) *forwarder {
	f := &forwarder{
		udp: &dns.Client{Net: "udp", Timeout: timeout, UDPSize: 1232},
		tcp: &dns.Client{Net: "tcp", Timeout: timeout},
	}
	for _, s := range servers {
		f.servers = append(f.servers, s.String())
		f.pools = append(f.pools, &connPool{addr: s.String()})
	}
	return f
}

func (f *forwarder) close() {
	for _, p := range f.pools {
		p.close()
	}
}

func (f *forwarder) exchange(ctx context.Context, m *dns.Msg) (*dns.Msg, error) {
	var errs []error
	for i, s := range f.servers {
		resp, err := f.exchangeUDP(ctx, f.pools[i], m)
		if err == nil && resp.Truncated {
			resp, _, err = f.tcp.ExchangeContext(ctx, m, s)
		}
		if err == nil {
			err = checkReply(m, resp)
		}
		if err == nil {
			return resp, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", s, err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("%w: %w", ErrUpstream, errors.Join(errs...))
}

func (f *forwarder) exchangeUDP(ctx context.Context, p *connPool, m *dns.Msg) (*dns.Msg, error) {
	pc, err := p.get(f.udp)
	if err != nil {
		return nil, err
	}
	resp, _, err := f.udp.ExchangeWithConnContext(ctx, m, pc.Conn)
	if err == nil && resp.Id != m.Id {
		err = dns.ErrId
	}
	p.put(pc, err == nil)
	return resp, err
}

func checkReply(q, r *dns.Msg) error {
	if r.Id != q.Id || !r.Response || len(r.Question) != 1 ||
		r.Question[0].Qtype != q.Question[0].Qtype || r.Question[0].Qclass != q.Question[0].Qclass ||
		!strings.EqualFold(r.Question[0].Name, q.Question[0].Name) {
		return errors.New("reply does not match the query")
	}
	switch r.Rcode {
	case dns.RcodeSuccess, dns.RcodeNameError:
		return nil
	}
	return fmt.Errorf("rcode %s", dns.RcodeToString[r.Rcode])
}

// upstreamQuery builds the query the resolver forwards: only the canonical
// name and type of the client's question, a fresh ID, RD, and our own EDNS0
// (no options: nothing of the client's OPT record travels upstream).
func upstreamQuery(name string, qtype uint16) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(name+".", qtype)
	m.RecursionDesired = true
	m.SetEdns0(1232, false)
	return m
}
