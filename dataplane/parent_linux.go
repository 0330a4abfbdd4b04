package dataplane

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// parentMark marks a cgroup as the sessions' parent of a Shinken agent
// (a trusted.* attribute: only root sets or reads one).
const parentMark = "trusted.shinken.parent"

// ErrForeignParent: the configured parent cgroup is someone else's.
var ErrForeignParent = errors.New("the parent cgroup is not Shinken's")

// claimParent makes parent the sessions' parent cgroup: made here, or an
// existing one that is Shinken's (ownsParent), and marks it. Every other
// cgroup is refused: the programs attached to the parent would decide
// the egress of whatever runs below it, and an uninstall kills every
// cgroup below it (-cgroup-parent system.slice would end the host's
// services).
func claimParent(parent, pinPath string) error {
	err := os.Mkdir(parent, 0o755)
	if err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("create parent cgroup: %w", err)
	}
	if err != nil {
		if err := ownsParent(parent, pinPath); err != nil {
			return err
		}
	}
	if err := unix.Setxattr(parent, parentMark, []byte("1"), 0); err != nil {
		return fmt.Errorf("mark parent cgroup %s: %w", parent, err)
	}
	return nil
}

// ownsParent is nil when the existing cgroup parent is Shinken's: it
// carries the mark, or the links pinned at pinPath are attached to it (an
// agent from before the mark made it), or it is empty (no child cgroup, no
// process: a leftover of a failed start, or one an operator made for
// it). Otherwise it is an error wrapping ErrForeignParent.
func ownsParent(parent, pinPath string) error {
	if n, err := unix.Getxattr(parent, parentMark, make([]byte, 8)); err == nil && n > 0 {
		return nil
	}
	id, err := cgroupID(parent)
	if err != nil {
		return err
	}
	if pinnedOn(pinPath, id) {
		return nil
	}
	ents, err := os.ReadDir(parent)
	if err != nil {
		return fmt.Errorf("parent cgroup: %w", err)
	}
	children := 0
	for _, e := range ents {
		if e.IsDir() {
			children++
		}
	}
	procs, err := os.ReadFile(filepath.Join(parent, "cgroup.procs"))
	if err != nil {
		return fmt.Errorf("parent cgroup: %w", err)
	}
	if children == 0 && len(bytes.TrimSpace(procs)) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s exists with %d child cgroups and %d processes, and carries neither the %s mark nor Shinken's pinned links (%s): choose a parent of its own (-cgroup-parent)",
		ErrForeignParent, parent, children, len(bytes.Fields(procs)), parentMark, pinPath)
}

// pinnedOn reports whether a cgroup link pinned under pinPath/links is
// attached to the cgroup with id.
func pinnedOn(pinPath string, id uint64) bool {
	dir := filepath.Join(pinPath, "links")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range ents {
		l, err := link.LoadPinnedLink(filepath.Join(dir, e.Name()), nil)
		if err != nil {
			continue
		}
		info, err := l.Info()
		l.Close()
		if err != nil {
			continue
		}
		if cg := info.Cgroup(); cg != nil && cg.CgroupId == id {
			return true
		}
	}
	return false
}
