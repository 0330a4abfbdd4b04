package boundary

// The session's user in its own view (identity_linux.go).

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/shinken-agent/shinken/agent/backend"
)

// TestSessionUser: a session's view names its uid (backend.SessionUser, in
// /etc/passwd and /etc/group mounted read-only over the host's) and gives
// it a home of its own (backend.SessionHome, in its private /tmp); another
// session's view names its own uid; the host's files are not changed.
func TestSessionUser(t *testing.T) {
	b := newBoundary(t, Config{}, nil)
	hostPasswd, err := os.ReadFile("/etc/passwd")
	if err != nil {
		t.Fatal(err)
	}
	hostGroup, _ := os.ReadFile("/etc/group")
	session(t, b, "usera", 95)
	session(t, b, "userb", 96)
	const script = `id -un; id -gn; stat -c '%u %g %a' ` + backend.SessionHome + `; touch ` + backend.SessionHome + `/f && echo wrote
if (echo x >> /etc/passwd) 2>/dev/null; then echo passwd-written; fi
echo ---; cat /etc/passwd`
	for _, c := range []struct {
		name  string
		index uint32
	}{{"usera", 95}, {"userb", 96}} {
		uid, _ := b.UID(c.index)
		out := runIn(t, b, c.name, &exec.Cmd{Path: "/bin/sh", Args: []string{"sh", "-c", script}, Dir: "/"}, true)
		head, passwd, _ := strings.Cut(out, "---\n")
		wantHead := fmt.Sprintf("%s\n%s\n%d %d 700\nwrote\n", backend.SessionUser, backend.SessionUser, uid, uid)
		if head != wantHead {
			t.Errorf("%s: %q, want %q", c.name, head, wantHead)
		}
		want := fmt.Sprintf("%s:x:%d:%d:", backend.SessionUser, uid, uid)
		var own []string
		for _, l := range strings.Split(passwd, "\n") {
			if f := strings.Split(l, ":"); len(f) > 3 && (f[0] == backend.SessionUser || f[2] == fmt.Sprint(uid)) {
				own = append(own, l)
			}
		}
		if len(own) != 1 || !strings.HasPrefix(own[0], want) || !strings.Contains(own[0], ":"+backend.SessionHome+":") {
			t.Errorf("%s: its entries in its /etc/passwd: %q, want one %q... with home %s", c.name, own, want, backend.SessionHome)
		}
		t.Logf("verified: %s runs as %q, home %s (its own, 0700, writable), its /etc/passwd read-only", c.name, own, backend.SessionHome)
	}
	if p, _ := os.ReadFile("/etc/passwd"); !bytes.Equal(p, hostPasswd) {
		t.Error("the host's /etc/passwd changed")
	}
	if g, _ := os.ReadFile("/etc/group"); !bytes.Equal(g, hostGroup) {
		t.Error("the host's /etc/group changed")
	}
}

// TestWithoutEntry: the session's copy of the host's passwd or group file
// leaves out an entry that claims the session user's name or its id.
func TestWithoutEntry(t *testing.T) {
	host := "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\nsquat:x:1879048200:5::/:/bin/sh\nbin:x:2:2::/bin:/usr/sbin/nologin\n"
	got := string(withoutEntry([]byte(host), "user", "1879048200"))
	if want := "root:x:0:0:root:/root:/bin/sh\nbin:x:2:2::/bin:/usr/sbin/nologin\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	// A last line without its newline, and CRLF line ends, as the
	// line scanner it replaced read them.
	got = string(withoutEntry([]byte("a:x:1:1\r\nuser:x:3:3\r\nb:x:2:2"), "user", "9"))
	if want := "a:x:1:1\nb:x:2:2\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestStartDir: a process whose request names no directory starts in the
// session's workspace where its view has one, else in the session user's
// home; one that names a directory starts there; both through Launch and
// through a prepared launch's arguments.
func TestStartDir(t *testing.T) {
	b := newBoundary(t, Config{}, nil)
	session(t, b, "homed", 97)
	session(t, b, "worked", 98)
	ws := workspaceDir(t)
	if err := b.SetWorkspace("worked", backend.Workspace{Dir: ws, Mode: backend.ModeWorkspaceWrite}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, dir, want string }{
		{"homed", "", backend.SessionHome}, {"homed", "/usr", "/usr"}, {"worked", "", ws}, {"worked", "/", "/"},
	} {
		out := runIn(t, b, c.name, &exec.Cmd{Path: "/bin/sh", Args: []string{"sh", "-c", "pwd"}, Dir: c.dir}, true)
		if strings.TrimSpace(out) != c.want {
			t.Errorf("%s, dir %q: pwd %q, want %q", c.name, c.dir, strings.TrimSpace(out), c.want)
		}
		pl, err := b.Prepare(c.name, backend.LaunchSpec{Argv: []string{"/bin/true"}, Dir: c.dir}, LaunchOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got := strings.Join(pl.Args, " ")
		pl.Close(true)
		if !strings.Contains(got, `"dir":"`+c.want+`"`) {
			t.Errorf("%s, dir %q: prepared launch %s, want dir %q", c.name, c.dir, got, c.want)
		}
	}
	// The session replaces its home by a link: the agent does not follow
	// it (it would resolve from the host's root); the next process starts
	// in /.
	runIn(t, b, "homed", &exec.Cmd{Path: "/bin/sh", Args: []string{"sh", "-c", "rmdir " + backend.SessionHome + " && ln -s /usr " + backend.SessionHome}, Dir: "/"}, true)
	if out := strings.TrimSpace(runIn(t, b, "homed", &exec.Cmd{Path: "/bin/sh", Args: []string{"sh", "-c", "pwd"}}, true)); out != "/" {
		t.Errorf("home replaced by a link to /usr: pwd %q, want /", out)
	}
}
