//go:build linux

// Command vmtest is the /init of a throwaway VM that runs the dataplane's
// tests on another kernel (see .ci/vmtest: Debian 12's own 6.1 kernel, under
// qemu with software emulation). It mounts what the tests need, brings up
// loopback, runs each test binary under /tests (the dataplane's and the
// session boundary's) with the -test.run pattern given as TESTRUN on the
// kernel command line (TESTRUN_dataplane, TESTRUN_boundary: one binary's
// own; VMTOOLS names the disk of git, make, gcc and python3 to mount
// first, TESTPROGRAMS the programs it gives), prints "vmtest: PASS" or "vmtest: FAIL", and
// powers the VM off.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	ok := run()
	if ok {
		fmt.Println("vmtest: PASS")
	} else {
		fmt.Println("vmtest: FAIL")
	}
	unix.Sync()
	unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
}

func run() bool {
	os.Setenv("PATH", "/usr/sbin:/usr/bin:/sbin:/bin") // the kernel gives /init none
	for _, m := range [][3]string{
		{"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"}, {"devtmpfs", "/dev", "devtmpfs"},
		{"cgroup2", "/sys/fs/cgroup", "cgroup2"}, {"bpf", "/sys/fs/bpf", "bpf"},
	} {
		if err := os.MkdirAll(m[1], 0o755); err != nil {
			fmt.Println("vmtest: mkdir", m[1], err)
			return false
		}
		if err := unix.Mount(m[0], m[1], m[2], 0, ""); err != nil {
			fmt.Println("vmtest: mount", m[1], err)
			return false
		}
	}
	// Kernel modules the tests need (overlay, for persistence): loaded
	// from /modules, in name order.
	mods, _ := filepath.Glob("/modules/*.ko")
	for _, m := range mods {
		f, err := os.Open(m)
		if err != nil {
			fmt.Println("vmtest: module:", err)
			return false
		}
		err = unix.FinitModule(int(f.Fd()), "", 0)
		f.Close()
		if err != nil && err != unix.EEXIST {
			fmt.Println("vmtest: load", m+":", err)
			return false
		}
	}
	if dev := os.Getenv("VMTOOLS"); dev != "" {
		if err := tools(dev); err != nil {
			fmt.Println("vmtest: tools:", err)
			return false
		}
	}
	if err := disk(); err != nil {
		fmt.Println("vmtest: disk:", err)
		return false
	}
	if err := loopbackUp(); err != nil {
		fmt.Println("vmtest: loopback:", err)
		return false
	}
	var uts unix.Utsname
	unix.Uname(&uts)
	fmt.Printf("vmtest: kernel %s\n", unix.ByteSliceToString(uts.Release[:]))
	if dev := os.Getenv("VMTOOLS"); dev != "" { // after the first line, which the console's reset codes precede
		fmt.Printf("vmtest: tools: %s on /opt/vmtools (%s)\n", dev, os.Getenv("TESTPROGRAMS"))
	}
	if prog := os.Getenv("VMRUN"); prog != "" {
		return runProgram(prog)
	}
	pattern := os.Getenv("TESTRUN")
	if pattern == "" {
		pattern = "."
	}
	bins, err := filepath.Glob("/tests/*.test")
	if err != nil || len(bins) == 0 {
		fmt.Println("vmtest: no test binaries under /tests:", err)
		return false
	}
	ok := true
	for _, bin := range bins {
		// TESTRUN_<name> (name: the binary's, without .test) is this
		// binary's own pattern, else TESTRUN.
		pat := pattern
		if p := os.Getenv("TESTRUN_" + strings.TrimSuffix(filepath.Base(bin), ".test")); p != "" {
			pat = p
		}
		name := strings.TrimSuffix(filepath.Base(bin), ".test")
		// TESTSKIP_<name>: this binary's tests not run here; TESTRUN2_
		// and TESTSKIP2_<name>: a second run of it (go test's -skip
		// splits its pattern at slashes, so one run cannot leave out
		// whole tests and some subtests of another).
		ok = runTests(bin, pat, os.Getenv("TESTSKIP_"+name)) && ok
		if p2 := os.Getenv("TESTRUN2_" + name); p2 != "" {
			ok = runTests(bin, p2, os.Getenv("TESTSKIP2_"+name)) && ok
		}
	}
	return ok
}

