package policy

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	cedar "github.com/cedar-policy/cedar-go"
	"github.com/cedar-policy/cedar-go/types"

	"github.com/shinken-agent/shinken/agent/capability"
)

// Property tests over random capabilities and requests drawn from small,
// overlapping value pools (so containment, near misses and boundaries occur
// often):
//
//  1. attenuation is sound: c.Within(b) == nil ⇒ every request c allows, b
//     allows too;
//  2. the compiled per-grant Cedar policy means exactly what the grammar
//     says: it permits a request iff Capability.Allows does.

var (
	poolDomains = []string{"example.com", "a.example.com", "b.a.example.com", "*.example.com", "**.example.com", "*.a.example.com", "**.a.example.com", "example.org", "xexample.com"}
	poolCIDRs   = []string{"10.0.0.0/8", "10.0.0.0/16", "10.1.2.0/23", "10.1.0.0/16", "10.1.2.0/24", "10.1.2.3/32", "10.2.0.0/16", "0.0.0.0/0", "2001:db8::/32", "2001:db8:1::/48", "::1/128"}
	poolPorts   = []PortRange{{Lo: 443, Hi: 443}, {Lo: 80, Hi: 80}, {Lo: 8000, Hi: 8100}, {Lo: 8050, Hi: 8060}, {Lo: 1, Hi: 1024}, {Lo: 1, Hi: 65535}, {Lo: 1023, Hi: 1025}}
	poolPaths   = []string{"/", "/work", "/work/out", "/work/out/a", "/work/outx", "/home/u", "/home/u/.ssh", "/etc"}
	poolItems   = []string{"0", "1", "2", "a:b", "c:d"}
	reqDomains  = []string{"example.com", "a.example.com", "b.a.example.com", "c.b.a.example.com", "x.example.com", "example.org", "xexample.com", "a.example.org"}
	reqAddrs    = []string{"10.1.2.3", "10.1.2.4", "10.1.3.1", "10.2.0.1", "10.0.0.1", "11.0.0.1", "2001:db8::1", "2001:db8:1::1", "2001:db9::1", "::1", "127.0.0.1"}
	reqPorts    = []uint16{1, 22, 79, 80, 81, 442, 443, 444, 1023, 1024, 1025, 7999, 8000, 8049, 8050, 8060, 8061, 8100, 8101, 65535}
	reqPaths    = []string{"/", "/work", "/work/out", "/work/out/a", "/work/out/a/b", "/work/outx", "/work/outx/y", "/work/x", "/home/u/f", "/home/u/.ssh/k", "/etc/passwd", "/tmp"}
)

func pick[T any](r *rand.Rand, pool []T, max int) []T {
	n := r.IntN(max + 1)
	out := make([]T, 0, n)
	for i := 0; i < n; i++ {
		out = append(out, pool[r.IntN(len(pool))])
	}
	return out
}

func randCap(r *rand.Rand, c Class) Capability {
	cp := Capability{Class: c}
	switch c {
	case ClassNetEgress:
		e := &EgressScope{Domains: pick(r, poolDomains, 2), Ports: pick(r, poolPorts, 2), TLSInspect: r.IntN(2) == 0}
		for _, s := range pick(r, poolCIDRs, 2) {
			e.CIDRs = append(e.CIDRs, netip.MustParsePrefix(s))
		}
		cp.Egress = e
	case ClassFSScope:
		cp.FS = &FSScope{Read: pick(r, poolPaths, 2), Write: pick(r, poolPaths, 2), Deny: pick(r, poolPaths, 1), Connect: pick(r, poolPaths, 1)}
	case ClassClipboard:
		cp.Clipboard = &ClipboardScope{PasteIn: r.IntN(2) == 0, CopyOut: r.IntN(2) == 0}
	case ClassGPU:
		cp.GPU = &GPUScope{DeviceIDs: pick(r, poolItems[:3], 2), Mode: []string{"compute", "render"}[r.IntN(2)]}
	case ClassInstall:
		cp.Install = &InstallScope{Scope: []string{"", "pkg", "any"}[r.IntN(3)]}
	case ClassPersistence:
		cp.Persistence = &PersistenceScope{Paths: pick(r, poolPaths, 2), SurvivesSession: r.IntN(2) == 0}
	case ClassCredentials:
		cp.Credentials = &CredentialsScope{BrokerScopes: pick(r, poolItems, 2), NeverRaw: true}
	case ClassPeripheral:
		cp.Peripheral = &PeripheralScope{Camera: r.IntN(2) == 0, Mic: r.IntN(2) == 0, InputInject: r.IntN(3) == 0, USB: pick(r, poolItems[3:], 1)}
	}
	return cp.Normalized()
}

