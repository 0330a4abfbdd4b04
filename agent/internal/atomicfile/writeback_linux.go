package atomicfile

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// writeback writes the n bytes of f from off out to the disk and waits for
// them (sync_file_range: the pages only, no metadata and no cache flush,
// so not durable; the fsync that follows is what makes them so). An I/O
// error, or ENOSPC from allocating the blocks, is the write's error. A
// filesystem that does not take the call (EINVAL, EOPNOTSUPP, ENOSYS,
// ESPIPE) gets none: the write goes on and its fsync writes the whole file
// out, as before.
func writeback(f *os.File, off, n int64) error {
	err := unix.SyncFileRange(int(f.Fd()), off, n,
		unix.SYNC_FILE_RANGE_WAIT_BEFORE|unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EINVAL), errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.ENOSYS), errors.Is(err, unix.ESPIPE):
		return errNoWriteback
	}
	return fmt.Errorf("write out %s: %w", f.Name(), err)
}
