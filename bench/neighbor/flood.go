//go:build linux

package main

// Session A's floods: this binary, started in A through the API
// (POST /v1/sessions/A/processes), floods for the given seconds, prints its
// counters ("name value" lines, then "done 1") and exits, after cleaning
// up. The fork bomb prints first, then starts the bomb and becomes sleep(1)
// until its deadline: its tree dies with it (or when the bench kills it).

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// floodMain runs "flood MODE SECONDS".
func flood(mode string, d time.Duration) error {
	deadline := time.Now().Add(d)
	var err error
	c := map[string]int64{}
	switch mode {
	case "dns":
		err = floodDNS(deadline, c)
	case "big":
		err = floodBig(deadline, c)
	case "deny":
		err = floodDeny(deadline, c)
	case "sockets":
		err = floodSockets(deadline, c)
	case "forkbomb":
		err = forkBomb(deadline, c)
	case "tmpfs":
		err = floodTmpfs(deadline, c)
	case "cpu":
		err = floodCPU(deadline, c)
	default:
		return fmt.Errorf("flood: unknown mode %q", mode)
	}
	if err != nil {
		return err
	}
	for k, v := range c {
		fmt.Printf("%s %d\n", k, v)
	}
	fmt.Println("done 1")
	return nil
}

// counters are shared by a flood's goroutines.
type counters struct {
	mu sync.Mutex
	m  map[string]int64
}

func (c *counters) add(k string, v int64) {
	c.mu.Lock()
	c.m[k] += v
	c.mu.Unlock()
}

func rcodeName(b []byte) string {
	if len(b) < 12 {
		return "short"
	}
	switch rc := b[3] & 0xf; rc {
	case dns.RcodeSuccess:
		return "noerror"
	case dns.RcodeRefused:
		return "refused"
	case dns.RcodeServerFailure:
		return "servfail"
	default:
		return "rcode" + strconv.Itoa(int(rc))
	}
}

// udpFlood runs g sender goroutines, each on its own UDP socket connected
// to port 53 (redirected to the resolver), sending name(g, i) as fast as
// it can, with a reader per socket counting replies by rcode.
func udpFlood(deadline time.Time, m map[string]int64, g int, name func(g, i int) string) {
	c := &counters{m: m}
	var wg sync.WaitGroup
	for k := 0; k < g; k++ {
		conn, err := net.Dial("udp4", "127.0.0.1:53")
		if err != nil {
			c.add("dial_errors", 1)
			continue
		}
		var rd sync.WaitGroup
		rd.Add(1)
		go func() {
			defer rd.Done()
			buf := make([]byte, 65536)
			got := map[string]int64{}
			for {
				n, err := conn.Read(buf)
				if err != nil {
					if strings.Contains(err.Error(), "use of closed") {
						break
					}
					got["read_errors"]++
					continue
				}
				got["reply_"+rcodeName(buf[:n])]++
			}
			for k, v := range got {
				c.add(k, v)
			}
		}()
		wg.Add(1)
		go func() {
			defer wg.Done()
			var sent, errs int64
			for i := 0; ; i++ {
				if i%256 == 0 && time.Now().After(deadline) {
					break
				}
				if _, err := conn.Write(query(uint16(i), name(k, i))); err != nil {
					errs++
				} else {
					sent++
				}
			}
			time.Sleep(500 * time.Millisecond) // late replies
			conn.Close()
			rd.Wait()
			c.add("queries_sent", sent)
			c.add("send_errors", errs)
		}()
	}
	wg.Wait()
}

// floodDNS: a third of the queries repeat one cached name, a third are
// names never asked (the upstream, a kernel write each), a third are names
// no grant allows (refused).
func floodDNS(deadline time.Time, m map[string]int64) error {
	udpFlood(deadline, m, 4, func(g, i int) string {
		switch i % 3 {
		case 0:
			return "a.long.neighbor.test."
		case 1:
			return fmt.Sprintf("a%d-%d.short.neighbor.test.", g, i)
		}
		return fmt.Sprintf("x%d-%d.denied.test.", g, i)
	})
	return nil
}

