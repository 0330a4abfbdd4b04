package dnsresolver

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"
)

// The steering program (BPF_PROG_TYPE_SK_REUSEPORT, attached to the UDP
// group with SO_ATTACH_REUSEPORT_EBPF) picks the socket of each datagram the
// kernel delivers to the group, in the context of the sender's send: for a
// session on loopback that is the session's own system call, on its own CPU
// time. It reads the destination address (the session address) and:
//
//   - a session not in the penalty box: socket (address mod UDPSockets);
//   - a session in the penalty box (the box map, kept by penaltyBox.steer):
//     at most steerLimit(QueryRate) datagrams per steerWindow go to the
//     penalty socket, to be read and answered within the session's bucket;
//     the rest go to the sink, a member of the group that is never read
//     and whose receive queue holds a few datagrams: the kernel drops them
//     there (the host's UDP RcvbufErrors counter), before any worker of the
//     agent spends time on them. The program counts them per session in the
//     box map; the resolver's maintain loop reads the counts
//     (Counters.KernelDropped) and keeps a session that still floods in the
//     box.
//
// Why a sink and not SK_DROP: a datagram the program drops finds no socket,
// and the kernel answers it with an ICMP port unreachable, charged to the
// host's global ICMP rate limit (net.ipv4.icmp_msgs_per_sec), which a
// flooder would then take from every other sender on the host.
//
// Without the limit, the penalty socket's worker read and dropped every
// datagram over the rate: about 80 % of one CPU of the agent's, at the
// agent's CPU weight, for one flooding session (bench/README.md,
// "Twenty-eighth session").
const (
	steerWindow = 100 * time.Millisecond
	// boxEntrySize is the box map's value: struct { u64 window; u64 count;
	// u64 drops; u64 limit }.
	boxEntrySize = 32
)

// steerLimit is the datagrams a penalised session may have delivered per
// steerWindow: its query rate over the window, at least one.
func steerLimit(rate int) uint64 {
	if rate <= 0 {
		return 1 << 62 // no rate: never dropped
	}
	return max(uint64(rate)*uint64(steerWindow)/uint64(time.Second), 1)
}

type boxEntry struct {
	Window, Count, Drops, Limit uint64
}

// steering is the attached program and its maps.
type steering struct {
	prog  *ebpf.Program
	socks *ebpf.Map // REUSEPORT_SOCKARRAY: the group's sockets, the penalty socket, the sink
	box   *ebpf.Map // HASH: session index -> boxEntry
	sink  *udpSocket
	limit uint64

	mu      sync.Mutex
	seen    map[uint32]uint64 // drops already reported, per box member
	pending map[uint32]uint64 // drops of members that left the box, not yet reported
}

// steerProgram is the program for a group of n sockets (then the penalty
// socket at index n and the sink at n+1).
func steerProgram(n int, socks, box *ebpf.Map) asm.Instructions {
	const (
		keyOff   = -4 // u32 key on the stack
		addrOff  = -8 // u32 destination address on the stack
		hdrStart = 1  // BPF_HDR_START_NET
		skPass   = 1
	)
	return asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		// The destination address: 4 bytes at offset 16 of the IPv4 header.
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Imm(asm.R2, 16),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, addrOff),
		asm.Mov.Imm(asm.R4, 4),
		asm.Mov.Imm(asm.R5, hdrStart),
		asm.FnSkbLoadBytesRelative.Call(),
		asm.JNE.Imm(asm.R0, 0, "pass"),
		asm.LoadMem(asm.R7, asm.RFP, addrOff, asm.Word),
		asm.HostTo(asm.BE, asm.R7, asm.Word),
		// A session address? Its index is the key of the box map.
		asm.Mov.Reg(asm.R8, asm.R7),
		asm.And.Imm32(asm.R8, int32(int64(sessionMask)-1<<32)), // the mask as a signed immediate
		asm.JNE.Imm32(asm.R8, int32(sessionBase), "spread"),
		asm.Mov.Reg(asm.R8, asm.R7),
		asm.And.Imm32(asm.R8, int32(^sessionMask)),
		asm.StoreMem(asm.RFP, keyOff, asm.R8, asm.Word),
		asm.LoadMapPtr(asm.R1, box.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, keyOff),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "spread"),
		asm.Mov.Reg(asm.R9, asm.R0),
		// In the box: count the datagram in the current window.
		asm.FnKtimeGetCoarseNs.Call(),
		asm.Div.Imm(asm.R0, int32(steerWindow)),
		asm.LoadMem(asm.R1, asm.R9, 0, asm.DWord),
		asm.JEq.Reg(asm.R1, asm.R0, "count"),
		asm.StoreMem(asm.R9, 0, asm.R0, asm.DWord),
		asm.Mov.Imm(asm.R1, 0),
		asm.StoreMem(asm.R9, 8, asm.R1, asm.DWord),
		asm.Mov.Imm(asm.R1, 1).WithSymbol("count"),
		asm.AddAtomic.Mem(asm.R9, asm.R1, asm.DWord, 8),
		asm.LoadMem(asm.R1, asm.R9, 8, asm.DWord),
		asm.LoadMem(asm.R2, asm.R9, 24, asm.DWord),
		asm.JGT.Reg(asm.R1, asm.R2, "drop"),
		asm.StoreImm(asm.RFP, keyOff, int64(n), asm.Word),
		asm.Ja.Label("select"),
		// Over the window's limit: count it, and send it to the sink.
		asm.Mov.Imm(asm.R1, 1).WithSymbol("drop"),
		asm.AddAtomic.Mem(asm.R9, asm.R1, asm.DWord, 16),
		asm.StoreImm(asm.RFP, keyOff, int64(n+1), asm.Word),
		asm.Ja.Label("select"),
		// Any other session: socket (address mod n).
		asm.Mod.Imm32(asm.R7, int32(n)).WithSymbol("spread"),
		asm.StoreMem(asm.RFP, keyOff, asm.R7, asm.Word),
		asm.Mov.Reg(asm.R1, asm.R6).WithSymbol("select"),
		asm.LoadMapPtr(asm.R2, socks.FD()),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, keyOff),
		asm.Mov.Imm(asm.R4, 0),
		asm.FnSkSelectReuseport.Call(),
		// SK_PASS: the selected socket, or the kernel's hash when the
		// selection failed (no socket at that index).
		asm.Mov.Imm(asm.R0, skPass).WithSymbol("pass"),
		asm.Return(),
	}
}

