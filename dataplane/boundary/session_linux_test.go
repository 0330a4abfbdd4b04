package boundary

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/elastic/go-seccomp-bpf/arch"
	"github.com/shinken-agent/shinken/agent/backend"
)

// TestInsideSession: what a session's own processes can still do among
// themselves, and what its namespaces look like from inside.
func TestInsideSession(t *testing.T) {
	b := newBoundary(t, Config{}, nil)
	session(t, b, "in", 21)
	marker, err := os.CreateTemp("/tmp", "shinken-bt-host-marker-")
	if err != nil {
		t.Fatal(err)
	}
	marker.Close()
	defer os.Remove(marker.Name())
	out := runIn(t, b, "in", helper("inside", []string{"B_SECRET_ENV=mine", "HOST_MARKER=" + marker.Name(), "HOST_RW_DIR=" + helperDir}), true)
	t.Logf("inside session:\n%s", out)
	res := results(out)
	want := map[string]bool{
		"shell_kills_child": true, "kill_own_child": true, "own_environ": true, "own_fd": true,
		"own_abstract_unix": true, "write_tmp": true, "write_dev_shm": true, "fork_exec": true,
		"host_tmp_visible": false, "write_host_dir": false, "unshare_newuser": false, "clone3": false,
	}
	for op, ok := range want {
		if !strings.HasPrefix(res[op], fmt.Sprintf("ok=%v", ok)) {
			t.Errorf("%s: %q, want ok=%v", op, res[op], ok)
		} else {
			t.Logf("verified: %s ok=%v", op, ok)
		}
	}
	uid, _ := b.UID(21)
	if !strings.Contains(out, fmt.Sprintf("UID %d %d\n", uid, uid)) {
		t.Errorf("want uid and gid %d", uid)
	}
	if !strings.Contains(out, "PID1 catatonit") {
		t.Errorf("pid 1 of the session's /proc should be catatonit")
	}
	// The launcher's own environment entry does not reach the target; a
	// caller's own GOMAXPROCS does.
	env := runIn(t, b, "in", &exec.Cmd{Path: "/bin/sh", Args: []string{"sh", "-c", "echo \"[$GOMAXPROCS]\""}, Env: []string{"A=1"}, Dir: "/"}, true)
	own := runIn(t, b, "in", &exec.Cmd{Path: "/bin/sh", Args: []string{"sh", "-c", "echo \"[$GOMAXPROCS]\""}, Env: []string{"GOMAXPROCS=7"}, Dir: "/"}, true)
	if strings.TrimSpace(env) != "[]" || strings.TrimSpace(own) != "[7]" {
		t.Errorf("GOMAXPROCS in the target: %q without, %q with the caller's own", env, own)
	}
	// A session of its own (setsid), so an autogroup of its own: nothing
	// launched shares the agent's CPU weight or its process group.
	ag := runIn(t, b, "in", &exec.Cmd{Path: "/bin/sh", Args: []string{"sh", "-c", "cat /proc/self/autogroup; echo $$ $(cut -d' ' -f6 /proc/$$/stat)"}, Dir: "/"}, true)
	// (A process in no autogroup of its own, as under the VM's /init, reads
	// an empty file.)
	if mine, err := os.ReadFile("/proc/self/autogroup"); err == nil && len(strings.Fields(string(mine))) > 0 && strings.Contains(ag, strings.Fields(string(mine))[0]+" ") {
		t.Errorf("a launched process shares the launcher's autogroup %q:\n%s", mine, ag)
	}
	lines := strings.Split(strings.TrimSpace(ag), "\n")
	if f := strings.Fields(lines[len(lines)-1]); len(f) != 2 || f[0] != f[1] {
		t.Errorf("a launched process does not lead its session (pid, sid):\n%s", ag)
	}
	for _, l := range strings.Split(out, "\n") {
		if pids, ok := strings.CutPrefix(l, "PIDS "); ok {
			// catatonit holder, the run's catatonit, this helper, maybe a
			// leftover child: nothing of the host.
			if n := len(strings.Split(strings.Fields(pids)[0], ",")); n > 5 {
				t.Errorf("the session's /proc shows %d processes: %s", n, pids)
			}
		}
	}
}

