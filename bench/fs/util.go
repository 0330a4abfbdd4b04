//go:build linux

package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"
)

// makeRepo makes a git repository of n small files in 100 directories,
// commits it once and runs `git status` once, so that the index is fresh
// (and, a second later, no entry is racily clean) before anything is timed.
func makeRepo(repo string, n int) error {
	for i := 0; i < n; i++ {
		d := filepath.Join(repo, fmt.Sprintf("d%02d", i%100))
		if i < 100 {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
		if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%05d.txt", i)), []byte(fmt.Sprintf("file %d\n", i)), 0o644); err != nil {
			return err
		}
	}
	git := func(args ...string) error {
		cmd := exec.Command("git", append([]string{"-C", repo, "-c", "user.name=bench", "-c", "user.email=bench@localhost"}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("git %v: %v %s", args, err, out)
		}
		return nil
	}
	for _, a := range [][]string{{"init", "-q"}, {"add", "-A"}, {"commit", "-q", "-m", "bench"}} {
		if err := git(a...); err != nil {
			return err
		}
	}
	time.Sleep(1100 * time.Millisecond)
	return git("status", "--porcelain")
}

func copyFile(from, to string, mode os.FileMode) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func numCPU() int { return runtime.NumCPU() }
