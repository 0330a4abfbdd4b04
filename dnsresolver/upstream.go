package dnsresolver

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
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
// truncated answer over TCP. Each UDP exchange uses a fresh socket (random
// source port) and the reply's ID and question must match the query.
type forwarder struct {
	servers []string
	udp     *dns.Client
	tcp     *dns.Client
}

func newForwarder(servers []netip.AddrPort, timeout time.Duration) *forwarder {
	f := &forwarder{
		udp: &dns.Client{Net: "udp", Timeout: timeout, UDPSize: 1232},
		tcp: &dns.Client{Net: "tcp", Timeout: timeout},
	}
	for _, s := range servers {
		f.servers = append(f.servers, s.String())
	}
	return f
}

func (f *forwarder) exchange(ctx context.Context, m *dns.Msg) (*dns.Msg, error) {
	var errs []error
	for _, s := range f.servers {
		resp, _, err := f.udp.ExchangeContext(ctx, m, s)
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
