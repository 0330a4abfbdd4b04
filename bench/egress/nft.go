//go:build linux

package main

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/shinken-agent/shinken/dataplane"
)

// The nftables peer: the same allowlist as a socket cgroupv2 set.

func (b *bench) setupNft(conn, sink netip.AddrPort) (dataplane.Session, error) {
	if _, err := exec.LookPath("nft"); err != nil {
		return dataplane.Session{}, errors.New("nft not found (apt-get install nftables), or run with -no-nft")
	}
	b.nftParent = filepath.Join(b.root, "shinken-bench-nft-"+b.tag)
	if err := os.Mkdir(b.nftParent, 0o755); err != nil {
		return dataplane.Session{}, err
	}
	// nft resolves cgroupv2 paths below /sys/fs/cgroup.
	rel, err := filepath.Rel("/sys/fs/cgroup", b.nftParent)
	if err != nil || strings.HasPrefix(rel, "..") {
		return dataplane.Session{}, fmt.Errorf("cgroup2 at %s is not below /sys/fs/cgroup", b.root)
	}
	level := strings.Count(strings.TrimPrefix(b.nftParent, b.root), "/") + 1
	b.nftTable = "shinken_bench_" + b.tag
	var sb strings.Builder
	fmt.Fprintf(&sb, "table inet %s {\n set allow {\n  typeof socket cgroupv2 level %d . ip daddr . tcp dport\n  size %d\n }\n", b.nftTable, level, *flagSessions**flagEntries+1024)
	sb.WriteString("}\n")
	// The output chain exists only during the nftables rounds (nftOn), so
	// the baseline and Shinken rounds do not pay for its hook. Denied TCP
	// gets a reset (ECONNREFUSED at once) rather than a silent drop that
	// would leave connect() retrying its SYN for minutes.
	b.nftChain = fmt.Sprintf("add chain inet %s out { type filter hook output priority 0; policy accept; }\n", b.nftTable) +
		fmt.Sprintf("add rule inet %s out meta l4proto tcp socket cgroupv2 level %d . ip daddr . tcp dport @allow accept\n", b.nftTable, level) +
		fmt.Sprintf("add rule inet %s out meta l4proto tcp socket cgroupv2 level %d %q reject with tcp reset\n", b.nftTable, level-1, rel) +
		fmt.Sprintf("add rule inet %s out socket cgroupv2 level %d %q drop\n", b.nftTable, level-1, rel)
	if out, err := nftRun(sb.String()); err != nil {
		return dataplane.Session{}, fmt.Errorf("nft: %v: %s", err, out)
	}
	// Sessions and elements, in chunks.
	var elems []string
	flush := func() error {
		if len(elems) == 0 {
			return nil
		}
		script := fmt.Sprintf("add element inet %s allow { %s }\n", b.nftTable, strings.Join(elems, ", "))
		elems = elems[:0]
		if out, err := nftRun(script); err != nil {
			return fmt.Errorf("nft add element: %v: %s", err, out)
		}
		return nil
	}
	for i := 0; i < *flagSessions; i++ {
		name := fmt.Sprintf("s%d", i)
		if err := os.Mkdir(filepath.Join(b.nftParent, name), 0o755); err != nil {
			return dataplane.Session{}, err
		}
		for j := 0; j < *flagEntries; j++ {
			elems = append(elems, fmt.Sprintf("%q . 10.%d.%d.%d . 443", rel+"/"+name, byte(i>>8), byte(i), j))
		}
		if len(elems) >= 20000 {
			if err := flush(); err != nil {
				return dataplane.Session{}, err
			}
		}
	}
	bench := filepath.Join(b.nftParent, "bench")
	if err := os.Mkdir(bench, 0o755); err != nil {
		return dataplane.Session{}, err
	}
	for j := 0; j < *flagEntries; j++ {
		elems = append(elems, fmt.Sprintf("%q . 11.0.0.%d . 443", rel+"/bench", j))
	}
	for _, ap := range []netip.AddrPort{conn, sink} {
		elems = append(elems, fmt.Sprintf("%q . %s . %d", rel+"/bench", ap.Addr(), ap.Port()))
	}
	if err := flush(); err != nil {
		return dataplane.Session{}, err
	}
	return dataplane.Session{Name: "nft-bench", Path: bench}, nil
}

// nftOn adds the output chain (the set stays loaded); nftOff deletes it.
func (b *bench) nftOn() error {
	if out, err := nftRun(b.nftChain); err != nil {
		return fmt.Errorf("nft: %v: %s", err, out)
	}
	return nil
}

func (b *bench) nftOff() error {
	if out, err := nftRun(fmt.Sprintf("delete chain inet %s out\n", b.nftTable)); err != nil {
		return fmt.Errorf("nft: %v: %s", err, out)
	}
	return nil
}

func nftRun(script string) ([]byte, error) {
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	return cmd.CombinedOutput()
}
