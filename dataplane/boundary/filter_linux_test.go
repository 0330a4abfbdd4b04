package boundary

import (
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/elastic/go-seccomp-bpf/arch"
	"github.com/shinken-agent/shinken/agent/backend"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// TestFilterVerdicts runs the assembled filter in a BPF interpreter over
// hand-made seccomp_data: each rule's verdict, and a foreign-architecture
// syscall (i386 ptrace through int 0x80 on amd64) killed rather than let
// through to the default allow.
func TestFilterVerdicts(t *testing.T) {
	native, _ := arch.GetInfo("")
	nr := func(name string) uint32 { return uint32(native.SyscallNames[name]) }
	// struct seccomp_data as the kernel lays it out on a little-endian
	// machine (the low word of an argument first), each 32-bit word
	// written big-endian because the interpreter loads in network order
	// where the kernel loads in host order.
	data := func(auditArch, nr uint32, args ...uint64) []byte {
		b := make([]byte, 64)
		binary.BigEndian.PutUint32(b[0:], nr)
		binary.BigEndian.PutUint32(b[4:], auditArch)
		for i, a := range args {
			binary.BigEndian.PutUint32(b[16+8*i:], uint32(a))
			binary.BigEndian.PutUint32(b[20+8*i:], uint32(a>>32))
		}
		return b
	}
	foreign := uint32(arch.I386.ID)
	if native.ID == arch.AARCH64.ID {
		foreign = uint32(arch.ARM.ID)
	}
	errno := func(e unix.Errno) uint32 { return uint32(unix.SECCOMP_RET_ERRNO | uint32(e)) }
	eperm, enosys, eafnosupport := errno(unix.EPERM), errno(unix.ENOSYS), errno(unix.EAFNOSUPPORT)
	call := func(name string, args ...uint64) []byte { return data(uint32(native.ID), nr(name), args...) }
	type verdict struct {
		what string
		data []byte
		want uint32
	}
	cases := []verdict{
		{"read", call("read"), unix.SECCOMP_RET_ALLOW},
		{"ptrace", call("ptrace"), eperm},
		{"pidfd_getfd", call("pidfd_getfd"), eperm},
		{"process_vm_readv", call("process_vm_readv"), eperm},
		{"bpf", call("bpf"), eperm},
		{"clone (fork)", call("clone", uint64(unix.SIGCHLD)), unix.SECCOMP_RET_ALLOW},
		{"clone CLONE_NEWUSER", call("clone", unix.CLONE_NEWUSER|uint64(unix.SIGCHLD)), eperm},
		{"unshare CLONE_NEWNS", call("unshare", unix.CLONE_NEWNS), unix.SECCOMP_RET_ALLOW},
		{"unshare CLONE_NEWUSER", call("unshare", unix.CLONE_NEWUSER), eperm},
		{"clone3", call("clone3"), enosys},
		{"foreign-ABI syscall 26 (i386 ptrace)", data(foreign, 26, 0), unix.SECCOMP_RET_KILL_PROCESS},
		// Socket families: an allowlist.
		{"socket AF_UNIX", call("socket", unix.AF_UNIX, unix.SOCK_STREAM, 0), unix.SECCOMP_RET_ALLOW},
		{"socket AF_INET", call("socket", unix.AF_INET, unix.SOCK_STREAM, 0), unix.SECCOMP_RET_ALLOW},
		{"socket AF_INET6 UDP", call("socket", unix.AF_INET6, unix.SOCK_DGRAM, unix.IPPROTO_UDP), unix.SECCOMP_RET_ALLOW},
		{"socket AF_NETLINK NETLINK_ROUTE", call("socket", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE), unix.SECCOMP_RET_ALLOW},
		{"socket AF_NETLINK NETLINK_SOCK_DIAG", call("socket", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_SOCK_DIAG), eafnosupport},
		{"socket AF_NETLINK NETLINK_AUDIT", call("socket", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_AUDIT), eafnosupport},
		{"socket AF_NETLINK NETLINK_ROUTE, high bits in the protocol", call("socket", unix.AF_NETLINK, unix.SOCK_RAW, 1<<32), eafnosupport},
		{"socket AF_VSOCK", call("socket", unix.AF_VSOCK, unix.SOCK_STREAM, 0), eafnosupport},
		{"socket AF_PACKET", call("socket", unix.AF_PACKET, unix.SOCK_RAW, 0), eafnosupport},
		{"socket AF_ALG", call("socket", unix.AF_ALG, unix.SOCK_SEQPACKET, 0), eafnosupport},
		{"socket AF_UNSPEC", call("socket", unix.AF_UNSPEC, unix.SOCK_STREAM, 0), eafnosupport},
		{"socket AF_VSOCK spelled AF_INET in the low word (high bits set)", call("socket", 1<<32|unix.AF_INET, unix.SOCK_STREAM, 0), eafnosupport},
		{"socketpair AF_UNIX", call("socketpair", unix.AF_UNIX, unix.SOCK_STREAM, 0), unix.SECCOMP_RET_ALLOW},
		{"socketpair AF_VSOCK", call("socketpair", unix.AF_VSOCK, unix.SOCK_STREAM, 0), eafnosupport},
		{"socketpair AF_NETLINK NETLINK_SOCK_DIAG", call("socketpair", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_SOCK_DIAG), eafnosupport},
		// io_uring and the mount API.
		{"io_uring_setup", call("io_uring_setup"), enosys},
		{"io_uring_enter", call("io_uring_enter"), enosys},
		{"io_uring_register", call("io_uring_register"), enosys},
	}
	for _, m := range refusedMounts {
		cases = append(cases, verdict{m, call(m), eperm})
	}
	run := func(o filterOptions, cases []verdict) {
		t.Helper()
		prog, err := filterProgram(o)
		if err != nil {
			t.Fatal(err)
		}
		vm, err := bpf.NewVM(prog)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cases {
			got, err := vm.Run(c.data)
			if err != nil {
				t.Fatal(err)
			}
			if uint32(got) != c.want {
				t.Errorf("%+v: %s: verdict %#x, want %#x", o, c.what, uint32(got), c.want)
			} else {
				t.Logf("verified (%+v): %s -> %#x", o, c.what, c.want)
			}
		}
		t.Logf("filter (%+v): %d instructions", o, len(prog))
	}
	run(filterOptions{}, cases)
	// The operator's knobs loosen their rules and nothing else.
	run(filterOptions{allowIOURing: true}, []verdict{
		{"io_uring_setup", call("io_uring_setup"), unix.SECCOMP_RET_ALLOW},
		{"io_uring_enter", call("io_uring_enter"), unix.SECCOMP_RET_ALLOW},
		{"socket AF_VSOCK", call("socket", unix.AF_VSOCK, unix.SOCK_STREAM, 0), eafnosupport},
		{"fsopen", call("fsopen"), eperm},
		{"clone3", call("clone3"), enosys},
	})
	run(filterOptions{allowUserNS: true}, []verdict{
		{"unshare CLONE_NEWUSER", call("unshare", unix.CLONE_NEWUSER), unix.SECCOMP_RET_ALLOW},
		{"clone3", call("clone3"), unix.SECCOMP_RET_ALLOW},
		{"io_uring_setup", call("io_uring_setup"), enosys},
		{"mount", call("mount"), eperm},
	})
}

const i386Src = `package main

import (
	"fmt"
	"syscall"
)

func main() {
	_, _, e := syscall.RawSyscall(syscall.SYS_PTRACE, syscall.PTRACE_TRACEME, 0, 0)
	fmt.Println("i386 ptrace(PTRACE_TRACEME) errno:", e)
}
`

// TestForeignABIKilled: a 32-bit x86 program (its syscalls enter through
// the i386 ABI, numbered differently) runs on the host, but in a session
// the filter kills it at its first syscall instead of letting its ptrace
// through.
func TestForeignABIKilled(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the foreign ABI built here is i386")
	}
	b := newBoundary(t, Config{}, nil)
	session(t, b, "abi", 61)
	src := filepath.Join(helperDir, "i386.go")
	bin := filepath.Join(helperDir, "i386")
	if err := os.WriteFile(src, []byte(i386Src), 0o644); err != nil {
		t.Fatal(err)
	}
	build := exec.Command("go", "build", "-o", bin, src)
	build.Env = append(os.Environ(), "GOARCH=386", "CGO_ENABLED=0", "GOFLAGS=", "GO111MODULE=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Skipf("cannot build an i386 program here: %v %s", err, out)
	}
	if out, err := exec.Command(bin).CombinedOutput(); err != nil {
		t.Skipf("this kernel runs no i386 programs (IA32 emulation off?): %v %s", err, out)
	} else {
		t.Logf("on the host: %s", strings.TrimSpace(string(out)))
	}
	cmd := &exec.Cmd{Path: bin, Args: []string{"i386"}, Dir: "/"}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := b.Launch("abi", cmd, LaunchOptions{}, false); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGSYS {
		t.Fatalf("i386 program in a session: %v, output %q; want killed by SIGSYS", err, out.String())
	}
	t.Logf("verified: in a session the i386 program is killed by SIGSYS at its first syscall (output %q)", out.String())
}