// allRequests enumerates the request pool of a class.
func allRequests(c Class) []UseRequest {
	var out []UseRequest
	switch c {
	case ClassNetEgress:
		for _, p := range reqPorts {
			for _, d := range reqDomains {
				out = append(out, UseRequest{Class: c, Op: "connect", Domain: d, Port: p})
			}
			for _, a := range reqAddrs {
				out = append(out, UseRequest{Class: c, Op: "connect", IP: netip.MustParseAddr(a), Port: p})
			}
		}
	case ClassFSScope, ClassPersistence:
		for _, op := range capability.Ops(c) {
			for _, p := range reqPaths {
				out = append(out, UseRequest{Class: c, Op: op, Path: p})
			}
		}
	default:
		for _, op := range capability.Ops(c) {
			for _, it := range append([]string{""}, poolItems...) {
				for _, m := range []string{"", "compute", "render"} {
					out = append(out, UseRequest{Class: c, Op: op, Item: it, Mode: m})
				}
			}
		}
	}
	return out
}

func TestAttenuationSoundness(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	for _, c := range Classes {
		t.Run(string(c), func(t *testing.T) {
			reqs := allRequests(c)
			within := 0
			for i := 0; i < 3000; i++ {
				child, bound := randCap(r, c), randCap(r, c)
				if i%3 == 0 {
					child = narrowOf(r, bound)
				}
				if child.Within(bound) != nil {
					continue
				}
				within++
				for _, q := range reqs {
					if child.Allows(q) && !bound.Allows(q) {
						t.Fatalf("%s is Within %s but allows %+v which the bound does not", child, bound, q)
					}
				}
			}
			if within < 100 {
				t.Fatalf("only %d contained pairs drawn; the generator is too sparse", within)
			}
		})
	}
}

// narrowOf returns a capability built from parts of b (often Within b).
func narrowOf(r *rand.Rand, b Capability) Capability {
	c := b.Normalized()
	switch c.Class {
	case ClassNetEgress:
		e := *c.Egress
		if len(e.Domains) > 0 {
			e.Domains = e.Domains[:r.IntN(len(e.Domains)+1)]
		}
		if len(e.CIDRs) > 0 {
			e.CIDRs = e.CIDRs[:r.IntN(len(e.CIDRs)+1)]
		}
		c.Egress = &e
	case ClassFSScope:
		f := *c.FS
		if len(f.Read) > 0 {
			f.Read = f.Read[:r.IntN(len(f.Read)+1)]
		}
		if len(f.Write) > 0 {
			f.Write = f.Write[:r.IntN(len(f.Write)+1)]
		}
		f.Deny = append(f.Deny, pick(r, poolPaths, 1)...)
		c.FS = &f
	}
	return c.Normalized()
}

func TestGrantPolicyMatchesGrammar(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 5))
	sess := SessionAttrs{ID: "s"}
	for _, c := range Classes {
		t.Run(string(c), func(t *testing.T) {
			reqs := allRequests(c)
			for i := 0; i < 60; i++ {
				g := GrantData{ID: "g", Session: "s", Capability: randCap(r, c)}
				pol := cedar.PolicyMap{"g": grantPolicy(g)}
				ents := types.EntityMap{grantUID("g"): grantEntity(g), sessionUID("s"): sessionEntity(sess)}
				for _, q := range reqs {
					d, diag := cedar.Authorize(pol, ents, CedarRequest("s", q, t0))
					if len(diag.Errors) > 0 {
						t.Fatalf("%s on %+v: evaluation error %v", g.Capability, q, diag.Errors)
					}
					if (d == cedar.Allow) != g.Capability.Allows(q) {
						t.Fatalf("%s on %+v: Cedar says %v, the grammar says %v", g.Capability, q, d, g.Capability.Allows(q))
					}
				}
			}
		})
	}
}

// TestDecideMatchesFlatSet: Decide (base slice plus each class template bound
// to the session's grants in turn) gives the same decision, the same deciding
// policies and no more errors than cedar.Authorize over the flat set of
// linked per-grant policies and every entity, for random grants of several
// sessions (some expired, some replaced or removed) and every request of
// the pools, with admin policies that permit and forbid.
func TestDecideMatchesFlatSet(t *testing.T) {
	dir := t.TempDir()
	admin := `@id("admin.permit-gpu-high")
permit (principal, action == Shinken::Action::"use", resource == Shinken::Capability::"gpu")
when { principal.trust_tier == "high" && context.request.mode == "render" };

@id("admin.forbid-tmp")
forbid (principal, action == Shinken::Action::"use", resource)
when { context.request.path_keys.contains("/tmp") };
`
	if err := os.WriteFile(filepath.Join(dir, "admin.cedar"), []byte(admin), 0o644); err != nil {
		t.Fatal(err)
	}
	e := newTestEngine(t, dir)
	r := rand.New(rand.NewPCG(11, 13))
	sessions := []string{"s1", "s2", "s3"}
	for i, id := range sessions {
		s := testSession(id)
		s.TrustTier = []string{"low", "normal", "high"}[i]
		e.PutSession(s)
		for j := 0; j < 12; j++ {
			c := Classes[r.IntN(len(Classes))]
			g := GrantData{ID: fmt.Sprintf("%s-g%d", id, j%9), Session: id, Capability: randCap(r, c)}
			if r.IntN(5) == 0 {
				g.Expires = t0.Add(-time.Minute)
			}
			if err := e.PutGrant(g); err != nil {
				t.Fatal(err)
			}
		}
		e.RemoveGrant(id, id+"-g3")
	}
	pm, em := e.Flatten()
	ids := func(d Decision) string {
		s := slices.Clone(d.Reasons)
		slices.Sort(s)
		return strings.Join(s, ",")
	}
	n := 0
	for _, id := range sessions {
		for _, c := range Classes {
			reqs := allRequests(c)
			if c == ClassNetEgress { // neither a domain nor an address
				reqs = append(reqs, UseRequest{Class: c, Op: "connect", Port: 443}, UseRequest{Class: c, Op: "connect"})
			}
			for _, q := range reqs {
				got, err := e.Decide(id, q, t0)
				if err != nil {
					t.Fatal(err)
				}
				want := decision(cedar.Authorize(pm, em, CedarRequest(id, q, t0)))
				if got.Allowed != want.Allowed || ids(got) != ids(want) || len(got.Errors) != len(want.Errors) {
					t.Fatalf("%s %+v: Decide %+v, flat set %+v", id, q, got, want)
				}
				n++
			}
		}
	}
	t.Logf("%d requests agree", n)
}

