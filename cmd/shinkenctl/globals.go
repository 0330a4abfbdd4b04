package main

// Global flags anywhere on the line, quiet flag sets, one-line errors.

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// globalFlags are the flags of shinkenctl itself; each takes a value.
var globalFlags = map[string]bool{"socket": true, "o": true}

// splitGlobals takes the global flags out of args wherever they stand, before
// the verb or after it (-o json, -o=json, --o json, --socket=PATH ...), up to
// a "--": what follows it is the command `run` starts, left as it is.
func splitGlobals(args []string) (globals, rest []string, err error) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return globals, append(rest, args[i:]...), nil
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || !globalFlags[name] {
			rest = append(rest, a)
			continue
		}
		if !hasValue {
			if i+1 >= len(args) {
				return nil, nil, fmt.Errorf("flag -%s needs a value", name)
			}
			i++
			value = args[i]
		}
		globals = append(globals, "-"+name+"="+value)
	}
	return globals, rest, nil
}

// newFlags is a verb's flag set: errors are returned (and printed once, as
// one line, by fail), never followed by the flag package's usage dump.
func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// fail prints err as one line and exits non-zero.
func fail(err error) {
	fmt.Fprintln(os.Stderr, "shinkenctl:", oneLine(err.Error()))
	os.Exit(1)
}

// oneLine joins the lines of a message (errors.Join makes several) with "; ".
func oneLine(s string) string {
	return strings.Join(strings.FieldsFunc(s, func(r rune) bool { return r == '\n' || r == '\r' }), "; ")
}
