package dnsresolver

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"runtime"
	"slices"
	"time"

	"github.com/miekg/dns"
	"github.com/shinken-agent/shinken/agent/backend"
)

// Errors of New, Start and SetPolicy.
var (
	ErrInvalidConfig = errors.New("dnsresolver: invalid config")
	ErrNoUpstream    = errors.New("dnsresolver: no upstream nameserver")
	ErrClosed        = errors.New("dnsresolver: closed")
	ErrStarted       = errors.New("dnsresolver: already started")
	ErrNotSupported  = errors.New("dnsresolver: not supported on this platform")
)

// Dataplane is what the resolver needs from the kernel side: the method set
// of backend.Backend's AllowEgress, so every backend satisfies it.
type Dataplane interface {
	// AllowEgress installs (or refreshes) one egress rule for the session.
	// It must return only once the rule is enforced. Refreshing should keep
	// the later of the old and new expiry: two names may resolve to one
	// address with different TTLs.
	AllowEgress(session string, r backend.EgressRule) error
}

// SessionIndexer is the part of backend.Backend that names sessions by
// kernel index.
type SessionIndexer interface {
	SessionByIndex(index uint32) (backend.Session, error)
}

// SessionNames adapts a SessionIndexer (any backend) to
// Config.SessionName.
func SessionNames(d SessionIndexer) func(uint32) (string, bool) {
	return func(index uint32) (string, bool) {
		s, err := d.SessionByIndex(index)
		if err != nil {
			return "", false
		}
		return s.Name, true
	}
}

// Defaults.
const (
	DefaultPort             = 53053 // 5353 is mDNS's
	DefaultMinTTL           = 5 * time.Second
	DefaultMaxTTL           = time.Hour
	DefaultUpstreamTimeout  = 2 * time.Second
	DefaultMaxCNAMEChain    = 8
	DefaultCacheSize        = 16384
	DefaultMaxInflight      = 4096
	DefaultUDPWorkers       = 1
	DefaultUDPBusyPoll      = 25 * time.Microsecond
	DefaultMaxTCPConns      = 1024
	DefaultPerSessionLimit  = 128
	DefaultMaxAnswerRecords = 16
	DefaultQueryRate        = 1000
	DefaultQueryBurst       = 2000
	DefaultWriteRate        = 500
	DefaultWriteBurst       = 2000
	DefaultResolvConf       = "/etc/resolv.conf"
)

