package dataplane

import (
	"fmt"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/dataplane/boundary"
	"github.com/shinken-agent/shinken/dataplane/kerneltest"
)

// BenchmarkRevokeBesideViews: one revoke (sweep mode: the flow sweep
// included) of a handle no entry names, beside 0 and 200 sessions each
// holding a file grant in its mount view. A revoke derives again only the
// views it reaches (reach_linux.go), so the two should cost the same.
func BenchmarkRevokeBesideViews(b *testing.B) {
	for _, n := range []int{0, 200} {
		b.Run(fmt.Sprintf("views=%d", n), func(b *testing.B) {
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
