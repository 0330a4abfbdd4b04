package dnsresolver

import (
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/shinken-agent/shinken/dataplane"
	"github.com/shinken-agent/shinken/dataplane/kerneltest"
)

// TestEntryCapKernel: real DNS packets to a resolver writing into the real
// dataplane. A session's DNS-derived entries stop at its cap: the answer
// past it is refused (DenyRcode) with a Denial whose reason is entry_cap,
// and nothing is written for it; once the entries' TTL passes the collector
// removes them from the kernel map, and the same name then resolves.
func TestEntryCapKernel(t *testing.T) {
	parent, pin := kerneltest.Private("shinken-dnscap-")
	dp := kerneltest.Open(t, func() (*dataplane.Dataplane, error) {
		return dataplane.Open(dataplane.Config{Parent: parent, PinPath: pin, MaxSessions: 64, MaxHandles: 256, MaxEgress4: 1024, MaxEgress6: 1024,
			MaxDNSEntries: 3, ExpiryInterval: 50 * time.Millisecond})
	})
	sess, err := dp.CreateSession("cap1", dataplane.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	h, err := dp.NewHandle(dataplane.HandleRef{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	var zone []string
	for i := 1; i <= 4; i++ {
		zone = append(zone, fmt.Sprintf("a%d.cap.test. 1 IN A 127.0.0.%d", i, 90+i))
	}
	up := startFakeUpstream(t, zone)
	den := &denialLog{}
	r, err := New(Config{
		Dataplane:   dp,
		SessionName: SessionNames(dp),
		ListenAddr:  netip.MustParseAddrPort("0.0.0.0:0"),
		Upstreams:   []netip.AddrPort{up.addr},
		MinTTL:      time.Second,
		MaxTTL:      time.Hour,
		CacheSize:   -1,
		OnDenial:    den.add,
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.SetPolicy(sess.Name, Policy{Grants: []Grant{{Pattern: "**.cap.test", Handle: h, Proto: dataplane.ProtoTCP,
		AllowNonPublic: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}}}); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	server := netip.AddrPortFrom(SessionAddr(sess.Index), r.Port()).String()
	ask := func(name string) *dns.Msg {
		t.Helper()
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeA)
		resp, _, err := (&dns.Client{Net: "udp", Timeout: 3 * time.Second}).Exchange(m, server)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	for i := 1; i <= 3; i++ {
		if resp := ask(fmt.Sprintf("a%d.cap.test.", i)); resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
			t.Fatalf("a%d: %v", i, resp)
		}
	}
	den.take()
	resp := ask("a4.cap.test.")
	if resp.Rcode != dns.RcodeRefused || len(resp.Answer) != 0 {
		t.Fatalf("past the cap: %v", resp)
	}
	ds := den.take()
	if len(ds) != 1 || ds[0].Reason != ReasonEntryCap || ds[0].Session != sess.Name || ds[0].Name != "a4.cap.test." {
		t.Fatalf("denials %+v, want one entry_cap for a4", ds)
	}
	if got := r.Stats().Total.Denials[ReasonEntryCap]; got != 1 {
		t.Fatalf("Denials[entry_cap] = %d", got)
	}
	rules, err := dp.EgressRules(sess.Name)
	if err != nil || len(rules) != 3 {
		t.Fatalf("kernel rules %v, %v; want the first three", rules, err)
	}
	for _, ru := range rules {
		if ru.Prefix.Addr() == netip.MustParseAddr("127.0.0.94") {
			t.Fatal("the refused answer's address is in the kernel")
		}
	}
	// TTL 1 s; the collector runs every 50 ms.
	deadline := time.Now().Add(3 * time.Second)
	for {
		rules, err = dp.EgressRules(sess.Name)
		if err != nil {
			t.Fatal(err)
		}
		if len(rules) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("expired entries still in the kernel: %v", rules)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if resp := ask("a4.cap.test."); resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
		t.Fatalf("a4 after the others expired: %v", resp)
	}
}
