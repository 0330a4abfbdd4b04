package capability

import (
	"encoding/json"
	"errors"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
)

// fullLines is, per class, a manifest line that sets every key the class
// renders, in canonical form (what String gives back). A new class adds
// its line here; TestRegistry fails until it does.
var fullLines = map[Class]string{
	ClassNetEgress:   "net.egress domains=**.example.com,a.example.org cidrs=10.0.0.0/8,2001:db8::/32 ports=443,8000-8100 tls_inspect=true",
	ClassNetInbound:  "net.inbound cidrs=10.0.0.0/8,192.0.2.7/32 ports=8080,9000-9010",
	ClassFSScope:     "fs.scope read=/work write=/work/out delete=/work/tmp deny=/work/.git connect=/run/app.sock",
	ClassClipboard:   "clipboard paste_in=true copy_out=true",
	ClassGPU:         "gpu device_ids=0,1 mode=compute",
	ClassInstall:     "install.privileged scope=pkg",
	ClassPersistence: "persistence paths=/work/cache survives_session=true",
	ClassCredentials: "credentials broker_scopes=github:read,hf:read",
	ClassPeripheral:  "peripheral camera=true mic=true usb=1d6b:0002 input_inject=true",
	ClassProcess:     "process exec=/bin/sh,/usr/bin/git max_processes=64",
}

// TestRegistry: every class of the seam's enum has exactly one spec, with
// the functions the grammar calls, unique manifest keys and ops.
func TestRegistry(t *testing.T) {
	if len(specs) != len(backend.Classes) {
		t.Errorf("%d specs for %d classes", len(specs), len(backend.Classes))
	}
	for _, c := range backend.Classes {
		s := specOf(c)
		if s == nil {
			t.Errorf("class %s has no spec (add class_<name>.go registering one)", c)
			continue
		}
		if s.class != c {
			t.Errorf("spec of %s names class %s", c, s.class)
		}
		names := ManifestKeys(c)
		if len(names) == 0 || len(slices.Compact(slices.Sorted(slices.Values(names)))) != len(names) {
			t.Errorf("%s: manifest keys %v (want some, each once)", c, names)
		}
		if slices.Contains(names, "tier") {
			t.Errorf("%s: manifest key \"tier\" is the allow line's own", c)
		}
		if ops := Ops(c); len(ops) == 0 || len(slices.Compact(slices.Sorted(slices.Values(ops)))) != len(ops) {
			t.Errorf("%s: ops %v (want some, each once)", c, ops)
		}
		if _, ok := fullLines[c]; !ok {
			t.Errorf("%s: no line in fullLines", c)
		}
	}
	if ManifestKeys("bogus") != nil || Ops("bogus") != nil {
		t.Error("an unknown class has keys or ops")
	}
}

// TestRegistryRoundTrip: per class, a manifest line setting every key
// parses, renders back to itself, re-parses to the same capability, and
// survives the JSON wire form; the empty capability renders as the bare
// class and parses back to itself.
func TestRegistryRoundTrip(t *testing.T) {
	for _, c := range Classes {
		t.Run(string(c), func(t *testing.T) {
			line := fullLines[c]
			ms, err := ParseManifests("rt", []byte("image x\nallow "+line+"\n"))
			if err != nil {
				t.Fatal(err)
			}
			got := ms[0].Entries[0].Capability
			if got.String() != line {
				t.Errorf("String: %q, want %q", got.String(), line)
			}
			if got.IsEmpty() {
				t.Errorf("%s is empty", got)
			}
			for _, k := range ManifestKeys(c) {
				if k == "never_raw" { // never rendered: always true
					continue
				}
				if !slices.ContainsFunc(splitFields(line), func(f string) bool { return f == k }) {
					t.Errorf("the line does not set key %q", k)
				}
			}
			again, err := ParseManifests("rt", []byte("image x\nallow "+got.String()+"\n"))
			if err != nil {
				t.Fatal(err)
			}
			if a := again[0].Entries[0].Capability; !reflect.DeepEqual(a, got) {
				t.Errorf("re-parse: %+v, want %+v", a, got)
			}
			b, err := json.Marshal(got)
			if err != nil {
				t.Fatal(err)
			}
			var back Capability
			if err := json.Unmarshal(b, &back); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(back.Normalized(), got) || back.Validate() != nil {
				t.Errorf("JSON %s: %+v, want %+v", b, back, got)
			}

			e := Empty(c)
			if e.String() != string(c) {
				t.Errorf("empty String: %q, want %q", e.String(), c)
			}
			ms, err = ParseManifests("rt", []byte("image x\nallow "+string(c)+"\n"))
			if err != nil {
				t.Fatal(err)
			}
			if g := ms[0].Entries[0].Capability; !reflect.DeepEqual(g, e.Normalized()) {
				t.Errorf("bare class parses to %+v, want %+v", g, e.Normalized())
			}
		})
	}
}

