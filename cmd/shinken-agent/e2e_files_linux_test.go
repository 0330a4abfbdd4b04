package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/shinken-agent/shinken/agent/audit"
)

const filesOwner = 4242 // the workspace's owner on the host: neither root nor a session uid

func fileSum(t *testing.T, p string) string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// leftovers lists the upload temporaries under dir.
func leftovers(dir string) []string {
	var found []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(d.Name(), ".shinken-upload-") {
			found = append(found, p)
		}
		return nil
	})
	return found
}

// TestFilesInAndOut is shinkenctl cp through the daemon with real
// sessions: a 100 MiB file goes into a workspace and comes back with the
// same sha256, owned on disk by the workspace's owner as the session's own
// writes are; what would leave the workspace (.., an absolute path
// elsewhere, a symbolic link placed by the host or by the session itself),
// a protected path, a read-only session, a file the session may not read,
// a FIFO and a session without a workspace are refused with their codes,
// and a refusal leaves nothing behind. Each transfer is in the audit log.
func TestFilesInAndOut(t *testing.T) {
	e := newEnv(t)
	e.startAgent()
	ws, err := os.MkdirTemp("/var/tmp", "shinken-e2e-files-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(ws)
	os.Chmod(ws, 0o755)
	os.Chown(ws, filesOwner, filesOwner)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(ws, ".git"), 0o755))
	must(os.WriteFile(filepath.Join(ws, ".git", "config"), []byte("[core]\n"), 0o644))
	must(os.Chown(filepath.Join(ws, ".git"), filesOwner, filesOwner))
	must(os.Chown(filepath.Join(ws, ".git", "config"), filesOwner, filesOwner))
	must(os.Symlink("/etc", filepath.Join(ws, "etc-link")))
	must(os.Symlink("/etc/hostname", filepath.Join(ws, "hostname-link")))
	must(os.WriteFile(filepath.Join(ws, "rootonly"), []byte("not the session's\n"), 0o600)) // root's: unmapped in the session's view
	outside := filepath.Join(os.TempDir(), "shinken-e2e-files-outside")
	os.Remove(outside)
	defer os.Remove(outside)

	e.mustCtl("session", "create", "fw", "-image", "e2e", "-workspace", ws, "-mode", "workspace-write")

	// 100 MiB round trip.
	local := t.TempDir()
	big := filepath.Join(local, "big.bin")
	f, err := os.Create(big)
	must(err)
	rng := rand.NewChaCha8([32]byte{1, 2, 3})
	_, err = io.CopyN(f, rng, 100<<20)
	must(err)
	must(f.Close())
	want := fileSum(t, big)
	hwm := func() int64 { // the agent's peak resident memory, KiB
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", e.agent.Process.Pid))
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmHWM:" {
				n, _ := strconv.ParseInt(f[1], 10, 64)
				return n
			}
		}
		t.Fatal("no VmHWM")
		return 0
	}
	hwm0 := hwm()
	// Into a directory that is not there: refused, nothing made, no
	// temporary left.
	if out, err := e.ctl("cp", big, "fw:sub/"); err == nil || !strings.Contains(out, "HTTP 404") {
		t.Errorf("cp into a missing directory: %v %q", err, out)
	}
	if _, err := os.Stat(filepath.Join(ws, "sub")); err == nil {
		t.Fatal("an upload made a directory")
	}
	out := e.mustCtl("cp", big, "fw:big.bin")
	if !strings.Contains(out, want) || !strings.Contains(out, "104857600 bytes") {
		t.Errorf("cp in: %q (want sha256 %s)", out, want)
	}
	onDisk := filepath.Join(ws, "big.bin")
	if got := fileSum(t, onDisk); got != want {
		t.Fatalf("on disk: sha256 %s, want %s", got, want)
	}
	var st syscall.Stat_t
	must(syscall.Stat(onDisk, &st))
	if st.Uid != filesOwner || st.Gid != filesOwner {
		t.Errorf("uploaded file on disk: uid %d gid %d, want the workspace owner %d", st.Uid, st.Gid, filesOwner)
	}
	// The session's own write lands with the same owner.
	e.mustCtl("run", "fw", "--", "sh", "-c", "echo s > "+ws+"/by-session")
	var st2 syscall.Stat_t
	must(syscall.Stat(filepath.Join(ws, "by-session"), &st2))
	if st2.Uid != st.Uid || st2.Gid != st.Gid {
		t.Errorf("session's write: uid %d gid %d; upload's: %d %d", st2.Uid, st2.Gid, st.Uid, st.Gid)
	}
	back := filepath.Join(local, "back.bin")
	e.mustCtl("cp", "fw:"+ws+"/big.bin", back)
	if got := fileSum(t, back); got != want {
		t.Fatalf("round trip: sha256 %s, want %s", got, want)
	}
	// Streamed, not held: the agent's peak memory grew by far less than
	// the file (100 MiB in and out).
	grew := hwm() - hwm0
	t.Logf("agent peak RSS: %d KiB, grew %d KiB over the round trip", hwm0, grew)
	if grew > 32<<10 {
		t.Errorf("the agent's peak RSS grew by %d KiB over a 100 MiB round trip", grew)
	}
	os.Remove(big)
	os.Remove(back)
	// From stdin: a chunked upload of unknown length.
	if out, code := e.ctlCode("from stdin\n", "cp", "-", "fw:stdin.txt"); code != 0 {
		t.Errorf("cp - fw:stdin.txt: %d %s", code, out)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "stdin.txt")); err != nil || string(b) != "from stdin\n" {
		t.Errorf("stdin.txt: %q %v", b, err)
	}

	small := filepath.Join(local, "small")
	must(os.WriteFile(small, []byte("payload\n"), 0o644))
	// The session makes its own way out: a link to its /tmp, a place it
	// may write outside the workspace.
	e.mustCtl("run", "fw", "--", "sh", "-c", "ln -s /tmp "+ws+"/session-link && echo p > /tmp/planted")
	e.mustCtl("run", "fw", "--", "mkfifo", ws+"/fifo")
	for _, c := range []struct {
		args []string
		code string
	}{
		{[]string{"cp", small, "fw:../" + filepath.Base(outside)}, "HTTP 403"},
		{[]string{"cp", small, "fw:sub/../../x"}, "HTTP 403"},
		{[]string{"cp", small, "fw:" + outside}, "HTTP 403"},
		{[]string{"cp", small, "fw:etc-link/shinken-e2e-files"}, "HTTP 403"},
		{[]string{"cp", small, "fw:session-link/shinken-e2e-files"}, "HTTP 403"},
		{[]string{"cp", small, "fw:hostname-link"}, "HTTP 403"},
		{[]string{"cp", "fw:hostname-link", "-"}, "HTTP 403"},
		{[]string{"cp", "fw:session-link/planted", "-"}, "HTTP 403"},
		{[]string{"cp", small, "fw:.git/config"}, "HTTP 403"},
		{[]string{"cp", "fw:rootonly", "-"}, "HTTP 403"},
		{[]string{"cp", "fw:missing", "-"}, "HTTP 404"},
		{[]string{"cp", small, "fw:missing-dir/x"}, "HTTP 404"},
		{[]string{"cp", "fw:fifo", "-"}, "HTTP 400"},
		{[]string{"cp", small, "fw:" + ws}, "HTTP 400"},
	} {
		out, err := e.ctl(c.args...)
		if err == nil || !strings.Contains(out, c.code) {
			t.Errorf("shinkenctl %s: %v %q, want a refusal with %s", strings.Join(c.args, " "), err, out, c.code)
		}
	}
	// No path, and a NUL: bad requests (cp SRC fw: names the source's
	// file in the workspace, so these go to the API itself).
	for _, q := range []string{"", "a%00b"} {
		if code, body := rawAPI(t, e.socket, "PUT", "/v1/sessions/fw/files?path="+q, "x"); code != 400 {
			t.Errorf("PUT path=%q: %d %s, want 400", q, code, body)
		}
	}
	for _, p := range []string{outside, filepath.Join(filepath.Dir(ws), "x"), "/etc/shinken-e2e-files"} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("a refused upload wrote %s", p)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(ws, ".git", "config")); string(b) != "[core]\n" {
		t.Errorf(".git/config now %q", b)
	}
	if l := leftovers(ws); len(l) > 0 {
		t.Errorf("refused uploads left %v", l)
	}
	// The session swaps a directory and a link to its /tmp in a loop
	// while uploads go through that name: each lands in the directory or
	// is refused, never in /tmp.
	race := strings.TrimSpace(e.mustCtl("start", "fw", "--", "sh", "-c",
		"cd "+ws+" && while :; do mkdir -p race; rm -rf race; ln -s /tmp race; rm -f race; done"))
	for i := 0; i < 40; i++ {
		e.ctl("cp", small, "fw:race/raced")
	}
	e.mustCtl("kill", "fw", race)
	if out := e.mustCtl("run", "fw", "--", "ls", "-a", "/tmp"); strings.Contains(out, "raced") || strings.Contains(out, "shinken-e2e-files") {
		t.Errorf("an upload went through a session's symbolic link into its /tmp: %q", out)
	}
	// Replacing a file keeps its mode.
	must(os.Chmod(filepath.Join(ws, "by-session"), 0o640))
	e.mustCtl("cp", small, "fw:by-session")
	if fi, err := os.Stat(filepath.Join(ws, "by-session")); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("replaced file: %v %v, want mode 0640", fi.Mode(), err)
	}
	if out := e.mustCtl("cp", "fw:by-session", "-"); out != "payload\n" {
		t.Errorf("cp out to stdout: %q", out)
	}
	e.mustCtl("session", "rm", "fw")

	// Read-only: reads work, writes are refused and leave nothing.
	e.mustCtl("session", "create", "fr", "-image", "e2e", "-workspace", ws, "-mode", "read-only")
	if out, err := e.ctl("cp", small, "fr:new-file"); err == nil || !strings.Contains(out, "HTTP 403") {
		t.Errorf("upload into a read-only workspace: %v %q", err, out)
	}
	if _, err := os.Lstat(filepath.Join(ws, "new-file")); err == nil {
		t.Error("a read-only session's upload left a file")
	}
	if out := e.mustCtl("cp", "fr:by-session", "-"); out != "payload\n" {
		t.Errorf("read from a read-only workspace: %q", out)
	}
	// No workspace: nothing of the host is the session's.
	e.mustCtl("session", "create", "fn", "-image", "e2e")
	if out, err := e.ctl("cp", small, "fn:/var/tmp/x"); err == nil || !strings.Contains(out, "no workspace") {
		t.Errorf("upload into a session without a workspace: %v %q", err, out)
	}

	b, err := os.ReadFile(filepath.Join(e.dir, "state", audit.LogFile))
	must(err)
	if !strings.Contains(string(b), "sha256 "+want) || !strings.Contains(string(b), `"file.get"`) {
		t.Errorf("audit log lacks the transfers:\n%s", grepLines(string(b), "file."))
	}
}