// TestRequestKeys: the request keys built in one buffer per kind are exactly
// the keys of the straightforward definitions.
func TestRequestKeys(t *testing.T) {
	for _, d := range append(reqDomains, "com", "a.b.c.d.e.example.co.uk") {
		want := []string{d, "**." + d}
		for s := d; strings.Contains(s, "."); {
			_, s, _ = strings.Cut(s, ".")
			want = append(want, "*."+s, "**."+s)
		}
		if got := domainKeysOf(d); !slices.Equal(got, want) {
			t.Errorf("domainKeysOf(%q) = %q, want %q", d, got, want)
		}
	}
	lens := &keyLens{v4: 1<<24 | 1<<32 | 1, port: 1<<16 | 1<<10 | 1}
	lens.v6[0] = 1 << 48
	lens.v6[2] = 1
	for _, s := range reqAddrs {
		a := netip.MustParseAddr(s)
		for _, l := range []*keyLens{nil, lens} {
			var want []string
			for b := a.BitLen(); b >= 0; b-- {
				if l.has(a, b) {
					p, _ := a.Prefix(b)
					want = append(want, p.String())
				}
			}
			if got := cidrKeysOf(a, l); !slices.Equal(got, want) {
				t.Errorf("cidrKeysOf(%s) = %q, want %q", a, got, want)
			}
		}
	}
	for _, p := range reqPorts {
		var want []string
		for l := 16; l >= 0; l-- {
			if lens.port&(1<<l) != 0 {
				want = append(want, fmt.Sprintf("%d/%d", uint32(p)>>(16-l)<<(16-l), l))
			}
		}
		if got := portKeysOf(p, lens); !slices.Equal(got, want) {
			t.Errorf("portKeysOf(%d) = %q, want %q", p, got, want)
		}
	}
}

// TestDecideConcurrent: decisions running in parallel with grant changes
// each see one consistent session (run with -race).
func TestDecideConcurrent(t *testing.T) {
	e := newTestEngine(t, "")
	e.PutSession(testSession("s1"))
	ok := egress([]string{"10.1.0.0/16"}, []PortRange{{Lo: 443, Hi: 443}})
	if err := e.PutGrant(GrantData{ID: "keep", Session: "s1", Capability: ok}); err != nil {
		t.Fatal(err)
	}
	allowed := UseRequest{Class: ClassNetEgress, Op: "connect", IP: netip.MustParseAddr("10.1.2.3"), Port: 443}
	denied := UseRequest{Class: ClassNetEgress, Op: "connect", IP: netip.MustParseAddr("10.9.2.3"), Port: 443}
	done := make(chan struct{})
	errs := make(chan error, 4)
	for w := 0; w < 4; w++ {
		go func() {
			for i := 0; ; i++ {
				select {
				case <-done:
					errs <- nil
					return
				default:
				}
				q, want := allowed, true
				if i%2 == 1 {
					q, want = denied, false
				}
				d, err := e.Decide("s1", q, t0)
				if err != nil || d.Allowed != want {
					errs <- fmt.Errorf("Decide(%+v) = %+v, %v; want allowed=%v", q, d, err, want)
					return
				}
			}
		}()
	}
	for i := 0; i < 300; i++ {
		id := fmt.Sprintf("g%d", i%7)
		if err := e.PutGrant(GrantData{ID: id, Session: "s1", Capability: egress([]string{"192.0.2.0/24"}, nil)}); err != nil {
			t.Fatal(err)
		}
		e.RemoveGrant("s1", fmt.Sprintf("g%d", (i+3)%7))
	}
	close(done)
	for w := 0; w < 4; w++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}
