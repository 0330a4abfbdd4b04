// Command shinken-agent is the Shinken node agent. For now it loads (or
// adopts) the egress dataplane, reports what this host can enforce, and waits;
// on SIGINT/SIGTERM it exits and leaves enforcement pinned in the kernel.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/shinken-agent/shinken/dataplane"
)

func main() {
	var (
		parent    = flag.String("cgroup-parent", dataplane.DefaultParent, "sessions' parent cgroup, below the cgroup2 mount")
		pin       = flag.String("pin-path", dataplane.DefaultPinPath, "bpffs directory for pinned links and maps")
		uninstall = flag.Bool("uninstall", false, "detach and remove everything (kills all session processes), then exit")
	)
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "shinken-agent: must run as root (it loads BPF programs and manages cgroups)")
		os.Exit(1)
	}
	cfg := dataplane.Config{Parent: *parent, PinPath: *pin}
	if *uninstall {
		if err := dataplane.Remove(cfg); err != nil {
			log.Error("uninstall", "err", err)
			os.Exit(1)
		}
		log.Info("uninstalled", "cgroup-parent", *parent, "pins", *pin)
		return
	}
	dp, err := dataplane.Open(cfg)
	if err != nil {
		log.Error("dataplane", "err", err)
		os.Exit(1)
	}
	sessions, _ := dp.Sessions()
	log.Info("dataplane ready", "adopted", dp.Adopted(), "cgroup", dp.ParentPath(), "pins", *pin, "sessions", len(sessions))
	for _, e := range dataplane.Report() {
		log.Info("enforcement", "class", e.Class, "mechanism", e.Mechanism, "level", e.Level, "note", e.Note)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	if err := dp.Close(); err != nil {
		log.Error("close", "err", err)
	}
	log.Info("stopped; enforcement stays pinned in the kernel")
}
