package dataplane

import (
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
)

// TestFileScopeDelete: delete[] on the mount view. A delete entry without
// its grant's write over it is refused (ErrDeleteNeedsWrite: the view
// cannot give unlink apart from write) and changes nothing: the session
// still cannot delete there, nor write (no widening into write). Inside its
// grant's write root it is held and the delete works. What the view cannot
// do, checked so that it is seen to change when a hook lands: a write root
// lets delete without a delete entry.
func TestFileScopeDelete(t *testing.T) {
	d, r := fsSession(t)
	h, err := d.NewHandle(HandleRef{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	err = d.Apply("fs", backend.Delta{Files: []backend.FileEntry{{Path: r + "/other", Access: backend.FileDelete, Handle: h}}})
	if !errors.Is(err, backend.ErrDeleteNeedsWrite) || !errors.Is(err, backend.ErrNotSupported) {
		t.Fatalf("a delete entry alone: %v, want ErrDeleteNeedsWrite", err)
	}
	t.Logf("verified: refused: %v", err)
	wantSh(t, d, "delete after the refused delete entry", "rm "+r+"/other/f", false)
	wantSh(t, d, "write after the refused delete entry", "echo x >> "+r+"/other/f", false)
	if snap, _ := d.Snapshot(); len(snap.Deltas["fs"].Files) != 0 {
		t.Errorf("the refused entry is held: %v", snap.Deltas["fs"].Files)
	}
	fileGrant(t, d, backend.FileEntry{Path: r + "/repo", Access: backend.FileWrite}, backend.FileEntry{Path: r + "/repo/a", Access: backend.FileDelete})
	wantSh(t, d, "delete inside its grant's write root", "rm "+r+"/repo/a/f", true)
	if _, err := os.Stat(r + "/repo/a/f"); err == nil {
		t.Error("repo/a/f still on the host")
	}
	// Where the mount view alone holds fs.scope they are not separable (the
	// probe row says so): a write root without a delete entry lets
	// delete. Where BPF LSM is active (.ci/vmtest) it refuses it.
	lsm := d.Probe().Class(backend.ClassFSScope).Level == backend.RevocableInKernel
	fileGrant(t, d, backend.FileEntry{Path: r + "/other", Access: backend.FileWrite})
	wantSh(t, d, fmt.Sprintf("delete under write alone (BPF LSM: %v)", lsm), "rm "+r+"/other/f", !lsm)
}
