package policy

// Decision layer: the Cedar encoding of each capability class, one entry per
// class keyed by capability.Class (the grammar itself is agent/capability's
// registry, class_<name>.go; this package cannot be imported by it, so its
// side of a class lives here): the fixed policy of a grant of the class, the
// Grant entity's data, the grant-time scope summary, and what the bounded
// checks (ProveGrant, the permissiveness search) probe. Every other file of
// the engine reads the class through this table.

import (
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/cedar-policy/cedar-go/ast"
	"github.com/cedar-policy/cedar-go/types"

	"github.com/shinken-agent/shinken/agent/capability"
)

// classEncoding is one capability class's Cedar encoding. Functions taking
// a capability get it normalized, its scope set.
type classEncoding struct {
	// condition is the fixed policy's condition (besides the grant being
	// live) over the request req, its op and the Grant entity G. It names
	// only agent-made identifiers; every user value (domain, prefix, path,
	// ...) stays in the Grant entity's data, put there by entity.
	condition func(op, req, G ast.Node) ast.Node
	// entity puts the scope into the Grant entity's attributes.
	entity func(c capability.Capability, a *grantAttrs)
	// scope (optional) puts what the grant-time base policies read of the
	// scope (context.scope) into s.
	scope func(c capability.Capability, s *scopeAttrs)
	// ports: the class's use requests carry a port, and its port keys.
	// agent/shiftproof assumes the classes with ports are net.egress and
	// net.inbound (request.go derivedPresent); TestClassEncodings holds it.
	ports bool
	// literals (optional) collects the scope's values, which ProveGrant
	// probes with their neighbours.
	literals func(c capability.Capability, lit *literals)
	// useProbes builds the use requests of the class the bounded checks try
	// from the literals (shift_probes.go has the shared builders).
	// They are appended to out (empty, perhaps with room).
	useProbes func(out []capability.UseRequest, c capability.Class, lit *literals, pr capability.SessionAttrs) []capability.UseRequest
	// grantProbes (optional) are the capabilities, besides the empty one,
	// the permissiveness search asks to grant.
	grantProbes func(c capability.Class, lit *literals) []capability.Capability
}

