package atomicfile

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// writeback writes the n bytes of f from off out to the disk and waits for
// them (sync_file_range: the pages only, no metadata and no cache flush,
// so not durable; the fsync that follows is what makes them so). An I/O
// error, or ENOSPC from allocating the blocks, is the write's error.
func writeback(f *os.File, off, n int64) error {
	err := unix.SyncFileRange(int(f.Fd()), off, n,
		unix.SYNC_FILE_RANGE_WAIT_BEFORE|unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER)
	if err != nil {
		return fmt.Errorf("write out %s: %w", f.Name(), err)
	}
	return nil
}
