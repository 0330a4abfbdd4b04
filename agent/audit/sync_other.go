//go:build !linux

package audit

import "os"

// fdatasync falls back to fsync where the Linux guarantee (a grown size
// is synced with the data) is not known to hold.
func fdatasync(f *os.File) error { return f.Sync() }
