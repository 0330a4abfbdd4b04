package policy

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cedar "github.com/cedar-policy/cedar-go"
	xast "github.com/cedar-policy/cedar-go/x/exp/ast"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func testSession(id string) SessionAttrs {
	return SessionAttrs{ID: id, Image: "py", TrustTier: "normal", Risk: "normal", TLSInspection: true,
		Protected: DefaultProtected("/home/agent"), PolicyStore: []string{"/etc/shinken"}}
}

func newTestEngine(t *testing.T, dir string) *Engine {
	t.Helper()
	e, err := NewEngine(dir)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func fsCap(read, write, deny []string) Capability {
	return Capability{Class: ClassFSScope, FS: &FSScope{Read: read, Write: write, Deny: deny}}
}

func egress(cidrs []string, ports []PortRange, domains ...string) Capability {
	c := Capability{Class: ClassNetEgress, Egress: &EgressScope{Domains: domains, Ports: ports}}
	for _, s := range cidrs {
		c.Egress.CIDRs = append(c.Egress.CIDRs, netip.MustParsePrefix(s))
	}
	return c
}

func TestDecideGrantPolicies(t *testing.T) {
	e := newTestEngine(t, "")
	e.PutSession(testSession("s1"))
	e.PutSession(testSession("s2"))
	grants := []GrantData{
		{ID: "g-egress", Session: "s1", Capability: egress([]string{"10.1.0.0/16"}, []PortRange{{Lo: 443, Hi: 443}, {Lo: 8000, Hi: 8100}}, "**.github.qkg1.top", "*.pypi.org")},
		{ID: "g-fs", Session: "s1", Capability: Capability{Class: ClassFSScope, FS: &FSScope{Read: []string{"/work"}, Write: []string{"/work/out", "/home/agent"}, Deny: []string{"/work/out/secret"}}}},
		{ID: "g-clip", Session: "s1", Capability: Capability{Class: ClassClipboard, Clipboard: &ClipboardScope{PasteIn: true}}},
		{ID: "g-gpu", Session: "s1", Capability: Capability{Class: ClassGPU, GPU: &GPUScope{DeviceIDs: []string{"0"}, Mode: GPUModeCompute}}},
		{ID: "g-inst", Session: "s1", Capability: Capability{Class: ClassInstall, Install: &InstallScope{Scope: InstallPkg}}},
		{ID: "g-pers", Session: "s1", Capability: Capability{Class: ClassPersistence, Persistence: &PersistenceScope{Paths: []string{"/work/cache"}}}},
		{ID: "g-cred", Session: "s1", Capability: Capability{Class: ClassCredentials, Credentials: &CredentialsScope{BrokerScopes: []string{"github:read"}, NeverRaw: true}}},
		{ID: "g-per", Session: "s1", Capability: Capability{Class: ClassPeripheral, Peripheral: &PeripheralScope{Mic: true, USB: []string{"1d6b:0002"}}}},
		{ID: "g-old", Session: "s1", Capability: egress([]string{"192.0.2.0/24"}, nil), Expires: t0.Add(-time.Second)},
	}
	for _, g := range grants {
		if err := e.PutGrant(g); err != nil {
			t.Fatal(err)
		}
		if err := ProveGrant(g, t0); err != nil {
			t.Errorf("ProveGrant(%s): %v", g.ID, err)
		}
	}
	ip := netip.MustParseAddr
	cases := []struct {
		name    string
		session string
		req     UseRequest
		want    bool
	}{
		{"egress cidr+port", "s1", UseRequest{Class: ClassNetEgress, Op: "connect", IP: ip("10.1.2.3"), Port: 443}, true},
		{"egress port range", "s1", UseRequest{Class: ClassNetEgress, Op: "connect", IP: ip("10.1.2.3"), Port: 8050}, true},
		{"egress wrong port", "s1", UseRequest{Class: ClassNetEgress, Op: "connect", IP: ip("10.1.2.3"), Port: 22}, false},
		{"egress outside cidr", "s1", UseRequest{Class: ClassNetEgress, Op: "connect", IP: ip("10.2.0.1"), Port: 443}, false},
		{"egress ** apex", "s1", UseRequest{Class: ClassNetEgress, Op: "connect", Domain: "github.qkg1.top", Port: 443}, true},
		{"egress ** sub", "s1", UseRequest{Class: ClassNetEgress, Op: "connect", Domain: "api.github.qkg1.top", Port: 443}, true},
		{"egress * excludes apex", "s1", UseRequest{Class: ClassNetEgress, Op: "connect", Domain: "pypi.org", Port: 443}, false},
		{"egress * sub", "s1", UseRequest{Class: ClassNetEgress, Op: "connect", Domain: "files.pypi.org", Port: 443}, true},
		{"egress lookalike", "s1", UseRequest{Class: ClassNetEgress, Op: "connect", Domain: "evilgithub.com", Port: 443}, false},
		{"egress expired grant", "s1", UseRequest{Class: ClassNetEgress, Op: "connect", IP: ip("192.0.2.1"), Port: 443}, false},
		{"other session sees nothing", "s2", UseRequest{Class: ClassNetEgress, Op: "connect", IP: ip("10.1.2.3"), Port: 443}, false},
		{"fs read", "s1", UseRequest{Class: ClassFSScope, Op: "read", Path: "/work/a"}, true},
		{"fs write does not imply read", "s1", UseRequest{Class: ClassFSScope, Op: "read", Path: "/home/agent/x"}, false},
		{"fs write", "s1", UseRequest{Class: ClassFSScope, Op: "write", Path: "/work/out/a"}, true},
		{"fs write outside", "s1", UseRequest{Class: ClassFSScope, Op: "write", Path: "/work/a"}, false},
		{"fs deny wins", "s1", UseRequest{Class: ClassFSScope, Op: "write", Path: "/work/out/secret/k"}, false},
		{"fs prefix sibling", "s1", UseRequest{Class: ClassFSScope, Op: "write", Path: "/work/outx"}, false},
		{"fs hard deny .ssh under broad grant", "s1", UseRequest{Class: ClassFSScope, Op: "write", Path: "/home/agent/.ssh/authorized_keys"}, false},
		{"fs hard deny rc file", "s1", UseRequest{Class: ClassFSScope, Op: "write", Path: "/home/agent/.bashrc"}, false},
		{"fs hard deny PATH dir", "s1", UseRequest{Class: ClassFSScope, Op: "write", Path: "/home/agent/.local/bin/ls"}, false},
		{"fs broad grant elsewhere", "s1", UseRequest{Class: ClassFSScope, Op: "write", Path: "/home/agent/notes.txt"}, true},
		{"clipboard paste", "s1", UseRequest{Class: ClassClipboard, Op: "paste_in"}, true},
		{"clipboard copy_out", "s1", UseRequest{Class: ClassClipboard, Op: "copy_out"}, false},
		{"gpu compute", "s1", UseRequest{Class: ClassGPU, Op: "use", Item: "0", Mode: "compute"}, true},
		{"gpu render", "s1", UseRequest{Class: ClassGPU, Op: "use", Item: "0", Mode: "render"}, false},
		{"gpu other device", "s1", UseRequest{Class: ClassGPU, Op: "use", Item: "1", Mode: "compute"}, false},
		{"install pkg", "s1", UseRequest{Class: ClassInstall, Op: "pkg"}, true},
		{"install any", "s1", UseRequest{Class: ClassInstall, Op: "any"}, false},
		{"persist", "s1", UseRequest{Class: ClassPersistence, Op: "persist", Path: "/work/cache/x"}, true},
		{"persist outside", "s1", UseRequest{Class: ClassPersistence, Op: "persist", Path: "/work/x"}, false},
		{"credentials scope", "s1", UseRequest{Class: ClassCredentials, Op: "broker", Item: "github:read"}, true},
		{"credentials other scope", "s1", UseRequest{Class: ClassCredentials, Op: "broker", Item: "github:write"}, false},
		{"peripheral mic", "s1", UseRequest{Class: ClassPeripheral, Op: "mic"}, true},
		{"peripheral camera", "s1", UseRequest{Class: ClassPeripheral, Op: "camera"}, false},
		{"peripheral usb", "s1", UseRequest{Class: ClassPeripheral, Op: "usb", Item: "1d6b:0002"}, true},
		{"peripheral input_inject", "s1", UseRequest{Class: ClassPeripheral, Op: "input_inject"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, err := e.Decide(tc.session, tc.req, t0)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed != tc.want {
				t.Fatalf("Decide = %+v, want allowed=%v", d, tc.want)
			}
			// The per-session path (with request keys cut to the lengths the
			// policies name) agrees with the flat set and all keys.
			pm, em := e.Flatten()
			if fd, _ := cedar.Authorize(pm, em, CedarRequest(tc.session, tc.req, t0)); (fd == cedar.Allow) != d.Allowed {
				t.Fatalf("flat set says %v, Decide says %v", fd, d.Allowed)
			}
			// The Go meaning of the grammar agrees with Cedar wherever no
			// hard-deny forbid fired.
			if len(d.Errors) > 0 {
				t.Fatalf("evaluation errors: %v", d.Errors)
			}
		})
	}
	if _, err := e.Decide("nobody", UseRequest{Class: ClassClipboard, Op: "paste_in"}, t0); !errors.Is(err, ErrUnknownSession) {
		t.Fatalf("unknown session: err = %v", err)
	}
	e.RemoveGrant("s1", "g-clip")
	if d, _ := e.Decide("s1", UseRequest{Class: ClassClipboard, Op: "paste_in"}, t0); d.Allowed {
		t.Fatal("removed grant still allows")
	}
}

func TestHardDenyForbids(t *testing.T) {
	e := newTestEngine(t, "")
	low := testSession("low")
	low.TrustTier = "low"
	high := testSession("high")
	high.Risk, high.TLSInspection = "high", false
	norm := testSession("norm")
	for _, s := range []SessionAttrs{low, high, norm} {
		e.PutSession(s)
	}
	// Broad grants that the forbids must carve.
	for _, g := range []GrantData{
		{ID: "l-inst", Session: "low", Capability: Capability{Class: ClassInstall, Install: &InstallScope{Scope: InstallAny}}},
		{ID: "h-eg", Session: "high", Capability: egress([]string{"0.0.0.0/0"}, nil)},
		{ID: "n-fs", Session: "norm", Capability: Capability{Class: ClassFSScope, FS: &FSScope{Write: []string{"/"}}}},
		{ID: "n-pe", Session: "norm", Capability: Capability{Class: ClassPersistence, Persistence: &PersistenceScope{Paths: []string{"/"}}}},
	} {
		if err := e.PutGrant(g); err != nil {
			t.Fatal(err)
		}
	}
	use := []struct {
		name, session string
		req           UseRequest
		forbid        string
	}{
		{"sudo low trust", "low", UseRequest{Class: ClassInstall, Op: "any"}, "hard.sudo-low-trust.use"},
		{"pkg low trust", "low", UseRequest{Class: ClassInstall, Op: "pkg"}, "hard.sudo-low-trust.use"},
		{"egress high risk without inspection", "high", UseRequest{Class: ClassNetEgress, Op: "connect", IP: netip.MustParseAddr("1.1.1.1"), Port: 443}, "hard.egress-no-tls.use"},
		{"write ~/.ssh", "norm", UseRequest{Class: ClassFSScope, Op: "write", Path: "/home/agent/.ssh/id_ed25519"}, "hard.fs-protected.use"},
		{"write ~/.aws", "norm", UseRequest{Class: ClassFSScope, Op: "write", Path: "/home/agent/.aws/credentials"}, "hard.fs-protected.use"},
		{"write /usr/bin", "norm", UseRequest{Class: ClassFSScope, Op: "write", Path: "/usr/bin/python3"}, "hard.fs-protected.use"},
		{"write ~/.zshrc", "norm", UseRequest{Class: ClassFSScope, Op: "write", Path: "/home/agent/.zshrc"}, "hard.fs-protected.use"},
		{"persist into ~/.profile", "norm", UseRequest{Class: ClassPersistence, Op: "persist", Path: "/home/agent/.profile"}, "hard.fs-protected.use"},
		{"write policy store", "norm", UseRequest{Class: ClassFSScope, Op: "write", Path: "/etc/shinken/base.cedar"}, "hard.policy-store.use"},
	}
	for _, tc := range use {
		t.Run("use/"+tc.name, func(t *testing.T) {
			d, err := e.Decide(tc.session, tc.req, t0)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed || !strings.Contains(strings.Join(d.Reasons, ","), tc.forbid) {
				t.Fatalf("Decide = %+v, want denied by %s", d, tc.forbid)
			}
		})
	}
	fsw := func(p string) Capability {
		return Capability{Class: ClassFSScope, FS: &FSScope{Write: []string{p}}}
	}
	grant := []struct {
		name, session string
		c             Capability
		tier          Tier
		forbid        string
	}{
		{"sudo low trust", "low", Capability{Class: ClassInstall, Install: &InstallScope{Scope: InstallPkg}}, TierAsk, "hard.sudo-low-trust.grant"},
		{"egress no tls high risk", "high", egress([]string{"1.1.1.0/24"}, nil), TierAsk, "hard.egress-no-tls.grant"},
		{"write inside ~/.ssh", "norm", fsw("/home/agent/.ssh"), TierAsk, "hard.fs-protected.grant"},
		{"write rc file", "norm", fsw("/home/agent/.bashrc"), TierAsk, "hard.fs-protected.grant"},
		{"write policy store", "norm", fsw("/etc/shinken/policy"), TierAsk, "hard.policy-store.grant"},
		{"block tier", "norm", Capability{Class: ClassCredentials, Credentials: &CredentialsScope{BrokerScopes: []string{"x"}, NeverRaw: true}}, TierBlock, "hard.block-tier.grant"},
	}
	for _, tc := range grant {
		t.Run("grant/"+tc.name, func(t *testing.T) {
			d, err := e.AuthorizeGrant(tc.session, tc.c, tc.tier, FirstParty, LifecycleSession, t0)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed || !strings.Contains(strings.Join(d.Reasons, ","), tc.forbid) {
				t.Fatalf("AuthorizeGrant = %+v, want denied by %s", d, tc.forbid)
			}
		})
	}
	// And the permitted counterparts.
	ok := egress([]string{"1.1.1.0/24"}, nil)
	ok.Egress.TLSInspect = true
	if d, _ := e.AuthorizeGrant("high", ok, TierAsk, FirstParty, LifecycleSession, t0); !d.Allowed {
		t.Fatalf("inspected egress on high risk: %+v", d)
	}
	if d, _ := e.AuthorizeGrant("norm", fsw("/home/agent/project"), TierNotify, FirstParty, LifecycleSession, t0); !d.Allowed {
		t.Fatalf("plain write grant: %+v", d)
	}
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestPolicyDirErrorsKeepPreviousSet(t *testing.T) {
	dir := t.TempDir()
	good := `@id("admin.gpu.trainer")
permit (principal, action == Shinken::Action::"use", resource == Shinken::Capability::"gpu")
when { principal.image == "trainer" && context.request.mode == "compute" };
`
	writeFile(t, filepath.Join(dir, "10-gpu.cedar"), good)
	e := newTestEngine(t, dir)
	tr := testSession("t1")
	tr.Image = "trainer"
	e.PutSession(tr)
	gpu := UseRequest{Class: ClassGPU, Op: "use", Item: "0", Mode: "compute"}
	if d, _ := e.Decide("t1", gpu, t0); !d.Allowed {
		t.Fatalf("standing admin permit: %+v", d)
	}
	cases := []struct {
		name, file, text, want string
	}{
		{"syntax", "20-bad.cedar", "permit(principal, action, resource);\n\npermit(principal, acton, resource);\n", "20-bad.cedar:3:"},
		{"unknown attribute", "20-bad.cedar", "\n\n\n@id(\"x\")\nforbid(principal, action == Shinken::Action::\"use\", resource) when { principal.trust == \"low\" };\n", "20-bad.cedar:4:"},
		{"unknown action", "20-bad.cedar", "permit(principal, action == Shinken::Action::\"fly\", resource);\n", "20-bad.cedar:1:"},
		{"reserved id", "20-bad.cedar", "@id(\"grant:x\")\npermit(principal, action == Shinken::Action::\"use\", resource);\n", "reserved"},
		{"duplicate id", "20-bad.cedar", good, "already used at"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			writeFile(t, filepath.Join(dir, tc.file), tc.text)
			t.Cleanup(func() { os.Remove(filepath.Join(dir, tc.file)) })
			_, err := e.Reload(ReloadOptions{AllowWiden: true})
			if !errors.Is(err, ErrPolicy) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Reload err = %v, want ErrPolicy containing %q", err, tc.want)
			}
			if d, _ := e.Decide("t1", gpu, t0); !d.Allowed {
				t.Fatal("previous policy set not kept")
			}
		})
	}
}

