package procs

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestEnsureMeta: a spare given meta.json's content with its job writes
// the file itself when the agent has not (yet, or ever: it died after
// handing the job), so that started.json never stands without it; it
// leaves the agent's file alone; with no content (the agent wrote the
// file before the job) it does nothing.
func TestEnsureMeta(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, metaFile)
	md := []byte(`{"id":"p-1","session":"s1"}`)
	if err := ensureMeta(dir, md); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(path); err != nil || !bytes.Equal(b, md) {
		t.Fatalf("meta.json after ensureMeta with none there: %q, %v; want %q", b, err, md)
	}
	agents := []byte(`{"id":"p-1","session":"s1","argv":["x"]}`)
	if err := os.WriteFile(path, agents, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := ensureMeta(dir, md); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); !bytes.Equal(b, agents) {
		t.Fatalf("ensureMeta rewrote the agent's meta.json: %q", b)
	}
	empty := t.TempDir()
	if err := ensureMeta(empty, nil); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(empty); len(ents) != 0 {
		t.Fatalf("ensureMeta with no content wrote %d files", len(ents))
	}
	if _, err := os.Stat(path + ".shim.tmp"); !os.IsNotExist(err) {
		t.Fatalf("temporary file left behind: %v", err)
	}
}
