package dataplane

import (
	"fmt"
	"io"
	"net"
	"reflect"
	"sort"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/shinken-agent/shinken/dataplane/kerneltest"
	"golang.org/x/sys/unix"
)

// programRuns reads the run count of each of the dataplane's programs (BPF
// run-time stats must be on), by the program's name in the object.
func programRuns(t *testing.T, d *Dataplane) map[string]uint64 {
	t.Helper()
	runs := map[string]uint64{}
	for name, st := range programStats(t, d) {
		runs[name] = st.RunCount
	}
	return runs
}

// programStats is every program's run count and run time (run time only
// while BPF run-time stats are on).
func programStats(t *testing.T, d *Dataplane) map[string]*ebpf.ProgramStats {
	t.Helper()
	stats := map[string]*ebpf.ProgramStats{}
	v := reflect.ValueOf(&d.objs.shkPrograms).Elem()
	for i := 0; i < v.NumField(); i++ {
		p, ok := v.Field(i).Interface().(*ebpf.Program)
		if !ok || p == nil {
			continue
		}
		st, err := p.Stats()
		if err != nil {
			t.Fatalf("stats of %s: %v", v.Type().Field(i).Tag.Get("ebpf"), err)
		}
		stats[v.Type().Field(i).Tag.Get("ebpf")] = st
	}
	return stats
}

// tcpSegs is what TCP_INFO says a socket has received and sent, in segments.
func tcpSegs(t *testing.T, c *net.TCPConn) (in, out uint32) {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var info *unix.TCPInfo
	var ierr error
	if err := rc.Control(func(fd uintptr) { info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); err != nil {
		t.Fatal(err)
	}
	if ierr != nil {
		t.Fatal(ierr)
	}
	return info.Segs_in, info.Segs_out
}

// TestEstablishedFlowRunsNoProgram: an established TCP flow of a session, in
// sweep mode, runs none of the dataplane's programs per packet, either way.
// BPF run-time stats count every run of each program while a session process
// sends 32 MiB to a host peer and receives 32 MiB back; TCP_INFO on the
// host's end counts the packets. Packet mode checks every packet (that is its
// point): there the same count shows the runs, which is what makes the
// sweep-mode figure mean something.
func TestEstablishedFlowRunsNoProgram(t *testing.T) { forModes(t, testEstablishedFlowRunsNoProgram) }

func testEstablishedFlowRunsNoProgram(t *testing.T, mode FlowMode) {
	kerneltest.RequireRoot(t)
	d := newDataplane(t, modeConfig(t, mode))
	s, err := d.CreateSession("hot", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	h := mustHandle(t, d, HandleRef{}, time.Time{})
	mustAllow(t, d, "hot", EgressRule{Prefix: pfx("127.0.0.2/32"), Proto: ProtoTCP, Ports: Port(portOf(t, ln.Addr().String())), Handle: h})

	p := startProbe(t, s, ProcOptions{})
	if got := p.Do("open c tcp " + ln.Addr().String()); got != "ok" {
		t.Fatalf("open: %s", got)
	}
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	conn := c.(*net.TCPConn)

	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		t.Fatalf("enable BPF run-time stats: %v", err)
	}
	defer stats.Close()

	const n = 32 << 20
	before := programRuns(t, d)
	in0, out0 := tcpSegs(t, conn)
	got := make(chan error, 1)
	go func() {
		_, err := io.CopyN(io.Discard, conn, n)
		got <- err
	}()
	if r := p.Do(fmt.Sprintf("send c %d", n)); r != "ok" {
		t.Fatalf("session send: %s", r)
	}
	if err := <-got; err != nil {
		t.Fatalf("host receive: %v", err)
	}
	sent := make(chan error, 1)
	go func() {
		_, err := conn.Write(make([]byte, n))
		sent <- err
	}()
	if r := p.Do(fmt.Sprintf("sink c %d", n)); r != "ok" {
		t.Fatalf("session receive: %s", r)
	}
	if err := <-sent; err != nil {
		t.Fatalf("host send: %v", err)
	}
	in1, out1 := tcpSegs(t, conn)
	after := programRuns(t, d)

	pkts := uint64(in1-in0) + uint64(out1-out0)
	var total uint64
	var ran []string
	for name, a := range after {
		if r := a - before[name]; r > 0 {
			total += r
			ran = append(ran, fmt.Sprintf("%s=%d", name, r))
		}
	}
	t.Logf("%s mode: %d packets (host end: %d in, %d out), %d program runs %v", mode, pkts, in1-in0, out1-out0, total, ran)
	if pkts < 500 {
		t.Fatalf("only %d packets moved: the count means nothing", pkts)
	}
	switch mode {
	case FlowSweep:
		// A few runs for control packets outside the flow would be
		// tolerable; one per data packet is what must not happen.
		if total*50 > pkts {
			t.Errorf("sweep mode: %d program runs over %d packets of an established flow %v: want none per packet", total, pkts, ran)
		}
	case FlowPacket:
		if total < pkts/2 {
			t.Errorf("packet mode: %d program runs over %d packets: the count misses the per-packet checks", total, pkts)
		}
	}

	// The connect path, for the record (counts, not timings): which
	// programs run per connect+close from the session, and how often.
	const conns = 2000
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	sb := programStats(t, d)
	r := p.Do(fmt.Sprintf("tcpflood %d %s 0", conns, ln.Addr()))
	var done, wallNs, cpuNs int64
	if _, err := fmt.Sscanf(r, "ok %d %d %d", &done, &wallNs, &cpuNs); err != nil || done == 0 {
		t.Fatalf("tcpflood: %s", r)
	}
	sa := programStats(t, d)
	var per []string
	var progNs float64
	for name, a := range sa {
		if r := a.RunCount - sb[name].RunCount; r > 0 {
			ns := float64(a.Runtime-sb[name].Runtime) / float64(r)
			progNs += ns * float64(r) / conns
			per = append(per, fmt.Sprintf("%s=%.2f (%.0f ns/run)", name, float64(r)/conns, ns))
		}
	}
	sort.Strings(per)
	t.Logf("%s mode: program time per connect+close %.0f ns (BPF run-time stats, on for this test only); the worker's connect+close %d ns wall, %d ns CPU (a rough check: the machine may be shared)", mode, progNs, wallNs/done, cpuNs/done)
	t.Logf("%s mode: program runs per connect+close %v", mode, per)
}
