package boundary

import (
	"fmt"
	"unsafe"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// refusedSyscalls are refused with EPERM in every session: each one reaches
// into another process (ptrace, process_vm_*, pidfd_getfd, kcmp), the
// kernel (bpf, perf_event_open, modules, kexec), a shared kernel store
// (keyrings) or a file by handle, bypassing path checks (open_by_handle_at);
// userfaultfd widens kernel races.
var refusedSyscalls = []string{
	"ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp",
	"perf_event_open", "bpf", "userfaultfd", "keyctl", "add_key", "request_key",
	"kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
	"open_by_handle_at",
}

// policy is the session filter: default allow; the syscalls above refused;
// new user namespaces refused unless allowed (unshare and clone check their
// flags; clone3 passes its flags in memory a filter cannot read, so it
// returns ENOSYS and libc and Go fall back to clone).
func policy(allowUserNS bool) seccomp.Policy {
	p := seccomp.Policy{
		DefaultAction: seccomp.ActionAllow,
		Syscalls: []seccomp.SyscallGroup{
			{Names: refusedSyscalls, Action: seccomp.ActionErrno | seccomp.Action(unix.EPERM)},
		},
	}
	if !allowUserNS {
		newUser := seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.BitsSet, Value: unix.CLONE_NEWUSER}}
		p.Syscalls = append(p.Syscalls,
			seccomp.SyscallGroup{Names: []string{"clone3"}, Action: seccomp.ActionErrno | seccomp.Action(unix.ENOSYS)},
			seccomp.SyscallGroup{
				NamesWithCondtions: []seccomp.NameWithConditions{
					{Name: "unshare", Conditions: newUser},
					{Name: "clone", Conditions: newUser},
				},
				Action: seccomp.ActionErrno | seccomp.Action(unix.EPERM),
			})
	}
	return p
}

// filterProgram assembles the filter for the running architecture. The
// library lets a syscall of a foreign architecture (the i386 ABI through
// int 0x80 on amd64, AArch32 on arm64) through to the default action, which
// would number ptrace differently and so skip every rule: three
// instructions in front kill a process that uses a foreign ABI.
func filterProgram(allowUserNS bool) ([]bpf.Instruction, error) {
	info, err := arch.GetInfo("")
	if err != nil {
		return nil, err
	}
	p := policy(allowUserNS)
	body, err := p.Assemble()
	if err != nil {
		return nil, fmt.Errorf("seccomp policy: %w", err)
	}
	prog := []bpf.Instruction{
		bpf.LoadAbsolute{Off: 4, Size: 4}, // seccomp_data.arch
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(info.ID), SkipTrue: 1},
		bpf.RetConstant{Val: unix.SECCOMP_RET_KILL_PROCESS},
	}
	return append(prog, body...), nil
}

// FilterLen is the number of BPF instructions of the session filter.
func FilterLen(allowUserNS bool) (int, error) {
	p, err := filterProgram(allowUserNS)
	return len(p), err
}

// rawFilter is the filter as the kernel takes it, an array of struct
// sock_filter (little-endian: the agent builds for amd64 and arm64), for
// the launcher to install.
func rawFilter(allowUserNS bool) ([]byte, error) {
	insts, err := filterProgram(allowUserNS)
	if err != nil {
		return nil, err
	}
	raw, err := bpf.Assemble(insts)
	if err != nil {
		return nil, fmt.Errorf("seccomp assemble: %w", err)
	}
	out := make([]byte, 0, 8*len(raw))
	for _, r := range raw {
		out = append(out, byte(r.Op), byte(r.Op>>8), r.Jt, r.Jf, byte(r.K), byte(r.K>>8), byte(r.K>>16), byte(r.K>>24))
	}
	return out, nil
}

// seccompAvailable reports whether this kernel takes seccomp filters: the
// GET_ACTION_AVAIL operation of seccomp(2) answers without changing
// anything.
func seccompAvailable() error {
	act := uint32(unix.SECCOMP_RET_ERRNO)
	_, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_GET_ACTION_AVAIL, 0, uintptr(unsafe.Pointer(&act)))
	if errno != 0 {
		return fmt.Errorf("seccomp(GET_ACTION_AVAIL): %w", errno)
	}
	act = unix.SECCOMP_RET_KILL_PROCESS
	if _, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_GET_ACTION_AVAIL, 0, uintptr(unsafe.Pointer(&act))); errno != 0 {
		return fmt.Errorf("seccomp: no SECCOMP_RET_KILL_PROCESS: %w", errno)
	}
	return nil
}