// encodings holds every class's Cedar encoding.
var encodings = map[capability.Class]classEncoding{
	capability.ClassNetEgress: {
		// The address and port keys are the receivers of containsAny and
		// the grant's sets its arguments: cedar-go hashes each element of
		// the argument, and a request carries a key per prefix length (33
		// or 129) where a grant has a CIDR or a few
		// (TestGrantConditionIteratesGrantSets).
		condition: func(op, req, G ast.Node) ast.Node {
			return op.Equal(ast.String("connect")).
				And(G.Access("domains").ContainsAny(req.Access("domain_keys")).Or(req.Access("cidr_keys").ContainsAny(G.Access("cidrs")))).
				And(req.Access("port_keys").ContainsAny(G.Access("ports")))
		},
		entity: func(c capability.Capability, a *grantAttrs) {
			a.domains = c.Egress.Domains
			a.cidrs = prefixStrings(c.Egress.CIDRs)
			a.ports = portBlocks(c.Egress.Ports)
			a.flag("tls_inspect", c.Egress.TLSInspect)
		},
		scope: func(c capability.Capability, s *scopeAttrs) { s.tls = c.Egress.TLSInspect },
		ports: true,
		literals: func(c capability.Capability, lit *literals) {
			for _, d := range c.Egress.Domains {
				base := strings.TrimPrefix(strings.TrimPrefix(d, "**."), "*.")
				lit.strs = append(lit.strs, base, "y."+base, "x"+base)
				if _, parent, ok := strings.Cut(base, "."); ok {
					lit.strs = append(lit.strs, parent)
				}
			}
			lit.ips = c.Egress.CIDRs
			portLiterals(c.Egress.Ports, lit)
		},
		useProbes: egressUseProbes,
		grantProbes: func(c capability.Class, _ *literals) []capability.Capability {
			return []capability.Capability{
				{Class: c, Egress: &capability.EgressScope{CIDRs: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}, TLSInspect: true}},
				{Class: c, Egress: &capability.EgressScope{CIDRs: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}}},
			}
		},
	},
	capability.ClassNetInbound: {
		// A peer (its address) opening a flow to one of the session's
		// ports.
		condition: func(op, req, G ast.Node) ast.Node {
			return op.Equal(ast.String("accept")).
				And(req.Access("cidr_keys").ContainsAny(G.Access("cidrs"))).
				And(req.Access("port_keys").ContainsAny(G.Access("ports")))
		},
		entity: func(c capability.Capability, a *grantAttrs) {
			a.cidrs = prefixStrings(c.Inbound.CIDRs)
			a.ports = portBlocks(c.Inbound.Ports)
		},
		ports: true,
		literals: func(c capability.Capability, lit *literals) {
			lit.ips = c.Inbound.CIDRs
			portLiterals(c.Inbound.Ports, lit)
		},
		useProbes: inboundUseProbes,
		grantProbes: func(c capability.Class, _ *literals) []capability.Capability {
			return []capability.Capability{
				{Class: c, Inbound: &capability.InboundScope{CIDRs: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}}},
				{Class: c, Inbound: &capability.InboundScope{CIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, Ports: []capability.PortRange{{Lo: 8080, Hi: 8080}}}},
			}
		},
	},
	capability.ClassFSScope: {
		// Narrowest wins inside one grant, axis by axis, with no
		// quantifier: the agent splits each axis's entries and the
		// grant's denies into nesting levels when it builds the entity
		// (capability.FSLevels; fsNest below), and a path is given iff
		// some level has an entry above it and no deny above it. connect
		// names a socket exactly: the request's item is its path
		// (useContextMemo), the grant's items the connect[] list less any
		// path its deny names (a tie the grammar refuses).
		condition: func(op, req, G ast.Node) ast.Node {
			keys := req.Access("path_keys")
			return op.Equal(ast.String("read")).And(fsNestCondition(G, "read", keys)).
				Or(op.Equal(ast.String("write")).And(fsNestCondition(G, "write", keys))).
				Or(op.Equal(ast.String("delete")).And(fsNestCondition(G, "delete", keys))).
				Or(op.Equal(ast.String("connect")).And(G.Access("items").Contains(req.Access("item"))))
		},
		entity: func(c capability.Capability, a *grantAttrs) {
			a.deny = c.FS.Deny
			for i, ax := range []struct {
				allow []string
				dst   *[]string
			}{{c.FS.Read, &a.read}, {c.FS.Write, &a.write}, {c.FS.Delete, &a.del}} {
				levels := capability.FSLevels(ax.allow, c.FS.Deny)
				if len(levels) > 0 {
					*ax.dst = levels[0].Allow
				}
				a.nest[i] = levels
			}
			for _, p := range c.FS.Connect {
				if !slices.Contains(c.FS.Deny, p) {
					a.items = append(a.items, p)
				}
			}
		},
		// A delete is a write for the grant-time forbids (credential
		// directories, shell rc files, the policy store).
		scope: func(c capability.Capability, s *scopeAttrs) {
			s.writeAncestors(c.FS.Write)
			s.writeAncestors(c.FS.Delete)
		},
		literals: func(c capability.Capability, lit *literals) {
			pathLiterals(lit, c.FS.Read, c.FS.Write, c.FS.Delete, c.FS.Deny, c.FS.Connect)
		},
		useProbes: pathUseProbes,
		grantProbes: pathGrantProbes(func(c capability.Class, p string) capability.Capability {
			return capability.Capability{Class: c, FS: &capability.FSScope{Write: []string{p}}}
		}),
	},
	capability.ClassClipboard: {
		condition: func(op, _, G ast.Node) ast.Node {
			return G.Access("flags").Contains(op).And(op.Equal(ast.String("paste_in")).Or(op.Equal(ast.String("copy_out"))))
		},
		entity: func(c capability.Capability, a *grantAttrs) {
			a.flag("paste_in", c.Clipboard.PasteIn)
			a.flag("copy_out", c.Clipboard.CopyOut)
		},
		useProbes: itemUseProbes(""),
	},
	capability.ClassGPU: {
		condition: func(op, req, G ast.Node) ast.Node {
			return op.Equal(ast.String("use")).And(G.Access("items").Contains(req.Access("item"))).And(G.Access("mode").Equal(req.Access("mode")))
		},
		entity: func(c capability.Capability, a *grantAttrs) { a.items, a.mode = c.GPU.DeviceIDs, c.GPU.Mode },
		scope:  func(c capability.Capability, s *scopeAttrs) { s.mode = c.GPU.Mode },
		literals: func(c capability.Capability, lit *literals) {
			lit.strs = append(lit.strs, c.GPU.DeviceIDs...)
		},
		useProbes: itemUseProbes(capability.GPUModeCompute, capability.GPUModeRender, capability.GPUModeRaw),
		grantProbes: func(c capability.Class, _ *literals) []capability.Capability {
			var out []capability.Capability
			for _, m := range []string{capability.GPUModeCompute, capability.GPUModeRender, capability.GPUModeRaw} {
				out = append(out, capability.Capability{Class: c, GPU: &capability.GPUScope{DeviceIDs: []string{"0"}, Mode: m}})
			}
			return out
		},
	},
	capability.ClassInstall: {
		condition: func(op, _, G ast.Node) ast.Node {
			return op.Equal(ast.String("pkg")).Or(op.Equal(ast.String("any"))).
				And(G.Access("mode").Equal(ast.String("any")).Or(G.Access("mode").Equal(op)))
		},
		entity:    func(c capability.Capability, a *grantAttrs) { a.mode = c.Install.Scope },
		scope:     func(c capability.Capability, s *scopeAttrs) { s.mode = c.Install.Scope },
		useProbes: itemUseProbes(""),
		grantProbes: func(c capability.Class, _ *literals) []capability.Capability {
			var out []capability.Capability
			for _, s := range []string{capability.InstallPkg, capability.InstallAny} {
				out = append(out, capability.Capability{Class: c, Install: &capability.InstallScope{Scope: s}})
			}
			return out
		},
	},
	capability.ClassPersistence: {
		condition: func(op, req, G ast.Node) ast.Node {
			return op.Equal(ast.String("persist")).And(G.Access("write").ContainsAny(req.Access("path_keys")))
		},
		entity: func(c capability.Capability, a *grantAttrs) {
			a.write = c.Persistence.Paths
			a.flag("survives_session", c.Persistence.SurvivesSession)
		},
		scope: func(c capability.Capability, s *scopeAttrs) { s.writeAncestors(c.Persistence.Paths) },
		literals: func(c capability.Capability, lit *literals) {
			pathLiterals(lit, c.Persistence.Paths)
		},
		useProbes: pathUseProbes,
		grantProbes: pathGrantProbes(func(c capability.Class, p string) capability.Capability {
			return capability.Capability{Class: c, Persistence: &capability.PersistenceScope{Paths: []string{p}}}
		}),
	},
	capability.ClassCredentials: {
		condition: func(op, req, G ast.Node) ast.Node {
			return op.Equal(ast.String("broker")).And(G.Access("items").Contains(req.Access("item")))
		},
		entity: func(c capability.Capability, a *grantAttrs) { a.items = c.Credentials.BrokerScopes },
		literals: func(c capability.Capability, lit *literals) {
			lit.strs = append(lit.strs, c.Credentials.BrokerScopes...)
		},
		useProbes: itemUseProbes(""),
	},
	capability.ClassPeripheral: {
		condition: func(op, req, G ast.Node) ast.Node {
			return op.Equal(ast.String("usb")).And(G.Access("items").Contains(req.Access("item"))).
				Or(op.NotEqual(ast.String("usb")).And(G.Access("flags").Contains(op)).
					And(op.Equal(ast.String("camera")).Or(op.Equal(ast.String("mic"))).Or(op.Equal(ast.String("input_inject")))))
		},
		entity: func(c capability.Capability, a *grantAttrs) {
			a.flag("camera", c.Peripheral.Camera)
			a.flag("mic", c.Peripheral.Mic)
			a.flag("input_inject", c.Peripheral.InputInject)
			a.items = c.Peripheral.USB
		},
		literals: func(c capability.Capability, lit *literals) {
			lit.strs = append(lit.strs, c.Peripheral.USB...)
		},
		useProbes: itemUseProbes(""),
	},
	capability.ClassProcess: {
		// exec names a program exactly: the request's item is its path
		// (useItem), the grant's items the exec list. max_processes is a
		// bound, not a use: no request asks for it.
		condition: func(op, req, G ast.Node) ast.Node {
			return op.Equal(ast.String("exec")).And(G.Access("items").Contains(req.Access("item")))
		},
		entity: func(c capability.Capability, a *grantAttrs) { a.items = c.Process.Exec },
		literals: func(c capability.Capability, lit *literals) {
			pathLiterals(lit, c.Process.Exec)
		},
		useProbes: pathUseProbes,
		grantProbes: pathGrantProbes(func(c capability.Class, p string) capability.Capability {
			return capability.Capability{Class: c, Process: &capability.ProcessScope{Exec: []string{p}}}
		}),
	},
}

