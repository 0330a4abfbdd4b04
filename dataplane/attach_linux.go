package dataplane

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// The hooks, where each is attached, and in which flow mode.

type progAttach struct {
	name   string
	prog   func(*shkPrograms) *ebpf.Program
	attach ebpf.AttachType
}

// inMode says whether a hook is attached in flow mode m: packet mode checks
// packets (both ways); sweep mode runs no program per packet: it refuses the
// sockets whose packets no other hook sees, and checks new inbound flows in
// sk_lookup, with the port holds of post_bind and sockops. sock_create
// (which also counts each session's sockets), sock_release (which drops
// the counts and the holds) and sockops (which marks accepted connections
// as never counted, bpf/quota.bpf.h) run in both modes: a socket that took
// a hold in sweep mode and closes while an agent runs packet mode must still
// drop it.
func (a progAttach) inMode(m FlowMode) bool {
	switch a.name {
	case "skb_egress", "skb_ingress":
		return m == FlowPacket
	case "post_bind4", "post_bind6", "sk_lookup":
		return m == FlowSweep
	}
	return true
}

// netns says whether the hook is attached to the agent's network namespace
// (sk_lookup) rather than to the sessions' parent cgroup.
func (a progAttach) netns() bool { return a.attach == ebpf.AttachSkLookup }

// The order is the order of attaching, and of replacing programs when an
// agent adopts pinned links: sockops (which marks accepted connections as
// never counted) and sock_release (which honours that mark and the counts an
// older agent kept in socket storage) are replaced before sock_create stops
// keeping a count in storage, so that no socket is counted by one version
// and missed by the other's release (bpf/quota.bpf.h).
var attachments = []progAttach{
	{"sockops", func(p *shkPrograms) *ebpf.Program { return p.ShkSockops }, ebpf.AttachCGroupSockOps},
	{"sock_release", func(p *shkPrograms) *ebpf.Program { return p.ShkSockRelease }, ebpf.AttachCgroupInetSockRelease},
	{"sock_create", func(p *shkPrograms) *ebpf.Program { return p.ShkSockCreate }, ebpf.AttachCGroupInetSockCreate},
	{"connect4", func(p *shkPrograms) *ebpf.Program { return p.ShkConnect4 }, ebpf.AttachCGroupInet4Connect},
	{"connect6", func(p *shkPrograms) *ebpf.Program { return p.ShkConnect6 }, ebpf.AttachCGroupInet6Connect},
	{"sendmsg4", func(p *shkPrograms) *ebpf.Program { return p.ShkSendmsg4 }, ebpf.AttachCGroupUDP4Sendmsg},
	{"sendmsg6", func(p *shkPrograms) *ebpf.Program { return p.ShkSendmsg6 }, ebpf.AttachCGroupUDP6Sendmsg},
	{"skb_egress", func(p *shkPrograms) *ebpf.Program { return p.ShkSkbEgress }, ebpf.AttachCGroupInetEgress},
	{"skb_ingress", func(p *shkPrograms) *ebpf.Program { return p.ShkSkbIngress }, ebpf.AttachCGroupInetIngress},
	{"recvmsg4", func(p *shkPrograms) *ebpf.Program { return p.ShkRecvmsg4 }, ebpf.AttachCGroupUDP4Recvmsg},
	{"recvmsg6", func(p *shkPrograms) *ebpf.Program { return p.ShkRecvmsg6 }, ebpf.AttachCGroupUDP6Recvmsg},
	{"getpeername4", func(p *shkPrograms) *ebpf.Program { return p.ShkGetpeername4 }, ebpf.AttachCgroupInet4GetPeername},
	{"getpeername6", func(p *shkPrograms) *ebpf.Program { return p.ShkGetpeername6 }, ebpf.AttachCgroupInet6GetPeername},
	{"post_bind4", func(p *shkPrograms) *ebpf.Program { return p.ShkPostBind4 }, ebpf.AttachCGroupInet4PostBind},
	{"post_bind6", func(p *shkPrograms) *ebpf.Program { return p.ShkPostBind6 }, ebpf.AttachCGroupInet6PostBind},
	{"sk_lookup", func(p *shkPrograms) *ebpf.Program { return p.ShkSkLookup }, ebpf.AttachSkLookup},
}

