package capability

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func fsCap(read, write, deny []string) Capability {
	return Capability{Class: ClassFSScope, FS: &FSScope{Read: read, Write: write, Deny: deny}}
}

func TestEmptyDefaults(t *testing.T) {
	for _, c := range Classes {
		t.Run(string(c), func(t *testing.T) {
			e := Empty(c)
			if err := e.Validate(); err != nil {
				t.Fatalf("empty %s invalid: %v", c, err)
			}
			if !e.IsEmpty() {
				t.Fatalf("empty %s is not empty: %s", c, e)
			}
			if DefaultTier(e, TierContext{}) != TierAuto {
				t.Fatalf("empty %s is not auto", c)
			}
			// The empty capability allows no request of its class.
			for _, op := range Ops(c) {
				if e.Allows(UseRequest{Class: c, Op: op, Path: "/x", IP: netip.MustParseAddr("1.2.3.4"), Port: 443, Domain: "a.example", Item: "0", Mode: "compute"}) {
					t.Fatalf("empty %s allows %s", c, op)
				}
			}
		})
	}
}

func TestValidate(t *testing.T) {
	cases := []struct {
		name string
		c    Capability
		ok   bool
	}{
		{"egress ok", egress([]string{"10.0.0.0/8", "2001:db8::/32"}, []PortRange{{443, 443}}, "**.github.qkg1.top", "*.pypi.org", "example.com"), true},
		{"egress unmasked cidr", egress(nil, nil), true},
		{"egress bare wildcard", Capability{Class: ClassNetEgress, Egress: &EgressScope{Domains: []string{"*"}}}, false},
		{"egress tld wildcard", Capability{Class: ClassNetEgress, Egress: &EgressScope{Domains: []string{"*.com"}}}, false},
		{"egress NUL in domain", Capability{Class: ClassNetEgress, Egress: &EgressScope{Domains: []string{"github.qkg1.top\x00.evil"}}}, false},
		{"egress percent", Capability{Class: ClassNetEgress, Egress: &EgressScope{Domains: []string{"git%68ub.com"}}}, false},
		{"egress upper case", Capability{Class: ClassNetEgress, Egress: &EgressScope{Domains: []string{"GitHub.com"}}}, false},
		{"egress host bits", Capability{Class: ClassNetEgress, Egress: &EgressScope{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.1/8")}}}, false},
		{"egress 4in6", Capability{Class: ClassNetEgress, Egress: &EgressScope{CIDRs: []netip.Prefix{netip.MustParsePrefix("::ffff:10.0.0.0/104")}}}, false},
		{"egress port 0", egress([]string{"10.0.0.0/8"}, []PortRange{{0, 10}}), false},
		{"egress empty port range", egress([]string{"10.0.0.0/8"}, []PortRange{{10, 9}}), false},
		{"fs ok", fsCap([]string{"/work"}, []string{"/work/out"}, []string{"/work/.git"}), true},
		{"fs relative", fsCap([]string{"work"}, nil, nil), false},
		{"fs dotdot", fsCap(nil, []string{"/work/../etc"}, nil), false},
		{"fs trailing slash", fsCap(nil, []string{"/work/"}, nil), false},
		{"fs control char", fsCap(nil, []string{"/work/\n"}, nil), false},
		// Narrowest wins inside one grant: an entry under the grant's own
		// deny is what nesting is for; only the same path both given and
		// denied is contradictory.
		{"fs write under its own deny", fsCap(nil, []string{"/repo", "/repo/a/b"}, []string{"/repo/a"}), true},
		{"fs read under its own deny", fsCap([]string{"/repo", "/repo/a/b/c"}, nil, []string{"/repo/a"}), true},
		{"fs connect under its own deny", Capability{Class: ClassFSScope, FS: &FSScope{Connect: []string{"/run/x.sock"}, Deny: []string{"/run"}}}, true},
		{"fs four levels", fsCap(nil, []string{"/r", "/r/a/b", "/r/a/b/c/d", "/r/a/b/c/d/e/f"}, []string{"/r/a", "/r/a/b/c", "/r/a/b/c/d/e"}), true},
		{"fs five levels", fsCap(nil, []string{"/r", "/r/a/b", "/r/a/b/c/d", "/r/a/b/c/d/e/f", "/r/a/b/c/d/e/f/g/h"}, []string{"/r/a", "/r/a/b/c", "/r/a/b/c/d/e", "/r/a/b/c/d/e/f/g"}), false},
		{"fs five levels over two axes", fsCap([]string{"/r/a/b/c/d/e/f/g/h"}, []string{"/r", "/r/a/b", "/r/a/b/c/d", "/r/a/b/c/d/e/f"}, []string{"/r/a", "/r/a/b/c", "/r/a/b/c/d/e", "/r/a/b/c/d/e/f/g"}), true},
		{"fs read at its own deny", fsCap([]string{"/repo/a"}, nil, []string{"/repo/a"}), false},
		{"fs write at its own deny", fsCap(nil, []string{"/repo", "/repo/a"}, []string{"/repo/a"}), false},
		{"fs delete at its own deny", Capability{Class: ClassFSScope, FS: &FSScope{Delete: []string{"/repo/a"}, Deny: []string{"/repo/a"}}}, false},
		{"fs connect at its own deny", Capability{Class: ClassFSScope, FS: &FSScope{Connect: []string{"/run/x.sock"}, Deny: []string{"/run/x.sock"}}}, false},
		{"clipboard ok", Capability{Class: ClassClipboard, Clipboard: &ClipboardScope{PasteIn: true}}, true},
		{"gpu ok", Capability{Class: ClassGPU, GPU: &GPUScope{DeviceIDs: []string{"0"}, Mode: "compute"}}, true},
		{"gpu bad mode", Capability{Class: ClassGPU, GPU: &GPUScope{DeviceIDs: []string{"0"}, Mode: "mine"}}, false},
		{"gpu no mode", Capability{Class: ClassGPU, GPU: &GPUScope{DeviceIDs: []string{"0"}}}, false},
		{"install ok", Capability{Class: ClassInstall, Install: &InstallScope{Scope: "pkg"}}, true},
		{"install bad", Capability{Class: ClassInstall, Install: &InstallScope{Scope: "root"}}, false},
		{"persistence ok", Capability{Class: ClassPersistence, Persistence: &PersistenceScope{Paths: []string{"/work/cache"}, SurvivesSession: true}}, true},
		{"persistence relative", Capability{Class: ClassPersistence, Persistence: &PersistenceScope{Paths: []string{"cache"}}}, false},
		{"credentials ok", Capability{Class: ClassCredentials, Credentials: &CredentialsScope{BrokerScopes: []string{"github:read"}, NeverRaw: true}}, true},
		{"credentials never_raw false", Capability{Class: ClassCredentials, Credentials: &CredentialsScope{BrokerScopes: []string{"github:read"}}}, false},
		{"credentials nil scope gets never_raw", Capability{Class: ClassCredentials}, true},
		{"peripheral ok", Capability{Class: ClassPeripheral, Peripheral: &PeripheralScope{USB: []string{"1d6b:0002"}}}, true},
		{"peripheral bad usb", Capability{Class: ClassPeripheral, Peripheral: &PeripheralScope{USB: []string{"a b"}}}, false},
		{"unknown class", Capability{Class: "net.egres"}, false},
		{"scope of another class", Capability{Class: ClassClipboard, FS: &FSScope{Read: []string{"/"}}}, false},
		{"two scopes", Capability{Class: ClassFSScope, FS: &FSScope{}, Clipboard: &ClipboardScope{}}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.c.Validate()
			if (err == nil) != tc.ok {
				t.Fatalf("Validate(%s) = %v, want ok=%v", tc.c, err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrInvalidCapability) {
				t.Fatalf("error %v does not wrap ErrInvalidCapability", err)
			}
		})
	}
}

// TestWithin covers attenuation (and the manifest bound) for every class,
// including every way of widening.
func TestWithin(t *testing.T) {
	p := func(s ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, x := range s {
			out = append(out, netip.MustParsePrefix(x))
		}
		return out
	}
	eg := func(d []string, c []netip.Prefix, ports []PortRange, tls bool) Capability {
		return Capability{Class: ClassNetEgress, Egress: &EgressScope{Domains: d, CIDRs: c, Ports: ports, TLSInspect: tls}}
	}
	parentEg := eg([]string{"**.github.qkg1.top", "*.pypi.org"}, p("10.0.0.0/8"), []PortRange{{443, 443}, {8000, 8100}}, true)
	parentFS := fsCap([]string{"/work"}, []string{"/work/out"}, []string{"/work/out/secret"})
	nestedFS := fsCap(nil, []string{"/repo", "/repo/a/b"}, []string{"/repo/a"})
	cases := []struct {
		name   string
		c, b   Capability
		widens bool
	}{
		{"egress same", parentEg, parentEg, false},
		{"egress narrower domain", eg([]string{"api.github.qkg1.top"}, nil, []PortRange{{443, 443}}, true), parentEg, false},
		{"egress ** covers *", eg([]string{"*.github.qkg1.top"}, nil, []PortRange{{443, 443}}, true), parentEg, false},
		{"egress * covers deeper **", eg([]string{"**.files.pypi.org"}, nil, []PortRange{{443, 443}}, true), parentEg, false},
		{"egress * does not cover apex", eg([]string{"pypi.org"}, nil, []PortRange{{443, 443}}, true), parentEg, true},
		{"egress * does not cover ** apex", eg([]string{"**.pypi.org"}, nil, []PortRange{{443, 443}}, true), parentEg, true},
		{"egress other domain", eg([]string{"evil.com"}, nil, []PortRange{{443, 443}}, true), parentEg, true},
		{"egress lookalike suffix", eg([]string{"evilgithub.com"}, nil, []PortRange{{443, 443}}, true), parentEg, true},
		{"egress narrower cidr", eg(nil, p("10.1.0.0/16"), []PortRange{{443, 443}}, true), parentEg, false},
		{"egress wider cidr", eg(nil, p("0.0.0.0/0"), []PortRange{{443, 443}}, true), parentEg, true},
		{"egress v6 not in v4", eg(nil, p("::/0"), []PortRange{{443, 443}}, true), parentEg, true},
		{"egress narrower ports", eg(nil, p("10.0.0.0/8"), []PortRange{{8000, 8010}}, true), parentEg, false},
		{"egress wider ports", eg(nil, p("10.0.0.0/8"), []PortRange{{7999, 8010}}, true), parentEg, true},
		{"egress any port", eg(nil, p("10.0.0.0/8"), nil, true), parentEg, true},
		{"egress drops tls_inspect", eg(nil, p("10.0.0.0/8"), []PortRange{{443, 443}}, false), parentEg, true},
		{"fs same", parentFS, parentFS, false},
		{"fs narrower", fsCap([]string{"/work/src"}, []string{"/work/out/a"}, []string{"/work/out/secret"}), parentFS, false},
		{"fs more deny", fsCap(nil, []string{"/work/out"}, []string{"/work/out/secret", "/work/out/x"}), parentFS, false},
		{"fs broader deny ok", fsCap(nil, []string{"/work/out"}, []string{"/work/out"}), parentFS, false},
		{"fs drops deny", fsCap(nil, []string{"/work/out"}, nil), parentFS, true},
		{"fs write outside", fsCap(nil, []string{"/work"}, []string{"/work/out/secret"}), parentFS, true},
		{"fs read via write", fsCap([]string{"/work/out"}, nil, []string{"/work/out/secret"}), fsCap(nil, []string{"/work/out"}, []string{"/work/out/secret"}), true},
		{"fs sibling prefix", fsCap([]string{"/workx"}, nil, []string{"/work/out/secret"}), parentFS, true},
		// A nested bound (narrowest wins): compared at every entry path.
		{"fs nested inner write", fsCap(nil, []string{"/repo/a/b"}, nil), nestedFS, false},
		{"fs nested same", nestedFS, nestedFS, false},
		{"fs nested other hole", fsCap(nil, []string{"/repo", "/repo/a/c"}, []string{"/repo/a"}), nestedFS, true},
		{"fs nested into the deny", fsCap(nil, []string{"/repo/a"}, nil), nestedFS, true},
		{"fs nested deeper deny", fsCap(nil, []string{"/repo", "/repo/a/b"}, []string{"/repo/a", "/repo/a/b/x"}), nestedFS, false},
		{"fs nested read not given", fsCap([]string{"/repo/a/b"}, nil, nil), nestedFS, true},
		{"clipboard narrower", Capability{Class: ClassClipboard, Clipboard: &ClipboardScope{PasteIn: true}}, Capability{Class: ClassClipboard, Clipboard: &ClipboardScope{PasteIn: true, CopyOut: true}}, false},
		{"clipboard copy_out", Capability{Class: ClassClipboard, Clipboard: &ClipboardScope{CopyOut: true}}, Capability{Class: ClassClipboard, Clipboard: &ClipboardScope{PasteIn: true}}, true},
		{"gpu subset", Capability{Class: ClassGPU, GPU: &GPUScope{DeviceIDs: []string{"0"}, Mode: "compute"}}, Capability{Class: ClassGPU, GPU: &GPUScope{DeviceIDs: []string{"0", "1"}, Mode: "compute"}}, false},
		{"gpu other device", Capability{Class: ClassGPU, GPU: &GPUScope{DeviceIDs: []string{"2"}, Mode: "compute"}}, Capability{Class: ClassGPU, GPU: &GPUScope{DeviceIDs: []string{"0", "1"}, Mode: "compute"}}, true},
		{"gpu other mode", Capability{Class: ClassGPU, GPU: &GPUScope{DeviceIDs: []string{"0"}, Mode: "render"}}, Capability{Class: ClassGPU, GPU: &GPUScope{DeviceIDs: []string{"0"}, Mode: "compute"}}, true},
		{"install pkg in any", Capability{Class: ClassInstall, Install: &InstallScope{Scope: "pkg"}}, Capability{Class: ClassInstall, Install: &InstallScope{Scope: "any"}}, false},
		{"install any in pkg", Capability{Class: ClassInstall, Install: &InstallScope{Scope: "any"}}, Capability{Class: ClassInstall, Install: &InstallScope{Scope: "pkg"}}, true},
		{"persistence narrower", Capability{Class: ClassPersistence, Persistence: &PersistenceScope{Paths: []string{"/work/cache/a"}}}, Capability{Class: ClassPersistence, Persistence: &PersistenceScope{Paths: []string{"/work/cache"}, SurvivesSession: true}}, false},
		{"persistence survives", Capability{Class: ClassPersistence, Persistence: &PersistenceScope{Paths: []string{"/work/cache"}, SurvivesSession: true}}, Capability{Class: ClassPersistence, Persistence: &PersistenceScope{Paths: []string{"/work/cache"}}}, true},
		{"credentials subset", Capability{Class: ClassCredentials, Credentials: &CredentialsScope{BrokerScopes: []string{"a"}, NeverRaw: true}}, Capability{Class: ClassCredentials, Credentials: &CredentialsScope{BrokerScopes: []string{"a", "b"}, NeverRaw: true}}, false},
		{"credentials extra scope", Capability{Class: ClassCredentials, Credentials: &CredentialsScope{BrokerScopes: []string{"c"}, NeverRaw: true}}, Capability{Class: ClassCredentials, Credentials: &CredentialsScope{BrokerScopes: []string{"a"}, NeverRaw: true}}, true},
		{"credentials raw", Capability{Class: ClassCredentials, Credentials: &CredentialsScope{BrokerScopes: []string{"a"}}}, Capability{Class: ClassCredentials, Credentials: &CredentialsScope{BrokerScopes: []string{"a"}, NeverRaw: true}}, true},
		{"peripheral mic", Capability{Class: ClassPeripheral, Peripheral: &PeripheralScope{Mic: true}}, Capability{Class: ClassPeripheral, Peripheral: &PeripheralScope{Mic: true, Camera: true}}, false},
		{"peripheral camera", Capability{Class: ClassPeripheral, Peripheral: &PeripheralScope{Camera: true}}, Capability{Class: ClassPeripheral, Peripheral: &PeripheralScope{Mic: true}}, true},
		{"peripheral input_inject", Capability{Class: ClassPeripheral, Peripheral: &PeripheralScope{InputInject: true}}, Capability{Class: ClassPeripheral, Peripheral: &PeripheralScope{Mic: true}}, true},
		{"peripheral usb", Capability{Class: ClassPeripheral, Peripheral: &PeripheralScope{USB: []string{"x:y"}}}, Capability{Class: ClassPeripheral, Peripheral: &PeripheralScope{USB: []string{"a:b"}}}, true},
		{"class change", Capability{Class: ClassClipboard, Clipboard: &ClipboardScope{PasteIn: true}}, parentFS, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.c.Within(tc.b)
			if tc.widens != (err != nil) {
				t.Fatalf("Within = %v, want widens=%v", err, tc.widens)
			}
			if err != nil && !errors.Is(err, ErrWidens) {
				t.Fatalf("%v does not wrap ErrWidens", err)
			}
		})
	}
}

func TestDefaultTierTable(t *testing.T) {
	ws := TierContext{Workspace: "/work"}
	cases := []struct {
		name string
		c    Capability
		want Tier
	}{
		{"egress loopback", egress([]string{"127.0.0.0/8", "::1/128"}, nil), TierAuto},
		{"egress public", egress([]string{"140.82.112.0/20"}, nil), TierAsk},
		{"egress domain", egress(nil, nil, "github.qkg1.top"), TierAsk},
		{"fs read workspace", fsCap([]string{"/work/src"}, nil, nil), TierAuto},
		{"fs write workspace", fsCap(nil, []string{"/work/out"}, nil), TierNotify},
		{"fs write outside", fsCap(nil, []string{"/srv"}, nil), TierAsk},
		{"fs read outside", fsCap([]string{"/etc"}, nil, nil), TierAsk},
		{"clipboard paste_in", Capability{Class: ClassClipboard, Clipboard: &ClipboardScope{PasteIn: true}}, TierAuto},
		{"clipboard copy_out", Capability{Class: ClassClipboard, Clipboard: &ClipboardScope{CopyOut: true}}, TierAsk},
		{"gpu compute", Capability{Class: ClassGPU, GPU: &GPUScope{DeviceIDs: []string{"0"}, Mode: "compute"}}, TierAsk},
		{"gpu render", Capability{Class: ClassGPU, GPU: &GPUScope{DeviceIDs: []string{"0"}, Mode: "render"}}, TierAsk},
		{"gpu raw", Capability{Class: ClassGPU, GPU: &GPUScope{DeviceIDs: []string{"0"}, Mode: "raw"}}, TierBlock},
		{"install pkg", Capability{Class: ClassInstall, Install: &InstallScope{Scope: "pkg"}}, TierAsk},
		{"sudo", Capability{Class: ClassInstall, Install: &InstallScope{Scope: "any"}}, TierBlock},
		{"persistence workspace", Capability{Class: ClassPersistence, Persistence: &PersistenceScope{Paths: []string{"/work/cache"}}}, TierAsk},
		{"persistence system", Capability{Class: ClassPersistence, Persistence: &PersistenceScope{Paths: []string{"/etc/cron.d"}}}, TierBlock},
		{"persistence root covers system", Capability{Class: ClassPersistence, Persistence: &PersistenceScope{Paths: []string{"/"}}}, TierBlock},
		{"credentials", Capability{Class: ClassCredentials, Credentials: &CredentialsScope{BrokerScopes: []string{"a"}, NeverRaw: true}}, TierBlock},
		{"peripheral mic", Capability{Class: ClassPeripheral, Peripheral: &PeripheralScope{Mic: true}}, TierAsk},
		{"peripheral input_inject", Capability{Class: ClassPeripheral, Peripheral: &PeripheralScope{InputInject: true}}, TierBlock},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := DefaultTier(tc.c, ws); got != tc.want {
				t.Fatalf("DefaultTier(%s) = %s, want %s", tc.c, got, tc.want)
			}
		})
	}
}

