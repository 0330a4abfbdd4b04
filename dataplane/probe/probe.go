//go:build linux

// Package probe is a tiny line protocol for running socket operations inside a
// session from tests and benchmarks. The test (or bench) binary re-executes
// itself inside the session with EnvVar set; Main then reads commands on stdin
// and answers each with one line on stdout: "ok [detail]" or "err ERRNO".
// It uses raw syscalls so that the errno the kernel returned is what the
// caller sees. Only tests and bench/ import it.
//
// Commands (ADDR is ip:port, [v6]:port for IPv6):
//
//	tcp ADDR              connect a TCP socket, then close it
//	conns t:ADDR u:ADDR.. one connect per ADDR (t: non-blocking TCP, u: UDP, nothing sent), AF_INET6 for [v6]:port; "ok R..." (ok or errno name each)
//	tcp6 ADDR             connect from an AF_INET6 socket (IPv4 ADDR is sent v4-mapped)
//	tcpfrom SRC ADDR      bind a TCP socket to SRC (ip:port), then connect it to ADDR
//	udp ADDR              sendto from an unconnected UDP socket
//	udp6 ADDR             sendto from an AF_INET6 UDP socket (v4-mapped for IPv4)
//	cudp ADDR             connect a UDP socket, then send on it
//	mmsg ADDR             sendmmsg two datagrams
//	tfo ADDR              TCP Fast Open: sendto(MSG_FASTOPEN) on an unconnected socket
//	mptcp ADDR            connect an MPTCP socket
//	open N tcp|udp ADDR   connect and keep the socket as N
//	write N TEXT          write TEXT on socket N
//	listen N ADDR         listen on TCP ADDR (port 0: any) and keep the socket as N; answers "ok PORT"
//	accept N M MS         accept one connection on listener N within MS milliseconds, keep it as M
//	ubind N ADDR          bind an unconnected UDP socket to ADDR, keep it as N; answers "ok PORT"
//	recv N MS             read one datagram (or bytes) from socket N within MS; "ok FROM DATA"
//	sendto N ADDR TEXT    sendto on socket N (UDP)
//	raw ADDR              send an ICMP echo through a raw socket
//	cgmove PATH           write our pid into PATH (a cgroup.procs file)
//	bpfget PATH           BPF_OBJ_GET a pinned object
//	loopudp ADDR          connect UDP sockets in a tight loop until EPERM; answers "ok NS START PREV LONGEST NIVCSW UNRUN LOOP PSTART": CLOCK_MONOTONIC ns
//	                      of the first denial's return, of that connect's start and of the previous (allowed) connect's return,
//	                      the longest loop iteration (ns), the thread's context switches during the loop (involuntary * 1000 + voluntary), the loop's wall
//	                      time minus the thread's CPU time (ns: time it did not run, the hypervisor's steal included), and
//	                      CLOCK_MONOTONIC ns when the loop began and when the previous connect began; then "CTL CTLEND": a control
//	                      instant 1.5 ms into the loop and the return of the first connect ending after it (0: none before the denial)
//	tcpflood N ADDR SECS  connect+close against ADDR N times or for SECS seconds, answers "ok COUNT NS CPUNS" (CPUNS: this process's user+system CPU time)
//	stream ADDR SECS      send a TCP stream for SECS seconds; answers "ok BYTES NS"
//	hammer ADDR SECS      TCP connect ADDR repeatedly for SECS seconds; answers "ok SUCCESSES FAILURES"
//	udpflood N ADDR       sendto ADDR N times from one unconnected UDP socket; answers "ok COUNT NS"
//	dns udp|cudp|tcp ADDR send "q" to ADDR (unconnected UDP, connected UDP or TCP) and read the reply; answers "ok FROM REPLY"
//	race N ADDR           N threads connect ADDR at once (a spin barrier); answers "ok ALLOWED EPERM OTHER"
//	racer ROUND ADDR      connect ADDR the moment ROUND is released on the words shared on fd 3 (race.go)
//	cpu N                 pin this process to CPU N
//	tid                   answers "ok TID" (the thread every command runs on)
//	pid                   answers "ok PID"
//	ids                   answers "ok UID GID GROUPS" (GROUPS: the supplementary groups, comma-separated)
//	fopen, fread, ...     file operations (files_linux.go)
package probe

