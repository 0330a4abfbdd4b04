package dataplane

import (
	"fmt"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/dataplane/boundary"
	"github.com/shinken-agent/shinken/dataplane/kerneltest"
)

// BenchmarkRevokeBesideViews: one revoke of a handle no entry names,
// beside 0 and 200 sessions each holding a file grant in its mount view;
// with flowed, the handle carries a flow mark (as if a connect had tried a
// rule under it), so that its revoke sweeps the host's sockets (sweep mode,
// the default here); without, it needs no sweep (flowmark_linux.go). A
// revoke derives again only the views it reaches (reach_linux.go), so the
// view count should not matter.
func BenchmarkRevokeBesideViews(b *testing.B) {
	for _, c := range []struct {
		views  int
		flowed bool
	}{{0, false}, {200, false}, {0, true}, {200, true}} {
		n := c.views
		b.Run(fmt.Sprintf("views=%d/flowed=%v", n, c.flowed), func(b *testing.B) {
			kerneltest.RequireRoot(b)
			root := fsTree(b)
			cfg := testConfig(b)
			cfg.Boundary = &boundary.Config{}
			d := newDataplane(b, cfg)
			for i := range n {
				name := fmt.Sprintf("v%d", i)
				if _, err := d.CreateSession(name, Limits{}); err != nil {
					b.Fatal(err)
				}
				h := mustHandle(b, d, HandleRef{}, time.Time{})
				if err := d.Apply(name, backend.Delta{Files: []backend.FileEntry{{Path: root + "/repo", Access: backend.FileWrite, Handle: h}}}); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				h := mustHandle(b, d, HandleRef{}, time.Time{})
				if c.flowed {
					if err := d.objs.ShkHandleFlows.Update(h.Slot, h.Generation, ebpf.UpdateAny); err != nil {
						b.Fatal(err)
					}
				}
				b.StartTimer()
				if err := d.Revoke(h); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := d.FreeHandle(h); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}