// Config configures a Resolver. Zero fields take the defaults above.
type Config struct {
	// Dataplane receives the egress entries. Required.
	Dataplane Dataplane
	// SessionName names the live session with a kernel index (the index the
	// session address encodes, see SessionAddr), or reports false. Required.
	// It is called for every query, so keep it a map lookup.
	SessionName func(index uint32) (session string, ok bool)

	// ListenAddr is where the UDP and TCP sockets bind. Default
	// 0.0.0.0:DefaultPort. It must be the IPv4 wildcard address (the
	// session addresses are all of 127.128.0.0/9); port 0 picks a free
	// port, see Resolver.Port.
	ListenAddr netip.AddrPort

	// Upstreams are asked in order; the first that answers wins. Default:
	// the nameservers of ResolvConf.
	Upstreams []netip.AddrPort
	// ResolvConf is read when Upstreams is empty. Default /etc/resolv.conf.
	ResolvConf string
	// UpstreamTimeout bounds one query to one upstream. Default 2s.
	UpstreamTimeout time.Duration

	// MinTTL and MaxTTL clamp every answer TTL and so every entry's expiry.
	// Defaults 5s and 1h.
	MinTTL, MaxTTL time.Duration

	// DenyRcode answers names that are not allowed: dns.RcodeRefused
	// (default) or dns.RcodeNameError (NXDOMAIN).
	DenyRcode int

	// MaxCNAMEChain caps the CNAME links followed from the question name;
	// a longer chain is SERVFAIL. Default 8.
	MaxCNAMEChain int

	// MaxAnswerRecords bounds the records of the question's type (A, AAAA
	// or a passthrough type) in one answer, and so the entries one answer
	// writes (times the grants matching the name): an answer carries the
	// first MaxAnswerRecords addresses, in the upstream's order, that the
	// session may reach, and the cache keeps at most 4 × MaxAnswerRecords
	// of an upstream answer's addresses (and MaxAnswerRecords of its other
	// records) to choose them from. The rest are never built, written or
	// sent, and the answer's TC bit stays clear (asking again over TCP
	// gives the same records). Default 16 (an answer of 16 A or AAAA
	// records fits 512 bytes for most names); at most 4096.
	MaxAnswerRecords int

	// PassthroughTypes are query types, besides A and AAAA, forwarded for
	// allowed names (e.g. dns.TypeTXT, dns.TypeMX). Their answers are
	// filtered to records on the CNAME chain and write no entries. ANY,
	// AXFR, IXFR and the address-carrying HTTPS/SVCB are never allowed here.
	PassthroughTypes []uint16

	// CacheSize bounds the shared answer cache (entries). Default 16384;
	// negative disables the cache.
	CacheSize int

	// AlwaysWrite makes every answer call AllowEgress for every rule. By
	// default a rule whose entry this resolver already wrote with the same
	// or a later expiry is skipped: a cached answer then costs no map write,
	// and a shorter TTL for an address another name also resolved to never
	// shortens that entry. The entry is in the kernel unless something
	// outside the resolver removed it; SetPolicy and RemovePolicy forget
	// what was written for their session. Skipping can only cost
	// availability (a connection denied), never widen access.
	AlwaysWrite bool

	// UDPSockets is the number of UDP sockets bound to ListenAddr with
	// SO_REUSEPORT; the kernel steers each session's datagrams to one of
	// them by session address, and a flooding session's to one more, the
	// penalty socket (reuseport_linux.go, steer_linux.go), so one session's
	// flood fills one socket's queue, not every session's. Default: the number of CPUs, at
	// most 16; at most 1024.
	UDPSockets int
	// UDPWorkers is the number of threads blocked in recvmmsg(2) on each
	// UDP socket (the penalty socket has one), each answering what the
	// cache can answer without a kernel write inline (a query that must go
	// upstream, or write entries first, gets its own goroutine). Default 1:
	// on the 2-core bench host every extra worker on one socket cost CPU
	// per query (Go runtime hand-offs) without adding throughput.
	UDPWorkers int
	// UDPBusyPoll is how long a busy UDP worker keeps looking for the next
	// query (non-blocking recvmmsg(2) in a loop) before it goes to sleep in
	// a blocking one. A worker is busy from a wake-up that finds more than
	// one query queued, or that came within 4 × UDPBusyPoll of going to
	// sleep, until a poll finds nothing; each poll that finds nothing
	// doubles (up to 64) the busy wake-ups needed before the next, each that
	// finds queries halves it. A resolver asked now and then never polls;
	// one whose queries come just too far apart for the poll wastes at most
	// one poll in 64 busy wake-ups. Sleeping costs a context switch per wake-up and, on an idle CPU
	// of a virtual machine, an exit to the hypervisor on both sides (on the
	// 2-vCPU bench guest, whose idle driver does not poll: about 30 µs of
	// round trip and more CPU per query than the polling). Default 25µs;
	// negative never polls.
	UDPBusyPoll time.Duration
	// MaxInflight bounds the queries waiting for the upstream plus the TCP
	// queries being handled; a UDP query beyond it is dropped (counted in
	// Dropped), a TCP one waits. Default 4096.
	MaxInflight int
	// MaxTCPConns bounds open TCP connections; more are closed at once.
	// Default 1024.
	MaxTCPConns int
	// PerSessionLimit bounds, for each session, both its queries waiting
	// for the upstream and its open TCP connections, so one session cannot
	// exhaust MaxInflight or MaxTCPConns for the others. Default 128.
	PerSessionLimit int

	// QueryRate and QueryBurst are each session's query token bucket:
	// QueryRate queries a second on average, up to QueryBurst at once (UDP
	// and TCP together, every query, answered from the fast path or not).
	// A query over the rate costs a token-bucket check and no more: it is
	// answered REFUSED at once (reason rate; the reply is built from the
	// query's bytes and carries no OPT), and counted in
	// Denials[ReasonRate], with at most one Denial a second per session.
	// A session that sends QueryRate queries over its rate within a second
	// goes into the penalty box (penalty.go): its queries over the rate are
	// then dropped without a reply (counted in RateDropped) and, on Linux,
	// its UDP queries reach a socket of their own. Defaults 1000 and 2000;
	// negative QueryRate: no limit.
	QueryRate, QueryBurst int
	// WriteRate and WriteBurst are each session's kernel-write token
	// bucket: AllowEgress calls (entries, one per address and matching
	// grant, not skipped by the write memo) a second, up to WriteBurst at
	// once. An answer whose entries need more tokens than the session has
	// is withheld (SERVFAIL, counted in WriteLimited); an answer needing
	// more than WriteBurst goes through from a full bucket. This bounds the
	// share of the dataplane's lock and the growth of kernel state one
	// session can take. Defaults 500 and 2000; negative WriteRate: no limit.
	WriteRate, WriteBurst int

	// HostAddrs is the set of the host's own addresses, stripped from every
	// answer unless a grant matching the name names the address exactly
	// (see Grant.AllowNonPublic). Nil: the resolver keeps its own, which
	// Start fills and keeps current from netlink (WatchHostAddrs), and
	// Start fails if it cannot; a daemon that shares the set (for the
	// kernel's never-list) makes one, watches it and passes it here.
	HostAddrs *HostAddrs

	// OnDenial, if set, is called (synchronously, keep it quick) for every
	// refused query.
	OnDenial func(Denial)

	// Logger defaults to slog.Default().
	Logger *slog.Logger

	now func() time.Time // tests
	up  exchanger        // tests: an in-process upstream
}