import (
	"bufio"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
	_ "unsafe" // go:linkname

	"golang.org/x/sys/unix"
)

// EnvVar selects probe mode in a re-executed binary.
const EnvVar = "SHINKEN_PROBE"

// Main serves the protocol on stdin/stdout until EOF, then exits.
func Main() {
	// Every command runs on this one OS thread, so "cpu" and a scheduling
	// policy set on "tid" apply to the thread doing the work.
	runtime.LockOSThread()
	p := &prober{socks: map[string]int{}, groups: map[string][]int{}}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<16), 1<<20)
	out := bufio.NewWriter(os.Stdout)
	for in.Scan() {
		line := strings.TrimSpace(in.Text())
		if line == "" {
			continue
		}
		res := p.do(strings.Fields(line))
		fmt.Fprintln(out, res)
		out.Flush()
	}
	os.Exit(0)
}

type prober struct {
	socks  map[string]int
	groups map[string][]int // quotaCmd's sockets
	shared *Barrier         // fd 3 mapped, for racer
}

func result(detail string, err error) string {
	if err == nil {
		if detail == "" {
			return "ok"
		}
		return "ok " + detail
	}
	var en unix.Errno
	if errors.As(err, &en) {
		return "err " + unix.ErrnoName(en)
	}
	return "err " + strings.ReplaceAll(err.Error(), "\n", " ")
}

func sockaddr(s string, forceV6 bool) (unix.Sockaddr, int, error) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return nil, 0, err
	}
	if ap.Addr().Is4() && !forceV6 {
		return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}, unix.AF_INET, nil
	}
	return &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}, unix.AF_INET6, nil
}

