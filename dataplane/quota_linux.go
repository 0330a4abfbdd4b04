package dataplane

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/shinken-agent/shinken/agent/backend"
)

// The per-session socket and port-hold counts (bpf/quota.bpf.h): the kernel
// makes a session's entry with its first socket and keeps it current; user
// space only reads it and deletes it with the session.

// How the socket count finds a socket's session (bpf/quota.bpf.h): its
// programs read the socket's cgroup with plain loads where the kernel has
// the bpf_cast_to_kern_ctx kfunc (Linux 6.2+; a weak kfunc, so the same
// object loads without it), else with bpf_probe_read_kernel, which the
// kernel gives only to a loader with CAP_PERFMON (or CAP_SYS_ADMIN) and
// without a lockdown of kernel reads. Where it does not, shk_sock_create and
// shk_sock_release are loaded from their _stored variants, which keep every
// count in socket storage (an allocation per session socket, about 1 µs per
// socket() here) and count to the creating task's session; the probe rows
// say which, and why.

// chooseSocketCount probes bpf_probe_read_kernel for cgroup/sock programs
// and, where it is missing, puts the storage fallback in spec.
func (d *Dataplane) chooseSocketCount(spec *ebpf.CollectionSpec) {
	d.sockRead = probeSockRead()
	d.sockKern, _ = kernelHasKfunc("bpf_cast_to_kern_ctx") // unreadable BTF: the programs' own loads would fail too
	if d.cfg.storedCount {
		d.sockRead = errors.New("the storage fallback was asked for")
	}
	if d.sockRead == nil {
		return
	}
	for _, name := range []string{"shk_sock_create", "shk_sock_release"} {
		alt := spec.Programs[name+"_stored"].Copy()
		alt.Name = name
		spec.Programs[name] = alt
	}
}

// probeSockRead loads a cgroup/sock_create program that reads 8 bytes of
// its socket with bpf_probe_read_kernel, as the socket count's programs do
// (at an offset from the context); nil when the kernel takes it.
func probeSockRead() error {
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R3, asm.R1),
		asm.Add.Imm(asm.R3, 8),
		asm.Mov.Reg(asm.R1, asm.RFP),
		asm.Add.Imm(asm.R1, -8),
		asm.Mov.Imm(asm.R2, 8),
		asm.FnProbeReadKernel.Call(),
		asm.Mov.Imm(asm.R0, 1),
		asm.Return(),
	}
	p, err := ebpf.NewProgramWithOptions(&ebpf.ProgramSpec{
		Name: "shk_probe_read", Type: ebpf.CGroupSock, AttachType: ebpf.AttachCGroupInetSockCreate,
		Instructions: insns, License: "Dual BSD/GPL",
	}, ebpf.ProgramOptions{LogDisabled: true})
	if err != nil {
		return fmt.Errorf("bpf_probe_read_kernel in a cgroup/sock program: %w", err)
	}
	return p.Close()
}

// SocketUse is what one session holds of the host's shared socket resources.
type SocketUse struct {
	Sockets int32 // inet sockets it created and has not released
	Ports   int32 // port holds of its sockets (sweep mode)
}

// SocketUse reads the counts of a session (zero before its first socket).
func (d *Dataplane) SocketUse(session string) (SocketUse, error) {
	s, err := d.Session(session)
	if err != nil {
		return SocketUse{}, err
	}
	var q shkShkQuota
	if err := d.objs.ShkQuotas.Lookup(s.CgroupID, &q); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return SocketUse{}, nil
		}
		return SocketUse{}, fmt.Errorf("read socket use of %s: %w", session, err)
	}
	return SocketUse{Sockets: q.Socks, Ports: q.Ports}, nil
}

// dropQuota deletes the counts of a session cgroup gone.
func (d *Dataplane) dropQuota(cgid uint64) error {
	if err := d.objs.ShkQuotas.Delete(cgid); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("drop socket counts of cgroup %d: %w", cgid, err)
	}
	return nil
}

// pruneQuotas deletes the counts of every cgroup that is no session any
// more (sessions removed while no agent ran); d.sessions is current.
func (d *Dataplane) pruneQuotas() error {
	live := map[uint64]bool{}
	for _, s := range d.sessions {
		live[s.CgroupID] = true
	}
	var (
		cgid  uint64
		q     shkShkQuota
		stale []uint64
	)
	it := d.objs.ShkQuotas.Iterate()
	for it.Next(&cgid, &q) {
		if !live[cgid] {
			stale = append(stale, cgid)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read socket counts: %w", err)
	}
	for _, id := range stale {
		if err := d.dropQuota(id); err != nil {
			return err
		}
	}
	return nil
}

// quotaRows are the probe rows of the socket and port limits: how they are
// enforced, and what they do not count.
func (d *Dataplane) quotaRows() []backend.Strength {
	socks := backend.Strength{Class: "sockets", Level: backend.RevocableInKernel,
		Mechanism: fmt.Sprintf("BPF cgroup/sock_create counts each inet socket (TCP, UDP, every inet type) a session task creates, cgroup/sock_release uncounts it; past %d open per session socket() fails with EPERM (reason socket_limit); counted to the session it was made in wherever its descriptor goes (SCM_RIGHTS) or its task moves", d.cfg.MaxSocketsPerSession),
		Reason:    "not counted: AF_UNIX and other non-inet sockets and socketpairs (cgroup/sock_create runs for inet sockets only: bounded by RLIMIT_NOFILE per process and RLIMIT_NPROC), connections accepted from a session listener (no sock_create; marked not counted at sockops PASSIVE_ESTABLISHED_CB), sockets made before the task joined the session (counted where they were made) or while no hook was attached"}
	if d.sockRead == nil {
		how := "bpf_probe_read_kernel"
		if d.sockKern {
			how = "plain loads through bpf_cast_to_kern_ctx"
		}
		socks.Mechanism += "; TCP and UDP sockets counted with no per-socket state, to the session of the socket's own cgroup (read with " + how + "), other kinds in socket storage"
	} else {
		socks.Mechanism += fmt.Sprintf("; fallback: every count kept in socket storage (one allocation per socket), to the creating task's session, because %v", d.sockRead)
	}
	ports := backend.Strength{Class: "ports", Level: backend.RevocableInKernel,
		Mechanism: fmt.Sprintf("sweep mode: each bound, listening or unconnected-sending session socket holds its port (ports.bpf.h); past %d holds per session bind() and the unconnected send fail with EPERM (reason port_limit); a listen on an autobound port (which sockops cannot refuse) and a socket held when the hooks are attached are counted but never refused, since a listener without a hold would be unchecked; those, and a connected socket's local port, are bounded by the socket limit (%d)", d.cfg.MaxPortsPerSession, d.cfg.MaxSocketsPerSession),
		Reason:    "TCP connects share local ports across destinations, UDP connects take one each: a session can hold at most its socket limit of the host's ephemeral range; many sessions together can still exhaust it"}
	if d.cfg.FlowMode != FlowSweep {
		ports.Mechanism = fmt.Sprintf("packet mode keeps no port holds: a session's local ports are bounded by its socket limit only (%d, one port per socket at most)", d.cfg.MaxSocketsPerSession)
	}
	return []backend.Strength{socks, ports}
}