// attachSteering loads the program for the group, attaches it, and adds
// the sink to the group. On error nothing is attached and the group is as
// it was (no sink): the kernel spreads datagrams by its hash.
func (g *udpGroup) attachSteering(rate int) (err error) {
	n := len(g.socks) - 1
	s := &steering{limit: steerLimit(rate), seen: map[uint32]uint64{}, pending: map[uint32]uint64{}}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	s.socks, err = ebpf.NewMap(&ebpf.MapSpec{Name: "shk_dns_socks", Type: ebpf.ReusePortSockArray, KeySize: 4, ValueSize: 8, MaxEntries: uint32(n + 2)})
	if err != nil {
		return fmt.Errorf("socket array: %w", err)
	}
	s.box, err = ebpf.NewMap(&ebpf.MapSpec{Name: "shk_dns_box", Type: ebpf.Hash, KeySize: 4, ValueSize: boxEntrySize, MaxEntries: maxPenalised})
	if err != nil {
		return fmt.Errorf("box map: %w", err)
	}
	s.prog, err = ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "shk_dns_steer", Type: ebpf.SkReuseport, License: "GPL",
		Instructions: steerProgram(n, s.socks, s.box),
	})
	if err != nil {
		return fmt.Errorf("load: %w", err)
	}
	for i, u := range g.socks {
		if err := s.socks.Put(uint32(i), uint64(u.fd)); err != nil {
			return fmt.Errorf("socket %d into the array: %w", i, err)
		}
	}
	if err := unix.SetsockoptInt(g.socks[0].fd, unix.SOL_SOCKET, unix.SO_ATTACH_REUSEPORT_EBPF, s.prog.FD()); err != nil {
		return fmt.Errorf("SO_ATTACH_REUSEPORT_EBPF: %w", err)
	}
	// The sink joins the group only now: before the program, the kernel's
	// hash could have picked it for any datagram. Until it is in the
	// array, a datagram over the limit finds no socket at its index and
	// the kernel's hash picks one of the others.
	s.sink, err = listenUDP(g.addr, true)
	if err != nil {
		return g.detach(fmt.Errorf("sink: %w", err))
	}
	// The smallest receive queue the kernel allows: a few datagrams.
	if err := unix.SetsockoptInt(s.sink.fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 0); err != nil {
		return g.detach(fmt.Errorf("sink SO_RCVBUF: %w", err))
	}
	if err := s.socks.Put(uint32(n+1), uint64(s.sink.fd)); err != nil {
		return g.detach(fmt.Errorf("sink into the array: %w", err))
	}
	g.steering = s
	return nil
}

// detach takes the program off the group (after a failed attachSteering)
// and returns err.
func (g *udpGroup) detach(err error) error {
	if derr := unix.SetsockoptInt(g.socks[0].fd, unix.SOL_SOCKET, unix.SO_DETACH_REUSEPORT_BPF, 0); derr != nil {
		return errors.Join(err, fmt.Errorf("SO_DETACH_REUSEPORT_BPF: %w", derr))
	}
	return err
}

// steer makes the box map hold exactly the sessions in penalised; a session
// that leaves keeps its drops, reported at the next drops call.
func (g *udpGroup) steer(penalised []uint32) error {
	s := g.steering
	if s == nil {
		return errors.New("no steering program attached")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	want := map[uint32]bool{}
	var errs []error
	for _, idx := range penalised {
		want[idx] = true
		if _, ok := s.seen[idx]; ok {
			continue
		}
		if err := s.box.Update(idx, boxEntry{Limit: s.limit}, ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
			errs = append(errs, fmt.Errorf("box: add %d: %w", idx, err))
			continue
		}
		s.seen[idx] = 0
	}
	for _, idx := range slices.Sorted(maps.Keys(s.seen)) {
		if want[idx] {
			continue
		}
		var e boxEntry
		if err := s.box.Lookup(idx, &e); err == nil && e.Drops > s.seen[idx] {
			s.pending[idx] += e.Drops - s.seen[idx]
		}
		if err := s.box.Delete(idx); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("box: remove %d: %w", idx, err))
			continue
		}
		delete(s.seen, idx)
	}
	return errors.Join(errs...)
}

// kernelDrops returns, per session index, the datagrams the program sent to
// the sink since the last call.
func (g *udpGroup) kernelDrops() map[uint32]uint64 {
	s := g.steering
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.pending
	s.pending = map[uint32]uint64{}
	for idx, seen := range s.seen {
		var e boxEntry
		if err := s.box.Lookup(idx, &e); err != nil || e.Drops <= seen {
			continue
		}
		out[idx] += e.Drops - seen
		s.seen[idx] = e.Drops
	}
	return out
}

func (s *steering) close() error {
	var errs []error
	if s.sink != nil {
		errs = append(errs, s.sink.close())
	}
	if s.prog != nil {
		errs = append(errs, s.prog.Close())
	}
	if s.socks != nil {
		errs = append(errs, s.socks.Close())
	}
	if s.box != nil {
		errs = append(errs, s.box.Close())
	}
	return errors.Join(errs...)
}
