package shiftproof

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// This file is the solver side: SMT-LIB text helpers, the z3 run and the
// parsing of its answer.
//
// z3 runs as a child process (`z3 -in -smt2`), not through its C library:
// the agent and shinkenctl need no libz3 or C toolchain of their own (they
// use cgo only where Go's standard library and libcap's psx do, on Linux)
// and cross-build for darwin and windows, a solver that crashes or runs away cannot take the daemon with
// it, and a timeout is a killed process, not a stuck thread. The price is a
// process start per query (a few milliseconds).

// Z3Path is the solver binary; the default is "z3" from PATH.
var Z3Path = "z3"

// ErrSolver is returned when the solver cannot be run or answers something
// other than sat, unsat or unknown.
var ErrSolver = errors.New("shiftproof: solver failed")

// smtString renders s as an SMT-LIB 2.6 string literal as z3 reads it:
// printable ASCII as is (a double quote doubled), every other character and
// the backslash as \u{...}.
func smtString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			b.WriteString(`""`)
		case r == '\\' || r < 0x20 || r > 0x7e:
			fmt.Fprintf(&b, `\u{%x}`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// unSMTString is the inverse of smtString for what z3 prints: a quoted
// literal with "" for a quote and \u{...} (or \x.. / \u....) escapes.
func unSMTString(lit string) (string, error) {
	if len(lit) < 2 || lit[0] != '"' || lit[len(lit)-1] != '"' {
		return "", fmt.Errorf("%w: not a string literal: %s", ErrSolver, lit)
	}
	s := lit[1 : len(lit)-1]
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' && i+1 < len(s) && s[i+1] == '"':
			b.WriteByte('"')
			i++
		case c == '\\' && strings.HasPrefix(s[i:], `\u{`):
			end := strings.IndexByte(s[i:], '}')
			if end < 0 {
				return "", fmt.Errorf("%w: bad escape in %s", ErrSolver, lit)
			}
			v, err := strconv.ParseUint(s[i+3:i+end], 16, 32)
			if err != nil {
				return "", fmt.Errorf("%w: bad escape in %s", ErrSolver, lit)
			}
			b.WriteRune(rune(v))
			i += end
		case c == '\\' && i+5 < len(s) && s[i+1] == 'u':
			v, err := strconv.ParseUint(s[i+2:i+6], 16, 32)
			if err != nil {
				b.WriteByte(c)
				continue
			}
			b.WriteRune(rune(v))
			i += 5
		case c == '\\' && i+3 < len(s) && s[i+1] == 'x':
			v, err := strconv.ParseUint(s[i+2:i+4], 16, 8)
			if err != nil {
				b.WriteByte(c)
				continue
			}
			b.WriteRune(rune(v))
			i += 3
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}

// Small SMT-LIB builders with constant folding, so that what the solver sees
// stays small (scope checks against other classes fold to false).

func and(xs ...string) string {
	var keep []string
	for _, x := range xs {
		switch x {
		case "true":
		case "false":
			return "false"
		default:
			keep = append(keep, x)
		}
	}
	switch len(keep) {
	case 0:
		return "true"
	case 1:
		return keep[0]
	}
	return "(and " + strings.Join(keep, " ") + ")"
}

func or(xs ...string) string {
	var keep []string
	for _, x := range xs {
		switch x {
		case "false":
		case "true":
			return "true"
		default:
			keep = append(keep, x)
		}
	}
	switch len(keep) {
	case 0:
		return "false"
	case 1:
		return keep[0]
	}
	return "(or " + strings.Join(keep, " ") + ")"
}

func not(x string) string {
	switch x {
	case "true":
		return "false"
	case "false":
		return "true"
	}
	if strings.HasPrefix(x, "(not ") {
		return x[5 : len(x)-1]
	}
	return "(not " + x + ")"
}

func ite(c, a, b string) string {
	switch {
	case c == "true":
		return a
	case c == "false":
		return b
	case a == b:
		return a
	}
	return "(ite " + c + " " + a + " " + b + ")"
}

func eq(a, b string) string {
	if a == b {
		return "true"
	}
	if isLiteral(a) && isLiteral(b) {
		return "false" // two different literals of the same sort
	}
	return "(= " + a + " " + b + ")"
}

// isLiteral: a string, numeral, bit-vector or boolean literal.
func isLiteral(x string) bool {
	if x == "" {
		return false
	}
	switch {
	case x[0] == '"', x[0] == '#', x == "true", x == "false":
		return true
	case x[0] >= '0' && x[0] <= '9':
		return true
	}
	return strings.HasPrefix(x, "(- ") && !strings.ContainsAny(x[3:], " (")
}

func smtInt(v int64) string {
	if v < 0 {
		return fmt.Sprintf("(- %d)", uint64(-v))
	}
	return strconv.FormatInt(v, 10)
}

// Verdict is the solver's answer to one query.
type Verdict int

const (
	Unsat Verdict = iota
	Sat
	Unknown
)

func (v Verdict) String() string {
	return [...]string{"unsat", "sat", "unknown"}[v]
}

// runZ3 feeds script to z3 and returns the verdict and, when sat, the
// values of vars (the text of each value, by name).
func runZ3(ctx context.Context, script string, vars []string, timeout time.Duration) (Verdict, map[string]string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout+2*time.Second)
	defer cancel()
	var in bytes.Buffer
	fmt.Fprintf(&in, "(set-option :produce-models true)\n(set-option :timeout %d)\n", timeout.Milliseconds())
	in.WriteString(script)
	in.WriteString("(check-sat)\n")
	if len(vars) > 0 {
		in.WriteString("(get-value (" + strings.Join(vars, " ") + "))\n")
	}
	if dir := os.Getenv("SHINKEN_SMT_DUMP"); dir != "" { // debugging: keep every query
		f, _ := os.CreateTemp(dir, "query-*.smt2")
		if f != nil {
			f.Write(in.Bytes())
			f.Close()
		}
	}
	cmd := exec.CommandContext(ctx, Z3Path, "-in", "-smt2", fmt.Sprintf("-T:%d", int(timeout.Seconds())+1))
	cmd.Stdin = &in
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	err := cmd.Run()
	text := out.String()
	first, rest, _ := strings.Cut(strings.TrimSpace(text), "\n")
	switch strings.TrimSpace(first) {
	case "unsat":
		return Unsat, nil, nil
	case "unknown", "timeout":
		return Unknown, nil, nil
	case "sat":
		vals, perr := parseValues(rest)
		if perr != nil {
			return Unknown, nil, perr
		}
		return Sat, vals, nil
	}
	if ctx.Err() != nil {
		return Unknown, nil, nil // killed at the deadline: unknown
	}
	if err != nil {
		return Unknown, nil, fmt.Errorf("%w: %s: %v: %s%s", ErrSolver, Z3Path, err, firstLine(stderr.String()), firstLine(text))
	}
	return Unknown, nil, fmt.Errorf("%w: unexpected answer %q", ErrSolver, firstLine(text))
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	if len(l) > 300 {
		l = l[:300]
	}
	return l
}

