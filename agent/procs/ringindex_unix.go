//go:build unix

package procs

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"
)

// createIndex makes the rings' index in dir (zero: both streams empty) and
// maps it read-write: the shim's, for its job (unmapped once the job's
// rings no longer reference it: a spare shim takes several jobs).
func createIndex(dir string) (*ringIndex, error) {
	f, err := os.OpenFile(filepath.Join(dir, indexFile), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := f.Truncate(indexBytes); err != nil {
		return nil, err
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, indexBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("procs: map %s: %w", indexFile, err)
	}
	x := &ringIndex{mem: mem}
	runtime.SetFinalizer(x, func(x *ringIndex) { unix.Munmap(x.mem) })
	return x, nil
}

// openIndex maps the rings' index in dir read-only (the agent's); it is
// unmapped once the index is no longer referenced.
func openIndex(dir string) (*ringIndex, error) {
	f, err := os.Open(filepath.Join(dir, indexFile))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || st.Size() != indexBytes {
		return nil, fmt.Errorf("procs: %s is not %d bytes (%v)", f.Name(), indexBytes, err)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, indexBytes, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("procs: map %s: %w", f.Name(), err)
	}
	x := &ringIndex{mem: mem}
	runtime.SetFinalizer(x, func(x *ringIndex) { unix.Munmap(x.mem) })
	return x, nil
}