func runTests(bin, run, skip string) bool {
	fmt.Printf("vmtest: running %s -test.run '%s' -test.skip '%s'\n", bin, run, skip)
	cmd := exec.Command(bin, "-test.v", "-test.count=1", "-test.timeout=40m", "-test.run", run, "-test.skip", skip)
	cmd.Dir = "/tmp"
	// The launchers built beforehand (kerneltest.BinDirEnv): no
	// toolchain here.
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "SHINKEN_TEST_BINDIR=/opt/shinken/bin"}
	// The programs the tools' disk gives (TESTPROGRAMS: .ci/vmtest's):
	// a test that needs one of them fails here if it is missing rather
	// than skip (kerneltest.RequirePrograms).
	if p := os.Getenv("TESTPROGRAMS"); p != "" {
		cmd.Env = append(cmd.Env, "SHINKEN_TEST_PROGRAMS="+p)
	}
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Printf("vmtest: %s: %v\n", bin, err)
		return false
	}
	return true
}

// runProgram runs prog (no arguments) in /tmp with the tests' environment,
// with securityfs mounted too (the agent's probe report then names the
// kernel's LSMs; the tests' VM leaves it out).
func runProgram(prog string) bool {
	if err := unix.Mount("securityfs", "/sys/kernel/security", "securityfs", 0, ""); err != nil {
		fmt.Println("vmtest: mount securityfs:", err)
		return false
	}
	fmt.Printf("vmtest: running %s\n", prog)
	cmd := exec.Command(prog)
	cmd.Dir = "/tmp"
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"}
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Printf("vmtest: %s: %v\n", prog, err)
		return false
	}
	return true
}

// tools mounts the tools' disk (.ci/vmtools: git, make, gcc, python3),
// device dev, read-only at /opt/vmtools, where the image's links to them
// point. The virtio modules are loaded by then; the device node may
// appear a moment later.
func tools(dev string) error {
	for i := 0; ; i++ {
		if _, err := os.Stat(dev); err == nil {
			break
		} else if i == 100 {
			return fmt.Errorf("%s: %w (after 10 s)", dev, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := unix.Mount(dev, "/opt/vmtools", "ext4", unix.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("mount %s on /opt/vmtools: %w", dev, err)
	}
	return nil
}

// disk puts /tmp and /var/tmp on an ext4 file system (made with busybox's
// mke2fs in a sparse file of the initramfs, mounted through a loop device):
// Linux 6.1 makes no idmapped mount of tmpfs (the initramfs), and the
// session view's workspace and grant binds are idmapped.
func disk() error {
	for _, c := range [][]string{
		{"truncate", "-s", "700M", "/disk.img"},
		{"mke2fs", "-q", "-F", "-I", "256", "/disk.img"}, // nanosecond times
		{"mkdir", "-p", "/mnt/disk"},
		{"mount", "-t", "ext4", "-o", "loop", "/disk.img", "/mnt/disk"},
		{"mkdir", "-p", "/mnt/disk/tmp", "/mnt/disk/var-tmp"},
		{"chmod", "1777", "/mnt/disk/tmp", "/mnt/disk/var-tmp"},
	} {
		cmd := exec.Command(c[0], c[1:]...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%v: %v %s", c, err, out)
		}
	}
	for _, m := range [][2]string{{"/mnt/disk/tmp", "/tmp"}, {"/mnt/disk/var-tmp", "/var/tmp"}} {
		if err := unix.Mount(m[0], m[1], "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s on %s: %w", m[0], m[1], err)
		}
	}
	return nil
}

// loopbackUp sets IFF_UP on lo (SIOCSIFFLAGS), which is all 127.0.0.0/8
// and ::1 need.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var ifr [unix.IFNAMSIZ + 24]byte
	copy(ifr[:], "lo")
	*(*uint16)(unsafe.Pointer(&ifr[unix.IFNAMSIZ])) = unix.IFF_UP | unix.IFF_LOOPBACK | unix.IFF_RUNNING
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCSIFFLAGS, uintptr(unsafe.Pointer(&ifr[0]))); e != 0 {
		return e
	}
	return nil
}
