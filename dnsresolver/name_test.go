package dnsresolver

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func TestSessionAddr(t *testing.T) {
	for _, tc := range []struct {
		index uint32
		addr  string // "" for the zero Addr
	}{
		{0, ""},
		{1, "127.128.0.1"},
		{255, "127.128.0.255"},
		{256, "127.128.1.0"},
		{65536, "127.129.0.0"},
		{MaxSessionIndex, "127.255.255.255"},
		{MaxSessionIndex + 1, ""},
		{1 << 31, ""},
	} {
		t.Run(tc.addr, func(t *testing.T) {
			got := SessionAddr(tc.index)
			if tc.addr == "" {
				if got.IsValid() {
					t.Fatalf("SessionAddr(%d) = %v, want invalid", tc.index, got)
				}
				return
			}
			if got.String() != tc.addr {
				t.Fatalf("SessionAddr(%d) = %v, want %s", tc.index, got, tc.addr)
			}
			back, ok := SessionIndexFromAddr(got)
			if !ok || back != tc.index {
				t.Fatalf("SessionIndexFromAddr(%v) = %d, %v", got, back, ok)
			}
			mapped := netip.AddrFrom16(got.As16())
			if back, ok := SessionIndexFromAddr(mapped); !ok || back != tc.index {
				t.Fatalf("SessionIndexFromAddr(%v) = %d, %v", mapped, back, ok)
			}
		})
	}
	for _, s := range []string{"127.128.0.0", "127.127.255.255", "127.0.0.1", "128.0.0.1", "10.128.0.1", "::1", "fe80::1"} {
		t.Run("not/"+s, func(t *testing.T) {
			if i, ok := SessionIndexFromAddr(netip.MustParseAddr(s)); ok {
				t.Fatalf("SessionIndexFromAddr(%s) = %d, true", s, i)
			}
		})
	}
	if _, ok := SessionIndexFromAddr(netip.Addr{}); ok {
		t.Fatal("zero Addr is a session")
	}
}