// TestNoPrivilegeGain: setuid-root and file-capability binaries copied
// into a session gain nothing.
func TestNoPrivilegeGain(t *testing.T) {
	b := newBoundary(t, Config{}, nil)
	// The agent's supplementary groups (root's, here) must not reach the
	// session: give this process some for the test.
	setgroupsAllThreads(t, []int{0, 4})
	t.Cleanup(func() { setgroupsAllThreads(t, nil) })
	session(t, b, "priv", 31)
	uid, _ := b.UID(31)
	dir, err := os.MkdirTemp(helperDir, "priv-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	suidID, suidHelper, capHelper := filepath.Join(dir, "id"), filepath.Join(dir, "suid-helper"), filepath.Join(dir, "cap-helper")
	capEff := filepath.Join(dir, "cap-eff-helper")
	for _, c := range [][2]string{{"/usr/bin/id", suidID}, {helperBin, suidHelper}, {helperBin, capHelper}, {helperBin, capEff}} {
		if err := copyFile(c[0], c[1], 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{suidID, suidHelper} {
		if err := os.Chmod(f, 0o4755|os.ModeSetuid); err != nil {
			t.Fatal(err)
		}
	}
	// cap_net_raw permitted (the program would raise it itself), and
	// permitted+effective (a capability-dumb binary).
	for f, c := range map[string]string{capHelper: "cap_net_raw+p", capEff: "cap_net_raw+ep"} {
		if out, err := exec.Command("setcap", c, f).CombinedOutput(); err != nil {
			t.Fatalf("setcap: %v %s", err, out)
		}
	}
	// The kernel refuses to execute a +ep binary whose capabilities it
	// would not grant in full: it gains nothing by not running at all.
	// The launcher executes the target itself, so the refusal is Launch's
	// error (EPERM from execve).
	cmd := helper("caps", nil)
	cmd.Path = capEff
	var capOut strings.Builder
	cmd.Stdout, cmd.Stderr = &capOut, &capOut
	if err := b.Launch("priv", cmd, LaunchOptions{}, true); err != nil {
		if !errors.Is(err, syscall.EPERM) && !strings.Contains(err.Error(), "operation not permitted") {
			t.Errorf("cap_net_raw+ep binary: %v", err)
		} else {
			t.Logf("verified: cap_net_raw+ep copy gains nothing: the kernel refuses to execute it (%v)", err)
		}
	} else if cmd.Wait(); strings.Contains(capOut.String(), "RESULT") && !strings.Contains(capOut.String(), "op=raw_socket ok=false") {
		t.Errorf("cap_net_raw+ep binary: %s", capOut.String())
	} else {
		t.Logf("verified: cap_net_raw+ep copy gains nothing: %s", strings.TrimSpace(capOut.String()))
	}
	idOut := runIn(t, b, "priv", &exec.Cmd{Path: suidID, Args: []string{"id", "-u"}, Dir: "/"}, true)
	if strings.TrimSpace(idOut) != fmt.Sprint(uid) {
		t.Errorf("setuid-root id -u printed %q, want %d", idOut, uid)
	} else {
		t.Logf("verified: setuid-root copy of id -u prints %s", strings.TrimSpace(idOut))
	}
	for _, bin := range []string{suidHelper, capHelper} {
		cmd := helper("caps", nil)
		cmd.Path = bin
		out := runIn(t, b, "priv", cmd, true)
		t.Logf("%s:\n%s", filepath.Base(bin), out)
		for _, l := range strings.Split(out, "\n") {
			f := strings.Fields(l)
			switch {
			case len(f) >= 3 && (f[1] == "Uid:" || f[1] == "Gid:"):
				for _, id := range f[2:] {
					if id != fmt.Sprint(uid) {
						t.Errorf("%s: %s", filepath.Base(bin), l)
					}
				}
			case len(f) >= 2 && f[1] == "Groups:" && len(f) > 2:
				t.Errorf("%s: %s, want no supplementary group", filepath.Base(bin), l)
			case len(f) == 3 && strings.HasPrefix(f[1], "Cap"):
				if strings.Trim(f[2], "0") != "" {
					t.Errorf("%s: %s, want no capability", filepath.Base(bin), l)
				}
			case len(f) == 3 && f[1] == "NoNewPrivs:" && f[2] != "1":
				t.Errorf("%s: %s", filepath.Base(bin), l)
			case len(f) >= 3 && f[1] == "SecureBits:":
				// Every bit of child.secureAll, each locked.
				if f[2] != "0xef" {
					t.Errorf("%s: %s, want 0xef (noroot, no_setuid_fixup, no_cap_ambient_raise, each locked; keep_caps locked off)", filepath.Base(bin), l)
				} else {
					t.Logf("verified: %s runs with securebits %s, every bit locked", filepath.Base(bin), f[2])
				}
			}
		}
		if r := results(out)["clear_securebits"]; !strings.HasPrefix(r, "ok=false") {
			t.Errorf("%s: clearing securebits %q, want refused", filepath.Base(bin), r)
		}
		if r := results(out)["raw_socket"]; !strings.HasPrefix(r, "ok=false") {
			t.Errorf("%s: raw socket %q, want refused", filepath.Base(bin), r)
		} else {
			t.Logf("verified: %s keeps uid %d, all capability sets zero, raw socket refused (%s)", filepath.Base(bin), uid, r)
		}
	}
}

// TestRunTreeKilled: a run in its own cgroup is killed whole by KillRun,
// whatever it forked (setsid, double fork), and ends whole when its first
// process exits; without its own cgroup the orphans survive (what the test
// would see if the protection were removed).
func TestRunTreeKilled(t *testing.T) {
	b := newBoundary(t, Config{}, nil)
	dir := session(t, b, "tree", 41)
	for _, own := range []bool{true, false} {
		cmd := &exec.Cmd{Path: "/bin/sh", Args: []string{"sh", "-c",
			"setsid sh -c 'sleep 1000 & sleep 1000' & (sleep 1000 &) ; sleep 1000"}, Dir: "/"}
		if err := b.Launch("tree", cmd, LaunchOptions{}, own); err != nil {
			t.Fatal(err)
		}
		// The holder, the run's sh and its sleeps (two under the setsid
		// sh, one double-forked, one its own): wait until at least the
		// six the check below wants are there (the VM's emulation took
		// over 300 ms to fork them once).
		var before []string
		for i := 0; i < 500; i++ {
			if before = procs(t, dir); len(before) >= 6 {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		b.KillRun(cmd.Process)
		cmd.Wait()
		var after []string
		for i := 0; i < 100; i++ {
			runs, _ := filepath.Glob(filepath.Join(dir, "run-*"))
			if after = procs(t, dir); len(after) == 1 && (len(runs) == 0 || !own) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Logf("own cgroup %v: %d processes in the session, %d left after KillRun", own, len(before), len(after))
		if own {
			if len(before) < 6 || len(after) != 1 {
				t.Errorf("run tree: %d processes before, %d after (want >= 6, then only the holder)", len(before), len(after))
			} else {
				t.Logf("verified: killing the run killed all %d of its processes, setsid and double-forked ones included", len(before)-1)
			}
		} else if len(after) == 1 {
			t.Errorf("without its own cgroup the run's orphans should survive (else this test cannot see an escape)")
		}
		if own {
			if runs, _ := filepath.Glob(filepath.Join(dir, "run-*")); len(runs) != 0 {
				t.Errorf("run cgroups left after the run: %v", runs)
			}
		}
		b.Release("tree") // kills the holder, so the session's namespaces and processes: recreate
		for len(procs(t, dir)) > 0 {
			time.Sleep(10 * time.Millisecond)
		}
		if err := b.Create("tree", dir, 41); err != nil {
			t.Fatal(err)
		}
	}
	// The first process exits by itself: everything it left behind dies.
	cmd := &exec.Cmd{Path: "/bin/sh", Args: []string{"sh", "-c",
		"setsid sh -c 'sleep 1000 & sleep 1000' & (sleep 1000 &) ; sleep 0.3; exit 0"}, Dir: "/"}
	if err := b.Launch("tree", cmd, LaunchOptions{}, true); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	var after []string
	for i := 0; i < 100; i++ {
		runs, _ := filepath.Glob(filepath.Join(dir, "run-*"))
		if after = procs(t, dir); len(after) == 1 && len(runs) == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(after) != 1 {
		t.Errorf("after the run's first process exited, %d processes are left in the session (want only the holder)", len(after))
	} else {
		t.Logf("verified: when the run's first process exited, its setsid and double-forked processes died and its cgroup was removed")
	}
}

// TestRunTimeout: a command started with exec.CommandContext (as the run
// API does) is killed whole when its context ends: Launch sets its Cancel
// to KillRun.
func TestRunTimeout(t *testing.T) {
	b := newBoundary(t, Config{}, nil)
	dir := session(t, b, "timeout", 42)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", "setsid sh -c 'sleep 1000 & sleep 1000' & (sleep 1000 &) ; sleep 1000")
	cmd.Dir = "/"
	if err := b.Launch("timeout", cmd, LaunchOptions{}, true); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	err := cmd.Wait()
	var left []string
	for i := 0; i < 100; i++ {
		if left = procs(t, dir); len(left) == 1 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(left) != 1 {
		t.Fatalf("after the timeout %d processes are left in the session (want only the holder)", len(left))
	}
	t.Logf("verified: the context's timeout ended the run after %v (%v) and left only the session's holder", time.Since(t0).Round(time.Millisecond), err)
}

// procs lists the processes of the session cgroup dir and of the run
// cgroups below it.
func procs(t *testing.T, dir string) []string {
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	out := strings.Fields(string(data))
	runs, _ := filepath.Glob(filepath.Join(dir, "run-*", "cgroup.procs"))
	for _, r := range runs {
		data, _ := os.ReadFile(r) // a run's cgroup may be gone meanwhile
		out = append(out, strings.Fields(string(data))...)
	}
	return out
}

// TestUIDs: distinct sessions get distinct uids, derived from the index
// alone, and an agent restart (a new Boundary adopting the session) finds
// the same holder, namespaces and uid.
func TestUIDs(t *testing.T) {
	var c Config
	c.SetDefaults()
	seen := map[uint32]uint32{}
	for i := uint32(1); i < 65536; i++ {
		u, err := c.UID(i)
		if err != nil {
			t.Fatal(err)
		}
		if j, dup := seen[u]; dup {
			t.Fatalf("indices %d and %d share uid %d", i, j, u)
		}
		seen[u] = i
		if u == 0 || u == 65534 || u < DefaultUIDBase {
			t.Fatalf("uid %d", u)
		}
	}
	t.Logf("verified: 65535 session indices get 65535 distinct uids in [%d, %d)", DefaultUIDBase, DefaultUIDBase+65536)
	if _, err := c.UID(0); err == nil {
		t.Error("index 0 must have no uid")
	}
	for _, bad := range []Config{{UIDBase: 1, UIDCount: 70000}, {UIDBase: 65000, UIDCount: 1000}, {UIDBase: DefaultUIDBase, UIDCount: 1000},
		{UIDBase: 0xFFFFFF00, UIDCount: 65536}} {
		if err := bad.Validate(65536); !errors.Is(err, ErrUIDRange) {
			t.Errorf("Validate(%+v) = %v, want ErrUIDRange", bad, err)
		}
	}

	b := newBoundary(t, Config{}, nil)
	dir := session(t, b, "adopt", 51)
	first := runIn(t, b, "adopt", &exec.Cmd{Path: "/bin/sh", Args: []string{"sh", "-c", "id -u; readlink /proc/self/ns/pid; touch /tmp/left-by-first"}, Dir: "/"}, false)
	b.mu.Lock()
	oldPID := b.holders["adopt"].pid
	b.mu.Unlock()

	// An empty run cgroup the earlier agent left goes at adoption; a
	// cgroup of another name stays.
	for _, d := range []string{"run-left", "kept"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { os.Remove(filepath.Join(dir, "kept")) })
	b2 := newBoundary(t, Config{}, nil) // the restarted agent
	if err := b2.Adopt("adopt", dir, 51); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b2.Release("adopt") })
	if _, err := os.Stat(filepath.Join(dir, "run-left")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the empty run cgroup an earlier agent left: %v after adoption, want it gone", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "kept")); err != nil {
		t.Errorf("a cgroup not named run-*: %v after adoption, want it kept", err)
	}
	if got := b2.holders["adopt"].pid; got != oldPID {
		t.Fatalf("adopted holder %d, want %d", got, oldPID)
	}
	second := runIn(t, b2, "adopt", &exec.Cmd{Path: "/bin/sh", Args: []string{"sh", "-c", "id -u; readlink /proc/self/ns/pid; ls /tmp/left-by-first"}, Dir: "/"}, false)
	f1, f2 := strings.Fields(first), strings.Fields(second)
	if len(f1) < 2 || len(f2) < 3 || f1[0] != f2[0] || f1[1] != f2[1] || f2[2] != "/tmp/left-by-first" {
		t.Fatalf("before restart %q, after %q: want the same uid, PID namespace and /tmp", first, second)
	}
	t.Logf("verified: after adoption the session keeps uid %s, PID namespace %s and its /tmp (holder pid %d)", f2[0], f2[1], oldPID)
}

// TestProbe: the report is measured, and a clash in the uid range blocks
// session creation unless the operator accepts it.
func TestProbe(t *testing.T) {
	b := newBoundary(t, Config{}, nil)
	for _, s := range b.Report() {
		t.Logf("%-26s %-14s %s %s", s.Class, s.Level, s.Mechanism, s.Reason)
		if s.Level != backend.FixedAtExec && slices.Contains(hostAccept(t), string(s.Class)) {
			t.Logf("%s: %s on this host, accepted by these tests (%s)", s.Class, s.Level, s.Reason)
		} else if s.Level != backend.FixedAtExec {
			t.Errorf("%s: %s on this host (%s)", s.Class, s.Level, s.Reason)
		}
	}
	if err := b.Ready(); err != nil {
		t.Fatal(err)
	}
	clash, err := New(Config{UIDBase: 1, UIDCount: 65533, Accept: hostAccept(t)}, 1000) // holds daemon (1), bin (2)...
	if err != nil {
		t.Fatal(err)
	}
	defer clash.Close()
	if err := clash.Ready(); err == nil || !strings.Contains(err.Error(), MechUIDRange) {
		t.Errorf("a range holding host users: Ready() = %v", err)
	} else {
		t.Logf("verified: %v", err)
	}
	if err := clash.Create("x", "/nonexistent", 1); err == nil {
		t.Error("Create must refuse while the boundary is incomplete")
	}
	ok, err := New(Config{UIDBase: 1, UIDCount: 65533, Accept: append([]string{MechUIDRange}, hostAccept(t)...)}, 1000)
	if err != nil {
		t.Fatal(err)
	}
	defer ok.Close()
	if err := ok.Ready(); err != nil {
		t.Errorf("accepted: %v", err)
	}
	userns := newBoundary(t, Config{AllowUserNS: true}, nil)
	if err := userns.Ready(); err != nil {
		t.Errorf("user namespaces allowed by the config: %v", err)
	}
	for _, r := range userns.Report() {
		if r.Class == MechUserNS && r.Level != backend.Unavailable {
			t.Errorf("user namespaces allowed: reported %s", r.Level)
		}
	}
	if err := (Config{Accept: []string{"nonsense"}, UIDCount: 1 << 20}).Validate(10); err == nil {
		t.Error("unknown accepted mechanism must be refused")
	}
}

// TestFilter: the filter assembles for this architecture, its size, and
// every syscall it names exists on each architecture the agent builds for.
func TestFilter(t *testing.T) {
	for _, userns := range []bool{false, true} {
		n, err := FilterLen(userns)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("seccomp filter (user namespaces allowed: %v): %d BPF instructions", userns, n)
	}
	for _, a := range []string{"amd64", "arm64"} {
		info, err := arch.GetInfo(a)
		if err != nil {
			t.Fatal(err)
		}
		names := append(append(append([]string(nil), refusedSyscalls...), refusedMounts...), ioURingSyscalls...)
		for _, name := range append(names, "unshare", "clone", "clone3", "socket", "socketpair") {
			if _, ok := info.SyscallNames[name]; !ok {
				t.Errorf("%s has no syscall %s", a, name)
			}
		}
	}
}

// TestLauncherFallback: without a usable launcher binary the boundary
// re-executes this binary (which called Main) and says why; without a
// usable C launcher, launches go through the Go launcher's launch mode; a
// launcher that someone other than root could write is refused as unusable.
func TestLauncherFallback(t *testing.T) {
	setup(t)
	unsafe, unsafeExec := filepath.Join(helperDir, "unsafe-launch"), filepath.Join(helperDir, "unsafe-exec")
	if err := copyFile(launchBin, unsafe, 0o757); err != nil {
		t.Fatal(err)
	}
	if err := copyFile(execBin, unsafeExec, 0o757); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(helperDir, "missing")
	for i, c := range []struct{ launcher, exec, want string }{
		{missing, missing, "re-execution of the agent's own binary"},
		{unsafe, unsafeExec, "re-execution of the agent's own binary"},
		{launchBin, missing, "the Go launcher's launch mode"},
		{launchBin, unsafeExec, "the Go launcher's launch mode"},
	} {
		b := newBoundary(t, Config{Launcher: c.launcher, Exec: c.exec}, nil)
		name, index := fmt.Sprintf("fallback%d", i), uint32(71+i)
		if r := b.Launcher(); !strings.Contains(r, c.want) || !strings.Contains(r, c.launcher) || !strings.Contains(r, c.exec) {
			t.Errorf("launcher %s, C launcher %s: report %q", c.launcher, c.exec, r)
		}
		session(t, b, name, index)
		out := runIn(t, b, name, &exec.Cmd{Path: "/usr/bin/id", Args: []string{"id", "-u"}, Dir: "/"}, true)
		uid, _ := b.UID(index)
		if strings.TrimSpace(out) != fmt.Sprint(uid) {
			t.Errorf("fallback launch: id -u = %q, want %d", out, uid)
		}
		t.Logf("verified: %s", b.Launcher())
	}
	b := newBoundary(t, Config{}, nil)
	if r := b.Launcher(); os.Getenv(goLaunchEnv) == "" && (!strings.Contains(r, "dedicated launcher binary") || !strings.Contains(r, execBin+" (C launcher)")) {
		t.Errorf("built launchers not used: %q", r)
	}
}

// TestLaunchError: a target that cannot be executed is Launch's error,
// with the launcher's reason (the C launcher's errno is wrapped), and the
// run's cgroup is removed.
func TestLaunchError(t *testing.T) {
	b := newBoundary(t, Config{}, nil)
	dir := session(t, b, "lerr", 81)
	err := b.Launch("lerr", &exec.Cmd{Path: "/nonexistent", Args: []string{"x"}, Dir: "/"}, LaunchOptions{}, true)
	if err == nil || !strings.Contains(err.Error(), "exec /nonexistent: no such file or directory") {
		t.Fatalf("launch of a missing target: %v", err)
	}
	// Either launcher: the errno crosses the status pipe, and the
	// failure is the program's (the request's), not the host's.
	if !errors.Is(err, syscall.ENOENT) || !errors.Is(err, backend.ErrExecFailed) {
		t.Errorf("launcher (C: %v): %v does not wrap ENOENT and backend.ErrExecFailed", b.cexe != nil, err)
	}
	if runs, _ := filepath.Glob(filepath.Join(dir, "run-*")); len(runs) != 0 {
		t.Errorf("run cgroups left: %v", runs)
	}
	t.Logf("verified: %v", err)
}

// goLaunchEnv set: newBoundary leaves the C launcher out, so that every
// launch goes through the Go launcher's launch mode.
const goLaunchEnv = "SHINKEN_BT_GO_LAUNCH"

// TestGoLaunchMode runs the protection tests again with launches through
// the Go launcher's launch mode (the agent's fallback when the C launcher
// is missing): both implementations must hold the same boundary.
func TestGoLaunchMode(t *testing.T) {
	setup(t)
	if os.Getenv(goLaunchEnv) != "" {
		t.Skip("already the Go launch mode")
	}
	tests := []string{"TestCrossSession", "TestCrossSessionLayers", "TestInsideSession", "TestNoPrivilegeGain",
		"TestRunTreeKilled", "TestRunTimeout", "TestFilterVerdicts", "TestForeignABIKilled", "TestFilter", "TestSessionSyscalls", "TestCgroupView",
		"TestLauncherFallback", "TestLaunchError", "TestTmpfsSize", "TestNProcBound", "TestLandlockCredentials",
		"TestRulesetRevokeNarrows", "TestRulesetNotInherited"}
	cmd := exec.Command(os.Args[0], "-test.run", "^("+strings.Join(tests, "|")+")$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), goLaunchEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the protection tests through the Go launcher's launch mode: %v\n%s", err, out)
	}
	for _, name := range tests {
		// A test that skips for a reason of its host skips in both modes:
		// in the VM of .ci/vmtest (launchers built beforehand) one that
		// needs a toolchain, on a kernel without IA32 emulation
		// TestForeignABIKilled. Its reason is in the output.
		if strings.Contains(string(out), "--- SKIP: "+name+" (") {
			t.Logf("%s skipped through the Go launch mode too (its reason is in the output)", name)
			continue
		}
		if !strings.Contains(string(out), "--- PASS: "+name+" (") {
			t.Errorf("%s did not pass through the Go launch mode:\n%s", name, out)
		}
	}
	t.Logf("%d protection tests passed through the Go launcher's launch mode", len(tests))
}

// TestRunIdentity (issue 22, build item 6): a launch names the session's
// own uid and gid or neither; another session's uid, a host user or a host
// group (shadow) is refused with ErrIdentity before anything starts, and
// the process gets no supplementary group.
func TestRunIdentity(t *testing.T) {
	b := newBoundary(t, Config{}, nil)
	dir := session(t, b, "ida", 93)
	session(t, b, "idb", 94)
	own, _ := b.UID(93)
	other, _ := b.UID(94)
	id := func(opts LaunchOptions) (string, error) {
		cmd := &exec.Cmd{Path: "/usr/bin/id", Args: []string{"id"}, Dir: "/"}
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := b.Launch("ida", cmd, opts, true); err != nil {
			return "", err
		}
		err := cmd.Wait()
		return strings.TrimSpace(out.String()), err
	}
	for _, opts := range []LaunchOptions{
		{UID: other}, {UID: other, GID: other}, {UID: own, GID: other}, {GID: other},
		{UID: own, GID: 42}, {GID: 42}, {UID: 65534, GID: 65534}, {UID: 1000}, {UID: own, GID: 0xFFFFFFFF},
	} {
		out, err := id(opts)
		if !errors.Is(err, ErrIdentity) {
			t.Errorf("launch as uid %d gid %d: %v %q, want ErrIdentity", opts.UID, opts.GID, err, out)
		} else {
			t.Logf("verified: uid %d gid %d refused: %v", opts.UID, opts.GID, err)
		}
	}
	if runs, _ := filepath.Glob(filepath.Join(dir, "run-*")); len(runs) != 0 {
		t.Errorf("refused launches left run cgroups: %v", runs)
	}
	want := fmt.Sprintf("uid=%d gid=%d groups=%d", own, own, own)
	named := regexp.MustCompile(`\([^)]*\)`) // the session view's names (TestSessionUser)
	for _, opts := range []LaunchOptions{{}, {UID: own}, {GID: own}, {UID: own, GID: own}} {
		out, err := id(opts)
		if out = named.ReplaceAllString(out, ""); err != nil || out != want {
			t.Errorf("launch as uid %d gid %d: %v %q, want %q", opts.UID, opts.GID, err, out, want)
		}
	}
	t.Logf("verified: the session's own identity (named or by default) runs as %q", want)
}
