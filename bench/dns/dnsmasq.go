//go:build linux

package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/miekg/dns"
)

// The peer: dnsmasq, its nftables set, its CPU time.

type peer struct {
	cmd  *exec.Cmd
	addr netip.AddrPort
	dir  string
}

func freePort() (uint16, error) {
	// A port free for both UDP and TCP on 127.0.0.1.
	for range 20 {
		pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := pc.LocalAddr().(*net.UDPAddr).Port
		ln, err := net.Listen("tcp4", fmt.Sprintf("127.0.0.1:%d", port))
		pc.Close()
		if err == nil {
			ln.Close()
			return uint16(port), nil
		}
	}
	return 0, errors.New("no free port")
}

func startDnsmasq(bin string, up netip.AddrPort, cache int, nftset string) (*peer, error) {
	dir, err := os.MkdirTemp("", "shinken-bench-dnsmasq-")
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	extra := ""
	if nftset != "" {
		extra = "nftset=/allowed.bench/" + nftset + "\n"
	}
	conf := fmt.Sprintf(`# written by bench/dns; loopback only
port=%d
listen-address=127.0.0.1
bind-interfaces
no-resolv
no-hosts
no-poll
no-negcache
server=/allowed.bench/%s#%d
cache-size=%d
dns-forward-max=1000
%s`, port, up.Addr(), up.Port(), cache, extra)
	cf := filepath.Join(dir, "dnsmasq.conf")
	if err := os.WriteFile(cf, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--keep-in-foreground", "--conf-file="+cf, "--pid-file="+filepath.Join(dir, "pid"), "--log-facility=-")
	cmd.Stderr = io.Discard
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	p := &peer{cmd: cmd, addr: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port), dir: dir}
	// Wait until it answers.
	m := new(dns.Msg)
	m.SetQuestion("n0.allowed.bench.", dns.TypeA)
	for i := 0; ; i++ {
		if _, _, err := (&dns.Client{Timeout: 200 * time.Millisecond}).Exchange(m, p.addr.String()); err == nil {
			break
		}
		if i == 50 {
			p.stop()
			return nil, errors.New("dnsmasq does not answer")
		}
		time.Sleep(100 * time.Millisecond)
	}
	return p, nil
}

// stop kills the dnsmasq this program started, by its pid.
func (p *peer) stop() {
	if p.cmd.Process != nil {
		p.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { p.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(3 * time.Second):
			p.cmd.Process.Kill()
			<-done
		}
	}
	os.RemoveAll(p.dir)
}

// nftSet makes a private nftables table holding one IPv4 set with
// timeouts, for dnsmasq's --nftset; it has no chain, so it filters nothing.
// The returned func deletes it.
func nftSet() (string, func(), error) {
	b := make([]byte, 4)
	rand.Read(b)
	table := "shinken_benchdns_" + hex.EncodeToString(b)
	script := fmt.Sprintf("add table inet %s\nadd set inet %s allowed { type ipv4_addr; flags timeout; timeout 5m; }\n", table, table)
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", nil, fmt.Errorf("nft: %v: %s", err, out)
	}
	return "4#inet#" + table + "#allowed", func() {
		if out, err := exec.Command("nft", "delete", "table", "inet", table).CombinedOutput(); err != nil {
			log.Printf("nft delete table %s: %v: %s", table, err, out)
		}
	}, nil
}

// cpu is dnsmasq's CPU time, from /proc/PID/stat.
func (p *peer) cpu() time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	var ut, st int64
	fmt.Sscan(f[11], &ut)
	fmt.Sscan(f[12], &st)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}
