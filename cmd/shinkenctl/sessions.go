package main

// The session verbs (create, ls, show, rm) and run.

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/shinken-agent/shinken/agent/api/wire"
	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/agent/capability"
)

func (c *client) session(args []string) error {
	if len(args) == 0 {
		return errors.New("usage: session create|ls|show|rm|forget ...")
	}
	switch args[0] {
	case "create":
		fs := newFlags("session create")
		image := fs.String("image", "default", "image (its manifest bounds what the session may ask)")
		trust := fs.String("trust", "normal", "trust tier: low, normal or high")
		risk := fs.String("risk", "normal", "risk: normal or high")
		headless := fs.Bool("headless", false, "no human watches this session")
		tls := fs.Bool("tls-inspection", false, "ask for TLS inspection of its egress (refused today: no proxy on this host enforces it)")
		ws := fs.String("workspace", "", "workspace directory (with -mode, part of the session's view at the same path)")
		mode := fs.String("mode", "", "workspace confinement: read-only or workspace-write (none: the workspace only names the tier table's working tree)")
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
		spec := capability.SessionSpec{ID: args[1], Image: *image, TrustTier: *trust, Risk: *risk, Headless: *headless, TLSInspection: *tls, Workspace: *ws, Mode: *mode, Home: *home}
		if *exp > 0 {
			spec.Expires = time.Now().Add(*exp)
		}
		spec.Quotas = backend.Limits{MemoryBytes: *mem, Pids: *pids, CPUPercent: uint32(*cpu)}
		body := wire.CreateSessionBody(spec)
		var v wire.SessionView
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
		var vs []wire.SessionView
		if _, err := c.call("GET", "/v1/sessions", nil, &vs); err != nil {
			return err
		}
		if c.output == "json" {
			c.printJSON(vs)
			return nil
		}
		var rows [][]string
		for _, v := range vs {
			uid := "-"
			if v.UID != nil {
				uid = strconv.FormatUint(uint64(*v.UID), 10)
			}
			holder := "-" // the backend keeps no holder process
			if v.Holder != nil {
				holder = map[bool]string{true: "running", false: "none"}[*v.Holder]
			}
			paused := "-"
			if v.Paused {
				paused = "paused"
			}
			rows = append(rows, []string{v.ID, v.Image, v.TrustTier, v.Risk, strconv.Itoa(int(v.Index)), uid, holder, paused, v.Path})
		}
		table("SESSION\tIMAGE\tTRUST\tRISK\tINDEX\tUID\tHOLDER\tPAUSED\tCGROUP", rows)
		return nil
	case "show":
		if len(args) != 2 {
			return errors.New("usage: session show ID")
		}
		var v wire.SessionView
		if _, err := c.call("GET", "/v1/sessions/"+args[1], nil, &v); err != nil {
			return err
		}
		c.printJSON(v)
		return nil
	case "rm", "delete":
		if len(args) != 2 {
			return errors.New("usage: session rm ID")
		}
		var res map[string]string
		if _, err := c.call("DELETE", "/v1/sessions/"+args[1], nil, &res); err != nil {
			return err
		}
		if c.output == "json" {
			c.printJSON(res)
			return nil
		}
		fmt.Printf("session %s removed\n", args[1])
		return nil
	case "forget":
		if len(args) != 2 {
			return errors.New("usage: session forget NAME (what sessions of that name kept in persistent paths)")
		}
		var res map[string]string
		if _, err := c.call("DELETE", "/v1/persisted/"+args[1], nil, &res); err != nil {
			return err
		}
		if c.output == "json" {
			c.printJSON(res)
			return nil
		}
		fmt.Printf("persistent paths of %s forgotten\n", args[1])
		return nil
	}
	return fmt.Errorf("unknown session verb %q", args[0])
}

func (c *client) run(args []string) error {
	fs := newFlags("run")
	timeout := fs.Float64("timeout", 60, "seconds")
	uid := fs.Uint("uid", 0, "uid (default: the session's own uid; never 0)")
	gid := fs.Uint("gid", 0, "gid (default: the session's own gid)")
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
	var res wire.RunResult
	if _, err := c.call("POST", "/v1/sessions/"+session+"/run", wire.RunRequest{Argv: argv, TimeoutS: *timeout, UID: uint32(*uid), GID: uint32(*gid)}, &res); err != nil {
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
	if res.Running {
		fmt.Fprintf(os.Stderr, "shinkenctl: the request's deadline passed; process %s runs on (shinkenctl logs -f %s %s)\n", res.Process, session, res.Process)
		return nil
	}
	if res.ExitCode != 0 {
		os.Exit(res.ExitCode)
	}
	return nil
}