// floodBig: names of bigRecords addresses each: over UDP, eight cached big
// names and every 50th query a new one (the upstream over TCP, kernel
// writes); one more goroutine asks big names over TCP, one connection per
// query.
func floodBig(deadline time.Time, m map[string]int64) error {
	var wg sync.WaitGroup
	wg.Add(1)
	var tcpOK, tcpErr, tcpTC, tcpRecords atomic.Int64
	tcpErrs := map[string]int64{}
	go func() {
		defer wg.Done()
		cl := &dns.Client{Net: "tcp", Timeout: 2 * time.Second}
		for i := 0; time.Now().Before(deadline); i++ {
			q := new(dns.Msg)
			name := fmt.Sprintf("big%d.big.neighbor.test.", i%8)
			if i%10 == 9 {
				name = fmt.Sprintf("t%d.big.neighbor.test.", i)
			}
			q.SetQuestion(name, dns.TypeA)
			r, _, err := cl.Exchange(q, "127.0.0.1:53")
			if err != nil {
				tcpErr.Add(1)
				k := "tcp_error_other"
				switch {
				case os.IsTimeout(err):
					k = "tcp_error_timeout"
				case errors.Is(err, syscall.ECONNRESET):
					k = "tcp_error_reset"
				case errors.Is(err, io.EOF):
					k = "tcp_error_eof"
				case errors.Is(err, syscall.ECONNREFUSED):
					k = "tcp_error_refused"
				}
				tcpErrs[k]++
				continue
			}
			tcpOK.Add(1)
			tcpRecords.Add(int64(len(r.Answer)))
			if r.Truncated {
				tcpTC.Add(1)
			}
		}
	}()
	udpFlood(deadline, m, 3, func(g, i int) string {
		if i%50 == 49 {
			return fmt.Sprintf("u%d-%d.big.neighbor.test.", g, i)
		}
		return fmt.Sprintf("big%d.big.neighbor.test.", i%8)
	})
	wg.Wait()
	for k, v := range tcpErrs {
		m[k] = v
	}
	m["tcp_answers"], m["tcp_errors"], m["tcp_truncated"], m["tcp_records"] = tcpOK.Load(), tcpErr.Load(), tcpTC.Load(), tcpRecords.Load()
	return nil
}

// floodDeny: four unconnected UDP sockets send one byte each to a new
// address of 10.0.0.0/8 (no grant: the kernel refuses each) port 9.
func floodDeny(deadline time.Time, m map[string]int64) error {
	c := &counters{m: m}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer unix.Close(fd)
			errs := map[string]int64{}
			b := []byte{0}
			for i := 0; ; i++ {
				if i%256 == 0 && time.Now().After(deadline) {
					break
				}
				n := uint32(g)<<22 | uint32(i)&(1<<22-1)
				sa := &unix.SockaddrInet4{Port: 9, Addr: [4]byte{10, byte(n >> 16), byte(n >> 8), byte(n)}}
				if err := unix.Sendto(fd, b, 0, sa); err != nil {
					errs["sendto_"+errName(err)]++
				} else {
					errs["sendto_ok"]++
				}
			}
			for k, v := range errs {
				c.add(k, v)
			}
		}()
	}
	wg.Wait()
	return nil
}

func errName(err error) string {
	if e, ok := err.(unix.Errno); ok {
		return unix.ErrnoName(e)
	}
	return "other"
}

// floodSockets: rounds of opening inet sockets (UDP and TCP in turn) until
// socket() is refused, each bound to an ephemeral port of 127.0.0.1 until
// bind() is refused, the UDP ones after that connected to a granted
// address (which takes an ephemeral port too); then all closed.
func floodSockets(deadline time.Time, m map[string]int64) error {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err == nil && rl.Cur < rl.Max {
		rl.Cur = rl.Max
		unix.Setrlimit(unix.RLIMIT_NOFILE, &rl)
	}
	unix.Getrlimit(unix.RLIMIT_NOFILE, &rl)
	m["rlimit_nofile"] = int64(rl.Cur)
	dst := &unix.SockaddrInet4{Port: 443, Addr: [4]byte{127, 64, 0, 1}}
	for time.Now().Before(deadline) {
		var fds []int
		bound, connected := int64(0), int64(0)
		binding := true
		for time.Now().Before(deadline) {
			typ := unix.SOCK_DGRAM
			if len(fds)%2 == 1 {
				typ = unix.SOCK_STREAM
			}
			fd, err := unix.Socket(unix.AF_INET, typ|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				m["socket_"+errName(err)]++
				break
			}
			fds = append(fds, fd)
			if binding {
				if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
					m["bind_"+errName(err)]++
					binding = false
				} else {
					bound++
				}
			} else if typ == unix.SOCK_DGRAM {
				if err := unix.Connect(fd, dst); err != nil {
					m["connect_"+errName(err)]++
				} else {
					connected++
				}
			}
		}
		m["max_sockets"] = max(m["max_sockets"], int64(len(fds)))
		m["max_bound"] = max(m["max_bound"], bound)
		m["max_connected"] = max(m["max_connected"], connected)
		m["sockets_opened"] += int64(len(fds))
		m["rounds"]++
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
	return nil
}