// parseValues reads z3's get-value answer: ((name value) (name value) ...).
func parseValues(s string) (map[string]string, error) {
	toks, err := sexpr(strings.TrimSpace(s))
	if err != nil {
		return nil, err
	}
	list, ok := toks.([]any)
	if !ok {
		return nil, fmt.Errorf("%w: model: %q", ErrSolver, firstLine(s))
	}
	out := map[string]string{}
	for _, e := range list {
		pair, ok := e.([]any)
		if !ok || len(pair) != 2 {
			return nil, fmt.Errorf("%w: model entry %v", ErrSolver, e)
		}
		name, _ := pair[0].(string)
		out[name] = render(pair[1])
	}
	return out, nil
}

func render(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	var parts []string
	for _, x := range v.([]any) {
		parts = append(parts, render(x))
	}
	return "(" + strings.Join(parts, " ") + ")"
}

// sexpr parses one s-expression: atoms are strings (string literals keep
// their quotes), lists are []any.
func sexpr(s string) (any, error) {
	pos := 0
	var parse func() (any, error)
	parse = func() (any, error) {
		for pos < len(s) && (s[pos] == ' ' || s[pos] == '\n' || s[pos] == '\t' || s[pos] == '\r') {
			pos++
		}
		if pos >= len(s) {
			return nil, fmt.Errorf("%w: unexpected end of model", ErrSolver)
		}
		switch s[pos] {
		case '(':
			pos++
			var list []any
			for {
				for pos < len(s) && (s[pos] == ' ' || s[pos] == '\n' || s[pos] == '\t' || s[pos] == '\r') {
					pos++
				}
				if pos < len(s) && s[pos] == ')' {
					pos++
					return list, nil
				}
				e, err := parse()
				if err != nil {
					return nil, err
				}
				list = append(list, e)
			}
		case '"':
			start := pos
			pos++
			for pos < len(s) {
				if s[pos] == '"' {
					if pos+1 < len(s) && s[pos+1] == '"' {
						pos += 2
						continue
					}
					pos++
					return s[start:pos], nil
				}
				pos++
			}
			return nil, fmt.Errorf("%w: unterminated string in model", ErrSolver)
		default:
			start := pos
			for pos < len(s) && !strings.ContainsRune(" \n\t\r()", rune(s[pos])) {
				pos++
			}
			return s[start:pos], nil
		}
	}
	return parse()
}