// TestSessionSyscalls (issue 22, build item 4): inside a session,
// socket() makes AF_UNIX, AF_INET, AF_INET6 and NETLINK_ROUTE sockets only
// (AF_VSOCK, NETLINK_SOCK_DIAG, AF_PACKET: EAFNOSUPPORT), io_uring_setup
// returns ENOSYS and the mount API EPERM; on the host, outside any
// session, the same program gets every one of them (so the test can
// fail). With Config.AllowIOURing, io_uring works in the session and the
// report's io_uring row says it is not refused.
func TestSessionSyscalls(t *testing.T) {
	b := newBoundary(t, Config{}, nil)
	host := helper("syscalls", nil)
	out, err := host.CombinedOutput()
	if err != nil {
		t.Fatalf("on the host: %v %s", err, out)
	}
	hostRes := results(string(out))
	t.Logf("on the host:\n%s", out)
	for _, op := range []string{"af_vsock", "netlink_sock_diag", "io_uring_setup", "open_tree"} {
		if !strings.HasPrefix(hostRes[op], "ok=true") {
			t.Errorf("on the host %s: %s (this kernel cannot show the filter refusing it)", op, hostRes[op])
		}
	}
	const (
		eafnosupport = "ok=false err=address family not supported by protocol"
		enosys       = "ok=false err=function not implemented"
		eperm        = "ok=false err=operation not permitted"
	)
	want := map[string]string{
		"af_inet": "ok=true", "af_inet6": "ok=true", "af_unix": "ok=true", "netlink_route": "ok=true",
		"socketpair_unix": "ok=true", "interfaces": "ok=true",
		"af_vsock": eafnosupport, "netlink_sock_diag": eafnosupport, "af_packet": eafnosupport,
		"socketpair_vsock": eafnosupport, "io_uring_setup": enosys, "open_tree": eperm,
	}
	check := func(b *Boundary, name string, index uint32, want map[string]string) {
		t.Helper()
		session(t, b, name, index)
		out := runIn(t, b, name, helper("syscalls", nil), true)
		res := results(out)
		for op, w := range want {
			if !strings.HasPrefix(res[op], w) {
				t.Errorf("%s: in a session %s: %q, want %q", name, op, res[op], w)
			} else {
				t.Logf("verified: %s: in a session %s: %s", name, op, res[op])
			}
		}
	}
	check(b, "sys", 91, want)

	ur := newBoundary(t, Config{AllowIOURing: true}, nil)
	if err := ur.Ready(); err != nil {
		t.Fatalf("io_uring allowed by the config: %v", err)
	}
	for _, r := range ur.Report() {
		if r.Class == MechIOURing && (r.Level != backend.Unavailable || !strings.Contains(r.Reason, "IORING_OP_SOCKET")) {
			t.Errorf("io_uring allowed: reported %s %q", r.Level, r.Reason)
		}
	}
	check(ur, "sys-uring", 92, map[string]string{"io_uring_setup": "ok=true", "af_vsock": eafnosupport, "open_tree": eperm})
}