func (p *prober) do(f []string) string {
	arg := func(i int) string {
		if i < len(f) {
			return f[i]
		}
		return ""
	}
	if r, ok := p.portCmd(f); ok {
		return r
	}
	if r, ok := p.quotaCmd(f); ok {
		return r
	}
	if r, ok := p.fileCmd(f); ok {
		return r
	}
	switch f[0] {
	case "dns":
		from, reply, err := dnsQuery(arg(1), arg(2))
		return result(from+" "+reply, err)
	case "cpu":
		n, _ := strconv.Atoi(arg(1))
		var set unix.CPUSet
		set.Set(n)
		return result("", unix.SchedSetaffinity(0, &set))
	case "tid":
		return result(strconv.Itoa(unix.Gettid()), nil)
	case "pid":
		return result(strconv.Itoa(os.Getpid()), nil)
	case "ids":
		groups, err := unix.Getgroups()
		g := make([]string, len(groups))
		for i, n := range groups {
			g[i] = strconv.Itoa(n)
		}
		return result(fmt.Sprintf("%d %d %s", unix.Getuid(), unix.Getgid(), strings.Join(g, ",")), err)
	case "conns":
		return conns(f[1:])
	case "tcp", "tcp6", "mptcp":
		proto := 0
		if f[0] == "mptcp" {
			proto = 262 // IPPROTO_MPTCP
		}
		fd, sa, err := p.socket(arg(1), f[0] == "tcp6", unix.SOCK_STREAM, proto)
		if err != nil {
			return result("", err)
		}
		defer unix.Close(fd)
		return result("", unix.Connect(fd, sa))
	case "tcpfrom":
		fd, sa, err := p.socket(arg(2), false, unix.SOCK_STREAM, 0)
		if err != nil {
			return result("", err)
		}
		defer unix.Close(fd)
		src, _, err := sockaddr(arg(1), false)
		if err == nil {
			err = unix.Bind(fd, src)
		}
		if err != nil {
			return result("", err)
		}
		return result("", unix.Connect(fd, sa))
	case "udp", "udp6":
		fd, sa, err := p.socket(arg(1), f[0] == "udp6", unix.SOCK_DGRAM, 0)
		if err != nil {
			return result("", err)
		}
		defer unix.Close(fd)
		return result("", unix.Sendto(fd, []byte("x"), 0, sa))
	case "cudp":
		fd, sa, err := p.socket(arg(1), false, unix.SOCK_DGRAM, 0)
		if err != nil {
			return result("", err)
		}
		defer unix.Close(fd)
		if err := unix.Connect(fd, sa); err != nil {
			return result("", err)
		}
		_, err = unix.Write(fd, []byte("x"))
		return result("", err)
	case "mmsg":
		fd, sa, err := p.socket(arg(1), false, unix.SOCK_DGRAM, 0)
		if err != nil {
			return result("", err)
		}
		defer unix.Close(fd)
		// Go's x/sys has no sendmmsg wrapper taking Sockaddr; sendmsg twice
		// through the same kernel path (udp_sendmsg) is covered by "udp", so
		// use the raw syscall with a two-entry vector.
		return result("", sendmmsg(fd, sa))
	case "tfo":
		fd, sa, err := p.socket(arg(1), false, unix.SOCK_STREAM, 0)
		if err != nil {
			return result("", err)
		}
		defer unix.Close(fd)
		return result("", unix.Sendto(fd, []byte("x"), unix.MSG_FASTOPEN, sa))
	case "open":
		typ := unix.SOCK_STREAM
		if arg(2) == "udp" {
			typ = unix.SOCK_DGRAM
		}
		fd, sa, err := p.socket(arg(3), false, typ, 0)
		if err != nil {
			return result("", err)
		}
		if err := unix.Connect(fd, sa); err != nil {
			unix.Close(fd)
			return result("", err)
		}
		p.socks[arg(1)] = fd
		return result("", nil)
	case "listen":
		fd, sa, err := p.socket(arg(2), false, unix.SOCK_STREAM, 0)
		if err != nil {
			return result("", err)
		}
		if err := unix.Bind(fd, sa); err != nil {
			unix.Close(fd)
			return result("", err)
		}
		if err := unix.Listen(fd, 16); err != nil {
			unix.Close(fd)
			return result("", err)
		}
		got, err := unix.Getsockname(fd)
		if err != nil {
			unix.Close(fd)
			return result("", err)
		}
		p.socks[arg(1)] = fd
		switch sa := got.(type) {
		case *unix.SockaddrInet4:
			return result(strconv.Itoa(sa.Port), nil)
		case *unix.SockaddrInet6:
			return result(strconv.Itoa(sa.Port), nil)
		}
		return "err unexpected socket address"
	case "ubind": // ubind NAME ADDR: an unconnected UDP socket; "ok <port>"
		fd, sa, err := p.socket(arg(2), false, unix.SOCK_DGRAM, 0)
		if err != nil {
			return result("", err)
		}
		if err := unix.Bind(fd, sa); err != nil {
			unix.Close(fd)
			return result("", err)
		}
		p.socks[arg(1)] = fd
		return result(localPort(fd))
	case "recv": // recv NAME MS: one datagram or read; "ok <from> <data>"
		fd, ok := p.socks[arg(1)]
		if !ok {
			return "err no such socket"
		}
		ms, _ := strconv.Atoi(arg(2))
		if err := pollIn(fd, ms); err != nil {
			return result("", err)
		}
		buf := make([]byte, 512)
		n, from, err := unix.Recvfrom(fd, buf, unix.MSG_DONTWAIT)
		if err != nil {
			return result("", err)
		}
		return result(sockaddrString(from)+" "+string(buf[:n]), nil)
	case "accept":
		lfd, ok := p.socks[arg(1)]
		if !ok {
			return "err no such socket"
		}
		ms, _ := strconv.Atoi(arg(3))
		pfd := []unix.PollFd{{Fd: int32(lfd), Events: unix.POLLIN}}
		// Poll again after a signal (the Go runtime's preemption signal
		// interrupts it with EINTR), for the time that is left.
		deadline := time.Now().Add(time.Duration(ms) * time.Millisecond)
		n, err := unix.Poll(pfd, ms)
		for err == unix.EINTR {
			left := int(time.Until(deadline) / time.Millisecond)
			n, err = unix.Poll(pfd, max(left, 0))
		}
		if err != nil {
			return result("", err)
		}
		if n == 0 {
			return "err timeout"
		}
		fd, _, err := unix.Accept4(lfd, unix.SOCK_CLOEXEC)
		if err != nil {
			return result("", err)
		}
		p.socks[arg(2)] = fd
		return result("", nil)
	case "send", "sink": // send|sink NAME BYTES: write, or read, exactly BYTES on a socket
		fd, ok := p.socks[arg(1)]
		if !ok {
			return "err no such socket"
		}
		n, err := strconv.ParseInt(arg(2), 10, 64)
		if err != nil || n < 0 {
			return "err bad byte count"
		}
		return result("", moveBytes(fd, n, f[0] == "send"))
	case "write":
		fd, ok := p.socks[arg(1)]
		if !ok {
			return "err no such socket"
		}
		_, err := unix.Write(fd, []byte(strings.Join(f[2:], " ")))
		return result("", err)
	case "sendto":
		fd, ok := p.socks[arg(1)]
		if !ok {
			return "err no such socket"
		}
		sa, _, err := sockaddr(arg(2), false)
		if err != nil {
			return result("", err)
		}
		return result("", unix.Sendto(fd, []byte(strings.Join(f[3:], " ")), 0, sa))
	case "raw":
		return result("", rawICMP(arg(1)))
	case "cgmove":
		return result("", os.WriteFile(arg(1), []byte(strconv.Itoa(os.Getpid())), 0))
	case "bpfget":
		return result("", bpfObjGet(arg(1)))
	case "loopudp":
		l, err := loopUDP(arg(1))
		return result(fmt.Sprintf("%d %d %d %d %d %d %d %d %d %d", l.denied, l.start, l.prev, l.longest, l.nivcsw, l.unrun, l.loop, l.prevStart, l.ctl, l.ctlEnd), err)
	case "race": // race N ADDR: N threads connect at once; "ok <allowed> <EPERM> <other>"
		n, _ := strconv.Atoi(arg(1))
		return raceConnect(p, n, arg(2))
	case "racer": // racer ROUND ADDR: one of several processes racing (race.go)
		round, _ := strconv.ParseUint(arg(1), 10, 32)
		return p.racer(uint32(round), arg(2))
	case "tcpflood":
		n, _ := strconv.Atoi(arg(1))
		secs, _ := strconv.ParseFloat(arg(3), 64)
		cpu0 := cpuNs()
		cnt, ns, err := tcpFlood(arg(2), n, time.Duration(secs*float64(time.Second)))
		return result(fmt.Sprintf("%d %d %d", cnt, ns, cpuNs()-cpu0), err)
	case "hammer":
		secs, _ := strconv.ParseFloat(arg(2), 64)
		ok, fail, err := hammer(arg(1), time.Duration(secs*float64(time.Second)))
		return result(fmt.Sprintf("%d %d", ok, fail), err)
	case "udpflood":
		n, _ := strconv.Atoi(arg(1))
		cnt, ns, err := udpFlood(arg(2), n)
		return result(fmt.Sprintf("%d %d", cnt, ns), err)
	case "stream":
		secs, _ := strconv.ParseFloat(arg(2), 64)
		b, ns, err := stream(arg(1), time.Duration(secs*float64(time.Second)))
		return result(fmt.Sprintf("%d %d", b, ns), err)
	}
	return "err unknown command " + f[0]
}

