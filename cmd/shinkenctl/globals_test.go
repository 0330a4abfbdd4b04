package main

import (
	"slices"
	"testing"
)

func TestSplitGlobals(t *testing.T) {
	for _, c := range []struct {
		in, globals, rest []string
	}{
		{[]string{"-o", "json", "cards"}, []string{"-o=json"}, []string{"cards"}},
		{[]string{"cards", "-o", "json"}, []string{"-o=json"}, []string{"cards"}},
		{[]string{"cards", "-all", "--o=json", "-socket", "/s"}, []string{"-o=json", "-socket=/s"}, []string{"cards", "-all"}},
		{[]string{"run", "s", "-o", "json", "--", "echo", "-o", "x"}, []string{"-o=json"}, []string{"run", "s", "--", "echo", "-o", "x"}},
		{[]string{"request", "s", "net.egress", "-port", "5-1"}, nil, []string{"request", "s", "net.egress", "-port", "5-1"}},
	} {
		g, r, err := splitGlobals(c.in)
		if err != nil || !slices.Equal(g, c.globals) || !slices.Equal(r, c.rest) {
			t.Errorf("%q: %q %q %v, want %q %q", c.in, g, r, err, c.globals, c.rest)
		}
	}
	if _, _, err := splitGlobals([]string{"cards", "-o"}); err == nil {
		t.Error("-o without a value accepted")
	}
}
