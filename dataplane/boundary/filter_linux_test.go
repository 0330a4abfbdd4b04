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
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// TestFilterVerdicts runs the assembled filter in a BPF interpreter over
// hand-made seccomp_data: each rule's verdict, and a foreign-architecture
// syscall (i386 ptrace through int 0x80 on amd64) killed rather than let
// through to the default allow.
func TestFilterVerdicts(t *testing.T) {
	prog, err := filterProgram(false)
	if err != nil {
		t.Fatal(err)
	}
	vm, err := bpf.NewVM(prog)
	if err != nil {
		t.Fatal(err)
	}
	native, _ := arch.GetInfo("")
	nr := func(name string) uint32 { return uint32(native.SyscallNames[name]) }
	// struct seccomp_data as the kernel lays it out on a little-endian
	// machine (the low word of an argument first), each 32-bit word
	// written big-endian because the interpreter loads in network order
	// where the kernel loads in host order.
	data := func(auditArch, nr uint32, arg0 uint64) []byte {
		b := make([]byte, 64)
		binary.BigEndian.PutUint32(b[0:], nr)
		binary.BigEndian.PutUint32(b[4:], auditArch)
		binary.BigEndian.PutUint32(b[16:], uint32(arg0))
		binary.BigEndian.PutUint32(b[20:], uint32(arg0>>32))
		return b
	}
	foreign := uint32(arch.I386.ID)
	if native.ID == arch.AARCH64.ID {
		foreign = uint32(arch.ARM.ID)
	}
	eperm, enosys := uint32(unix.SECCOMP_RET_ERRNO|uint32(unix.EPERM)), uint32(unix.SECCOMP_RET_ERRNO|uint32(unix.ENOSYS))
	cases := []struct {
		what string
		data []byte
		want uint32
	}{
		{"read", data(uint32(native.ID), nr("read"), 0), unix.SECCOMP_RET_ALLOW},
		{"ptrace", data(uint32(native.ID), nr("ptrace"), 0), eperm},
		{"pidfd_getfd", data(uint32(native.ID), nr("pidfd_getfd"), 0), eperm},
		{"process_vm_readv", data(uint32(native.ID), nr("process_vm_readv"), 0), eperm},
		{"bpf", data(uint32(native.ID), nr("bpf"), 0), eperm},
		{"clone (fork)", data(uint32(native.ID), nr("clone"), uint64(unix.SIGCHLD)), unix.SECCOMP_RET_ALLOW},
		{"clone CLONE_NEWUSER", data(uint32(native.ID), nr("clone"), unix.CLONE_NEWUSER|uint64(unix.SIGCHLD)), eperm},
		{"unshare CLONE_NEWNS", data(uint32(native.ID), nr("unshare"), unix.CLONE_NEWNS), unix.SECCOMP_RET_ALLOW},
		{"unshare CLONE_NEWUSER", data(uint32(native.ID), nr("unshare"), unix.CLONE_NEWUSER), eperm},
		{"clone3", data(uint32(native.ID), nr("clone3"), 0), enosys},
		{"foreign-ABI syscall 26 (i386 ptrace)", data(foreign, 26, 0), unix.SECCOMP_RET_KILL_PROCESS},
	}
	for _, c := range cases {
		got, err := vm.Run(c.data)
		if err != nil {
			t.Fatal(err)
		}
		if uint32(got) != c.want {
			t.Errorf("%s: verdict %#x, want %#x", c.what, uint32(got), c.want)
		} else {
			t.Logf("verified: %s -> %#x", c.what, c.want)
		}
	}
	t.Logf("filter: %d instructions", len(prog))
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
