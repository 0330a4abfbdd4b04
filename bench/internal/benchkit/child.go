package benchkit

import (
	"bufio"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"sync"
)

// Child is a helper process run from the bench's own binary (a fake DNS
// upstream), so that its CPU is its own and not the bench's. The protocol:
// the child prints the loopback port it serves on as its first line; when
// its stdin closes it prints one count (say, the queries it answered) and
// exits.
type Child struct {
	Addr netip.AddrPort // 127.0.0.1 and the port the child printed
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Reader
	once sync.Once
	n    uint64
}

// StartChild runs this executable with args and env=1 added to its
// environment (the child's main looks for env) and waits for its port.
func StartChild(env string, args ...string) (*Child, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, args...)
	cmd.Env = append(os.Environ(), env+"=1")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	outp, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &Child{cmd: cmd, in: in, out: bufio.NewReader(outp)}
	var port uint16
	if _, err := fmt.Fscanln(c.out, &port); err != nil {
		c.Stop()
		return nil, fmt.Errorf("%s: %w", env, err)
	}
	c.Addr = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)
	return c, nil
}

// Stop closes the child's stdin, reads its count and waits for it; later
// calls return the same count.
func (c *Child) Stop() uint64 {
	c.once.Do(func() {
		c.in.Close()
		fmt.Fscanln(c.out, &c.n)
		c.cmd.Wait()
	})
	return c.n
}
