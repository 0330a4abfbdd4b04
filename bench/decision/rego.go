package main

import (
	"runtime/debug"
	"strings"
	"time"

	"github.com/shinken-agent/shinken/agent"
)

// regoPolicy is the Rego equivalent of the agent's shipped base policies'
// use-time half and of the grant templates of the classes the benchmark
// loads (net.egress, fs.scope, gpu, clipboard): deny by default, a grant
// allows when live and matching, the hard-deny forbids override.
const regoPolicy = `package shinken

default allow := false

allow if {
	not deny
	some g in data.sessions[input.session].grants
	g.class == input.class
	input.now_ns < g.expires_ns
	grant_matches(g)
}

grant_matches(g) if {
	g.class == "net.egress"
	input.op == "connect"
	input.ip != ""
	some c in g.cidrs
	net.cidr_contains(c, input.ip)
	port_ok(g)
}

grant_matches(g) if {
	g.class == "net.egress"
	input.op == "connect"
	input.domain != ""
	some d in g.domains
	domain_match(d, input.domain)
	port_ok(g)
}

grant_matches(g) if {
	g.class == "fs.scope"
	input.op == "read"
	some p in g.read
	under(input.path, p)
	not denied_path(g)
}

grant_matches(g) if {
	g.class == "fs.scope"
	input.op == "write"
	some p in g.write
	under(input.path, p)
	not denied_path(g)
}

grant_matches(g) if {
	g.class == "gpu"
	input.op == "use"
	input.item in g.items
	g.mode == input.mode
}

grant_matches(g) if {
	g.class == "clipboard"
	input.op in {"paste_in", "copy_out"}
	input.op in g.flags
}

denied_path(g) if {
	some p in g.deny
	under(input.path, p)
}

port_ok(g) if count(g.ports) == 0

port_ok(g) if {
	some r in g.ports
	r.lo <= input.port
	input.port <= r.hi
}

under(path, root) if path == root
under(path, root) if startswith(path, concat("", [root, "/"]))

domain_match(pat, d) if pat == d
domain_match(pat, d) if {
	startswith(pat, "**.")
	base := substring(pat, 3, -1)
	d == base
}
domain_match(pat, d) if {
	startswith(pat, "**.")
	endswith(d, substring(pat, 2, -1))
}
domain_match(pat, d) if {
	startswith(pat, "*.")
	not startswith(pat, "**.")
	endswith(d, substring(pat, 1, -1))
}

s := data.sessions[input.session].attrs

deny if {
	input.class == "install.privileged"
	s.trust_tier == "low"
}

deny if {
	input.op in {"write", "persist"}
	some p in s.protected
	under(input.path, p)
}

deny if {
	input.op in {"write", "persist"}
	some p in s.policy_store
	under(input.path, p)
}

deny if {
	input.class == "net.egress"
	s.risk == "high"
	not s.tls_inspection
}
`

func regoData(sessions []session) map[string]any {
	out := make(map[string]any, len(sessions))
	for _, s := range sessions {
		var grants []any
		for _, g := range s.grants {
			c := g.Capability.Normalized()
			m := map[string]any{"class": string(c.Class), "expires_ns": g.Expires.UnixNano()}
			switch c.Class {
			case agent.ClassNetEgress:
				var cidrs, domains, ports []any
				for _, p := range c.Egress.CIDRs {
					cidrs = append(cidrs, p.String())
				}
				for _, d := range c.Egress.Domains {
					domains = append(domains, d)
				}
				for _, p := range c.Egress.Ports {
					ports = append(ports, map[string]any{"lo": int(p.Lo), "hi": int(p.Hi)})
				}
				m["cidrs"], m["domains"], m["ports"] = orEmpty(cidrs), orEmpty(domains), orEmpty(ports)
			case agent.ClassFSScope:
				m["read"], m["write"], m["deny"] = strs(c.FS.Read), strs(c.FS.Write), strs(c.FS.Deny)
			case agent.ClassGPU:
				m["items"], m["mode"] = strs(c.GPU.DeviceIDs), c.GPU.Mode
			case agent.ClassClipboard:
				var f []any
				if c.Clipboard.PasteIn {
					f = append(f, "paste_in")
				}
				if c.Clipboard.CopyOut {
					f = append(f, "copy_out")
				}
				m["flags"] = orEmpty(f)
			}
			grants = append(grants, m)
		}
		a := s.attrs
		out[a.ID] = map[string]any{
			"attrs": map[string]any{"trust_tier": a.TrustTier, "risk": a.Risk, "tls_inspection": a.TLSInspection,
				"protected": strs(a.Protected), "policy_store": strs(a.PolicyStore)},
			"grants": grants,
		}
	}
	return out
}

func strs(s []string) []any {
	out := make([]any, 0, len(s))
	for _, x := range s {
		out = append(out, x)
	}
	return out
}

func orEmpty(s []any) []any {
	if s == nil {
		return []any{}
	}
	return s
}

func regoInput(q query, now time.Time) map[string]any {
	ip := ""
	if q.req.IP.IsValid() {
		ip = q.req.IP.String()
	}
	return map[string]any{
		"session": q.session, "class": string(q.req.Class), "op": q.req.Op, "now_ns": now.UnixNano(),
		"ip": ip, "domain": strings.ToLower(q.req.Domain), "port": int(q.req.Port),
		"path": q.req.Path, "item": q.req.Item, "mode": q.req.Mode,
	}
}

func opaVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/open-policy-agent/opa" {
				return d.Version
			}
		}
	}
	return "?"
}
