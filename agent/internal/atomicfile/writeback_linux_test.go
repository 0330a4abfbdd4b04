package atomicfile

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// dirtyBytes is how much of f's page cache is dirty (cachestat, Linux
// 6.5+; the test is skipped before).
func dirtyBytes(t *testing.T, f *os.File) int64 {
	t.Helper()
	var st unix.Cachestat_t
	err := unix.Cachestat(uint(f.Fd()), &unix.CachestatRange{}, &st, 0) // Len 0: to the end
	if errors.Is(err, unix.ENOSYS) {
		t.Skip("no cachestat (Linux before 6.5): the file's dirty pages cannot be counted")
	}
	if err != nil {
		t.Fatal(err)
	}
	return int64(st.Dirty) * int64(os.Getpagesize())
}

// diskDir is a directory on a filesystem that keeps dirty pages for
// writeback (not tmpfs, which t.TempDir may be).
func diskDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err == nil && fs.Type == unix.TMPFS_MAGIC {
		d, err := os.MkdirTemp("/var/tmp", "atomicfile-test-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(d) })
		dir = d
	}
	return dir
}

// TestStepWriterWritesOut: a file written through WriteWith's writer holds
// at most one step of dirty pages (the rest written out as it came), where
// the same bytes written plainly are all still dirty.
func TestStepWriterWritesOut(t *testing.T) {
	dir := diskDir(t)
	data := bytes.Repeat([]byte("0123456789abcdef"), (3*WritebackStep+100<<10)/16)
	write := func(w io.Writer) {
		for p := data; len(p) > 0; {
			n := min(len(p), 64<<10)
			if _, err := w.Write(p[:n]); err != nil {
				t.Fatal(err)
			}
			p = p[n:]
		}
	}
	plain, err := os.Create(filepath.Join(dir, "plain"))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	write(plain)
	if d := dirtyBytes(t, plain); d < 2*WritebackStep {
		t.Skipf("the plain file has %d dirty bytes of %d: this filesystem or host writes back at once, nothing to compare", d, len(data))
	}
	stepped, err := os.Create(filepath.Join(dir, "stepped"))
	if err != nil {
		t.Fatal(err)
	}
	defer stepped.Close()
	write(&stepWriter{f: stepped})
	if d := dirtyBytes(t, stepped); d > WritebackStep+64<<10 {
		t.Fatalf("written through the step writer, %d bytes of %d still dirty; want at most the last step's %d", d, len(data), WritebackStep+64<<10)
	}
	got, err := os.ReadFile(stepped.Name())
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes (%v), want the %d written", len(got), err, len(data))
	}
}

// TestWriteWithLarge: a file of several steps, written in pieces of odd
// sizes, replaces the old one byte for byte.
func TestWriteWithLarge(t *testing.T) {
	p := filepath.Join(diskDir(t), "big")
	if err := os.WriteFile(p, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 2*WritebackStep+12345)
	for i := range data {
		data[i] = byte(i * 7)
	}
	err := WriteWith(p, 0o600, func(w io.Writer) error {
		for rest, n := data, 1; len(rest) > 0; n = n*3 + 1 {
			k := min(len(rest), n%(300<<10)+1)
			if _, err := w.Write(rest[:k]); err != nil {
				return err
			}
			rest = rest[k:]
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(p)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes (%v), want the %d written", len(got), err, len(data))
	}
}

// TestStepWriterNoWriteback: a file that takes no sync_file_range (a pipe
// here: ESPIPE) is written all the same, its writeback left to the fsync.
func TestStepWriterNoWriteback(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	read := make(chan int64)
	go func() { n, _ := io.Copy(io.Discard, r); read <- n }()
	sw := &stepWriter{f: w}
	data := make([]byte, 3*WritebackStep)
	for p := data; len(p) > 0; p = p[64<<10:] {
		if _, err := sw.Write(p[:64<<10]); err != nil {
			t.Fatalf("write to a pipe through the step writer: %v", err)
		}
	}
	w.Close()
	if n := <-read; n != int64(len(data)) || !sw.none {
		t.Fatalf("%d bytes through, writeback given up %v; want %d and true", n, sw.none, len(data))
	}
}
