//go:build linux

package main

import (
	"bufio"
	"crypto/rand"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
	"github.com/shinken-agent/shinken/dataplane"
)

// The load: closed-loop clients in their own processes, and their results.

type result struct {
	n, errs int
	wrong   int // unexpected rcode
	lat     []time.Duration
	elapsed time.Duration
}

func (r *result) add(o result) {
	r.n += o.n
	r.errs += o.errs
	r.wrong += o.wrong
	r.lat = append(r.lat, o.lat...)
	r.elapsed += o.elapsed
}

func (r *result) qps() float64 { return float64(r.n) / r.elapsed.Seconds() }

func (r *result) pct(p float64) time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	slices.Sort(r.lat)
	return r.lat[min(len(r.lat)-1, int(float64(len(r.lat))*p))]
}

// pack prepares one wire query per name.
func pack(names []string) [][]byte {
	out := make([][]byte, len(names))
	for i, n := range names {
		m := new(dns.Msg)
		m.SetQuestion(n, dns.TypeA)
		out[i], _ = m.Pack()
	}
	return out
}

// load runs conc closed-loop clients against target for d.
func load(target netip.AddrPort, queries [][]byte, wantRcode int, conc int, d time.Duration) (result, error) {
	var (
		mu    sync.Mutex
		total result
		wg    sync.WaitGroup
		ferr  error
	)
	start := time.Now()
	deadline := start.Add(d)
	for w := range conc {
		wg.Go(func() {
			c, err := net.DialUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}, net.UDPAddrFromAddrPort(target))
			if err != nil {
				mu.Lock()
				ferr = err
				mu.Unlock()
				return
			}
			defer c.Close()
			var r result
			r.lat = make([]time.Duration, 0, 1<<16)
			buf := make([]byte, 1500)
			q := make([]byte, 512)
			var idb [2]byte
			for i := w; ; i++ {
				t0 := time.Now()
				if !t0.Before(deadline) {
					break
				}
				qq := queries[i%len(queries)]
				q = append(q[:0], qq...)
				rand.Read(idb[:])
				copy(q, idb[:])
				c.SetReadDeadline(t0.Add(2 * time.Second))
				if _, err := c.Write(q); err != nil {
					r.errs++
					continue
				}
				for {
					n, err := c.Read(buf)
					if err != nil {
						r.errs++
						break
					}
					if n < 12 || buf[0] != idb[0] || buf[1] != idb[1] {
						continue // stale reply of a timed-out query
					}
					r.lat = append(r.lat, time.Since(t0))
					r.n++
					if int(buf[3]&0xf) != wantRcode {
						r.wrong++
					}
					break
				}
			}
			mu.Lock()
			total.add(r)
			mu.Unlock()
		})
	}
	wg.Wait()
	total.elapsed = time.Since(start)
	return total, ferr
}

// clientMain is the load generator, a separate process so that it never
// shares a Go scheduler or garbage collector with the resolver under test.
// Arguments: TARGET NAMEFILE RCODE CONC DURATION; it writes n, errs, wrong,
// elapsed and then every latency (ns) as little-endian int64s on stdout.
func clientMain() {
	a := flag.Args()
	target := netip.MustParseAddrPort(a[0])
	data, err := os.ReadFile(a[1])
	if err != nil {
		log.Fatal(err)
	}
	var rcode, conc int
	fmt.Sscan(a[2], &rcode)
	fmt.Sscan(a[3], &conc)
	d, _ := time.ParseDuration(a[4])
	r, err := load(target, pack(strings.Fields(string(data))), rcode, conc, d)
	if err != nil {
		log.Fatal(err)
	}
	w := bufio.NewWriter(os.Stdout)
	for _, v := range []int64{int64(r.n), int64(r.errs), int64(r.wrong), int64(r.elapsed)} {
		binary.Write(w, binary.LittleEndian, v)
	}
	for _, l := range r.lat {
		binary.Write(w, binary.LittleEndian, int64(l))
	}
	w.Flush()
}

// runClient runs one scenario in a client process.
func runClient(target netip.AddrPort, nameFile string, rcode, conc int, d time.Duration, in *dataplane.Session) (result, error) {
	self, err := os.Executable()
	if err != nil {
		return result{}, err
	}
	cmd := exec.Command(self, target.String(), nameFile, fmt.Sprint(rcode), fmt.Sprint(conc), d.String())
	cmd.Env = append(os.Environ(), clientEnv+"=1", "GOMAXPROCS=1")
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return result{}, err
	}
	if in != nil {
		// Inside the session: its port-53 traffic is redirected by the kernel.
		err = dataplane.StartIn(*in, cmd, dataplane.ProcOptions{Privileged: true})
	} else {
		err = cmd.Start()
	}
	if err != nil {
		return result{}, fmt.Errorf("client: %w", err)
	}
	out, err := io.ReadAll(stdout)
	if werr := cmd.Wait(); err == nil {
		err = werr
	}
	if err != nil {
		return result{}, fmt.Errorf("client: %w", err)
	}
	if len(out) < 32 || len(out)%8 != 0 {
		return result{}, fmt.Errorf("client: %d bytes of output", len(out))
	}
	v := func(i int) int64 { return int64(binary.LittleEndian.Uint64(out[8*i:])) }
	r := result{n: int(v(0)), errs: int(v(1)), wrong: int(v(2)), elapsed: time.Duration(v(3))}
	for i := 4; i < len(out)/8; i++ {
		r.lat = append(r.lat, time.Duration(v(i)))
	}
	return r, nil
}
