package backend

import (
	"regexp"
	"strings"
	"testing"
)

// sessionNameRE is what validSessionName replaced (a regexp compiled at
// every start of every binary linking this package): the test's oracle.
var sessionNameRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$`)

// TestValidSessionNameAsRegexp checks validSessionName against the regular
// expression it replaced: every string of up to 3 bytes over an alphabet
// of each class's edges and its neighbours, the length bounds, non-ASCII
// and newlines (Go's $ matches at the end of the text only).
func TestValidSessionNameAsRegexp(t *testing.T) {
	alphabet := []byte("09AZaz_.-/@[`{:~ \n\x00\x7f\x80\xff")
	var names []string
	var walk func(prefix string, n int)
	walk = func(prefix string, n int) {
		names = append(names, prefix)
		if n == 0 {
			return
		}
		for _, c := range alphabet {
			walk(prefix+string([]byte{c}), n-1)
		}
	}
	walk("", 3)
	for _, n := range []int{63, 64, 65, 100} {
		names = append(names, strings.Repeat("a", n), "_"+strings.Repeat("-", n-1), "."+strings.Repeat("a", n-1), strings.Repeat("a", n-1)+"\n", strings.Repeat("a", n-1)+"é")
	}
	names = append(names, "é", "aé", "a\u00e9b", "session-1", "s.1", "-s", ".s", "a\nb")
	for _, name := range names {
		if got, want := validSessionName(name), sessionNameRE.MatchString(name); got != want {
			t.Errorf("validSessionName(%q) = %v, the regexp says %v", name, got, want)
		}
	}
}

// FuzzValidSessionName compares validSessionName with the regexp on
// arbitrary strings (its seeds run with go test).
func FuzzValidSessionName(f *testing.F) {
	for _, s := range []string{"", "a", "-a", "a-", ".", strings.Repeat("z", 64), strings.Repeat("z", 65), "a\n", "é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if got, want := validSessionName(name), sessionNameRE.MatchString(name); got != want {
			t.Errorf("validSessionName(%q) = %v, the regexp says %v", name, got, want)
		}
	})
}
