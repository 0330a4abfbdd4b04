// Command shinkenctl drives the Shinken agent over its Unix-socket API.
//
//	shinkenctl [-socket PATH] [-o table|json] VERB ...
//
// Verbs: status; session create|ls|show|rm; run SESSION -- CMD...; request;
// decide; policy diff|apply;
// grants; revoke; attenuate; cards; approve CARD --once|--session|--pattern;
// deny CARD; cancel CARD; events [-f]; audit verify. `shinkenctl help` prints
// the usage of each.
package main

// The command line: usage, flags, dispatch of the verbs, and the status,
// cards and events views.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/shinken-agent/shinken/agent/api/wire"
	"github.com/shinken-agent/shinken/agent/capability"
	"github.com/shinken-agent/shinken/cmd/shinkenctl/panel"
)

const usage = `usage: shinkenctl [-socket PATH] [-o table|json] VERB ... (global flags before or after the verb)

  status                                   what the agent enforces, and how
  session create ID [-image I] [-trust low|normal|high] [-risk normal|high] [-headless] [-tls-inspection] [-workspace DIR] [-home DIR] [-expires DUR] [-memory BYTES] [-pids N] [-cpu-percent P]
  session ls | show ID | rm ID
  run SESSION [-timeout SECS] [-uid N -gid N] -- CMD [ARG...]
  exec [-i] [-t] [-e NAME=VALUE]... [-w DIR] [-deadline SECS] SESSION -- CMD [ARG...]
                                           start and attach (exec -it SESSION -- bash: a shell); exit code passed through
  start [same flags as exec] SESSION -- CMD [ARG...]   start a process, print its id
  ps SESSION | logs [-f] [-from N] [-stderr] SESSION ID | attach [-i] [-t] [-from N] SESSION ID
  kill [-s SIGNAL] SESSION ID              a signal, or (without -s) kill the process's whole tree
  pause SESSION | resume SESSION           freeze / thaw every process of the session
  request SESSION CLASS [-cidr P]... [-domain D]... [-port N|LO-HI]... [-lifecycle once|session] [-ttl DUR] [-external] [-parent HANDLE] [-json SCOPE]
  decide SESSION CLASS OP [-domain D] [-ip A] [-port N] [-path P] [-item I] [-mode M]
                                           use-time decision and the rule that decided (exit 3: deny)
  policy diff|apply [--allow-widening] FILE.cedar...
                                           a policy change through the permissiveness gate
  grants [SESSION]
  revoke HANDLE | revoke -id GRANT
  attenuate PARENT-HANDLE SESSION CLASS [scope flags as for request]
  cards [-all]
  approve CARD --once|--session|--pattern
  deny CARD
  cancel CARD
  events [-f]
  audit verify [-full]
  panel [-port N]                          the permission panel in your browser (127.0.0.1, one-time token)
`

func main() {
	fs := newFlags("shinkenctl")
	socket := fs.String("socket", "/run/shinken/agent.sock", "agent API socket")
	out := fs.String("o", "table", "output: table or json")
	globals, args, err := splitGlobals(os.Args[1:])
	if err == nil {
		err = fs.Parse(globals)
	}
	if err != nil {
		fail(err)
	}
	if *out != "table" && *out != "json" {
		fail(fmt.Errorf("-o %q: want table or json", *out))
	}
	c := &client{output: *out, hc: &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", *socket)
		},
	}}}
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		fmt.Print(usage)
		return
	}
	if err := c.dispatch(args); err != nil {
		var code exitCode
		if errors.As(err, &code) {
			os.Exit(int(code))
		}
		fail(err)
	}
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
	case "exec", "start", "ps", "logs", "attach", "kill", "pause", "resume":
		return c.procVerb(args[0], args[1:])
	case "request":
		return c.request(args[1:], "")
	case "decide":
		return c.decide(args[1:])
	case "policy":
		return c.policy(args[1:])
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
		var gs []capability.GrantInfo
		if _, err := c.call("GET", path, nil, &gs); err != nil {
			return err
		}
		if c.output == "json" {
			c.printJSON(gs)
			return nil
		}
		var rows [][]string
		for _, g := range gs {
			phase := string(g.Phase)
			if g.Consumed {
				phase += " (consumed)"
			}
			rows = append(rows, []string{g.ID, g.Session, string(g.Capability.Class), g.Capability.Summary(), g.Tier.String(), string(g.Lifecycle), phase, expires(g.Expires)})
		}
		table("GRANT\tSESSION\tCLASS\tSCOPE\tTIER\tLIFECYCLE\tPHASE\tEXPIRES", rows)
		return nil
	case "revoke":
		fs := newFlags("revoke")
		id := fs.String("id", "", "grant id instead of a handle")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		body := wire.RevokeBody{ID: *id}
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
		if c.output == "json" {
			c.printJSON(res)
			return nil
		}
		fmt.Println("revoked")
		return nil
	case "cards":
		path := "/v1/cards"
		if len(args) > 1 && args[1] == "-all" {
			path += "?all=1"
		}
		var cards []capability.Card
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
				rows = append(rows, []string{id, sess, st, cd.Tier.String(), it.Actor, string(it.Resource), it.Scope.Summary(), string(it.Provenance), it.Rule})
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
		if _, err := c.call("POST", "/v1/cards/"+args[1]+"/approve", wire.ApproveBody{Mode: mode}, &res); err != nil {
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
		var cd capability.Card
		if _, err := c.call("POST", "/v1/cards/"+args[1]+"/"+args[0], nil, &cd); err != nil {
			return err
		}
		if c.output == "json" {
			c.printJSON(cd)
			return nil
		}
		fmt.Printf("card %s %s\n", cd.ID, cd.Status)
		return nil
	case "panel":
		return panel.Main(c.hc, args[1:], os.Stdout, c.output == "json")
	case "events":
		return c.events(len(args) > 1 && (args[1] == "-f" || args[1] == "--follow"))
	case "audit":
		if len(args) < 2 || args[1] != "verify" || len(args) > 3 || (len(args) == 3 && args[2] != "-full") {
			return errors.New("usage: audit verify [-full]")
		}
		path := "/v1/audit/verify"
		if len(args) == 3 {
			path += "?full=1"
		}
		var res map[string]any
		code, err := c.call("GET", path, nil, &res)
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
		r, _ := res["result"].(map[string]any)
		fmt.Printf("audit log OK: %v records, last seq %v\n", r["records"], r["head"])
		if notes, ok := r["notes"].([]any); ok {
			for _, n := range notes {
				fmt.Printf("note: %v\n", n)
			}
		}
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
		var r wire.Record
		if json.Unmarshal(sc.Bytes(), &r) != nil {
			continue
		}
		fmt.Printf("%s %-6s %-18s %s\n", r.Time.Format(time.RFC3339Nano), r.Source, r.Kind, string(r.Data))
	}
	return sc.Err()
}
