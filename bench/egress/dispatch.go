//go:build linux

package main

// The dispatch contender: a cgroup with, at each cgroup hook Shinken
// attaches in its flow mode (dataplane.CgroupHooks), a program that returns
// "allow" at once and does nothing else. Its connect+close rate against the
// baseline's is what running those hooks costs on this kernel before any
// program does any work: the floor of egress_connect_ratio_vs_baseline for
// any design with these attach points (issue 21, point 2: "cut it toward
// the dispatch floor"). The sk_lookup hook is attached to the network
// namespace, so the baseline pays it too, and it is not part of the
// difference.

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"

	"github.com/shinken-agent/shinken/dataplane"
)

var (
	flagNoDispatch   = flag.Bool("no-dispatch", false, "skip the dispatch contender (programs that return at once, at Shinken's cgroup hooks: the connect ratio's dispatch floor)")
	flagDispatchLess = flag.String("dispatch-less", "", "diagnostic: a second dispatch contender without these hooks (attach type names as cilium/ebpf prints them, comma-separated, e.g. CGroupSockOps): what they cost")
)

// progType is the program type each of Shinken's cgroup attach types takes.
func progType(a ebpf.AttachType) (ebpf.ProgramType, error) {
	switch a {
	case ebpf.AttachCGroupSockOps:
		return ebpf.SockOps, nil
	case ebpf.AttachCGroupInetSockCreate, ebpf.AttachCgroupInetSockRelease, ebpf.AttachCGroupInet4PostBind, ebpf.AttachCGroupInet6PostBind:
		return ebpf.CGroupSock, nil
	case ebpf.AttachCGroupInet4Connect, ebpf.AttachCGroupInet6Connect, ebpf.AttachCGroupUDP4Sendmsg, ebpf.AttachCGroupUDP6Sendmsg,
		ebpf.AttachCGroupUDP4Recvmsg, ebpf.AttachCGroupUDP6Recvmsg, ebpf.AttachCgroupInet4GetPeername, ebpf.AttachCgroupInet6GetPeername:
		return ebpf.CGroupSockAddr, nil
	case ebpf.AttachCGroupInetEgress, ebpf.AttachCGroupInetIngress:
		return ebpf.CGroupSKB, nil
	}
	return 0, fmt.Errorf("dispatch contender: no program type for attach type %v", a)
}

// dispatch is the contender's cgroup and what is attached to it.
type dispatch struct {
	cg    string
	links []link.Link // one per hook
	progs []*ebpf.Program
}

// newDispatch makes the cgroup (below root, named for name) and attaches
// a program that returns 1 at each of the hooks of flow mode m but those
// named in less (it takes them out of less). On an error after the cgroup
// was made it returns the closed contender with the error, for the bench's
// cleanup to remove the cgroup.
func newDispatch(root, name, tag string, m dataplane.FlowMode, less map[string]bool) (*dispatch, error) {
	d := &dispatch{cg: filepath.Join(root, "shinken-bench-"+name+"-"+tag)}
	if err := os.Mkdir(d.cg, 0o755); err != nil {
		return nil, err
	}
	for _, a := range dataplane.CgroupHooks(m) {
		if less[a.String()] {
			delete(less, a.String())
			continue
		}
		t, err := progType(a)
		if err != nil {
			d.close()
			return d, err
		}
		p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "shk_bench_noop", Type: t, AttachType: a, License: "GPL",
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()}})
		if err != nil {
			d.close()
			return d, fmt.Errorf("dispatch contender: load a program for %v: %w", a, err)
		}
		d.progs = append(d.progs, p)
		l, err := link.AttachCgroup(link.CgroupOptions{Path: d.cg, Attach: a, Program: p})
		if err != nil {
			d.close()
			return d, fmt.Errorf("dispatch contender: attach at %v: %w", a, err)
		}
		d.links = append(d.links, l)
	}
	if len(less) > 0 {
		d.close()
		return d, fmt.Errorf("-dispatch-less: %v: not among the hooks of %s mode", less, m)
	}
	return d, nil
}

// close detaches and unloads the programs (the cgroup is removed by the
// bench's cleanup, with its processes).
func (d *dispatch) close() {
	if d == nil {
		return
	}
	for _, l := range d.links {
		l.Close()
	}
	for _, p := range d.progs {
		p.Close()
	}
	d.links, d.progs = nil, nil
}

// setupDispatch makes the dispatch contender and, with -dispatch-less, the
// second one; each is kept for the cleanup as soon as its cgroup exists.
func (b *bench) setupDispatch() error {
	if *flagNoDispatch {
		return nil
	}
	add := func(name string, less map[string]bool, keep **dispatch) error {
		d, err := newDispatch(b.root, name, b.tag, b.dp.FlowMode(), less)
		b.mu.Lock()
		*keep = d
		b.mu.Unlock()
		return err
	}
	if err := add("dispatch", nil, &b.disp); err != nil || *flagDispatchLess == "" {
		return err
	}
	less := map[string]bool{}
	for _, n := range strings.Split(*flagDispatchLess, ",") {
		less[n] = true
	}
	return add("dispatch-less", less, &b.dispLess)
}
