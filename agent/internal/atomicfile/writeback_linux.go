//go:build amd64 || arm64

package atomicfile

import (
	"fmt"
	"os"
	"syscall"
)

// sync_file_range's flags (linux/fs.h).
const (
	syncFileRangeWaitBefore = 1
	syncFileRangeWrite      = 2
	syncFileRangeWaitAfter  = 4
)

// writeback writes the n bytes of f from off out to the disk and waits for
// them (sync_file_range: the pages only, no metadata and no cache flush,
// so not durable; the fsync that follows is what makes them so). An I/O
// error, or ENOSPC from allocating the blocks, is the write's error. A
// filesystem that does not take the call (EINVAL, EOPNOTSUPP, ENOSYS,
// ESPIPE) gets none: the write goes on and its fsync writes the whole file
// out, as before. The standard library's syscall, not x/sys: this package
// is the store's, which imports the standard library alone
// (agent/backend's TestImportGraph); on 64-bit amd64 and arm64 the call
// takes its four arguments in order.
func writeback(f *os.File, off, n int64) error {
	_, _, e := syscall.Syscall6(syscall.SYS_SYNC_FILE_RANGE, f.Fd(), uintptr(off), uintptr(n),
		syncFileRangeWaitBefore|syncFileRangeWrite|syncFileRangeWaitAfter, 0, 0)
	switch {
	case e == 0:
		return nil
	case e == syscall.EINVAL, e == syscall.EOPNOTSUPP, e == syscall.ENOSYS, e == syscall.ESPIPE:
		return errNoWriteback
	}
	return fmt.Errorf("write out %s: sync_file_range: %w", f.Name(), e)
}
