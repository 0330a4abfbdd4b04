package child

import (
	"slices"
	"strings"
	"testing"
)

// TestSpecVersions: v2 specs carry NProc and TmpfsBytes through; the v1
// forms (without them) still parse, as 0 (left as inherited, kernel size).
func TestSpecVersions(t *testing.T) {
	l := Launch{UID: 7, GID: 7, Status: 3, ExeFD: 4, Landlock: 3, Path: "/bin/true", NProc: 4096}
	got, argv, err := ParseLaunch(l.Args([]string{"true", "x"}))
	if err != nil || got.NProc != 4096 || got.UID != 7 || !slices.Equal(argv, []string{"true", "x"}) {
		t.Fatalf("v2 launch: %+v %v %v", got, argv, err)
	}
	// v3: the Landlock rights and rules; a rule holding a newline is
	// left out (no rule: less access); v2 still parses, with none.
	l.FS, l.FSRules = 0x7fff, []string{"/usr", "/etc/passwd", "/bad\nname", "/var/tmp"}
	got, argv, err = ParseLaunch(l.Args([]string{"true"}))
	if err != nil || got.FS != 0x7fff || !slices.Equal(got.FSRules, []string{"/usr", "/etc/passwd", "/var/tmp"}) || got.Path != "/bin/true" || !slices.Equal(argv, []string{"true"}) {
		t.Fatalf("v3 launch: %+v %v %v", got, argv, err)
	}
	// v4: a ruleset's fd instead of rules.
	l.FSRules, l.Ruleset = nil, 5
	if a := l.Args([]string{"true"}); a[3] != "" || !strings.HasPrefix(a[1], "v4,") {
		t.Fatalf("v4 args %q", a)
	}
	got, argv, err = ParseLaunch(l.Args([]string{"true"}))
	if err != nil || got.Ruleset != 5 || got.FS != 0x7fff || got.FSRules != nil || got.Path != "/bin/true" || !slices.Equal(argv, []string{"true"}) {
		t.Fatalf("v4 launch: %+v %v %v", got, argv, err)
	}
	for _, bad := range [][]string{
		{LaunchArg0, "v4,7,7,0,3,4,3,0,9,7,5", "", "/usr", "/bin/true", "true"}, // rules beside a ruleset
		{LaunchArg0, "v4,7,7,0,3,4,3,0,9,0,5", "", "", "/bin/true", "true"},     // a ruleset without rights
		{LaunchArg0, "v4,7,7,0,3,4,3,0,9,7,2", "", "", "/bin/true", "true"},     // stdio as the ruleset
		{LaunchArg0, "v4,7,7,0,3,4,3,0,9,7", "", "", "/bin/true", "true"},       // no ruleset field
	} {
		if _, _, err := ParseLaunch(bad); err == nil {
			t.Errorf("launch %q accepted", bad)
		}
	}
	got, argv, err = ParseLaunch([]string{LaunchArg0, "v2,7,7,0,3,4,3,0,9", "", "/bin/true", "true"})
	if err != nil || got.FS != 0 || got.FSRules != nil || got.NProc != 9 || got.Path != "/bin/true" || !slices.Equal(argv, []string{"true"}) {
		t.Fatalf("v2 launch: %+v %v %v", got, argv, err)
	}
	for _, bad := range [][]string{
		{LaunchArg0, "v3,7,7,0,3,4,3,0,9,0", "", "/usr", "/bin/true", "true"},  // rules without rights
		{LaunchArg0, "v3,7,7,0,3,4,3,0,9,131072", "", "", "/bin/true", "true"}, // a right past MaxFS
		{LaunchArg0, "v3,7,7,0,3,4,3,0,9,7", "", "/usr"},                       // no target path
	} {
		if _, _, err := ParseLaunch(bad); err == nil {
			t.Errorf("launch %q accepted", bad)
		}
	}
	got, _, err = ParseLaunch([]string{LaunchArg0, "v1,7,7,0,3,4,3,0", "", "/bin/true", "true"})
	if err != nil || got.NProc != 0 || got.UID != 7 || got.Landlock != 3 {
		t.Fatalf("v1 launch: %+v %v", got, err)
	}
	for _, bad := range []string{"v2,7,7,0,3,4,3,0", "v1,7,7,0,3,4,3,0,5", "v2,7,7,0,3,4,3,0,-1", "v2,7,7,0,3,4,3,0,4194305", "v3,7,7,0,3,4,3,0,5"} {
		if _, _, err := ParseLaunch([]string{LaunchArg0, bad, "", "/bin/true"}); err == nil {
			t.Errorf("launch spec %q accepted", bad)
		}
	}
	i, err := ParseInit(Init{Status: 3, Catatonit: "/c", TmpfsBytes: 1 << 20}.Args())
	if err != nil || i.TmpfsBytes != 1<<20 || i.Status != 3 {
		t.Fatalf("v2 init: %+v %v", i, err)
	}
	if i, err = ParseInit([]string{InitArg0, "v1,3,1", "/c"}); err != nil || i.TmpfsBytes != 0 || !i.NoMounts {
		t.Fatalf("v1 init: %+v %v", i, err)
	}
}

// TestKeepBelow: the target keeps the descriptors below the launcher's own
// (the lowest of Status, ExeFD and Ruleset), whichever of them come.
func TestKeepBelow(t *testing.T) {
	for _, c := range []struct {
		l    Launch
		want int
	}{
		{Launch{Status: 3, ExeFD: 4}, 3},             // Launch, nothing passed
		{Launch{Status: 5, ExeFD: 6}, 5},             // two ExtraFiles passed
		{Launch{Status: 4, ExeFD: 5, Ruleset: 3}, 3}, // the session's ruleset first
		{Launch{Status: 6, ExeFD: 7, Ruleset: 5}, 5}, // two passed, then the ruleset
		{Launch{Status: 3, ExeFD: -1}, 3},            // no binary descriptor
		{Launch{Status: 7, ExeFD: 4, Ruleset: 0}, 4}, // an order the agent does not use: still the lowest
	} {
		if got := c.l.keepBelow(); got != c.want {
			t.Errorf("%+v: keepBelow %d, want %d", c.l, got, c.want)
		}
	}
}
