package main

// The decide and policy verbs: a use-time decision with the rule that
// decided, and policy changes through the permissiveness gate.

import (
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/shinken-agent/shinken/agent/api/wire"
	"github.com/shinken-agent/shinken/agent/capability"
)

func (c *client) decide(args []string) error {
	if len(args) < 3 {
		return errors.New("usage: decide SESSION CLASS OP [-domain D] [-ip A] [-port N] [-path P] [-item I] [-mode M]")
	}
	fs := flag.NewFlagSet("decide", flag.ContinueOnError)
	domain := fs.String("domain", "", "net.egress: the name")
	ip := fs.String("ip", "", "net.egress: the address; net.inbound: the peer's")
	port := fs.Uint("port", 0, "net.egress: the peer's port; net.inbound: the session's own")
	path := fs.String("path", "", "fs.scope, persistence: the path")
	item := fs.String("item", "", "gpu device, broker scope, usb id")
	mode := fs.String("mode", "", "gpu mode")
	if err := fs.Parse(args[3:]); err != nil {
		return err
	}
	req := capability.UseRequest{Class: capability.Class(args[1]), Op: args[2], Domain: *domain, Path: *path, Item: *item, Mode: *mode, Port: uint16(*port)}
	if *port > 65535 {
		return fmt.Errorf("-port %d: out of range", *port)
	}
	if *ip != "" {
		a, err := netip.ParseAddr(*ip)
		if err != nil {
			return fmt.Errorf("-ip: %w", err)
		}
		req.IP = a
	}
	var d capability.UseDecision
	if _, err := c.call("POST", "/v1/decide", wire.DecideBody{Session: args[0], Request: req}, &d); err != nil {
		return err
	}
	if c.output == "json" {
		c.printJSON(d)
		return nil
	}
	verdict := "deny"
	if d.Allowed {
		verdict = "allow"
	}
	fmt.Printf("%s (decided by %s)\n", verdict, d.DecidedBy)
	for _, e := range d.Errors {
		fmt.Printf("  policy error: %s\n", e)
	}
	if !d.Allowed {
		os.Exit(3) // scripts can branch on a denial
	}
	return nil
}

func (c *client) policy(args []string) error {
	if len(args) < 2 || args[0] != "diff" && args[0] != "apply" {
		return errors.New("usage: policy diff|apply [--allow-widening] FILE.cedar...")
	}
	fs := flag.NewFlagSet("policy", flag.ContinueOnError)
	widen := fs.Bool("allow-widening", false, "apply even if the gate finds the change wider (the counterexample is audited)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	body := wire.PolicyBody{Files: map[string]string{}, Apply: args[0] == "apply", AllowWidening: *widen}
	for _, f := range fs.Args() {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		body.Files[filepath.Base(f)] = string(data)
	}
	if len(body.Files) == 0 {
		return errors.New("policy: no files")
	}
	var res wire.PolicyResult
	if _, err := c.call("POST", "/v1/policies", body, &res); err != nil {
		return err
	}
	if res.PolicyReport == nil && res.Error != "" {
		return errors.New(res.Error)
	}
	if c.output == "json" {
		c.printJSON(res)
	} else if res.PolicyReport != nil {
		switch {
		case res.Applied:
			fmt.Println("applied:", res.Summary)
		case body.Apply:
			fmt.Println("refused:", res.Summary)
			fmt.Fprintln(os.Stderr, res.Error)
		default:
			fmt.Println(res.Summary)
		}
		if f := res.Forbids; f != nil {
			for _, d := range f.DecideTimeOnly {
				fmt.Printf("forbid %s (%s): enforced at decide time only: %s\n", d.ID, d.Where, d.Why)
			}
			if len(f.InKernel) > 0 {
				fmt.Printf("forbids in the kernel's deny table: %s\n", strings.Join(f.InKernel, ", "))
			}
		}
	}
	if res.Error != "" || res.PolicyReport != nil && res.Widens && !res.Applied {
		os.Exit(3)
	}
	return nil
}
