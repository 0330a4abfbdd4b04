//go:build linux

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// max_sessions (flag and file) reaches the backend, and a count outside
// [2, 2^23] is refused with an error that names it.
func TestMaxSessionsConfig(t *testing.T) {
	cfg, _, err := load([]string{"-config", "", "-max-sessions", "131072"})
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.backendConfig().MaxSessions; got != 131072 {
		t.Errorf("backend MaxSessions %d, want 131072", got)
	}
	cfg, _, err = load([]string{"-config", ""})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.backendConfig().MaxSessions != 0 {
		t.Errorf("default MaxSessions %d, want 0 (the backend's default)", cfg.backendConfig().MaxSessions)
	}
	for _, bad := range []string{"1", "8388609"} {
		if _, _, err := load([]string{"-config", "", "-max-sessions", bad}); err == nil || !strings.Contains(err.Error(), "max") {
			t.Errorf("-max-sessions %s: err %v, want an error naming the bound", bad, err)
		}
	}
	file := filepath.Join(t.TempDir(), "agent.json")
	os.WriteFile(file, []byte(`{"max_sessions": 1}`), 0o600)
	if _, _, err := load([]string{"-config", file}); err == nil || !strings.Contains(err.Error(), "max sessions 1") {
		t.Errorf("max_sessions 1 in the file: err %v, want an error naming it", err)
	}
	os.WriteFile(file, []byte(`{"max_sessions": 200000}`), 0o600)
	cfg, _, err = load([]string{"-config", file})
	if err != nil || cfg.backendConfig().MaxSessions != 200000 {
		t.Errorf("max_sessions 200000 in the file: %v, MaxSessions %d", err, cfg.backendConfig().MaxSessions)
	}
}
