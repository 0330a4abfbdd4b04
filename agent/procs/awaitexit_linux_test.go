package procs

import (
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestAwaitExit: awaitExit returns once its child has ended, not before,
// and leaves it to Wait to reap (the exit status is still Wait's to read).
func TestAwaitExit(t *testing.T) {
	cmd := exec.Command("sleep", "0.3")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	awaitExit(cmd.Process.Pid)
	if d := time.Since(t0); d < 250*time.Millisecond {
		t.Fatalf("awaitExit returned after %v, while the process (sleep 0.3) ran", d)
	}
	if err := cmd.Wait(); err != nil || !cmd.ProcessState.Success() {
		t.Fatalf("Wait after awaitExit: %v, %v (want the exit status 0 of the unreaped child)", err, cmd.ProcessState)
	}

	cmd = exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(100*time.Millisecond, func() { cmd.Process.Kill() })
	t0 = time.Now()
	awaitExit(cmd.Process.Pid)
	if d := time.Since(t0); d < 50*time.Millisecond || d > 10*time.Second {
		t.Fatalf("awaitExit returned after %v for a process killed after 100ms", d)
	}
	cmd.Wait()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("Wait after awaitExit: %v (want killed by SIGKILL)", cmd.ProcessState)
	}
}