func (p *prober) socket(addr string, v6 bool, typ, proto int) (int, unix.Sockaddr, error) {
	sa, fam, err := sockaddr(addr, v6)
	if err != nil {
		return -1, nil, err
	}
	fd, err := unix.Socket(fam, typ|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		return -1, nil, err
	}
	return fd, sa, nil
}

// Monotonic returns CLOCK_MONOTONIC in nanoseconds, the clock loopudp
// reports: the runtime's own reading (the vDSO on Linux, no system call;
// x/sys/unix's ClockGettime is a real syscall, a few hundred ns here, which
// loopudp would pay twice per connect).
func Monotonic() int64 { return nanotime() }

// nanotime is the runtime's CLOCK_MONOTONIC (runtime/time_nofake.go keeps
// this linkname working for packages outside the standard library).
//
//go:linkname nanotime runtime.nanotime
func nanotime() int64

func tcpFlood(addr string, n int, d time.Duration) (int, int64, error) {
	sa, fam, err := sockaddr(addr, false)
	if err != nil {
		return 0, 0, err
	}
	start := Monotonic()
	end := start + int64(d)
	cnt := 0
	for ; n <= 0 || cnt < n; cnt++ {
		if d > 0 && cnt&63 == 0 && Monotonic() > end {
			break
		}
		fd, err := unix.Socket(fam, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return cnt, 0, err
		}
		if err := unix.Connect(fd, sa); err != nil {
			unix.Close(fd)
			return cnt, 0, err
		}
		// RST on close keeps TIME_WAIT from exhausting ports.
		_ = unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
		unix.Close(fd)
	}
	return cnt, Monotonic() - start, nil
}