func (d *Dataplane) attach() error {
	parentID, err := cgroupID(d.parent)
	if err != nil {
		return err
	}
	used := map[string]bool{}
	for _, a := range attachments {
		if !a.inMode(d.cfg.FlowMode) {
			continue
		}
		used[a.name] = true
		if a.name == "sock_create" && d.markOld {
			// sockops and sock_release are this agent's already;
			// the older sock_create still counts in storage.
			if err := runIter(d.objs.ShkMarkUncounted); err != nil {
				return fmt.Errorf("mark the sockets an older agent did not count: %w", err)
			}
			d.markOld = false
		}
		pin := filepath.Join(d.cfg.PinPath, "links", a.name)
		prog := a.prog(&d.objs.shkPrograms)
		if l, err := link.LoadPinnedLink(pin, nil); err == nil {
			info, err := l.Info()
			if err == nil && !a.netns() {
				if cg := info.Cgroup(); cg != nil && cg.CgroupId != parentID {
					l.Close()
					return fmt.Errorf("pinned link %s is attached to cgroup %d, not the parent %s (%d)", pin, cg.CgroupId, d.parent, parentID)
				}
			}
			if err := l.Update(prog); err != nil {
				l.Close()
				return fmt.Errorf("adopt %s: replace program: %w", a.name, err)
			}
			d.links = append(d.links, l)
			continue
		} else if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("adopt %s: %w", a.name, err)
		}
		var l link.Link
		if a.netns() {
			l, err = attachNetNs(prog)
		} else {
			l, err = link.AttachCgroup(link.CgroupOptions{Path: d.parent, Attach: a.attach, Program: prog})
		}
		if err != nil {
			return fmt.Errorf("attach %s at %s: %w", a.name, d.parent, err)
		}
		if err := l.Pin(pin); err != nil {
			l.Close()
			return fmt.Errorf("pin %s: %w", a.name, err)
		}
		d.links = append(d.links, l)
	}
	if d.cfg.FlowMode == FlowSweep {
		// Sockets made before these hooks hold no port yet; the hooks
		// they were made under (packet mode's ingress) still run.
		if err := d.holdExistingPorts(); err != nil {
			return err
		}
	}
	// Only now, with every hook of this mode in place, let go of the others.
	return d.removeObsoleteLinks(used)
}

// attachedPrograms counts the programs attached at the parent cgroup over all
// of Shinken's hooks (each hook should hold exactly one).
func (d *Dataplane) attachedPrograms() (int, error) {
	fd, err := unix.Open(d.parent, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("open parent cgroup: %w", err)
	}
	defer unix.Close(fd)
	n := 0
	for _, a := range attachments {
		if a.netns() {
			// Other agents' programs may share the namespace: count ours.
			m, err := netnsAttached(a.prog(&d.objs.shkPrograms))
			if err != nil {
				return 0, fmt.Errorf("query %s: %w", a.name, err)
			}
			n += m
			continue
		}
		res, err := link.QueryPrograms(link.QueryOptions{Target: fd, Attach: a.attach})
		if err != nil {
			return 0, fmt.Errorf("query %s: %w", a.name, err)
		}
		n += len(res.Programs)
	}
	return n, nil
}

// The sk_lookup program (sweep mode's inbound check) is attached to the
// network namespace the agent runs in: the kernel runs it for every new
// inbound TCP flow and every datagram to an unconnected UDP socket there,
// and it decides those bound for ports session sockets hold. A session
// socket in another namespace is one the session made itself (with a user
// namespace): only the session's own processes can reach it.

// attachNetNs attaches prog to the calling thread's network namespace.
func attachNetNs(prog *ebpf.Program) (link.Link, error) {
	fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open network namespace: %w", err)
	}
	defer unix.Close(fd)
	return link.AttachNetNs(fd, prog)
}

// netnsAttached counts the attachments of prog to the calling thread's
// network namespace (1 when attached once).
func netnsAttached(prog *ebpf.Program) (int, error) {
	info, err := prog.Info()
	if err != nil {
		return 0, err
	}
	id, ok := info.ID()
	if !ok {
		return 0, fmt.Errorf("program ID unknown")
	}
	fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("open network namespace: %w", err)
	}
	defer unix.Close(fd)
	res, err := link.QueryPrograms(link.QueryOptions{Target: fd, Attach: ebpf.AttachSkLookup})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, p := range res.Programs {
		if p.ID == id {
			n++
		}
	}
	return n, nil
}

// holdExistingPorts has every session socket already listening (TCP) or
// bound and unconnected (UDP) take the hold on its port that sweep mode's
// inbound check needs (shk_hold_tcp|udp, bpf/sweep.bpf.c): sockets made
// under an older agent or in packet mode, which no bind hook saw. Holds
// already taken stay as they are.
func (d *Dataplane) holdExistingPorts() error {
	for _, p := range []*ebpf.Program{d.objs.ShkHoldTcp, d.objs.ShkHoldUdp} {
		if err := runIter(p); err != nil {
			return fmt.Errorf("port holds: %w", err)
		}
	}
	return nil
}

// runIter runs socket iterator p once over every socket of its kind.
func runIter(p *ebpf.Program) error {
	it, err := link.AttachIter(link.IterOptions{Program: p})
	if err != nil {
		return fmt.Errorf("attach iterator: %w", err)
	}
	defer it.Close()
	r, err := it.Open()
	if err != nil {
		return fmt.Errorf("run iterator: %w", err)
	}
	defer r.Close()
	if _, err := io.Copy(io.Discard, r); err != nil {
		return fmt.Errorf("run iterator: %w", err)
	}
	return nil
}

// CgroupHooks lists the cgroup attach types of the hooks Shinken attaches
// at the sessions' parent in flow mode m (sk_lookup, attached to the
// network namespace, is left out), in attaching order. A benchmark attaches
// programs that return at once at the same hooks to measure what their
// dispatch alone costs (bench/egress, the dispatch contender).
func CgroupHooks(m FlowMode) []ebpf.AttachType {
	var out []ebpf.AttachType
	for _, a := range attachments {
		if a.inMode(m) && !a.netns() {
			out = append(out, a.attach)
		}
	}
	return out
}
