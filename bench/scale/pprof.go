//go:build linux

package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"time"
)

// profile saves the daemon's heap profile (after a GC) at n sessions, then a
// CPU profile of -pprof-secs of back-to-back /metrics scrapes, into -pprof:
// heap_N.pb.gz, heap_N.txt (with the
// runtime's MemStats) and scrape_cpu_N.pb.gz (go tool pprof reads them beside the
// daemon's binary). It runs after the timed scrapes, so it does not touch
// the figures.
func (b *bench) profile(n int) error {
	if err := os.MkdirAll(*flagPprof, 0o755); err != nil {
		return err
	}
	save := func(url, name string) error {
		resp, err := b.hc.Get("http://shinken" + url)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			msg, _ := io.ReadAll(resp.Body)
			return fmt.Errorf("%s: HTTP %d: %s", url, resp.StatusCode, msg)
		}
		f, err := os.Create(filepath.Join(*flagPprof, name))
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, resp.Body); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
	if err := save("/debug/pprof/heap?gc=1", fmt.Sprintf("heap_%s.pb.gz", label(n))); err != nil {
		return err
	}
	// The text form ends with the runtime's MemStats (heap in use, idle,
	// released; stacks; GC goal), which say where RSS beyond the live heap is.
	if err := save("/debug/pprof/heap?debug=1", fmt.Sprintf("heap_%s.txt", label(n))); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() {
		done <- save(fmt.Sprintf("/debug/pprof/profile?seconds=%d", *flagPprofS), fmt.Sprintf("scrape_cpu_%s.pb.gz", label(n)))
	}()
	end := time.Now().Add(time.Duration(*flagPprofS) * time.Second)
	scrapes := 0
	for time.Now().Before(end) {
		resp, err := http.Get("http://" + b.metrics + "/metrics")
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		scrapes++
	}
	if err := <-done; err != nil {
		return err
	}
	fmt.Printf("  profiles in %s: heap_%s.pb.gz, scrape_cpu_%s.pb.gz (%d scrapes)\n", *flagPprof, label(n), label(n), scrapes)
	return nil
}
