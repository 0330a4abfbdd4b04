package boundary

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The programs the tests run inside sessions (this test binary, re-executed
// with SHINKEN_BT_HELPER=mode).

var victimSecret = []byte("B-SECRET-MEMORY")

func runHelper(mode string, args []string) int {
	switch mode {
	case "victim":
		return victim(args)
	case "attack":
		return attack(args)
	case "inside":
		return inside()
	case "caps":
		return caps()
	case "syscalls":
		return syscalls()
	case "fill":
		return fill(args)
	case "forkloop":
		return forkLoop(args)
	}
	fmt.Fprintln(os.Stderr, "unknown helper", mode)
	return 2
}

func result(op string, ok bool, err error) {
	fmt.Printf("RESULT op=%s ok=%v err=%v\n", op, ok, err)
}

// victim (session B): holds a TCP connection to args[0], listens on the
// abstract UNIX socket args[1], prints "READY fd addr", then waits for
// stdin to close.
func victim(args []string) int {
	signal.Ignore(syscall.SIGUSR1)
	c, err := net.Dial("tcp", args[0])
	if err != nil {
		fmt.Println("dial:", err)
		return 1
	}
	f, _ := c.(*net.TCPConn).File() // a dup: the fd A will try to take
	l, err := net.Listen("unix", "@"+args[1])
	if err != nil {
		fmt.Println("listen:", err)
		return 1
	}
	go func() {
		for {
			a, err := l.Accept()
			if err != nil {
				return
			}
			fmt.Println("B-ABSTRACT-ACCEPTED")
			a.Close()
		}
	}()
	fmt.Printf("READY %d %d\n", f.Fd(), uintptr(unsafe.Pointer(&victimSecret[0])))
	bufio.NewReader(os.Stdin).ReadString('\n')
	return 0
}

// attack (session A): every way of reaching into process args[0] (its fd
// args[1] is B's TCP socket, args[2] the address of B's secret, args[3]
// B's abstract socket). Prints one RESULT line per operation: ok=true means
// the operation reached B.
func attack(args []string) int {
	pid, _ := strconv.Atoi(args[0])
	fd, _ := strconv.Atoi(args[1])
	addr, _ := strconv.ParseUint(args[2], 10, 64)

	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		result("pidfd_getfd", false, fmt.Errorf("pidfd_open: %w", err))
	} else {
		stolen, err := unix.PidfdGetfd(pidfd, fd, 0)
		if err == nil {
			_, err = unix.Write(stolen, []byte("A-STOLE-B-SOCKET\n"))
		}
		result("pidfd_getfd", err == nil, err)
	}

	_, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_SEIZE, uintptr(pid), 0, 0, 0, 0)
	result("ptrace", e == 0, errOf(e))

	buf := make([]byte, len(victimSecret))
	_, err = unix.ProcessVMReadv(pid, []unix.Iovec{{Base: &buf[0], Len: uint64(len(buf))}},
		[]unix.RemoteIovec{{Base: uintptr(addr), Len: len(buf)}}, 0)
	result("process_vm_readv", err == nil && string(buf) == string(victimSecret), err)

	err = unix.Kill(pid, unix.SIGUSR1)
	result("kill", err == nil, err)

	env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	result("proc_environ", err == nil && strings.Contains(string(env), "B_SECRET_ENV"), err)

	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	result("proc_fd", err == nil && len(fds) > 0, err)

	c, err := net.Dial("unix", "@"+args[3]) // connected: it reached B's listener
	if err == nil {
		c.Close()
	}
	result("abstract_unix", err == nil, err)
	return 0
}

