package boundary

import (
	"testing"

	"github.com/shinken-agent/shinken/dataplane/kerneltest"
	"golang.org/x/sys/unix"
)

// TestIdmapNSCached: a second idmapped mount with the same owner and
// session uid reuses the user namespace (no new process), a different
// session uid gets its own, and the cache stays bounded. (An evicted
// namespace's inode number may be reused, so it is not compared.)
func TestIdmapNSCached(t *testing.T) {
	kerneltest.RequireRoot(t)
	b := newBoundary(t, Config{}, nil)
	nsIno := func(owner, sess uint32) uint64 {
		t.Helper()
		fd, err := b.idmapNS(owner, owner, sess)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			t.Fatal(err)
		}
		return st.Ino
	}
	a1, a2, c := nsIno(0, 300001), nsIno(0, 300001), nsIno(0, 300002)
	if a1 != a2 {
		t.Errorf("same mapping, two namespaces (%d, %d): the cache did not hold it", a1, a2)
	}
	if a1 == c {
		t.Errorf("sessions 300001 and 300002 share namespace %d", c)
	}
	for i := uint32(0); i < 2*idmapCacheSize; i++ {
		nsIno(1000, 400000+i)
	}
	b.idmapMu.Lock()
	n := len(b.idmaps.fds)
	b.idmapMu.Unlock()
	if n > idmapCacheSize {
		t.Errorf("%d namespaces kept, bound %d", n, idmapCacheSize)
	}
}
