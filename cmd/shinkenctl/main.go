// Command shinkenctl drives the Shinken agent over its Unix-socket API.
//
//	shinkenctl [-socket PATH] [-o table|json] VERB ...
//
// Verbs: status; session create|ls|show|rm; run SESSION -- CMD...; request;
// grants; revoke; attenuate; cards; approve CARD --once|--session|--pattern;
// deny CARD; cancel CARD; events [-f]; audit verify. `shinkenctl help` prints
// the usage of each.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/shinken-agent/shinken/agent"
	"github.com/shinken-agent/shinken/agent/api"
	"github.com/shinken-agent/shinken/agent/backend"
)

const usage = `usage: shinkenctl [-socket PATH] [-o table|json] VERB ...

  status                                   what the agent enforces, and how
  session create ID [-image I] [-trust low|normal|high] [-risk normal|high] [-headless] [-tls-inspection] [-workspace DIR] [-home DIR] [-expires DUR] [-memory BYTES] [-pids N] [-cpu-percent P]
  session ls | show ID | rm ID
  run SESSION [-timeout SECS] [-uid N -gid N] -- CMD [ARG...]
  request SESSION CLASS [-cidr P]... [-domain D]... [-port N|LO-HI]... [-lifecycle once|session] [-ttl DUR] [-external] [-parent HANDLE] [-json SCOPE]
  grants [SESSION]
  revoke HANDLE | revoke -id GRANT
  attenuate PARENT-HANDLE SESSION CLASS [scope flags as for request]
  cards [-all]
  approve CARD --once|--session|--pattern
  deny CARD
  cancel CARD
  events [-f]
  audit verify
`

type client struct {
	hc     *http.Client
	output string
}

func main() {
	fs := flag.NewFlagSet("shinkenctl", flag.ExitOnError)
	socket := fs.String("socket", "/run/shinken/agent.sock", "agent API socket")
	out := fs.String("o", "table", "output: table or json")
	fs.Usage = func() { fmt.Fprint(os.Stderr, usage) }
	fs.Parse(os.Args[1:])
	if *out != "table" && *out != "json" {
		fail(fmt.Errorf("-o %q: want table or json", *out))
	}
	c := &client{output: *out, hc: &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", *socket)
		},
	}}}
	args := fs.Args()
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" {
		fmt.Print(usage)
		return
	}
	if err := c.dispatch(args); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "shinkenctl:", err)
	os.Exit(1)
}

// apiError is a non-2xx answer.
type apiError struct {
	Status int
	Msg    string
}

func (e *apiError) Error() string { return fmt.Sprintf("%s (HTTP %d)", e.Msg, e.Status) }

func (c *client) call(method, path string, body, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, "http://shinken"+path, rd)
	if err != nil {
		return 0, err
	}
	if u := os.Getenv("SUDO_USER"); u != "" {
		req.Header.Set("X-Shinken-Actor", u)
	} else if u := os.Getenv("USER"); u != "" {
		req.Header.Set("X-Shinken-Actor", u)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		var ne *net.OpError
		if errors.As(err, &ne) {
			return 0, fmt.Errorf("cannot reach the agent: %w (is shinken-agent running, and are you root or in the operator group?)", ne.Err)
		}
		return 0, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, err
	}
	if resp.StatusCode >= 300 && resp.StatusCode != http.StatusAccepted && !(resp.StatusCode == http.StatusForbidden && path == "/v1/requests") {
		var e api.Error
		if json.Unmarshal(data, &e) == nil && e.Error != "" {
			return resp.StatusCode, &apiError{resp.StatusCode, e.Error}
		}
		return resp.StatusCode, &apiError{resp.StatusCode, strings.TrimSpace(string(data))}
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return resp.StatusCode, fmt.Errorf("decode answer: %w", err)
		}
	}
	return resp.StatusCode, nil
}