// splitFields returns the keys a rendered line sets.
func splitFields(line string) []string {
	var out []string
	for _, f := range strings.Fields(line)[1:] {
		k, _, _ := strings.Cut(f, "=")
		out = append(out, k)
	}
	return out
}

// TestCompile: each class compiles to its own section of the Delta; a
// class whose OS state does not exist yet compiles to an empty Delta.
func TestCompile(t *testing.T) {
	ref := backend.HandleRef{Slot: 3, Generation: 1}
	withState := map[Class]bool{ClassNetEgress: true, ClassNetInbound: true, ClassFSScope: true, ClassPersistence: true, ClassProcess: true}
	for _, c := range Classes {
		t.Run(string(c), func(t *testing.T) {
			ms, err := ParseManifests("c", []byte("image x\nallow "+fullLines[c]+"\n"))
			if err != nil {
				t.Fatal(err)
			}
			d := Compile(ms[0].Entries[0].Capability, ref)
			if got := !d.IsEmpty(); got != withState[c] {
				t.Fatalf("Compile(%s) = %+v: OS state %v, want %v", fullLines[c], d, got, withState[c])
			}
			if err := d.Validate(); err != nil {
				t.Fatalf("Compile(%s): %v", fullLines[c], err)
			}
			if !Compile(Empty(c), ref).IsEmpty() {
				t.Fatalf("the empty %s compiles to OS state", c)
			}
			for _, r := range d.AddressRules() {
				if r.Handle != ref || r.Proto != backend.ProtoAny {
					t.Errorf("rule %s: handle %v proto %v, want %v and any", r, r.Handle, r.Proto, ref)
				}
			}
		})
	}
	if !Compile(Capability{Class: "bogus"}, ref).IsEmpty() {
		t.Error("an unknown class compiles to OS state")
	}

	// net.egress: every cidr × every port range, domains to nothing (the
	// resolver adds their rules); no ports: any port.
	eg := Capability{Class: ClassNetEgress, Egress: &EgressScope{Domains: []string{"a.example.com"},
		CIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("::1/128")},
		Ports: []PortRange{{443, 443}, {8000, 8100}}}}
	d := Compile(eg, ref)
	if len(d.Egress) != 4 || len(d.Inbound) != 0 || d.Egress[0].Prefix != netip.MustParsePrefix("10.0.0.0/8") || d.Egress[1].Ports != (backend.PortRange{Lo: 8000, Hi: 8100}) || d.Egress[0].Inbound {
		t.Errorf("egress delta %+v", d)
	}
	eg.Egress.Ports = nil
	if d := Compile(eg, ref); len(d.Egress) != 2 || d.Egress[0].Ports != backend.AnyPort {
		t.Errorf("egress without ports: %+v", d)
	}
	// net.inbound: its own section, every rule marked Inbound.
	in := Capability{Class: ClassNetInbound, Inbound: &InboundScope{CIDRs: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}}}
	if d := Compile(in, ref); len(d.Inbound) != 1 || len(d.Egress) != 0 || !d.Inbound[0].Inbound || d.Inbound[0].Ports != backend.AnyPort {
		t.Errorf("inbound delta %+v", d)
	}
}

// TestUnenforced: a net.egress scope asking for TLS inspection is refused
// whatever the probe says; nothing else is.
func TestUnenforced(t *testing.T) {
	tls := Capability{Class: ClassNetEgress, Egress: &EgressScope{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, TLSInspect: true}}
	if err := Unenforced(tls); !errors.Is(err, ErrTLSInspection) || !errors.Is(err, ErrNotEnforceable) {
		t.Errorf("tls_inspect: %v", err)
	}
	for _, c := range Classes {
		if err := Unenforced(Empty(c)); err != nil {
			t.Errorf("empty %s: %v", c, err)
		}
		if err := Unenforced(Capability{Class: c}); err != nil {
			t.Errorf("nil-scope %s: %v", c, err)
		}
	}
}
