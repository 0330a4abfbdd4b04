package dataplane

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/dataplane/probe"
)

var probeBin string

func TestMain(m *testing.M) {
	if os.Getenv(probe.EnvVar) != "" {
		probe.Main()
	}
	if os.Getenv(loaderEnv) != "" {
		loaderMain()
	}
	code := m.Run()
	if probeBin != "" {
		os.RemoveAll(filepath.Dir(probeBin))
	}
	os.Exit(code)
}

var probeOnce sync.Once

// probeBinary is a copy of the test binary that an unprivileged session
// process can execute (go test builds into a 0700 directory).
func probeBinary(t testing.TB) string {
	probeOnce.Do(func() {
		self, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		dir, err := os.MkdirTemp("", "shinken-probe-")
		if err != nil {
			t.Fatal(err)
		}
		os.Chmod(dir, 0o755)
		data, err := os.ReadFile(self)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, "probe")
		if err := os.WriteFile(p, data, 0o755); err != nil {
			t.Fatal(err)
		}
		probeBin = p
	})
	if probeBin == "" {
		t.Fatal("no probe binary")
	}
	return probeBin
}

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (it loads BPF programs and makes cgroups); run the suite as root, as CI does")
	}
}

func randName(prefix string) string {
	b := make([]byte, 4)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// testConfig returns a config private to one test: its own parent cgroup and
// pin directory, so tests never touch a running agent's.
func testConfig(t testing.TB) Config {
	n := randName("shinken-test-")
	return Config{Parent: n, PinPath: "/sys/fs/bpf/" + n, MaxSessions: 1024, MaxHandles: 4096, MaxEgress4: 1 << 16, MaxEgress6: 1 << 16}
}

func newDataplane(t testing.TB, cfg Config) *Dataplane {
	t.Helper()
	requireRoot(t)
	d, err := Open(cfg)
	if err != nil {
		t.Fatalf("open dataplane: %v", err)
	}
	t.Cleanup(func() {
		if err := d.Uninstall(); err != nil {
			t.Errorf("uninstall: %v", err)
		}
	})
	return d
}

type sessProc struct {
	t   testing.TB
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func startProbe(t testing.TB, s Session, opts ProcOptions) *sessProc {
	t.Helper()
	cmd := exec.Command(probeBinary(t))
	cmd.Env = []string{probe.EnvVar + "=1"}
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(cmd, opts); err != nil {
		t.Fatal(err)
	}
	p := &sessProc{t: t, cmd: cmd, in: in, out: bufio.NewScanner(out)}
	t.Cleanup(p.stop)
	return p
}

func (p *sessProc) do(line string) string {
	p.t.Helper()
	if _, err := io.WriteString(p.in, line+"\n"); err != nil {
		p.t.Fatalf("probe %q: %v", line, err)
	}
	if !p.out.Scan() {
		p.t.Fatalf("probe %q: no answer (%v)", line, p.out.Err())
	}
	return p.out.Text()
}

func (p *sessProc) stop() {
	p.in.Close()
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		p.cmd.Process.Kill()
		<-done
	}
}

// tcpServer accepts on addr and collects what each connection sends.
type tcpServer struct {
	ln   net.Listener
	data chan string
}

func listenTCP(t testing.TB, addr string) *tcpServer {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	s := &tcpServer{ln: ln, data: make(chan string, 1024)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 4096)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						s.data <- string(buf[:n])
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return s
}

func (s *tcpServer) addr() string { return s.ln.Addr().String() }

type udpServer struct {
	pc   net.PacketConn
	data chan string
}

func listenUDP(t testing.TB, addr string) *udpServer {
	t.Helper()
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	s := &udpServer{pc: pc, data: make(chan string, 1024)}
	go func() {
		buf := make([]byte, 2048)
		for {
			n, _, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			s.data <- string(buf[:n])
		}
	}()
	t.Cleanup(func() { pc.Close() })
	return s
}

func (s *udpServer) addr() string { return s.pc.LocalAddr().String() }

// expectData waits for want on ch; expectNoData checks nothing arrives.
func expectData(t testing.TB, ch chan string, want string) {
	t.Helper()
	var got strings.Builder
	deadline := time.After(3 * time.Second)
	for !strings.Contains(got.String(), want) {
		select {
		case s := <-ch:
			got.WriteString(s)
		case <-deadline:
			t.Fatalf("expected %q to arrive, got %q", want, got.String())
		}
	}
}

func expectNoData(t testing.TB, ch chan string, wait time.Duration) {
	t.Helper()
	select {
	case s := <-ch:
		t.Fatalf("expected nothing to arrive, got %q", s)
	case <-time.After(wait):
	}
}

func drain(ch chan string) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

func mustAllow(t testing.TB, d *Dataplane, sess string, r EgressRule) {
	t.Helper()
	if err := d.AllowEgress(sess, r); err != nil {
		t.Fatalf("allow %s: %v", r, err)
	}
}

func mustHandle(t testing.TB, d *Dataplane, parent HandleRef, exp time.Time) HandleRef {
	t.Helper()
	h, err := d.NewHandle(parent, exp)
	if err != nil {
		t.Fatalf("new handle: %v", err)
	}
	return h
}

func isErr(err, target error) bool { return errors.Is(err, target) }

var zeroTime time.Time

// doAsync is do for use from another goroutine (no t.Fatal there).
func (p *sessProc) doAsync(line string) string {
	if _, err := io.WriteString(p.in, line+"\n"); err != nil {
		return "err " + err.Error()
	}
	if !p.out.Scan() {
		return "err no answer"
	}
	return p.out.Text()
}
