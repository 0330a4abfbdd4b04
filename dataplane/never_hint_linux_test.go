package dataplane

import (
	"net/netip"
	"testing"
	"time"
)

// never4 and never6 are the keys of one never-list entry, as setNeverList
// writes them.
func never4(prefix string, port uint16) shkShkNever4Key {
	p := netip.MustParsePrefix(prefix)
	return shkShkNever4Key{Prefixlen: uint32(16 + p.Bits()), Port: port<<8 | port>>8, Addr: p.Addr().As4()}
}

func never6(prefix string, port uint16) shkShkNever6Key {
	p := netip.MustParsePrefix(prefix)
	return shkShkNever6Key{Prefixlen: uint32(16 + p.Bits()), Port: port<<8 | port>>8, Addr: p.Addr().As16()}
}

func hintSkips(bits []uint8, i int) bool { return bits[i/8]>>(i%8)&1 == 1 }

// TestNeverHintBits: the hint skips exactly the lookups no entry can
// answer: a port-specific entry keeps its port's lookup (and no first
// byte's), an every-port entry keeps the first bytes its prefix covers,
// prefixes shorter than a byte included.
func TestNeverHintBits(t *testing.T) {
	h := neverHint(map[shkShkNever4Key]bool{
		never4("169.254.0.0/16", 0):  true,
		never4("127.0.0.5/32", 8080): true,
		never4("64.0.0.0/2", 0):      true,
		never4("0.0.0.0/0", 53):      true,
	}, map[shkShkNever6Key]bool{
		never6("fe80::/10", 0): true,
	})
	for p := range 65536 {
		if want := p != 8080 && p != 53; hintSkips(h.PortClear[:], p) != want {
			t.Errorf("port %d: skips %v, want %v", p, !want, want)
		}
	}
	for b := range 256 {
		if want := b != 169 && (b < 64 || b > 127); hintSkips(h.V4Clear[:], b) != want {
			t.Errorf("IPv4 first byte %d: skips %v, want %v", b, !want, want)
		}
		if want := b != 0xfe; hintSkips(h.V6Clear[:], b) != want {
			t.Errorf("IPv6 first byte %#x: skips %v, want %v", b, !want, want)
		}
	}
	all := neverHint(map[shkShkNever4Key]bool{never4("0.0.0.0/0", 0): true}, nil)
	for b := range 256 {
		if hintSkips(all.V4Clear[:], b) {
			t.Fatalf("0.0.0.0/0 every port: first byte %d skipped", b)
		}
	}
}

// TestNeverHint: the never-list is enforced through the hint the kernel
// reads, as it changes and across an adoption (whose new hint map starts
// empty and is written from the adopted entries, not only the defaults).
// A session with a 0.0.0.0/0 grant tries destinations whose lookups the
// hint would skip if it were wrong: a first byte covered only by a prefix
// shorter than a byte, a port named on every address, and an adopted entry.
func TestNeverHint(t *testing.T) {
	d, reopen := openAdoptable(t)
	s, err := d.CreateSession("nh", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	a := listenTCP(t, "127.0.0.9:0")
	b := listenTCP(t, "127.0.0.9:0")
	pa := netip.MustParseAddrPort(a.addr()).Port()
	h := mustHandle(t, d, HandleRef{}, time.Time{})
	mustAllow(t, d, "nh", EgressRule{Prefix: pfx("0.0.0.0/0"), Handle: h})
	p := startProbe(t, s, ProcOptions{})
	want := func(step, dst, w string) {
		t.Helper()
		if got := p.Do("tcp " + dst); got != w {
			t.Errorf("%s: connect %s: %s, want %s", step, dst, got, w)
		}
	}
	set := func(extra ...NeverEntry) {
		t.Helper()
		if err := d.SetNeverList(append(DefaultNeverList(), extra...)); err != nil {
			t.Fatal(err)
		}
	}
	want("defaults", a.addr(), "ok")
	set(NeverEntry{Prefix: pfx("64.0.0.0/2")})
	want("64.0.0.0/2 listed", a.addr(), "err EPERM")
	want("64.0.0.0/2 listed", "169.254.169.254:80", "err EPERM")
	set(NeverEntry{Prefix: pfx("0.0.0.0/0"), Port: pa})
	want("0.0.0.0/0 port A listed", a.addr(), "err EPERM")
	want("0.0.0.0/0 port A listed", b.addr(), "ok")
	set()
	want("back to the defaults", a.addr(), "ok")
	want("back to the defaults", "169.254.169.254:80", "err EPERM")

	set(NeverEntry{Prefix: pfx("127.0.0.9/32")})
	d = reopen(d)
	var hint shkShkNeverHint
	if err := d.objs.ShkNeverHints.Lookup(uint32(0), &hint); err != nil {
		t.Fatal(err)
	}
	if hintSkips(hint.V4Clear[:], 127) || !hintSkips(hint.V4Clear[:], 8) {
		t.Fatalf("adopted: the hint skips 127.x %v (want not: an adopted entry), 8.x %v (want to)",
			hintSkips(hint.V4Clear[:], 127), hintSkips(hint.V4Clear[:], 8))
	}
	want("adopted 127.0.0.9/32", a.addr(), "err EPERM")
	want("adopted 127.0.0.9/32", b.addr(), "err EPERM")
}
