package dataplane

import (
	"errors"
	"fmt"
	"io/fs"

	"github.com/shinken-agent/shinken/agent/backend"
)

// fsLSMRules is the inode entries (shk_fs_inodes) of one session's file
// entries: for each inode an entry's path names, one rule per grant
// (handle), that grant's accesses there folded together, or its deny bit
// where the grant gives nothing there (the kernel then takes that grant's
// rights on the inode and no other grant's: bpf/files.bpf.c's fs_entry).
// It says at each such inode what backend.FileRightsView says for the
// grants naming it:
//
//   - A deny entry on a path that does not exist denies nothing that
//     exists, and is skipped, as the mount view skips it (nothing there to
//     mask). A path made at that name later is not denied until the
//     session's entries are next applied (its next grant, release or
//     override change; the view also re-derives at a revoke's sweep): a
//     limit the two mechanisms share, said in the threat model.
//   - Credential locations (never): an entry at or under one gives nothing
//     (its grant's deny bit on its inode) unless it carries an admin
//     override (FileEntry.Override) and no location of fixed (the agent's
//     own) nor a container runtime's socket covers it; a location at or
//     under an entry's path gets a deny rule under that entry's grant
//     (a broad entry above a location never opens it), except where that
//     grant's override entry names the location itself (its rule there is
//     the override's access). A location that does not exist yet is not
//     covered (as in the view).
func fsLSMRules(index uint32, entries []backend.FileEntry, never, fixed []string) (map[shkfsShkFsKey]*shkfsShkFsValue, error) {
	type grantAt struct {
		k shkfsShkFsKey
		h HandleRef
	}
	type rule struct {
		give    uint32 // accesses the grant's entries give at the inode
		deny    bool   // the grant's deny entry names the inode
		blocked bool   // a credential location takes the grant's entry there
		opened  bool   // the grant's override entry names the inode
	}
	rules := map[grantAt]*rule{}
	var order []grantAt // the map's order is random: the kernel's rule order is the entries'
	at := func(x grantAt) *rule {
		r := rules[x]
		if r == nil {
			r = &rule{}
			rules[x] = r
			order = append(order, x)
		}
		return r
	}
	fixedAt := func(p string) bool {
		for _, l := range [][]string{fixed, backend.ContainerRuntimeSockets} {
			for _, n := range l {
				if backend.PathUnder(p, n) {
					return true
				}
			}
		}
		return false
	}
	var below []grantAt // credential locations below an entry's path
	for _, e := range entries {
		bits := fsAccessBits(e.Access)
		if bits == 0 {
			continue
		}
		dev, ino, err := fsInode(e.Path)
		if err != nil {
			if e.Access == backend.FileDeny && errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return nil, fmt.Errorf("%w: %s: %w", backend.ErrInvalidFileEntry, e, err)
		}
		x := grantAt{shkfsShkFsKey{Session: index, Dev: dev, Ino: ino}, e.Handle}
		r := at(x)
		if e.Access == backend.FileDeny {
			r.deny = true
			continue
		}
		credential := false
		for _, n := range never {
			switch {
			case backend.PathUnder(e.Path, n):
				credential = true
			case backend.PathUnder(n, e.Path):
				if ndev, nino, nerr := fsInode(n); nerr == nil {
					below = append(below, grantAt{shkfsShkFsKey{Session: index, Dev: ndev, Ino: nino}, e.Handle})
				}
			}
		}
		switch {
		case !credential:
			r.give |= bits
		case e.Override && !fixedAt(e.Path):
			r.give |= bits
			r.opened = true
		default:
			r.blocked = true
		}
	}
	for _, x := range below {
		if r := rules[x]; r == nil || !r.opened {
			at(x).blocked = true
		}
	}
	want := map[shkfsShkFsKey]*shkfsShkFsValue{}
	for _, x := range order {
		r := rules[x]
		access := r.give
		if r.deny || access == 0 {
			access = fsDenyBit
		}
		v := want[x.k]
		if v == nil {
			v = &shkfsShkFsValue{}
			want[x.k] = v
		}
		if int(v.Nrules) == len(v.Rules) {
			return nil, fmt.Errorf("%w: more than %d grants name one inode (dev %d, inode %d) of the session", backend.ErrInvalidFileEntry, len(v.Rules), x.k.Dev, x.k.Ino)
		}
		v.Rules[v.Nrules] = shkfsShkFsRule{Handle: x.h.Slot, Generation: x.h.Generation, Access: access}
		v.Nrules++
	}
	return want, nil
}