func TestPolicyEditPermissivenessShift(t *testing.T) {
	dir := t.TempDir()
	base := `@id("admin.gpu.trainer")
permit (principal, action == Shinken::Action::"use", resource == Shinken::Capability::"gpu")
when { principal.image == "trainer" && context.request.mode == "compute" };
`
	writeFile(t, filepath.Join(dir, "gpu.cedar"), base)
	e := newTestEngine(t, dir)
	cases := []struct {
		name   string
		text   string // new content of gpu.cedar
		extra  string // content of extra.cedar ("" = none)
		widens bool
		proved bool
	}{
		{"unchanged", base, "", false, true},
		{"add forbid", base, `@id("admin.no-render") forbid(principal, action == Shinken::Action::"use", resource == Shinken::Capability::"gpu") when { context.request.mode == "render" };`, false, true},
		{"remove permit", "", "", false, true},
		{"narrow permit", `@id("admin.gpu.trainer")
permit (principal, action == Shinken::Action::"use", resource == Shinken::Capability::"gpu")
when { principal.image == "trainer" && context.request.mode == "compute" && context.request.item == "0" };`, "", false, true}, // proven by the solver
		{"widen to render", `@id("admin.gpu.trainer")
permit (principal, action == Shinken::Action::"use", resource == Shinken::Capability::"gpu")
when { principal.image == "trainer" };`, "", true, false},
		{"new egress permit", base, `@id("admin.egress") permit(principal, action == Shinken::Action::"use", resource == Shinken::Capability::"net.egress") when { context.request.domain_keys.contains("**.evil.example") };`, true, false},
		{"drop a hard-deny via permit is impossible but a base edit that removes nothing and adds permit on sudo", base, `@id("admin.sudo") permit(principal, action == Shinken::Action::"use", resource == Shinken::Capability::"install.privileged");`, true, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			writeFile(t, filepath.Join(dir, "gpu.cedar"), tc.text)
			if tc.extra != "" {
				writeFile(t, filepath.Join(dir, "extra.cedar"), tc.extra)
			}
			t.Cleanup(func() {
				os.Remove(filepath.Join(dir, "extra.cedar"))
				writeFile(t, filepath.Join(dir, "gpu.cedar"), base)
				if _, err := e.Reload(ReloadOptions{AllowWiden: true}); err != nil {
					t.Fatal(err)
				}
			})
			before := e.PolicyIDs()
			rep, err := e.Reload(ReloadOptions{})
			if tc.widens {
				if !errors.Is(err, ErrPolicyWidens) || rep.Counterexample == nil {
					t.Fatalf("Reload = %v, %v; want ErrPolicyWidens with a counterexample", rep, err)
				}
				t.Logf("counterexample: %s", rep.Counterexample)
				if len(e.PolicyIDs()) != len(before) {
					t.Fatal("widening edit was installed")
				}
				return
			}
			if err != nil {
				t.Fatalf("Reload: %v", err)
			}
			if rep.Proved != tc.proved {
				t.Fatalf("Proved = %v, want %v (report %+v)", rep.Proved, tc.proved, rep)
			}
		})
	}
}

