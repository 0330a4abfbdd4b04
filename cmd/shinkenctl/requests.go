package main

// The request and attenuate verbs: a capability from flags, sent as a
// request, and how its outcome is printed.

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/shinken-agent/shinken/agent/api/wire"
	"github.com/shinken-agent/shinken/agent/capability"
)

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func (c *client) request(args []string, parent string) error {
	if len(args) < 2 {
		return errors.New("usage: request SESSION CLASS [scope flags]")
	}
	session, class := args[0], args[1]
	fs := newFlags("request")
	var cidrs, domains, ports multi
	fs.Var(&cidrs, "cidr", "net.egress prefix; net.inbound: where peers connect from (repeatable)")
	fs.Var(&domains, "domain", "net.egress domain: host, *.host or **.host (repeatable)")
	fs.Var(&ports, "port", "net.egress port or LO-HI range; net.inbound: the session's own port (repeatable; none: any)")
	lc := fs.String("lifecycle", "session", "once or session")
	ttl := fs.Duration("ttl", 0, "time box (0: the lifecycle's default)")
	external := fs.Bool("external", false, "parameters come from external content (promotes the tier)")
	scopeJSON := fs.String("json", "", "the whole capability as JSON (instead of the scope flags)")
	if err := fs.Parse(args[2:]); err != nil {
		return err
	}
	capab := capability.Capability{Class: capability.Class(class)}
	if *scopeJSON != "" {
		dec := json.NewDecoder(strings.NewReader(*scopeJSON))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&capab); err != nil {
			return fmt.Errorf("-json: %w", err)
		}
	} else if class == string(capability.ClassNetEgress) || class == string(capability.ClassNetInbound) {
		e := &capability.EgressScope{Domains: domains}
		for _, s := range cidrs {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				return fmt.Errorf("-cidr %q: %w", s, err)
			}
			e.CIDRs = append(e.CIDRs, p)
		}
		for _, s := range ports {
			lo, hi, _ := strings.Cut(s, "-")
			if hi == "" {
				hi = lo
			}
			l, err1 := strconv.ParseUint(lo, 10, 16)
			h, err2 := strconv.ParseUint(hi, 10, 16)
			if err1 != nil || err2 != nil {
				return fmt.Errorf("-port %q: want N or LO-HI", s)
			}
			e.Ports = append(e.Ports, capability.PortRange{Lo: uint16(l), Hi: uint16(h)})
		}
		if class == string(capability.ClassNetInbound) {
			if len(e.Domains) > 0 {
				return errors.New("net.inbound takes no -domain (peers are named by -cidr)")
			}
			capab.Inbound = &capability.InboundScope{CIDRs: e.CIDRs, Ports: e.Ports}
		} else {
			capab.Egress = e
		}
	}
	req := capability.GrantRequest{Session: session, Capability: capab, Lifecycle: capability.Lifecycle(*lc), TTL: *ttl}
	if *external {
		req.Provenance = "external"
	}
	if parent != "" {
		var g capability.Grant
		if _, err := c.call("POST", "/v1/grants/attenuate", wire.AttenuateBody{Parent: parent, Request: req}, &g); err != nil {
			return err
		}
		if c.output == "json" {
			c.printJSON(g)
			return nil
		}
		fmt.Printf("granted %s handle=%s tier=%s expires=%s\n", g.ID, g.Handle, g.Tier, expires(g.Expires))
		return nil
	}
	var res []wire.RequestResult
	if _, err := c.call("POST", "/v1/requests", wire.RequestBody{Requests: []capability.GrantRequest{req}}, &res); err != nil {
		return err
	}
	refused := false
	for _, r := range res {
		switch {
		case r.Outcome != "denied" && r.Outcome != "invalid":
			if c.output != "json" {
				printResult(r)
			}
		case c.output != "json":
			fmt.Fprintf(os.Stderr, "shinkenctl: %s: %s (HTTP %d)\n", r.Outcome, oneLine(r.Reason), r.Status)
			refused = true
		default:
			refused = true
		}
	}
	if c.output == "json" {
		c.printJSON(res)
	}
	if refused {
		os.Exit(3)
	}
	return nil
}

func printResult(r wire.RequestResult) {
	switch r.Outcome {
	case "granted":
		fmt.Printf("granted %s handle=%s tier=%s expires=%s\n", r.Grant.ID, r.Grant.Handle, r.Grant.Tier, expires(r.Grant.Expires))
	case "pending":
		fmt.Printf("pending: card %s (%s) — approve with: shinkenctl approve %s --once|--session|--pattern\n", r.Card, r.Reason, r.Card)
	default:
		fmt.Printf("%s: %s\n", r.Outcome, r.Reason)
	}
}

func printResults(v any) error {
	b, _ := json.Marshal(v)
	var rs []wire.RequestResult
	if err := json.Unmarshal(b, &rs); err != nil {
		return err
	}
	for _, r := range rs {
		printResult(r)
	}
	return nil
}