func errOf(e syscall.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

// inside: what a session process can and cannot do among its own.
func inside() int {
	fmt.Printf("UID %d %d\n", os.Getuid(), os.Getgid())
	// A shell kills its own child.
	out, err := exec.Command("/bin/sh", "-c", "sleep 100 & kill $!; wait $!; echo $?").CombinedOutput()
	result("shell_kills_child", err == nil && strings.HasSuffix("\n"+strings.TrimSpace(string(out)), "\n143"), fmt.Errorf("%v %q", err, out))
	// Go kills its own child.
	c := exec.Command("/bin/sleep", "100")
	err = c.Start()
	if err == nil {
		err = c.Process.Signal(syscall.SIGTERM)
		c.Wait()
	}
	result("kill_own_child", err == nil, err)
	env, err := os.ReadFile("/proc/self/environ")
	result("own_environ", err == nil && strings.Contains(string(env), "B_SECRET_ENV"), err)
	fds, err := os.ReadDir("/proc/self/fd")
	result("own_fd", err == nil && len(fds) > 0, err)
	// The session's /proc shows the session only: its pid 1 is catatonit.
	ents, _ := os.ReadDir("/proc")
	var pids []string
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, e.Name())
		}
	}
	comm, _ := os.ReadFile("/proc/1/comm")
	fmt.Printf("PIDS %s PID1 %s\n", strings.Join(pids, ","), strings.TrimSpace(string(comm)))
	// An abstract socket between two processes of the same launch.
	name := fmt.Sprintf("@shinken-bt-inside-%d", os.Getpid())
	l, err := net.Listen("unix", name)
	if err == nil {
		go func() {
			if a, err := l.Accept(); err == nil {
				a.Close()
			}
		}()
		var cn net.Conn
		if cn, err = net.Dial("unix", name); err == nil {
			cn.Close()
		}
	}
	result("own_abstract_unix", err == nil, err)
	// Private /tmp, read-only host root.
	marker := os.Getenv("HOST_MARKER")
	_, err = os.Stat(marker)
	result("host_tmp_visible", err == nil, err)
	err = os.WriteFile("/tmp/mine", []byte("x"), 0o600)
	result("write_tmp", err == nil, err)
	err = os.WriteFile("/dev/shm/mine", []byte("x"), 0o600)
	result("write_dev_shm", err == nil, err)
	err = os.WriteFile(os.Getenv("HOST_RW_DIR")+"/x", []byte("x"), 0o600)
	result("write_host_dir", err == nil, err)
	devs, _ := os.ReadDir("/dev")
	var names []string
	for _, d := range devs {
		names = append(names, d.Name())
	}
	fmt.Printf("DEV %s\n", strings.Join(names, ","))
	// Refused even among one's own: user namespaces, clone3.
	// (util-linux unshare: single-threaded, unlike this Go program, which
	// the kernel would refuse a user namespace with EINVAL anyway.)
	out, err = exec.Command("unshare", "--user", "true").CombinedOutput()
	result("unshare_newuser", err == nil, fmt.Errorf("%v %s", err, strings.TrimSpace(string(out))))
	_, _, e := unix.RawSyscall(unix.SYS_CLONE3, 0, 0, 0)
	result("clone3", e != unix.ENOSYS, errOf(e))
	out, err = exec.Command("/bin/sh", "-c", "echo forked").CombinedOutput()
	result("fork_exec", err == nil && strings.TrimSpace(string(out)) == "forked", err)
	return 0
}

// caps: the identity and capability sets this process got, and whether it
// can open a raw socket.
func caps() int {
	st, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(st), "\n") {
		if strings.HasPrefix(l, "Uid:") || strings.HasPrefix(l, "Gid:") || strings.HasPrefix(l, "Groups:") || strings.HasPrefix(l, "Cap") || strings.HasPrefix(l, "NoNewPrivs") || strings.HasPrefix(l, "Seccomp:") {
			fmt.Println("STATUS", strings.Join(strings.Fields(l), " "))
		}
	}
	bits, err := unix.PrctlRetInt(unix.PR_GET_SECUREBITS, 0, 0, 0, 0)
	fmt.Printf("STATUS SecureBits: %#x %v\n", bits, err)
	// Clearing them needs CAP_SETPCAP, and a locked bit can never be
	// cleared: either way the attempt must fail.
	err = unix.Prctl(unix.PR_SET_SECUREBITS, 0, 0, 0, 0)
	result("clear_securebits", err == nil, err)
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP)
	if err == nil {
		unix.Close(fd)
	}
	result("raw_socket", err == nil, err)
	return 0
}

// syscalls: the socket families, io_uring and the mount API, as a session
// process gets them. ok=true means the kernel did it.
func syscalls() int {
	sock := func(op string, family, typ, proto int) {
		fd, err := unix.Socket(family, typ|unix.SOCK_CLOEXEC, proto)
		if err == nil {
			unix.Close(fd)
		}
		result(op, err == nil, err)
	}
	sock("af_inet", unix.AF_INET, unix.SOCK_STREAM, 0)
	sock("af_inet6", unix.AF_INET6, unix.SOCK_DGRAM, 0)
	sock("af_unix", unix.AF_UNIX, unix.SOCK_STREAM, 0)
	sock("netlink_route", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE)
	sock("af_vsock", unix.AF_VSOCK, unix.SOCK_STREAM, 0)
	sock("netlink_sock_diag", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_SOCK_DIAG)
	sock("af_packet", unix.AF_PACKET, unix.SOCK_DGRAM, 0)
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err == nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
	}
	result("socketpair_unix", err == nil, err)
	_, err = unix.Socketpair(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	result("socketpair_vsock", err == nil, err) // the kernel has none: EOPNOTSUPP without the filter
	// getifaddrs' way (NETLINK_ROUTE): the interfaces, loopback among them.
	ifs, err := net.Interfaces()
	result("interfaces", err == nil && len(ifs) > 0, err)
	// io_uring_setup(1, &params): a ring, on a kernel that has io_uring.
	var params [120]byte
	fd, _, e := unix.Syscall(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&params[0])), 0)
	if e == 0 {
		unix.Close(int(fd))
	}
	result("io_uring_setup", e == 0, errOf(e))
	// open_tree without OPEN_TREE_CLONE needs no privilege (an O_PATH
	// descriptor): the one call of the mount API a process without
	// capabilities gets from the kernel.
	fd, err = openTree("/")
	if err == nil {
		unix.Close(int(fd))
	}
	result("open_tree", err == nil, err)
	return 0
}

func openTree(path string) (uintptr, error) {
	p, err := unix.BytePtrFromString(path)
	if err != nil {
		return 0, err
	}
	dirfd := unix.AT_FDCWD
	fd, _, e := unix.Syscall(unix.SYS_OPEN_TREE, uintptr(dirfd), uintptr(unsafe.Pointer(p)), unix.O_CLOEXEC)
	return fd, errOf(e)
}