// TestNoPolicyInjection: scope values that look like Cedar are data, never
// policy text: a grant whose path is a would-be injection allows exactly that
// path, and every per-grant policy type-checks against the schema.
func TestNoPolicyInjection(t *testing.T) {
	e := newTestEngine(t, "")
	e.PutSession(testSession("s1"))
	evil := `/work/x") || true || ("`
	g := GrantData{ID: "g1", Session: "s1", Capability: fsCap(nil, []string{evil}, nil)}
	if err := g.Capability.Validate(); err != nil {
		t.Fatalf("the path is a legal (odd) path: %v", err)
	}
	if err := e.PutGrant(g); err != nil {
		t.Fatal(err)
	}
	if text := string(grantPolicy(g).MarshalCedar()); strings.Contains(text, "true ||") || strings.Contains(text, "/work") {
		t.Fatalf("user value reached the policy text:\n%s", text)
	}
	cases := []struct {
		path string
		want bool
	}{
		{evil, true},
		{evil + "/f", true},
		{"/work/y", false},
		{"/etc/passwd", false},
	}
	for _, tc := range cases {
		t.Run(tc.path, func(t *testing.T) {
			d, err := e.Decide("s1", UseRequest{Class: ClassFSScope, Op: "write", Path: tc.path}, t0)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed != tc.want {
				t.Fatalf("allowed = %v, want %v", d.Allowed, tc.want)
			}
		})
	}
	// Every class's template, filled, validates against the schema.
	full := []Capability{
		egress([]string{"10.0.0.0/8"}, []PortRange{{Lo: 1, Hi: 65535}}, "**.a.example"),
		fsCap([]string{"/a"}, []string{"/b"}, []string{"/b/c"}),
		{Class: ClassClipboard, Clipboard: &ClipboardScope{PasteIn: true, CopyOut: true}},
		{Class: ClassGPU, GPU: &GPUScope{DeviceIDs: []string{"0"}, Mode: "render"}},
		{Class: ClassInstall, Install: &InstallScope{Scope: "pkg"}},
		{Class: ClassPersistence, Persistence: &PersistenceScope{Paths: []string{"/p"}, SurvivesSession: true}},
		{Class: ClassCredentials, Credentials: &CredentialsScope{BrokerScopes: []string{"x"}, NeverRaw: true}},
		{Class: ClassPeripheral, Peripheral: &PeripheralScope{Camera: true, USB: []string{"a:b"}}},
	}
	for _, c := range full {
		p := grantPolicy(GrantData{ID: "v", Session: "s1", Capability: c})
		if err := e.validator.Policy("v", (*xast.Policy)(p.AST())); err != nil {
			t.Errorf("%s template: %v", c.Class, err)
		}
	}
}

func TestPortBlocks(t *testing.T) {
	for _, r := range []PortRange{{Lo: 1, Hi: 65535}, {Lo: 443, Hi: 443}, {Lo: 8000, Hi: 8100}, {Lo: 1023, Hi: 1025}, {Lo: 65535, Hi: 65535}} {
		blocks := portBlocks([]PortRange{r})
		for _, port := range []uint16{r.Lo - 1, r.Lo, r.Hi, r.Hi + 1, (r.Lo + r.Hi) / 2} {
			if port == 0 {
				continue
			}
			in := r.Lo <= port && port <= r.Hi
			keys := portKeysOf(port, nil)
			hit := false
			for _, k := range keys {
				for _, b := range blocks {
					hit = hit || k == b
				}
			}
			if hit != in {
				t.Errorf("range %v port %d: matched=%v want %v (blocks %v)", r, port, hit, in, blocks)
			}
		}
	}
}
