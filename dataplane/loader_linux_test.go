package dataplane

import (
	"fmt"
	"net/netip"
	"os"
	"time"
)

const loaderEnv = "SHINKEN_TEST_LOADER"

func loaderConfig() Config {
	return Config{Parent: os.Getenv("SHINKEN_TEST_PARENT"), PinPath: os.Getenv("SHINKEN_TEST_PIN"),
		MaxSessions: 1024, MaxHandles: 4096, MaxEgress4: 1 << 16, MaxEgress6: 1 << 16}
}

// loaderMain is a stand-in agent process for the adoption test: it loads the
// dataplane, creates session "ad" allowed to reach SHINKEN_TEST_ALLOW, and
// exits without uninstalling.
func loaderMain() {
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "loader:", err)
		os.Exit(1)
	}
	d, err := Open(loaderConfig())
	if err != nil {
		fail(err)
	}
	if _, err := d.CreateSession("ad"); err != nil {
		fail(err)
	}
	h, err := d.NewHandle(HandleRef{}, time.Time{})
	if err != nil {
		fail(err)
	}
	ap := netip.MustParseAddrPort(os.Getenv("SHINKEN_TEST_ALLOW"))
	if err := d.AllowEgress("ad", EgressRule{Prefix: netip.PrefixFrom(ap.Addr(), 32), Proto: ProtoTCP, Ports: Port(ap.Port()), Handle: h}); err != nil {
		fail(err)
	}
	d.Close()
	os.Exit(0)
}
