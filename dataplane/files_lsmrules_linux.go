package dataplane

import (
	"errors"
	"fmt"
	"io/fs"
	"slices"

	"github.com/shinken-agent/shinken/agent/backend"
)

// fsLSMRules is the inode entries (shk_fs_inodes) of one session's file
// entries. The kernel's walk stops at the nearest inode with a live rule
// and takes what its live rules give together (bpf/files.bpf.c's
// fs_entry), so each keyed inode holds one rule for every grant (handle)
// whose entries cover its path: that grant's rights there as
// backend.FileRightsView says them for the grant's entries alone (narrowest
// wins inside the grant, credential locations closed unless the grant's
// own override entry opens them), or the grant's deny bit where it gives
// nothing there. Then at the nearest keyed inode the live rules add up to
// what the live grants give there, which is what they give at every path
// below it down to the next keyed inode (no grant has an entry in
// between); a revoked grant's rules are dead everywhere at once, and where
// every rule of an inode is dead, every grant covering it is revoked and
// the walk rightly goes on up. The keyed inodes:
//
//   - each entry's path (read, write, delete, deny; persistence and
//     connect entries are mounts of the view only). A deny entry on a path
//     that does not exist denies nothing that exists, and is skipped, as
//     the mount view skips it (nothing there to mask). A path made at that
//     name later is not denied until the session's entries are next
//     applied (its next grant, release or override change; the view also
//     re-derives at a revoke's sweep): a limit the two mechanisms share,
//     said in the threat model.
//   - each credential location (never) at or under an entry's path, where
//     it exists (one that does not exist yet is not covered, as in the
//     view): the grants covering it get nothing there unless their own
//     override entry names the location itself.
//
// A path reached at one inode by two names (hard link, bind mount) gets
// per grant what that grant gives at every one of them (the deny bit if
// one gives nothing).
func fsLSMRules(index uint32, entries []backend.FileEntry, never, fixed []string) (map[shkfsShkFsKey]*shkfsShkFsValue, error) {
	var keyed []backend.FileEntry // only what the LSM keys
	for _, e := range entries {
		if fsAccessBits(e.Access) != 0 {
			keyed = append(keyed, e)
		}
	}
	type at struct {
		k shkfsShkFsKey
		p string
	}
	var points []at
	add := func(p string, missingOK bool, e backend.FileEntry) error {
		dev, ino, err := fsInode(p)
		if err != nil {
			if missingOK && errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return fmt.Errorf("%w: %s: %w", backend.ErrInvalidFileEntry, e, err)
		}
		points = append(points, at{shkfsShkFsKey{Session: index, Dev: dev, Ino: ino}, p})
		return nil
	}
	for _, e := range keyed {
		if err := add(e.Path, e.Access == backend.FileDeny, e); err != nil {
			return nil, err
		}
		for _, n := range never {
			if n != e.Path && backend.PathUnder(n, e.Path) {
				if err := add(n, true, e); err != nil {
					return nil, err
				}
			}
		}
	}
	type grantAt struct {
		k shkfsShkFsKey
		h HandleRef
	}
	access := map[grantAt]uint32{}
	var order []grantAt // the map's order is random: the kernel's rule order is the entries'
	done := map[at]bool{}
	for _, x := range points {
		if done[x] {
			continue
		}
		done[x] = true
		var hs []HandleRef
		for _, e := range keyed {
			if backend.PathUnder(x.p, e.Path) && !slices.Contains(hs, e.Handle) {
				hs = append(hs, e.Handle)
			}
		}
		for _, h := range hs {
			own := slices.DeleteFunc(slices.Clone(keyed), func(e backend.FileEntry) bool { return e.Handle != h })
			r := backend.FileRightsView(own, never, fixed, x.p)
			var bits uint32
			if r.Read {
				bits |= fsAccessBits(backend.FileRead)
			}
			if r.Write {
				bits |= fsAccessBits(backend.FileWrite)
			}
			if r.Delete {
				bits |= fsAccessBits(backend.FileDelete)
			}
			if bits == 0 {
				bits = fsDenyBit
			}
			g := grantAt{x.k, h}
			old, seen := access[g]
			switch {
			case !seen:
				access[g] = bits
				order = append(order, g)
			case old&fsDenyBit != 0 || bits&fsDenyBit != 0 || old&bits == 0:
				access[g] = fsDenyBit
			default:
				access[g] = old & bits
			}
		}
	}
	want := map[shkfsShkFsKey]*shkfsShkFsValue{}
	for _, g := range order {
		v := want[g.k]
		if v == nil {
			v = &shkfsShkFsValue{}
			want[g.k] = v
		}
		if int(v.Nrules) == len(v.Rules) {
			return nil, fmt.Errorf("%w: more than %d grants cover one inode (dev %d, inode %d) of the session that an entry names: the kernel entry holds one rule per covering grant", backend.ErrInvalidFileEntry, len(v.Rules), g.k.Dev, g.k.Ino)
		}
		v.Rules[v.Nrules] = shkfsShkFsRule{Handle: g.h.Slot, Generation: g.h.Generation, Access: access[g]}
		v.Nrules++
	}
	return want, nil
}