func (c *client) printJSON(v any) {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

func table(header string, rows [][]string) {
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	tw.Flush()
}

func need(args []string, n int, what string) error {
	if len(args) < n {
		return fmt.Errorf("usage: %s", what)
	}
	return nil
}

func (c *client) dispatch(args []string) error {
	switch args[0] {
	case "status":
		var st map[string]any
		if _, err := c.call("GET", "/v1/status", nil, &st); err != nil {
			return err
		}
		if c.output == "json" {
			c.printJSON(st)
			return nil
		}
		return c.printStatus(st)
	case "session", "sessions":
		return c.session(args[1:])
	case "run":
		return c.run(args[1:])
	case "request":
		return c.request(args[1:], "")
	case "attenuate":
		if err := need(args, 2, "attenuate PARENT-HANDLE SESSION CLASS [scope flags]"); err != nil {
			return err
		}
		return c.request(args[2:], args[1])
	case "grants":
		path := "/v1/grants"
		if len(args) > 1 {
			path += "?session=" + args[1]
		}
		var gs []agent.GrantInfo
		if _, err := c.call("GET", path, nil, &gs); err != nil {
			return err
		}
		if c.output == "json" {
			c.printJSON(gs)
			return nil
		}
		var rows [][]string
		for _, g := range gs {
			rows = append(rows, []string{g.ID, g.Session, string(g.Capability.Class), scopeString(g.Capability), g.Tier.String(), string(g.Lifecycle), string(g.Phase), expires(g.Expires)})
		}
		table("GRANT\tSESSION\tCLASS\tSCOPE\tTIER\tLIFECYCLE\tPHASE\tEXPIRES", rows)
		return nil
	case "revoke":
		fs := flag.NewFlagSet("revoke", flag.ContinueOnError)
		id := fs.String("id", "", "grant id instead of a handle")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		body := api.RevokeBody{ID: *id}
		if *id == "" {
			if fs.NArg() != 1 {
				return errors.New("usage: revoke HANDLE | revoke -id GRANT")
			}
			body.Handle = fs.Arg(0)
		}
		var res map[string]string
		if _, err := c.call("POST", "/v1/grants/revoke", body, &res); err != nil {
			return err
		}
		fmt.Println("revoked")
		return nil
	case "cards":
		path := "/v1/cards"
		if len(args) > 1 && args[1] == "-all" {
			path += "?all=1"
		}
		var cards []api.Card
		if _, err := c.call("GET", path, nil, &cards); err != nil {
			return err
		}
		if c.output == "json" {
			c.printJSON(cards)
			return nil
		}
		var rows [][]string
		for _, cd := range cards {
			for i, it := range cd.Items {
				id, sess, st := cd.ID, cd.Session, cd.Status
				if i > 0 {
					id, sess, st = "", "", ""
				}
				rows = append(rows, []string{id, sess, st, cd.Tier.String(), it.Actor, string(it.Resource), scopeString(it.Scope), string(it.Provenance), it.Rule})
			}
		}
		table("CARD\tSESSION\tSTATUS\tTIER\tACTOR\tRESOURCE\tSCOPE\tPROVENANCE\tRULE", rows)
		return nil
	case "approve":
		if len(args) != 3 {
			return errors.New("usage: approve CARD --once|--session|--pattern")
		}
		mode := strings.TrimLeft(args[2], "-")
		if mode != "once" && mode != "session" && mode != "pattern" {
			return fmt.Errorf("approve: %q: want --once, --session or --pattern", args[2])
		}
		var res map[string]any
		if _, err := c.call("POST", "/v1/cards/"+args[1]+"/approve", api.ApproveBody{Mode: mode}, &res); err != nil {
			return err
		}
		if c.output == "json" {
			c.printJSON(res)
			return nil
		}
		return printResults(res["results"])
	case "deny", "cancel":
		if len(args) != 2 {
			return fmt.Errorf("usage: %s CARD", args[0])
		}
		var cd api.Card
		if _, err := c.call("POST", "/v1/cards/"+args[1]+"/"+args[0], nil, &cd); err != nil {
			return err
		}
		fmt.Printf("card %s %s\n", cd.ID, cd.Status)
		return nil
	case "events":
		return c.events(len(args) > 1 && (args[1] == "-f" || args[1] == "--follow"))
	case "audit":
		if len(args) != 2 || args[1] != "verify" {
			return errors.New("usage: audit verify")
		}
		var res map[string]any
		code, err := c.call("GET", "/v1/audit/verify", nil, &res)
		if err != nil {
			var ae *apiError
			if errors.As(err, &ae) && code == http.StatusConflict {
				return errors.New("audit log verification FAILED: " + ae.Msg)
			}
			return err
		}
		if c.output == "json" {
			c.printJSON(res)
			return nil
		}
		fmt.Printf("audit log OK: %v\n", res["result"])
		return nil
	}
	return fmt.Errorf("unknown verb %q (shinkenctl help)", args[0])
}

func (c *client) printStatus(st map[string]any) error {
	keys := make([]string, 0, len(st))
	for k := range st {
		if k != "enforcement" && k != "backend" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Printf("%-18s %v\n", k+":", st[k])
	}
	fmt.Println()
	var rows [][]string
	if enf, ok := st["enforcement"].([]any); ok {
		for _, e := range enf {
			m, _ := e.(map[string]any)
			g := "no"
			if b, _ := m["grantable"].(bool); b {
				g = "yes"
			}
			rows = append(rows, []string{fmt.Sprint(m["class"]), g, fmt.Sprint(m["level"]), fmt.Sprint(m["mechanism"]), fmt.Sprint(m["reason"])})
		}
	}
	table("CLASS\tGRANTABLE\tLEVEL\tMECHANISM\tREASON", rows)
	if be, ok := st["backend"].(map[string]any); ok {
		if bd, ok := be["boundary"].([]any); ok && len(bd) > 0 {
			fmt.Println()
			rows = rows[:0]
			for _, e := range bd {
				m, _ := e.(map[string]any)
				rows = append(rows, []string{fmt.Sprint(m["class"]), fmt.Sprint(m["level"]), fmt.Sprint(m["mechanism"]), fmt.Sprint(m["reason"])})
			}
			table("BOUNDARY\tLEVEL\tMECHANISM\tREASON", rows)
		}
	}
	return nil
}

func expires(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return time.Until(t).Round(time.Second).String()
}

func scopeString(c agent.Capability) string {
	if c.Class == agent.ClassNetEgress && c.Egress != nil {
		var parts []string
		for _, p := range c.Egress.CIDRs {
			parts = append(parts, p.String())
		}
		parts = append(parts, c.Egress.Domains...)
		var ports []string
		for _, p := range c.Egress.Ports {
			ports = append(ports, p.String())
		}
		s := strings.Join(parts, ",")
		if len(ports) > 0 {
			s += " ports=" + strings.Join(ports, ",")
		}
		return s
	}
	b, _ := json.Marshal(c)
	return string(b)
}

func (c *client) session(args []string) error {
	if len(args) == 0 {
		return errors.New("usage: session create|ls|show|rm ...")
	}
	switch args[0] {
	case "create":
		fs := flag.NewFlagSet("session create", flag.ContinueOnError)
		image := fs.String("image", "default", "image (its manifest bounds what the session may ask)")
		trust := fs.String("trust", "normal", "trust tier: low, normal or high")
		risk := fs.String("risk", "normal", "risk: normal or high")
		headless := fs.Bool("headless", false, "no human watches this session")
		tls := fs.Bool("tls-inspection", false, "its egress goes through TLS inspection")
		ws := fs.String("workspace", "", "workspace directory")
		home := fs.String("home", "", "home directory")
		exp := fs.Duration("expires", 0, "session lifetime (0: none)")
		mem := fs.Uint64("memory", 0, "memory quota, bytes (cgroup2 memory.max)")
		pids := fs.Uint64("pids", 0, "process quota (cgroup2 pids.max)")
		cpu := fs.Uint("cpu-percent", 0, "CPU quota, percent of one CPU (cgroup2 cpu.max)")
		if len(args) < 2 || strings.HasPrefix(args[1], "-") {
			return errors.New("usage: session create ID [flags]")
		}
		if err := fs.Parse(args[2:]); err != nil {
			return err
		}
		spec := agent.SessionSpec{ID: args[1], Image: *image, TrustTier: *trust, Risk: *risk, Headless: *headless, TLSInspection: *tls, Workspace: *ws, Home: *home}
		if *exp > 0 {
			spec.Expires = time.Now().Add(*exp)
		}
		body := api.CreateSessionBody{SessionSpec: spec, Quotas: backend.Limits{MemoryBytes: *mem, Pids: *pids, CPUPercent: uint32(*cpu)}}
		var v api.SessionView
		if _, err := c.call("POST", "/v1/sessions", body, &v); err != nil {
			return err
		}
		if c.output == "json" {
			c.printJSON(v)
			return nil
		}
		fmt.Printf("session %s created (index %d, cgroup %s)\n", v.ID, v.Index, v.Path)
		return nil
	case "ls", "list":
		var vs []api.SessionView
		if _, err := c.call("GET", "/v1/sessions", nil, &vs); err != nil {
			return err
		}
		if c.output == "json" {
			c.printJSON(vs)
			return nil
		}
		var rows [][]string
		for _, v := range vs {
			rows = append(rows, []string{v.ID, v.Image, v.TrustTier, v.Risk, strconv.Itoa(int(v.Index)), v.Path})
		}
		table("SESSION\tIMAGE\tTRUST\tRISK\tINDEX\tCGROUP", rows)
		return nil
	case "show":
		if len(args) != 2 {
			return errors.New("usage: session show ID")
		}
		var v api.SessionView
		if _, err := c.call("GET", "/v1/sessions/"+args[1], nil, &v); err != nil {
			return err
		}
		c.printJSON(v)
		return nil
	case "rm", "delete":
		if len(args) != 2 {
			return errors.New("usage: session rm ID")
		}
		if _, err := c.call("DELETE", "/v1/sessions/"+args[1], nil, nil); err != nil {
			return err
		}
		fmt.Printf("session %s removed\n", args[1])
		return nil
	}
	return fmt.Errorf("unknown session verb %q", args[0])
}

func (c *client) run(args []string) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	timeout := fs.Float64("timeout", 60, "seconds")
	uid := fs.Uint("uid", 0, "uid (default nobody)")
	gid := fs.Uint("gid", 0, "gid")
	if len(args) < 1 {
		return errors.New("usage: run SESSION [-timeout S] -- CMD [ARG...]")
	}
	session := args[0]
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	argv := fs.Args()
	if len(argv) == 0 {
		return errors.New("usage: run SESSION [-timeout S] -- CMD [ARG...]")
	}
	var res api.RunResult
	if _, err := c.call("POST", "/v1/sessions/"+session+"/run", api.RunRequest{Argv: argv, TimeoutS: *timeout, UID: uint32(*uid), GID: uint32(*gid)}, &res); err != nil {
		return err
	}
	if c.output == "json" {
		c.printJSON(res)
		return nil
	}
	os.Stdout.WriteString(res.Stdout)
	os.Stderr.WriteString(res.Stderr)
	if res.TimedOut {
		fmt.Fprintln(os.Stderr, "shinkenctl: command timed out")
	}
	if res.ExitCode != 0 {
		os.Exit(res.ExitCode)
	}
	return nil
}

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func (c *client) request(args []string, parent string) error {
	if len(args) < 2 {
		return errors.New("usage: request SESSION CLASS [scope flags]")
	}
	session, class := args[0], args[1]
	fs := flag.NewFlagSet("request", flag.ContinueOnError)
	var cidrs, domains, ports multi
	fs.Var(&cidrs, "cidr", "net.egress prefix (repeatable)")
	fs.Var(&domains, "domain", "net.egress domain: host, *.host or **.host (repeatable)")
	fs.Var(&ports, "port", "net.egress port or LO-HI range (repeatable; none: any)")
	lc := fs.String("lifecycle", "session", "once or session")
	ttl := fs.Duration("ttl", 0, "time box (0: the lifecycle's default)")
	external := fs.Bool("external", false, "parameters come from external content (promotes the tier)")
	scopeJSON := fs.String("json", "", "the whole capability as JSON (instead of the scope flags)")
	if err := fs.Parse(args[2:]); err != nil {
		return err
	}
	capab := agent.Capability{Class: agent.Class(class)}
	if *scopeJSON != "" {
		dec := json.NewDecoder(strings.NewReader(*scopeJSON))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&capab); err != nil {
			return fmt.Errorf("-json: %w", err)
		}
	} else if class == string(agent.ClassNetEgress) {
		e := &agent.EgressScope{Domains: domains}
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
			e.Ports = append(e.Ports, agent.PortRange{Lo: uint16(l), Hi: uint16(h)})
		}
		capab.Egress = e
	}
	req := agent.GrantRequest{Session: session, Capability: capab, Lifecycle: agent.Lifecycle(*lc), TTL: *ttl}
	if *external {
		req.Provenance = "external"
	}
	if parent != "" {
		var g agent.Grant
		if _, err := c.call("POST", "/v1/grants/attenuate", api.AttenuateBody{Parent: parent, Request: req}, &g); err != nil {
			return err
		}
		if c.output == "json" {
			c.printJSON(g)
			return nil
		}
		fmt.Printf("granted %s handle=%s tier=%s expires=%s\n", g.ID, g.Handle, g.Tier, expires(g.Expires))
		return nil
	}
	var res []api.RequestResult
	if _, err := c.call("POST", "/v1/requests", api.RequestBody{Requests: []agent.GrantRequest{req}}, &res); err != nil {
		return err
	}
	if c.output == "json" {
		c.printJSON(res)
	} else {
		for _, r := range res {
			printResult(r)
		}
	}
	for _, r := range res {
		if r.Outcome == "denied" || r.Outcome == "invalid" {
			os.Exit(3)
		}
	}
	return nil
}

func printResult(r api.RequestResult) {
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
	var rs []api.RequestResult
	if err := json.Unmarshal(b, &rs); err != nil {
		return err
	}
	for _, r := range rs {
		printResult(r)
	}
	return nil
}

func (c *client) events(follow bool) error {
	path := "/v1/events"
	if follow {
		path += "?follow=1"
	}
	req, _ := http.NewRequest("GET", "http://shinken"+path, nil)
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach the agent: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return &apiError{resp.StatusCode, strings.TrimSpace(string(b))}
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		if c.output == "json" {
			fmt.Println(sc.Text())
			continue
		}
		var r api.Record
		if json.Unmarshal(sc.Bytes(), &r) != nil {
			continue
		}
		fmt.Printf("%s %-6s %-18s %s\n", r.Time.Format(time.RFC3339Nano), r.Source, r.Kind, string(r.Data))
	}
	return sc.Err()
}