// encodingOf is class c's entry (the zero entry for an unknown class: its
// grants permit nothing, and nothing is probed).
func encodingOf(c capability.Class) classEncoding { return encodings[c] }

func prefixStrings(ps []netip.Prefix) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.String())
	}
	return out
}

// portLiterals: each range's ends, and the ends of the port space.
func portLiterals(ps []capability.PortRange, lit *literals) {
	for _, p := range ps {
		lit.longs = append(lit.longs, int64(p.Lo), int64(p.Hi))
	}
	lit.longs = append(lit.longs, 1, 65534)
}

// pathLiterals: each path, a sibling just past it, and its parent.
func pathLiterals(lit *literals, lists ...[]string) {
	for _, l := range lists {
		for _, p := range l {
			lit.strs = append(lit.strs, p, p+"x", filepath.Dir(p))
		}
	}
}

// fsNestAxes are the axes whose entries nest (their order is grantAttrs.nest's).
var fsNestAxes = [...]string{"read", "write", "delete"}

// fsNestCondition is narrowest-wins for one axis of an fs.scope grant G over
// the request's path keys: with A_i the axis's level-i entries (level 1:
// G.<axis>; deeper: G.<axis>_nest.a<i>) and D_i the grant's level-i denies
// (G.<axis>_nest.d<i>), the path is given iff
//
//	A_1 & (!D_1 | (A_2 & (!D_2 | ... (A_n & !D_n))))
//
// where each term says the set holds one of the path's keys. Along a path's
// chain the levels only grow (capability.FSLevels), so this holds exactly
// when the deepest entry of the axis or of the denies above the path is an
// entry of the axis; nested, it stops at the first level whose deny is not
// above the path (most paths: level 1).
func fsNestCondition(G ast.Node, axis string, keys ast.Node) ast.Node {
	nest := G.Access(types.String(axis + "_nest"))
	allow := func(i int) ast.Node {
		if i == 1 {
			return G.Access(types.String(axis))
		}
		return nest.Access(types.String("a" + strconv.Itoa(i)))
	}
	deny := func(i int) ast.Node { return nest.Access(types.String("d" + strconv.Itoa(i))) }
	cond := allow(capability.MaxFSNesting).ContainsAny(keys).And(ast.Not(deny(capability.MaxFSNesting).ContainsAny(keys)))
	for i := capability.MaxFSNesting - 1; i >= 1; i-- {
		cond = allow(i).ContainsAny(keys).And(ast.Not(deny(i).ContainsAny(keys)).Or(cond))
	}
	return cond
}
