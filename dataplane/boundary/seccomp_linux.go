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

// refusedMounts are the mount API, refused with EPERM: without
// capabilities every one of them fails anyway, but they become live the day
// a session may hold capabilities in a user namespace of its own
// (Config.AllowUserNS), and a filter that names them keeps it that way.
var refusedMounts = []string{
	"mount", "umount2", "pivot_root", "fsopen", "fsconfig", "fsmount", "fspick",
	"move_mount", "open_tree", "open_tree_attr", "mount_setattr",
}

// setIDModes are the mode arguments (argument index by syscall) that
// could make a set-user-ID or set-group-ID file: refused with EPERM when
// the mode has S_ISUID or S_ISGID. A session writes its workspace and
// granted roots through mounts that show their owner (root, often) as the
// session's uid: without this rule it could chmod u+s a file it made there
// and leave the host a setuid-root program (the mounts are nosuid in the
// session's view, not on the host). openat2 passes its mode in memory a
// filter cannot read: it returns ENOSYS (libc and Go do not use it for
// open). Names the running architecture lacks (open, creat on arm64) are
// skipped.
var setIDModes = []struct {
	name string
	arg  uint32
}{
	{"chmod", 1}, {"fchmod", 1}, {"fchmodat", 2}, {"fchmodat2", 2},
	{"open", 2}, {"openat", 3}, {"creat", 1},
	{"mkdir", 1}, {"mkdirat", 2}, {"mknod", 1}, {"mknodat", 2},
}

func setIDRules(names map[string]int) []seccomp.NameWithConditions {
	var out []seccomp.NameWithConditions
	for _, m := range setIDModes {
		if _, ok := names[m.name]; !ok {
			continue
		}
		out = append(out, seccomp.NameWithConditions{Name: m.name, Conditions: seccomp.ArgumentConditions{
			{Argument: m.arg, Operation: seccomp.BitsSet, Value: unix.S_ISUID | unix.S_ISGID}}})
	}
	return out
}

// ioURingSyscalls are refused with ENOSYS (a kernel without io_uring, which
// programs fall back from) unless the operator allows io_uring: its
// operations reach the kernel without a system call the filter sees
// (IORING_OP_SOCKET makes a socket of any family, for one), so each
// syscall refused here would need an opcode refused there too.
var ioURingSyscalls = []string{"io_uring_setup", "io_uring_enter", "io_uring_register"}

// Socket families a session may create (socket, socketpair); every other
// family is refused with EAFNOSUPPORT, as a kernel without it answers.
// AF_NETLINK only with protocol NETLINK_ROUTE (interfaces, addresses and
// routes, read by getifaddrs and getaddrinfo); its other protocols
// (NETLINK_SOCK_DIAG lists the host's sockets, audit, uevents, generic
// netlink families) are refused.
const (
	afUnix, afInet, afInet6, afNetlink = unix.AF_UNIX, unix.AF_INET, unix.AF_INET6, unix.AF_NETLINK
	netlinkRoute                       = unix.NETLINK_ROUTE
)

// socketFamilies are the socket rules: the refusals' conditions. Each
// argument is compared as 64 bits, so a value with stray high bits (the
// kernel reads an int) differs from every allowed family and is refused.
func socketFamilies() []seccomp.NameWithConditions {
	other := seccomp.ArgumentConditions{
		{Argument: 0, Operation: seccomp.NotEqual, Value: afUnix},
		{Argument: 0, Operation: seccomp.NotEqual, Value: afInet},
		{Argument: 0, Operation: seccomp.NotEqual, Value: afInet6},
		{Argument: 0, Operation: seccomp.NotEqual, Value: afNetlink},
	}
	netlink := seccomp.ArgumentConditions{
		{Argument: 0, Operation: seccomp.Equal, Value: afNetlink},
		{Argument: 2, Operation: seccomp.NotEqual, Value: netlinkRoute},
	}
	var out []seccomp.NameWithConditions
	for _, name := range []string{"socket", "socketpair"} {
		out = append(out, seccomp.NameWithConditions{Name: name, Conditions: other},
			seccomp.NameWithConditions{Name: name, Conditions: netlink})
	}
	return out
}

// filterOptions are what the operator may loosen (Config).
type filterOptions struct {
	allowUserNS, allowIOURing bool
}

func (c Config) filterOptions() filterOptions {
	return filterOptions{allowUserNS: c.AllowUserNS, allowIOURing: c.AllowIOURing}
}

// policy is the session filter: default allow; the syscalls above refused
// (the mount API, and io_uring unless allowed); socket families outside the
// allowlist refused; new user namespaces refused unless allowed (unshare
// and clone check their flags; clone3 passes its flags in memory a filter
// cannot read, so it returns ENOSYS and libc and Go fall back to clone).
func policy(o filterOptions) seccomp.Policy {
	eperm := seccomp.ActionErrno | seccomp.Action(unix.EPERM)
	p := seccomp.Policy{
		DefaultAction: seccomp.ActionAllow,
		Syscalls: []seccomp.SyscallGroup{
			{Names: append(append([]string(nil), refusedSyscalls...), refusedMounts...), Action: eperm},
			{NamesWithCondtions: socketFamilies(), Action: seccomp.ActionErrno | seccomp.Action(unix.EAFNOSUPPORT)},
		},
	}
	if info, err := arch.GetInfo(""); err == nil {
		p.Syscalls = append(p.Syscalls, seccomp.SyscallGroup{NamesWithCondtions: setIDRules(info.SyscallNames), Action: eperm})
	}
	enosys := []string{"openat2"}
	if !o.allowIOURing {
		enosys = append(enosys, ioURingSyscalls...)
	}
	if !o.allowUserNS {
		enosys = append(enosys, "clone3")
		newUser := seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.BitsSet, Value: unix.CLONE_NEWUSER}}
		p.Syscalls = append(p.Syscalls,
			seccomp.SyscallGroup{
				NamesWithCondtions: []seccomp.NameWithConditions{
					{Name: "unshare", Conditions: newUser},
					{Name: "clone", Conditions: newUser},
				},
				Action: eperm,
			})
	}
	if len(enosys) > 0 {
		p.Syscalls = append(p.Syscalls, seccomp.SyscallGroup{Names: enosys, Action: seccomp.ActionErrno | seccomp.Action(unix.ENOSYS)})
	}
	return p
}

// filterProgram assembles the filter for the running architecture. The
// library lets a syscall of a foreign architecture (the i386 ABI through
// int 0x80 on amd64, AArch32 on arm64) through to the default action, which
// would number ptrace differently and so skip every rule: three
// instructions in front kill a process that uses a foreign ABI.
func filterProgram(o filterOptions) ([]bpf.Instruction, error) {
	info, err := arch.GetInfo("")
	if err != nil {
		return nil, err
	}
	p := policy(o)
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

// FilterLen is the number of BPF instructions of the session filter with
// io_uring refused (the default); Boundary.FilterLen is that of the filter
// a boundary installs.
func FilterLen(allowUserNS bool) (int, error) {
	p, err := filterProgram(filterOptions{allowUserNS: allowUserNS})
	return len(p), err
}

// rawFilter is the filter as the kernel takes it, an array of struct
// sock_filter (little-endian: the agent builds for amd64 and arm64), for
// the launcher to install.
func rawFilter(o filterOptions) ([]byte, error) {
	insts, err := filterProgram(o)
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
