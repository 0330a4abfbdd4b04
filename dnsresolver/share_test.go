package dnsresolver

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkMakeRoom: what making room in a full answer cache holds its
// lock for (the walk for expired answers, the sort of the owners, the
// quarter dropped), by how many sessions fetched its answers.
func BenchmarkMakeRoom(b *testing.B) {
	now := time.Unix(2_000_000_000, 0)
	live := &result{expires: now.Add(time.Hour)}
	for _, owners := range []int{2, 1000, DefaultCacheSize} {
		b.Run(fmt.Sprint("owners=", owners), func(b *testing.B) {
			c := newCache(DefaultCacheSize)
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				for j := 0; len(c.m) < c.max; j++ {
					c.put(cacheKey{fmt.Sprint("n", i, "-", j), 1}, live, fmt.Sprint("o", j%owners), now)
				}
				b.StartTimer()
				c.mu.Lock()
				c.makeRoomLocked(now)
				c.mu.Unlock()
			}
		})
	}
}
