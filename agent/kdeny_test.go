package agent

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
)

// TestBreakerCountsKernelDenials: the kernel's own denials (real refusals
// of the memory backend, read from its event stream as the daemon does)
// count on the breaker: three distinct refused destinations terminate a
// headless session; a thousand retries of one destination count once (a
// tight retry loop is not three denials), peers refused at the session's
// listener count nothing (someone else's attempts), and a session the
// kernel never refused is untouched.
func TestBreakerCountsKernelDenials(t *testing.T) {
	d := memKernel(t)
	a := openAgent(t, d, t.TempDir())
	mustSession(t, a, SessionSpec{ID: "loop", Headless: true})
	mustSession(t, a, SessionSpec{ID: "scan", Headless: true})
	rd, err := d.Events()
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	feed := func(n int) {
		t.Helper()
		for range n {
			rd.SetDeadline(time.Now().Add(2 * time.Second))
			ev, err := rd.Read()
			if err != nil {
				t.Fatalf("read denial: %v", err)
			}
			a.KernelDenial(ctx, ev)
		}
	}
	for range 1000 {
		if got := connectTCP(t, d, "loop", "198.51.100.1:443"); got != backend.ReasonNoRule {
			t.Fatalf("connect: %s", got)
		}
	}
	feed(1000)
	if b, err := a.Breaker("loop"); err != nil || b.Tripped || b.Total != 1 {
		t.Fatalf("retry loop: breaker %+v, %v; want one denial counted", b, err)
	}
	// Peers refused at the session's listener are not the session's
	// attempts: 100 of them, from distinct addresses, count nothing.
	for i := range 100 {
		if got, err := d.Accept("loop", netip.AddrPortFrom(netip.AddrFrom4([4]byte{203, 0, 113, byte(i)}), 40000), 8080, backend.ProtoTCP); err != nil || got != backend.ReasonNoInbound {
			t.Fatalf("accept: %s %v", got, err)
		}
	}
	feed(100)
	if b, err := a.Breaker("loop"); err != nil || b.Tripped || b.Total != 1 {
		t.Fatalf("after refused peers: breaker %+v, %v; want still one denial", b, err)
	}
	for i := range 3 {
		if got := connectTCP(t, d, "scan", fmt.Sprintf("198.51.100.%d:443", 10+i)); got != backend.ReasonNoRule {
			t.Fatalf("connect: %s", got)
		}
	}
	feed(3)
	if _, err := a.Breaker("scan"); !errors.Is(err, ErrUnknownSession) {
		t.Fatalf("headless session refused three destinations by the kernel and not terminated: %v", err)
	}
	if _, err := d.Session("scan"); !errors.Is(err, backend.ErrSessionNotFound) {
		t.Fatalf("backend session still there: %v", err)
	}
	if _, err := a.Breaker("loop"); err != nil {
		t.Fatalf("the other session: %v", err)
	}
}