func (c *Config) setDefaults() {
	if !c.ListenAddr.IsValid() {
		c.ListenAddr = netip.AddrPortFrom(netip.IPv4Unspecified(), DefaultPort)
	}
	if c.ResolvConf == "" {
		c.ResolvConf = DefaultResolvConf
	}
	if c.UpstreamTimeout == 0 {
		c.UpstreamTimeout = DefaultUpstreamTimeout
	}
	if c.MinTTL == 0 {
		c.MinTTL = DefaultMinTTL
	}
	if c.MaxTTL == 0 {
		c.MaxTTL = DefaultMaxTTL
	}
	if c.DenyRcode == 0 {
		c.DenyRcode = dns.RcodeRefused
	}
	if c.MaxCNAMEChain == 0 {
		c.MaxCNAMEChain = DefaultMaxCNAMEChain
	}
	if c.CacheSize == 0 {
		c.CacheSize = DefaultCacheSize
	}
	if c.QueryRate == 0 {
		c.QueryRate = DefaultQueryRate
	}
	if c.QueryBurst == 0 {
		c.QueryBurst = max(DefaultQueryBurst, c.QueryRate)
	}
	if c.WriteRate == 0 {
		c.WriteRate = DefaultWriteRate
	}
	if c.WriteBurst == 0 {
		c.WriteBurst = max(DefaultWriteBurst, c.WriteRate)
	}
	if c.MaxAnswerRecords == 0 {
		c.MaxAnswerRecords = DefaultMaxAnswerRecords
	}
	if c.UDPSockets == 0 {
		c.UDPSockets = min(runtime.NumCPU(), 16)
	}
	if c.UDPWorkers == 0 {
		c.UDPWorkers = DefaultUDPWorkers
	}
	switch {
	case c.UDPBusyPoll == 0:
		c.UDPBusyPoll = DefaultUDPBusyPoll
	case c.UDPBusyPoll < 0:
		c.UDPBusyPoll = 0
	}
	if c.PerSessionLimit == 0 {
		c.PerSessionLimit = DefaultPerSessionLimit
	}
	if c.MaxTCPConns == 0 {
		c.MaxTCPConns = DefaultMaxTCPConns
	}
	if c.MaxInflight == 0 {
		c.MaxInflight = DefaultMaxInflight
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.now == nil {
		c.now = time.Now
	}
}

func (c *Config) validate() error {
	if c.Dataplane == nil {
		return fmt.Errorf("%w: Dataplane is required", ErrInvalidConfig)
	}
	if c.SessionName == nil {
		return fmt.Errorf("%w: SessionName is required", ErrInvalidConfig)
	}
	if a := c.ListenAddr.Addr(); !a.Is4() || !a.IsUnspecified() {
		return fmt.Errorf("%w: ListenAddr %v: must be 0.0.0.0:<port>, the session addresses span 127.128.0.0/9", ErrInvalidConfig, c.ListenAddr)
	}
	for _, u := range c.Upstreams {
		if !u.IsValid() || u.Port() == 0 {
			return fmt.Errorf("%w: upstream %v", ErrInvalidConfig, u)
		}
		if SessionPrefix.Contains(u.Addr().Unmap()) {
			return fmt.Errorf("%w: upstream %v is a session address", ErrInvalidConfig, u)
		}
	}
	if c.UpstreamTimeout < 0 {
		return fmt.Errorf("%w: UpstreamTimeout %v", ErrInvalidConfig, c.UpstreamTimeout)
	}
	if c.MinTTL < time.Second || c.MaxTTL < c.MinTTL || c.MaxTTL > 7*24*time.Hour {
		return fmt.Errorf("%w: TTL clamp [%v, %v]: want 1s <= MinTTL <= MaxTTL <= 168h", ErrInvalidConfig, c.MinTTL, c.MaxTTL)
	}
	if c.DenyRcode != dns.RcodeRefused && c.DenyRcode != dns.RcodeNameError {
		return fmt.Errorf("%w: DenyRcode %d: want REFUSED (5) or NXDOMAIN (3)", ErrInvalidConfig, c.DenyRcode)
	}
	if c.MaxCNAMEChain < 0 || c.MaxCNAMEChain > 32 {
		return fmt.Errorf("%w: MaxCNAMEChain %d: want 0..32", ErrInvalidConfig, c.MaxCNAMEChain)
	}
	for _, t := range c.PassthroughTypes {
		if slices.Contains(neverPassthrough, t) {
			return fmt.Errorf("%w: PassthroughTypes: %s may not be passed through", ErrInvalidConfig, dns.TypeToString[t])
		}
	}
	if c.QueryRate > 0 && c.QueryBurst < 1 || c.WriteRate > 0 && c.WriteBurst < 1 || c.QueryRate > 1e9 || c.WriteRate > 1e9 {
		return fmt.Errorf("%w: QueryRate %d, QueryBurst %d, WriteRate %d, WriteBurst %d", ErrInvalidConfig, c.QueryRate, c.QueryBurst, c.WriteRate, c.WriteBurst)
	}
	if c.MaxAnswerRecords < 1 || c.MaxAnswerRecords > 4096 {
		return fmt.Errorf("%w: MaxAnswerRecords %d: want 1..4096", ErrInvalidConfig, c.MaxAnswerRecords)
	}
	if c.UDPSockets < 1 || c.UDPSockets > 1024 {
		return fmt.Errorf("%w: UDPSockets %d: want 1..1024", ErrInvalidConfig, c.UDPSockets)
	}
	if c.UDPWorkers < 1 || c.UDPWorkers > 65536 {
		return fmt.Errorf("%w: UDPWorkers %d", ErrInvalidConfig, c.UDPWorkers)
	}
	if c.UDPBusyPoll > time.Millisecond {
		return fmt.Errorf("%w: UDPBusyPoll %v: at most 1ms", ErrInvalidConfig, c.UDPBusyPoll)
	}
	if c.PerSessionLimit < 1 {
		return fmt.Errorf("%w: PerSessionLimit %d", ErrInvalidConfig, c.PerSessionLimit)
	}
	if c.MaxTCPConns < 1 {
		return fmt.Errorf("%w: MaxTCPConns %d", ErrInvalidConfig, c.MaxTCPConns)
	}
	if c.MaxInflight < 1 {
		return fmt.Errorf("%w: MaxInflight %d", ErrInvalidConfig, c.MaxInflight)
	}
	return nil
}

// Types never forwarded: ANY and zone transfers are refused, A/AAAA are
// handled natively, HTTPS/SVCB/CNAME are answered empty locally, and OPT/TSIG
// style meta types are no questions at all.
var neverPassthrough = []uint16{
	dns.TypeANY, dns.TypeAXFR, dns.TypeIXFR, dns.TypeA, dns.TypeAAAA,
	dns.TypeHTTPS, dns.TypeSVCB, dns.TypeCNAME, dns.TypeOPT, dns.TypeTSIG,
	dns.TypeTKEY, dns.TypeMAILA, dns.TypeMAILB, dns.TypeNone,
}

// upstreamsFromResolvConf reads the nameservers of a resolv.conf file.
func upstreamsFromResolvConf(path string) ([]netip.AddrPort, error) {
	cc, err := dns.ClientConfigFromFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: read %s: %w", ErrNoUpstream, path, err)
	}
	var out []netip.AddrPort
	port := uint16(53)
	if cc.Port != "" {
		var p uint16
		if _, err := fmt.Sscan(cc.Port, &p); err == nil && p != 0 {
			port = p
		}
	}
	for _, s := range cc.Servers {
		a, err := netip.ParseAddr(s)
		if err != nil || SessionPrefix.Contains(a.Unmap()) {
			continue
		}
		out = append(out, netip.AddrPortFrom(a, port))
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: none usable in %s", ErrNoUpstream, path)
	}
	return out, nil
}
