package dataplane

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"

	"github.com/shinken-agent/shinken/dataplane/kerneltest"
	"github.com/shinken-agent/shinken/dataplane/probe"
)

// TestSocketCountPaths: the ways a session could move a socket's count
// (bpf/quota.bpf.h) or make a socket un-count what it never counted, each
// tried, with the count checked after every step: descriptors passed to
// another session, to the host and from the host (SCM_RIGHTS); a task moved
// to another session with its sockets; sockets made in a cgroup below the
// session's; sockets made before the task joined;
// connections accepted from a session listener (closed, passed on, never
// accepted, MPTCP), in a loop; and a socket whose storage says it was
// counted by an older agent.
func TestSocketCountPaths(t *testing.T) {
	forModes(t, func(t *testing.T, mode FlowMode) { testSocketCountPaths(t, mode, false) })
}

// TestSocketCountStored: the same paths with the fallback the agent loads
// where bpf_probe_read_kernel is missing (every count in socket storage),
// and the probe row that says so.
func TestSocketCountStored(t *testing.T) {
	forModes(t, func(t *testing.T, mode FlowMode) { testSocketCountPaths(t, mode, true) })
}

func testSocketCountPaths(t *testing.T, mode FlowMode, stored bool) {
	const maxSocks = 64
	cfg := modeConfig(t, mode)
	cfg.MaxSocketsPerSession = maxSocks
	cfg.storedCount = stored
	d := newDataplane(t, cfg)
	for _, row := range d.quotaRows() {
		if row.Class == "sockets" && strings.Contains(row.Mechanism, "fallback") != stored {
			t.Errorf("socket limit's probe row (storage fallback %v): %s", stored, row.Mechanism)
		}
	}
	if !stored && d.sockRead != nil {
		t.Errorf("the socket count fell back to socket storage on this kernel: %v", d.sockRead)
	}
	if !stored {
		checkSockRead(t, d)
	}
	a, err := d.CreateSession("ca", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := d.CreateSession("cb", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	pa := startProbe(t, a, ProcOptions{})
	pb := startProbe(t, b, ProcOptions{})
	use := func(t *testing.T, s string) int32 {
		t.Helper()
		u, err := d.SocketUse(s)
		if err != nil {
			t.Fatal(err)
		}
		return u.Sockets
	}
	want := func(t *testing.T, p *probe.Proc, cmd, wantOut string) {
		t.Helper()
		if got := p.Do(cmd); got != wantOut {
			t.Fatalf("%s: %q, want %q", cmd, got, wantOut)
		}
	}
	counts := func(t *testing.T, step string, wa, wb int32) {
		t.Helper()
		if ga, gb := use(t, "ca"), use(t, "cb"); ga != wa || gb != wb {
			t.Errorf("%s: sessions count (%d, %d) sockets, want (%d, %d)", step, ga, gb, wa, wb)
		}
	}
	// recvAsync starts p receiving descriptors on addr into group g.
	recvAsync := func(p *probe.Proc, g, addr string) chan string {
		ch := make(chan string, 1)
		go func() { ch <- p.DoAsync(fmt.Sprintf("fdrecv %s %s 3000", g, addr)) }()
		return ch
	}
	addr := func(t *testing.T) string {
		return fmt.Sprintf("shk-count-%d-%s", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "-"))
	}

	t.Run("to another session", func(t *testing.T) {
		ba, bb := use(t, "ca"), use(t, "cb")
		for _, kind := range []string{"tcp", "udp"} {
			want(t, pa, "nsock s 8 "+kind, "ok 8")
			counts(t, "made in ca", ba+8, bb)
			got := recvAsync(pb, "g", addr(t)+kind)
			want(t, pa, "fdsend s "+addr(t)+kind, "ok 8")
			if r := <-got; r != "ok 8" {
				t.Fatalf("fdrecv: %s", r)
			}
			want(t, pa, "closen s 100", "ok 8")
			counts(t, "passed to cb, closed in ca", ba+8, bb)
			want(t, pb, "closen g 100", "ok 8")
			counts(t, "closed in cb", ba, bb)
		}
	})

	t.Run("to and from the host", func(t *testing.T) {
		ba, bb := use(t, "ca"), use(t, "cb")
		want(t, pa, "nsock s 6 udp", "ok 6")
		got := make(chan []int, 1)
		go func() { fds, _ := probe.RecvFDs(addr(t), 3000); got <- fds }()
		want(t, pa, "fdsend s "+addr(t), "ok 6")
		fds := <-got
		if len(fds) != 6 {
			t.Fatalf("host received %d sockets, want 6", len(fds))
		}
		want(t, pa, "closen s 100", "ok 6")
		counts(t, "passed to the host, closed in ca", ba+6, bb)
		for _, fd := range fds {
			unix.Close(fd)
		}
		counts(t, "closed by the host", ba, bb)

		// The host's sockets, closed in a session: no count moves, and
		// the session gets no room past its limit.
		var host []int
		for i := 0; i < 6; i++ {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			host = append(host, fd)
		}
		r := recvAsync(pa, "h", addr(t)+"in")
		if err := probe.SendFDs(addr(t)+"in", host); err != nil {
			t.Fatal(err)
		}
		if got := <-r; got != "ok 6" {
			t.Fatalf("fdrecv: %s", got)
		}
		for _, fd := range host {
			unix.Close(fd)
		}
		want(t, pa, "closen h 100", "ok 6")
		counts(t, "host sockets closed in ca", ba, bb)
		n := maxSocks - int(ba)
		want(t, pa, fmt.Sprintf("nsock s %d tcp", n+4), fmt.Sprintf("ok %d err operation not permitted", n))
		want(t, pa, "closen s 1000", fmt.Sprintf("ok %d", n))
		counts(t, "after the limit", ba, bb)
	})

	t.Run("task moved", func(t *testing.T) {
		ba, bb := use(t, "ca"), use(t, "cb")
		pm := startProbe(t, a, ProcOptions{})
		want(t, pm, "nsock s 5 tcp", "ok 5")
		counts(t, "made in ca", ba+5, bb)
		moveTo(t, pm, b.Path)
		want(t, pm, "closen s 100", "ok 5")
		counts(t, "closed after the task moved to cb", ba, bb)
		want(t, pm, "nsock t 3 udp", "ok 3")
		counts(t, "made after the move", ba, bb+3)
		want(t, pm, "closen t 100", "ok 3")
		counts(t, "closed", ba, bb)
	})

	t.Run("sub-cgroup", func(t *testing.T) {
		// A socket made in a cgroup below the session's counts to the
		// session (its ancestor at the sessions' level).
		ba, bb := use(t, "ca"), use(t, "cb")
		sub := filepath.Join(a.Path, "sub")
		if err := os.Mkdir(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		ps := startProbe(t, a, ProcOptions{})
		moveTo(t, ps, sub)
		t.Cleanup(func() { ps.Stop(); os.Remove(sub) })
		want(t, ps, "nsock s 4 udp", "ok 4")
		counts(t, "made in ca/sub", ba+4, bb)
		want(t, ps, "closen s 100", "ok 4")
		counts(t, "closed", ba, bb)
	})

	t.Run("made before joining", func(t *testing.T) {
		ba, bb := use(t, "ca"), use(t, "cb")
		ph := probe.Start(t, func(c *exec.Cmd) error { return c.Start() })
		want(t, ph, "nsock s 5 tcp", "ok 5")
		want(t, ph, "nsock u 5 udp", "ok 5")
		moveTo(t, ph, a.Path)
		counts(t, "a host task joined ca", ba, bb)
		want(t, ph, "closen s 100", "ok 5")
		want(t, ph, "closen u 100", "ok 5")
		counts(t, "its older sockets closed in ca", ba, bb)
		want(t, ph, "nsock t 2 tcp", "ok 2")
		counts(t, "made in ca", ba+2, bb)
		want(t, ph, "closen t 100", "ok 2")
		counts(t, "closed", ba, bb)
	})

	t.Run("accepted connections", func(t *testing.T) {
		h := mustHandle(t, d, HandleRef{}, time.Time{})
		mustAllow(t, d, "ca", EgressRule{Prefix: pfx("127.0.0.0/8"), Proto: ProtoTCP, Handle: h, Inbound: true})
		ba, bb := use(t, "ca"), use(t, "cb")
		port := pa.Do("listen l 127.0.0.1:0")
		if !strings.HasPrefix(port, "ok ") {
			t.Fatalf("listen: %s", port)
		}
		target := "127.0.0.1:" + strings.TrimPrefix(port, "ok ")
		counts(t, "listening", ba+1, bb)
		dial := func(t *testing.T, n int) []net.Conn {
			t.Helper()
			var cs []net.Conn
			for i := 0; i < n; i++ {
				c, err := net.DialTimeout("tcp", target, 2*time.Second)
				if err != nil {
					t.Fatalf("dial %s: %v", target, err)
				}
				cs = append(cs, c)
			}
			t.Cleanup(func() {
				for _, c := range cs {
					c.Close()
				}
			})
			return cs
		}
		// Accepted and closed, 20 rounds: the count never goes below
		// what the session made (each round would otherwise free one
		// more socket past the limit).
		for round := 0; round < 20; round++ {
			dial(t, 3)
			want(t, pa, "naccept c l 3 2000", "ok 3")
			counts(t, "accepted", ba+1, bb)
			want(t, pa, "closen c 100", "ok 3")
		}
		counts(t, "after 20 rounds of accept and close", ba+1, bb)
		// Accepted, passed to another session, closed there.
		dial(t, 4)
		want(t, pa, "naccept c l 4 2000", "ok 4")
		r := recvAsync(pb, "g", addr(t))
		want(t, pa, "fdsend c "+addr(t), "ok 4")
		if got := <-r; got != "ok 4" {
			t.Fatalf("fdrecv: %s", got)
		}
		want(t, pa, "closen c 100", "ok 4")
		want(t, pb, "closen g 100", "ok 4")
		counts(t, "accepted, closed in cb", ba+1, bb)
		// Never accepted: the listener closes with them queued.
		dial(t, 4)
		time.Sleep(50 * time.Millisecond)
		want(t, pa, "close l", "ok")
		counts(t, "listener closed with 4 connections queued", ba, bb)
	})

	t.Run("accepted mptcp", func(t *testing.T) {
		ba, bb := use(t, "ca"), use(t, "cb")
		port := pa.Do("mlisten m 127.0.0.1:0")
		if !strings.HasPrefix(port, "ok ") {
			t.Skipf("no MPTCP listener on this host: %s", port)
		}
		h := mustHandle(t, d, HandleRef{}, time.Time{})
		mustAllow(t, d, "ca", EgressRule{Prefix: pfx("127.0.0.0/8"), Proto: ProtoTCP, Handle: h, Inbound: true})
		target := "127.0.0.1:" + strings.TrimPrefix(port, "ok ")
		counts(t, "listening", ba+1, bb)
		for _, multipath := range []bool{true, false} { // MPTCP, then plain TCP (fallback)
			for round := 0; round < 5; round++ {
				var dl net.Dialer
				dl.Timeout = 2 * time.Second
				dl.SetMultipathTCP(multipath)
				var cs []net.Conn
				for i := 0; i < 3; i++ {
					c, err := dl.Dial("tcp", target)
					if err != nil {
						t.Fatalf("dial %s (multipath %v): %v", target, multipath, err)
					}
					cs = append(cs, c)
				}
				want(t, pa, "naccept c m 3 2000", "ok 3")
				want(t, pa, "closen c 100", "ok 3")
				for _, c := range cs {
					c.Close()
				}
			}
			counts(t, fmt.Sprintf("after 5 rounds of accept and close (multipath %v)", multipath), ba+1, bb)
		}
		want(t, pa, "close m", "ok")
		counts(t, "closed", ba, bb)
	})

	t.Run("counted by an older agent", func(t *testing.T) {
		// An older agent kept every count in socket storage: such a
		// socket un-counts through its storage, once.
		ba, bb := use(t, "ca"), use(t, "cb")
		want(t, pa, "nsock s 3 tcp", "ok 3")
		got := make(chan []int, 1)
		go func() { fds, _ := probe.RecvFDs(addr(t), 3000); got <- fds }()
		want(t, pa, "fdsend s "+addr(t), "ok 3")
		fds := <-got
		if len(fds) != 3 {
			t.Fatalf("host received %d sockets, want 3", len(fds))
		}
		st := make([]byte, 32) // struct shk_sock: key, held, counted
		binary.LittleEndian.PutUint64(st[24:], a.CgroupID)
		for _, fd := range fds {
			if err := d.objs.ShkSocks.Update(uint32(fd), st, 0); err != nil {
				t.Fatalf("set socket storage: %v", err)
			}
		}
		want(t, pa, "closen s 100", "ok 3")
		counts(t, "closed in ca, alive in the host", ba+3, bb)
		for _, fd := range fds {
			unix.Close(fd)
		}
		counts(t, "closed", ba, bb)
	})
}

// moveTo moves probe p's process into the cgroup at path.
func moveTo(t *testing.T, p *probe.Proc, path string) {
	t.Helper()
	pid := strings.TrimPrefix(p.Do("pid"), "ok ")
	if _, err := strconv.Atoi(pid); err != nil {
		t.Fatalf("pid: %q", pid)
	}
	if err := os.WriteFile(filepath.Join(path, "cgroup.procs"), []byte(pid), 0); err != nil {
		t.Fatalf("move %s to %s: %v", pid, path, err)
	}
}

// TestSocketCountUpgrade: an agent taking over from one that kept every
// socket count in socket storage. Such an agent left accepted connections
// with no storage (never counted) and its counted sockets with storage that
// says so; the new agent, which counts TCP without storage, must mark the
// former before its sock_create is attached, or closing them would each
// free one socket past the limit. The older agent's state is made here with
// this agent's programs and then rewritten through the storage map (its
// layout is the older agent's).
func TestSocketCountUpgrade(t *testing.T) {
	kerneltest.RequireRoot(t)
	cfg := testConfig(t)
	cfg.MaxSocketsPerSession = 64
	d, err := Open(cfg)
	if err != nil {
		t.Fatalf("open dataplane: %v", err)
	}
	a, err := d.CreateSession("ua", Limits{})
	if err != nil {
		d.Uninstall()
		t.Fatal(err)
	}
	pa := startProbe(t, a, ProcOptions{})
	h := mustHandle(t, d, HandleRef{}, time.Time{})
	mustAllow(t, d, "ua", EgressRule{Prefix: pfx("127.0.0.0/8"), Proto: ProtoTCP, Handle: h, Inbound: true})
	port := pa.Do("listen l 127.0.0.1:0")
	if !strings.HasPrefix(port, "ok ") {
		d.Uninstall()
		t.Fatalf("listen: %s", port)
	}
	var peers []net.Conn
	for i := 0; i < 6; i++ {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strings.TrimPrefix(port, "ok "), 2*time.Second)
		if err != nil {
			d.Uninstall()
			t.Fatal(err)
		}
		peers = append(peers, c)
	}
	defer func() {
		for _, c := range peers {
			c.Close()
		}
	}()
	if got := pa.Do("naccept c l 6 2000"); got != "ok 6" {
		d.Uninstall()
		t.Fatalf("naccept: %s", got)
	}
	if got := pa.Do("nsock s 3 tcp"); got != "ok 3" {
		d.Uninstall()
		t.Fatalf("nsock: %s", got)
	}
	// The older agent's state: the accepted connections without storage,
	// the made sockets counted in theirs.
	addr := fmt.Sprintf("shk-upgrade-%d", os.Getpid())
	st := make([]byte, 32) // struct shk_sock: key, held, counted
	binary.LittleEndian.PutUint64(st[24:], a.CgroupID)
	for _, g := range []string{"c", "s"} {
		got := make(chan []int, 1)
		go func() { fds, _ := probe.RecvFDs(addr+g, 3000); got <- fds }()
		if r := pa.Do("fdsend " + g + " " + addr + g); !strings.HasPrefix(r, "ok ") {
			d.Uninstall()
			t.Fatalf("fdsend: %s", r)
		}
		for _, fd := range <-got {
			if g == "c" {
				err = d.objs.ShkSocks.Delete(uint32(fd))
			} else {
				err = d.objs.ShkSocks.Update(uint32(fd), st, 0)
			}
			unix.Close(fd)
			if err != nil {
				d.Uninstall()
				t.Fatalf("rewrite socket storage: %v", err)
			}
		}
	}
	before, err := d.SocketUse("ua")
	if err != nil {
		d.Uninstall()
		t.Fatal(err)
	}
	d.Close()
	if err := os.Remove(filepath.Join(cfg.PinPath, "shk_sockcount")); err != nil {
		t.Fatal(err)
	}
	d2 := newDataplane(t, cfg)
	if got := pa.Do("closen c 100"); got != "ok 6" {
		t.Fatalf("closen: %s", got)
	}
	u, err := d2.SocketUse("ua")
	if err != nil {
		t.Fatal(err)
	}
	if u.Sockets != before.Sockets {
		t.Errorf("closing 6 connections accepted under the older agent: %d sockets counted, want %d", u.Sockets, before.Sockets)
	}
	if got := pa.Do("closen s 100"); got != "ok 3" {
		t.Fatalf("closen: %s", got)
	}
	if u, _ := d2.SocketUse("ua"); u.Sockets != before.Sockets-3 {
		t.Errorf("after closing the 3 sockets the older agent counted: %d sockets counted, want %d", u.Sockets, before.Sockets-3)
	}
	// (The listener, made by this agent's programs, has storage for its
	// port hold that says nothing about a count, which no older agent
	// left: the marking takes it for uncounted. Not checked.)
	pa.Do("close l")
}

// checkSockRead: the socket count's programs, as the kernel runs them
// (their translated instructions, dead branches removed by the verifier),
// call bpf_probe_read_kernel exactly where the probe row says the socket's
// cgroup is read with it, and not where it says plain loads through
// bpf_cast_to_kern_ctx (Linux 6.2+: this host; Debian 12's 6.1 in
// .ci/vmtest reads with the helper). A translated helper call names its
// helper by address (the function's, less __bpf_call_base's), found in
// /proc/kallsyms.
func checkSockRead(t *testing.T, d *Dataplane) {
	t.Helper()
	var row string
	for _, r := range d.quotaRows() {
		if r.Class == "sockets" {
			row = r.Mechanism
		}
	}
	kern := strings.Contains(row, "plain loads through bpf_cast_to_kern_ctx")
	if kern != d.sockKern || kern == strings.Contains(row, "read with bpf_probe_read_kernel") {
		t.Fatalf("socket limit's probe row (kfunc found: %v): %s", d.sockKern, row)
	}
	syms, err := os.ReadFile("/proc/kallsyms")
	if err != nil {
		t.Fatal(err)
	}
	addr := map[string]uint64{}
	for _, l := range strings.Split(string(syms), "\n") {
		if f := strings.Fields(l); len(f) >= 3 && (f[2] == "bpf_probe_read_kernel" || f[2] == "__bpf_call_base") {
			addr[f[2]], _ = strconv.ParseUint(f[0], 16, 64)
		}
	}
	if addr["bpf_probe_read_kernel"] == 0 || addr["__bpf_call_base"] == 0 {
		t.Fatalf("/proc/kallsyms has no address of bpf_probe_read_kernel or __bpf_call_base: %v", addr)
	}
	imm := int32(int64(addr["bpf_probe_read_kernel"] - addr["__bpf_call_base"]))
	for name, p := range map[string]*ebpf.Program{"shk_sock_create": d.objs.ShkSockCreate, "shk_sock_release": d.objs.ShkSockRelease} {
		info, err := p.Info()
		if err != nil {
			t.Fatal(err)
		}
		insns, err := info.Instructions()
		if err != nil {
			t.Fatalf("%s: translated instructions: %v", name, err)
		}
		calls := 0
		for _, ins := range insns {
			if ins.OpCode.JumpOp() == asm.Call && ins.Src == asm.R0 && int32(ins.Constant) == imm {
				calls++
			}
		}
		if (calls > 0) == kern {
			t.Errorf("%s calls bpf_probe_read_kernel %d times; the probe row says: %s", name, calls, row)
		}
	}
	t.Logf("the socket count reads the socket's cgroup with plain loads: %v", kern)
}