func TestCanonicalName(t *testing.T) {
	long63 := strings.Repeat("a", 63)
	for _, tc := range []struct {
		in, want string // want "" means refused
	}{
		{"example.com", "example.com"},
		{"Example.COM.", "example.com"},
		{"a-b.c0m", "a-b.c0m"},
		{"xn--bcher-kva.example", "xn--bcher-kva.example"},
		{"localhost", "localhost"},
		{long63 + ".com", long63 + ".com"},
		{strings.Repeat("a.", 126) + "b", strings.Repeat("a.", 126) + "b"},
		{"", ""},
		{".", ""},
		{"..", ""},
		{"a..b", ""},
		{".a.b", ""},
		{"a.b..", ""},
		{"exa\x00mple.com", ""},
		{"example.com\x00.evil.com", ""},
		{"example.com\r\nx", ""},
		{"exa\nmple.com", ""},
		{"exa\tmple.com", ""},
		{"exa\x7fmple.com", ""},
		{"exa%2emple.com", ""},
		{"%00.example.com", ""},
		{`exa\000mple.com`, ""}, // miekg/dns presentation of a NUL byte
		{`a\.b.com`, ""},        // a dot inside a label
		{"exa mple.com", ""},
		{"exa_mple.com", ""},
		{"*.example.com", ""},
		{"ex@mple.com", ""},
		{"exämple.com", ""},
		{"example.com/path", ""},
		{"-example.com", ""},
		{"example-.com", ""},
		{long63 + "a.com", ""},
		{strings.Repeat("a.", 127) + "b", ""},
		{"1.2.3.4", ""},
		{"example.123", ""},
		{"0x7f.1", ""},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := CanonicalName(tc.in)
			if tc.want == "" {
				if err == nil {
					t.Fatalf("CanonicalName(%q) = %q, want error", tc.in, got)
				}
				if !errors.Is(err, ErrInvalidName) {
					t.Fatalf("error %v does not wrap ErrInvalidName", err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("CanonicalName(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestParsePattern(t *testing.T) {
	for _, tc := range []struct {
		pat     string
		err     bool
		match   []string
		nomatch []string
	}{
		{pat: "example.com", match: []string{"example.com"}, nomatch: []string{"www.example.com", "xexample.com", "example.com.evil", "com"}},
		{pat: "Example.COM.", match: []string{"example.com"}},
		{pat: "*.example.com", match: []string{"a.example.com", "a.b.example.com"}, nomatch: []string{"example.com", "aexample.com", "example.com.evil"}},
		{pat: "**.example.com", match: []string{"example.com", "a.example.com", "a.b.example.com"}, nomatch: []string{"aexample.com", "com", "example.org"}},
		{pat: "*", err: true},
		{pat: "**", err: true},
		{pat: "*.", err: true},
		{pat: "**.", err: true},
		{pat: "", err: true},
		{pat: "*.com", err: true},
		{pat: "**.com", err: true},
		{pat: "a*.example.com", err: true},
		{pat: "a.*.example.com", err: true},
		{pat: "*example.com", err: true},
		{pat: "***.example.com", err: true},
		{pat: "*.*.example.com", err: true},
		{pat: "example.*", err: true},
		{pat: "exa\x00mple.com", err: true},
		{pat: "%2a.example.com", err: true},
		{pat: "*.exa mple.com", err: true},
	} {
		t.Run(tc.pat, func(t *testing.T) {
			p, err := ParsePattern(tc.pat)
			if tc.err {
				if err == nil {
					t.Fatalf("ParsePattern(%q) = %v, want error", tc.pat, p)
				}
				if !errors.Is(err, ErrInvalidPattern) {
					t.Fatalf("error %v does not wrap ErrInvalidPattern", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			// The compiled (indexed) policy must agree with Pattern.Match.
			c, err := compilePolicy(Policy{Grants: []Grant{{Pattern: tc.pat, Handle: h1}}, Deny: []string{tc.pat}})
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range tc.match {
				if !p.Match(n) || len(c.grants(n)) != 1 || !c.denied(n) {
					t.Errorf("%v does not match %q (match %v, grants %d, denied %v)", p, n, p.Match(n), len(c.grants(n)), c.denied(n))
				}
			}
			for _, n := range tc.nomatch {
				if p.Match(n) || len(c.grants(n)) != 0 || c.denied(n) {
					t.Errorf("%v matches %q", p, n)
				}
			}
		})
	}
}

func TestCompilePolicyErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    Policy
		want error
	}{
		{"bare star", Policy{Grants: []Grant{{Pattern: "*", Handle: h1}}}, ErrInvalidPattern},
		{"no handle", Policy{Grants: []Grant{{Pattern: "a.test"}}}, ErrInvalidGrant},
		{"bad proto", Policy{Grants: []Grant{{Pattern: "a.test", Handle: h1, Proto: 1}}}, ErrInvalidGrant},
		{"bad ports", Policy{Grants: []Grant{{Pattern: "a.test", Handle: h1, Ports: portRange(10, 5)}}}, ErrInvalidGrant},
		{"bad prefix", Policy{Grants: []Grant{{Pattern: "a.test", Handle: h1, AllowNonPublic: []netip.Prefix{{}}}}}, ErrInvalidGrant},
		{"bad deny", Policy{Deny: []string{"**"}}, ErrInvalidPattern},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := compilePolicy(tc.p); !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
}

func TestIsPublic(t *testing.T) {
	for _, tc := range []struct {
		addr   string
		public bool
	}{
		{"8.8.8.8", true},
		{"93.184.216.34", true},
		{"2606:2800:220:1::1", true},
		{"2a00:1450:4001::1", true},
		{"0.0.0.0", false},
		{"0.1.2.3", false},
		{"10.0.0.1", false},
		{"100.64.0.1", false},
		{"100.127.255.255", false},
		{"100.128.0.1", true},
		{"127.0.0.1", false},
		{"127.128.0.1", false},
		{"169.254.169.254", false},
		{"172.16.0.1", false},
		{"172.31.255.255", false},
		{"172.32.0.1", true},
		{"192.0.0.192", false},
		{"192.0.2.1", false},
		{"192.168.1.1", false},
		{"198.18.0.1", false},
		{"198.51.100.1", false},
		{"203.0.113.1", false},
		{"224.0.0.1", false},
		{"239.255.255.250", false},
		{"240.0.0.1", false},
		{"255.255.255.255", false},
		{"::", false},
		{"::1", false},
		{"::ffff:8.8.8.8", false},
		{"::ffff:10.0.0.1", false},
		{"64:ff9b::a00:1", false},
		{"2001::1", false},
		{"2001:db8::1", false},
		{"2002:a00:1::1", false},
		{"fc00::1", false},
		{"fd00::1", false},
		{"fe80::1", false},
		{"ff02::1", false},
		{"3fff::1", false},
	} {
		t.Run(tc.addr, func(t *testing.T) {
			if got := IsPublic(netip.MustParseAddr(tc.addr)); got != tc.public {
				t.Fatalf("IsPublic(%s) = %v, want %v", tc.addr, got, tc.public)
			}
		})
	}
	if IsPublic(netip.MustParseAddr("fe80::1%eth0")) || IsPublic(netip.Addr{}) {
		t.Fatal("zoned or zero address is public")
	}
}

func TestLogLimiter(t *testing.T) {
	var l logLimiter
	t0 := time.Unix(1000, 0)
	steps := []struct {
		at         time.Duration
		ok         bool
		suppressed uint64
	}{
		{0, true, 0},
		{100 * time.Millisecond, false, 0},
		{900 * time.Millisecond, false, 0},
		{1100 * time.Millisecond, true, 2},
		{1200 * time.Millisecond, false, 0},
		{5 * time.Second, true, 1},
	}
	for _, s := range steps {
		t.Run(s.at.String(), func(t *testing.T) {
			ok, n := l.allow(t0.Add(s.at))
			if ok != s.ok || n != s.suppressed {
				t.Fatalf("allow = %v, %d; want %v, %d", ok, n, s.ok, s.suppressed)
			}
		})
	}
}
