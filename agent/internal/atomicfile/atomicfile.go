// Package atomicfile replaces a file's contents so that a crash at any
// instant leaves either the old file or the new one, whole, never a mix.
package atomicfile

import (
	"errors"
	"io"
	"os"
	"path/filepath"
)

// Write replaces path with data, which ends up with exactly mode (the umask
// neither widens nor narrows it). It writes a fresh temporary file in the same
// directory (created exclusively, 0600 until the chmod, so no other writer
// shares it and nobody reads a partial file), fsyncs it, renames it over path
// and fsyncs the directory, so the rename itself is durable when Write
// returns nil. On any error before the rename the temporary file is removed
// and path is untouched; an error from the directory fsync comes after the
// rename, so path may then hold either version.
func Write(path string, data []byte, mode os.FileMode) error {
	return WriteWith(path, mode, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// WriteWith is Write with the contents written by write, into the
// temporary file (buffered by the caller if it writes in small pieces), so
// a large file is never held whole in memory: an error from write leaves
// path untouched, as any error before the rename does. What write has
// written goes out to the disk a step (WritebackStep) at a time as it
// comes (writeback: Linux on amd64 and arm64), so that the fsync at the
// end finds little left, and
// a concurrent fsync of another file on the same filesystem (the agent's
// journal or audit log behind a grant) does not wait, in the filesystem's
// journal commit, for the whole file's data at once.
func WriteWith(path string, mode os.FileMode, write func(io.Writer) error) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	renamed := false
	defer func() {
		if !renamed {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err := f.Chmod(mode); err != nil {
		return err
	}
	if err := write(&stepWriter{f: f}); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	renamed = true
	return SyncDir(dir)
}

// SyncDir fsyncs a directory, making the creations, renames and removals of
// its entries durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// WritebackStep is how much WriteWith lets its file gather before it
// writes it out and waits (the "bytes per sync" of database engines).
const WritebackStep = 1 << 20

// stepWriter writes to f and, each time WritebackStep more bytes have been
// written, writes them out to the disk and waits (writeback): a step of
// write-out at a time, on the writer's own thread, not the whole file at
// its fsync. Not a durability point: the fsync still makes the file
// durable.
type stepWriter struct {
	f       *os.File
	written int64 // bytes written so far
	out     int64 // bytes written out by writeback
	none    bool  // the filesystem or OS has no writeback: leave it to the fsync
}

// errNoWriteback: writeback is not available for this file.
var errNoWriteback = errors.New("atomicfile: no writeback here")

func (w *stepWriter) Write(p []byte) (int, error) {
	n, err := w.f.Write(p)
	w.written += int64(n)
	if err == nil && !w.none && w.written-w.out >= WritebackStep {
		switch werr := writeback(w.f, w.out, w.written-w.out); {
		case errors.Is(werr, errNoWriteback):
			w.none = true
		case werr != nil:
			return n, werr
		}
		w.out = w.written
	}
	return n, err
}