func stream(addr string, d time.Duration) (int64, int64, error) {
	sa, fam, err := sockaddr(addr, false)
	if err != nil {
		return 0, 0, err
	}
	fd, err := unix.Socket(fam, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, 0, err
	}
	defer unix.Close(fd)
	if err := unix.Connect(fd, sa); err != nil {
		return 0, 0, err
	}
	buf := make([]byte, 64<<10)
	var total int64
	start := Monotonic()
	end := start + int64(d)
	for Monotonic() < end {
		n, err := unix.Write(fd, buf)
		if err != nil {
			return total, 0, err
		}
		total += int64(n)
	}
	return total, Monotonic() - start, nil
}

func hammer(addr string, d time.Duration) (ok, fail int, err error) {
	sa, fam, err := sockaddr(addr, false)
	if err != nil {
		return 0, 0, err
	}
	end := Monotonic() + int64(d)
	for Monotonic() < end {
		fd, err := unix.Socket(fam, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return ok, fail, err
		}
		if unix.Connect(fd, sa) == nil {
			ok++
		} else {
			fail++
		}
		_ = unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
		unix.Close(fd)
	}
	return ok, fail, nil
}

func udpFlood(addr string, n int) (int, int64, error) {
	sa, fam, err := sockaddr(addr, false)
	if err != nil {
		return 0, 0, err
	}
	fd, err := unix.Socket(fam, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, 0, err
	}
	defer unix.Close(fd)
	start := Monotonic()
	for i := 0; i < n; i++ {
		if err := unix.Sendto(fd, []byte("x"), 0, sa); err != nil {
			return i, 0, err
		}
	}
	return n, Monotonic() - start, nil
}

func dnsQuery(mode, addr string) (string, string, error) {
	sa, fam, err := sockaddr(addr, false)
	if err != nil {
		return "", "", err
	}
	typ := unix.SOCK_DGRAM
	if mode == "tcp" {
		typ = unix.SOCK_STREAM
	}
	fd, err := unix.Socket(fam, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return "", "", err
	}
	defer unix.Close(fd)
	tv := unix.Timeval{Sec: 3}
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	if mode == "udp" {
		err = unix.Sendto(fd, []byte("q"), 0, sa)
	} else {
		if err = unix.Connect(fd, sa); err == nil {
			_, err = unix.Write(fd, []byte("q"))
		}
	}
	if err != nil {
		return "", "", err
	}
	buf := make([]byte, 512)
	n, from, err := unix.Recvfrom(fd, buf, 0)
	for err == unix.EINTR {
		// A socket with SO_RCVTIMEO is not restarted after a signal, and
		// the Go runtime signals its threads (preemption): wait again.
		n, from, err = unix.Recvfrom(fd, buf, 0)
	}
	if err != nil {
		return "", "", err
	}
	if mode == "tcp" {
		// A connected stream has no per-read source: report the peer.
		from, err = unix.Getpeername(fd)
		if err != nil {
			return "", "", err
		}
	}
	return sockaddrString(from), string(buf[:n]), nil
}

func sockaddrString(sa unix.Sockaddr) string {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port)).String()
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port)).String()
	}
	return "?"
}

// cpuNs is the process's user+system CPU time.
func cpuNs() int64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// moveBytes writes (or reads) exactly n bytes on fd.
func moveBytes(fd int, n int64, send bool) error {
	buf := make([]byte, 64<<10)
	for n > 0 {
		chunk := buf[:min(int64(len(buf)), n)]
		var m int
		var err error
		if send {
			m, err = unix.Write(fd, chunk)
		} else {
			m, err = unix.Read(fd, chunk)
		}
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if m == 0 {
			return errors.New("end of stream")
		}
		n -= int64(m)
	}
	return nil
}