// floodCPU is the control: one busy loop per CPU and nothing else, so the
// other floods' figures can be read against plain CPU contention.
func floodCPU(deadline time.Time, m map[string]int64) error {
	var n atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < runtime.NumCPU(); g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var i int64
			for ; i%(1<<20) != 0 || time.Now().Before(deadline); i++ {
			}
			n.Add(i)
		}()
	}
	wg.Wait()
	m["loops"], m["spinners"] = n.Load(), int64(runtime.NumCPU())
	return nil
}

// floodTmpfs: rounds of filling /tmp and then /dev/shm in 1 MiB writes
// until the write fails, then removing the files.
func floodTmpfs(deadline time.Time, m map[string]int64) error {
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = byte(i)
	}
	for round := 0; time.Now().Before(deadline); round++ {
		for _, dir := range []string{"/tmp", "/dev/shm"} {
			key := strings.ReplaceAll(strings.TrimPrefix(dir, "/"), "/", "_")
			p := fmt.Sprintf("%s/fill-%d", dir, round)
			f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
			if err != nil {
				return err
			}
			var n int64
			for time.Now().Before(deadline) {
				k, err := f.Write(chunk)
				n += int64(k)
				if err != nil {
					if pe, ok := err.(*os.PathError); ok {
						err = pe.Err
					}
					m[key+"_write_"+errName(err)]++
					break
				}
			}
			f.Close()
			os.Remove(p)
			m[key+"_max_bytes"] = max(m[key+"_max_bytes"], n)
			m[key+"_bytes_written"] += n
		}
		m["rounds"]++
	}
	return nil
}

// The fork bomb: the first child forks, and so does every child, forever;
// a fork refused (RLIMIT_NPROC: EAGAIN) is retried after forkRetry. The
// children run only raw system calls (no Go runtime: a raw fork copies one
// thread), in a nosplit loop. SIGCHLD is ignored so that nothing is left a
// zombie.
//
// The worker prints its figures before the first fork and then execs
// sleep(1) for what is left of the flood: a Go process whose uid holds its
// RLIMIT_NPROC cannot make a thread, and in 3 of 11 runs (twenty-first
// session) it hung before printing. The bench counts A's processes from
// the host (host.go), so nothing needs the worker after the fork.
var (
	forkRetry = unix.Timespec{Nsec: 100e6}
)

//go:nosplit
func bombLoop() {
	for {
		r, _, e := syscall.RawSyscall6(syscall.SYS_CLONE, uintptr(syscall.SIGCHLD), 0, 0, 0, 0, 0)
		if e != 0 {
			syscall.RawSyscall(syscall.SYS_NANOSLEEP, uintptr(unsafe.Pointer(&forkRetry)), 0, 0)
			continue
		}
		_ = r // parent (r > 0) and child (r == 0) both go on forking
	}
}

func forkBomb(deadline time.Time, _ map[string]int64) error {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NPROC, &rl); err != nil {
		return err
	}
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		return err
	}
	argv := []string{"sleep", fmt.Sprintf("%.3f", time.Until(deadline).Seconds())}
	fmt.Printf("rlimit_nproc %d\ndone 1\n", rl.Cur)
	signal.Ignore(syscall.SIGCHLD)
	r, _, e := syscall.RawSyscall6(syscall.SYS_CLONE, uintptr(syscall.SIGCHLD), 0, 0, 0, 0, 0)
	if e != 0 {
		return fmt.Errorf("first fork: %v", e)
	}
	if r == 0 {
		bombLoop()
	}
	return syscall.Exec(sleep, argv, os.Environ())
}