func TestPromotion(t *testing.T) {
	cases := []struct {
		tier Tier
		prov Provenance
		want Tier
	}{
		{TierAuto, FirstParty, TierAuto},
		{TierNotify, FirstParty, TierNotify},
		{TierAsk, FirstParty, TierAsk},
		{TierBlock, FirstParty, TierBlock},
		{TierAuto, External, TierAsk},
		{TierNotify, External, TierAsk},
		{TierAsk, External, TierBlock},
		{TierBlock, External, TierBlock},
	}
	for _, tc := range cases {
		t.Run(tc.tier.String()+"/"+string(tc.prov), func(t *testing.T) {
			got := Promote(tc.tier, tc.prov)
			if got != tc.want {
				t.Fatalf("Promote = %s, want %s", got, tc.want)
			}
			if tc.prov == External && tc.tier != TierBlock && got <= tc.tier {
				t.Fatalf("external did not promote by at least one tier")
			}
		})
	}
}

func TestTwoOfThree(t *testing.T) {
	loop := egress([]string{"127.0.0.1/32"}, nil)
	pub := egress([]string{"203.0.113.0/24"}, nil)
	copyOut := Capability{Class: ClassClipboard, Clipboard: &ClipboardScope{CopyOut: true}}
	paste := Capability{Class: ClassClipboard, Clipboard: &ClipboardScope{PasteIn: true}}
	cases := []struct {
		name   string
		before Ingredients
		c      Capability
		prov   Provenance
		mt     *Tier
		want   Tier
	}{
		{"none", Ingredients{}, paste, FirstParty, nil, TierAuto},
		{"two of three is fine", Ingredients{ExternalIngestion: true}, loop, FirstParty, nil, TierAuto},
		{"third ingredient (egress) → ask", Ingredients{ExternalIngestion: true, CredentialAccess: true}, pub, FirstParty, ptr(TierAuto), TierAsk},
		{"third ingredient (copy_out) → ask", Ingredients{ExternalIngestion: true, CredentialAccess: true}, copyOut, FirstParty, ptr(TierNotify), TierAsk},
		{"external provenance as third", Ingredients{CredentialAccess: true, ExternalCommunication: true}, paste, External, nil, TierAsk},
		{"loopback egress is not external comms", Ingredients{ExternalIngestion: true, CredentialAccess: true}, loop, FirstParty, nil, TierAuto},
		{"manifest tier lowers default", Ingredients{}, pub, FirstParty, ptr(TierNotify), TierNotify},
		{"manifest tier then promotion", Ingredients{}, pub, External, ptr(TierNotify), TierAsk},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := EffectiveTier(tc.c, TierContext{Workspace: "/work"}, tc.mt, tc.prov, tc.before)
			if got != tc.want {
				t.Fatalf("EffectiveTier = %s, want %s", got, tc.want)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func TestManifestParse(t *testing.T) {
	good := `# python sandbox
image py
allow net.egress domains=**.github.qkg1.top,pypi.org cidrs=140.82.112.0/20,10.0.0.1 ports=443,8000-8100 tier=ask
allow fs.scope read=/work write=/work/out deny=/work/.git   # trailing comment
allow clipboard paste_in=true copy_out=false

image trainer
allow gpu device_ids=0,1 mode=compute
allow credentials broker_scopes=hf:read never_raw=true
`
	ms, err := ParseManifests("m.conf", []byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 || ms[0].Image != "py" || len(ms[0].Entries) != 3 || ms[1].Image != "trainer" || len(ms[1].Entries) != 2 {
		t.Fatalf("parsed %+v", ms)
	}
	if e := ms[0].Entries[0]; e.Line != 3 || e.Tier == nil || *e.Tier != TierAsk || len(e.Capability.Egress.CIDRs) != 2 || e.Capability.Egress.CIDRs[0] != netip.MustParsePrefix("10.0.0.1/32") {
		t.Fatalf("entry 0: %+v", e)
	}
	// Match: inside and outside.
	if _, err := ms[0].Match(egress(nil, []PortRange{{443, 443}}, "api.github.qkg1.top")); err != nil {
		t.Fatalf("inside manifest: %v", err)
	}
	if _, err := ms[0].Match(egress(nil, []PortRange{{443, 443}}, "evil.com")); !errors.Is(err, ErrOutsideManifest) || !strings.Contains(err.Error(), "m.conf:3") {
		t.Fatalf("outside manifest: %v", err)
	}
	if _, err := ms[0].Match(Capability{Class: ClassGPU, GPU: &GPUScope{DeviceIDs: []string{"0"}, Mode: "compute"}}); !errors.Is(err, ErrOutsideManifest) {
		t.Fatalf("undeclared class: %v", err)
	}

	bad := []struct {
		name, text, want string
	}{
		{"unknown class", "image a\n\nallow net.egres domains=x.com\n", `m.conf:3: unknown class "net.egres"`},
		{"allow before image", "# x\nallow clipboard paste_in=true\n", "m.conf:2: allow before any image line"},
		{"unknown directive", "image a\ngrant clipboard\n", `m.conf:2: unknown directive "grant"`},
		{"unknown key", "image a\nallow clipboard paste=true\n", `m.conf:2: unknown key "paste" for class clipboard`},
		{"bad bool", "image a\nallow clipboard paste_in=yes\n", `m.conf:2: paste_in="yes": want true or false`},
		{"bad tier", "image a\nallow clipboard paste_in=true tier=maybe\n", `m.conf:2: unknown tier "maybe"`},
		{"bad cidr", "image a\nallow net.egress cidrs=10.0.0/8\n", `m.conf:2: cidrs: "10.0.0/8" is not a prefix or address`},
		{"host bits", "image a\nallow net.egress cidrs=10.0.0.1/8\n", `m.conf:2:`},
		{"bad port", "image a\nallow net.egress cidrs=10.0.0.0/8 ports=70000\n", `m.conf:2: ports: "70000"`},
		{"bad domain", "image a\nallow net.egress domains=*\n", `m.conf:2:`},
		{"relative path", "image a\n\n\nallow fs.scope write=work\n", `m.conf:4:`},
		{"never_raw false", "image a\nallow credentials broker_scopes=x never_raw=false\n", `m.conf:2: never_raw=false`},
		{"lower block", "image a\nallow install.privileged scope=any tier=ask\n", "m.conf:2: install.privileged scope=any is Block tier"},
		{"duplicate key", "image a\nallow fs.scope read=/a read=/b\n", `m.conf:2: key "read" given twice`},
		{"duplicate image", "image a\nimage a\n", `m.conf:2: image "a" already declared at line 1`},
		{"empty list element", "image a\nallow fs.scope read=/a,,/b\n", "m.conf:2: read: empty element"},
		{"no equals", "image a\nallow fs.scope read\n", `m.conf:2: "read": want key=value`},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseManifests("m.conf", []byte(tc.text))
			if !errors.Is(err, ErrManifest) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrManifest containing %q", err, tc.want)
			}
		})
	}
}

func egress(cidrs []string, ports []PortRange, domains ...string) Capability {
	c := Capability{Class: ClassNetEgress, Egress: &EgressScope{Domains: domains, Ports: ports}}
	for _, s := range cidrs {
		c.Egress.CIDRs = append(c.Egress.CIDRs, netip.MustParsePrefix(s))
	}
	return c
}

// FuzzParseManifests: the parser never panics; an error names a line of the
// input and wraps ErrManifest; what it accepts validates and round-trips.
func FuzzParseManifests(f *testing.F) {
	f.Add("image py\nallow net.egress domains=**.github.qkg1.top cidrs=10.0.0.0/8 ports=443,8000-8100 tier=ask\n")
	f.Add("image a\nallow fs.scope read=/work write=/work/out deny=/work/.git # c\nallow clipboard paste_in=true\n")
	f.Add("image a\nallow credentials broker_scopes=x never_raw=false\n")
	f.Add("allow gpu\n")
	f.Add("image a\nallow net.egres\n")
	f.Fuzz(func(t *testing.T, text string) {
		ms, err := ParseManifests("f.manifest", []byte(text))
		if err != nil {
			var me *ManifestError
			if !errors.As(err, &me) || !errors.Is(err, ErrManifest) {
				t.Fatalf("error %v is not a *ManifestError", err)
			}
			if me.Line < 1 || me.Line > strings.Count(text, "\n")+1 {
				t.Fatalf("error line %d outside the input", me.Line)
			}
			return
		}
		for _, m := range ms {
			for _, e := range m.Entries {
				if err := e.Capability.Validate(); err != nil {
					t.Fatalf("accepted an invalid capability %s: %v", e.Capability, err)
				}
				again, err := ParseManifests("g", []byte("image x\nallow "+e.Capability.String()+"\n"))
				if err != nil {
					t.Fatalf("%q does not re-parse: %v", e.Capability.String(), err)
				}
				if got := again[0].Entries[0].Capability; got.Within(e.Capability) != nil || e.Capability.Within(got) != nil {
					t.Fatalf("round trip changed %s into %s", e.Capability, got)
				}
			}
		}
	})
}
