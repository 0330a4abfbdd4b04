package main

// End-to-end: policy changes through the gate (shinkenctl policy, SIGHUP, a
// restart) and use-time decisions (shinkenctl decide), through the daemon.

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shinken-agent/shinken/agent/shiftproof"
	"github.com/shinken-agent/shinken/agent/shiftproof/z3test"
)

const e2eGPU = `@id("admin.gpu")
permit (principal, action == Shinken::Action::"use", resource == Shinken::Capability::"gpu")
when { principal.image == "trainer" && context.request.mode == "compute" };
`

func TestPolicyGateEndToEnd(t *testing.T) {
	z3test.Require(t, shiftproof.Z3Path) // the daemon's solver: a failure under CI
	e := newEnv(t)
	pdir := filepath.Join(e.dir, "policy")
	os.MkdirAll(pdir, 0o755)
	os.WriteFile(filepath.Join(pdir, "gpu.cedar"), []byte(e2eGPU), 0o644)
	e.startAgent()

	// decide: the rule that decided
	e.mustCtl("session", "create", "pg", "-image", "e2e")
	var res []reqResult
	e.ctlJSON(&res, "request", "pg", "net.egress", "-cidr", "127.0.0.2/32", "-port", "443")
	if res[0].Outcome != "granted" {
		t.Fatalf("%+v", res)
	}
	if out := e.mustCtl("decide", "pg", "net.egress", "connect", "-ip", "127.0.0.2", "-port", "443"); !strings.HasPrefix(out, "allow (decided by grant:") {
		t.Fatalf("decide allowed: %q", out)
	}
	if out, err := e.ctl("decide", "pg", "gpu", "use", "-item", "0", "-mode", "compute"); err == nil || !strings.HasPrefix(out, "deny (decided by default-deny)") {
		t.Fatalf("decide denied: %q, %v", out, err)
	}

	// policy diff / apply through the gate
	prop := filepath.Join(t.TempDir(), "gpu.cedar")
	os.WriteFile(prop, []byte(strings.Replace(e2eGPU, `principal.image == "trainer" && `, "", 1)), 0o644)
	if out, err := e.ctl("policy", "diff", prop); err == nil || !strings.Contains(out, "widening:") || !strings.Contains(out, "admin.gpu") {
		t.Fatalf("policy diff of a widening (exit 3): %q, %v", out, err)
	}
	if out, err := e.ctl("policy", "apply", prop); err == nil || !strings.Contains(out, "refused:") {
		t.Fatalf("policy apply of a widening: %q, %v", out, err)
	}
	if data, _ := os.ReadFile(filepath.Join(pdir, "gpu.cedar")); string(data) != e2eGPU {
		t.Fatal("a refused change reached the policy directory")
	}
	narrow := filepath.Join(t.TempDir(), "gpu.cedar")
	os.WriteFile(narrow, []byte(strings.Replace(e2eGPU, `"compute"`, `"compute" && context.request.item == "0"`, 1)), 0o644)
	if out := e.mustCtl("policy", "apply", narrow); !strings.Contains(out, "applied: proven non-widening") {
		t.Fatalf("policy apply of a narrowing: %q", out)
	}
	if out := e.mustCtl("policy", "apply", "--allow-widening", prop); !strings.Contains(out, "applied:") {
		t.Fatalf("policy apply --allow-widening: %q", out)
	}
	if out := e.mustCtl("decide", "pg", "gpu", "use", "-item", "0", "-mode", "compute"); !strings.HasPrefix(out, "allow (decided by admin.gpu)") {
		t.Fatalf("decide after the accepted widening: %q", out)
	}

	// SIGHUP: a widening edit of the directory is refused, the set stays
	os.WriteFile(filepath.Join(pdir, "extra.cedar"), []byte(`@id("admin.sudo") permit (principal, action == Shinken::Action::"use", resource == Shinken::Capability::"install.privileged");`), 0o644)
	e.agent.Process.Signal(syscall.SIGHUP)
	deadline := time.Now().Add(10 * time.Second)
	for {
		e.logMu.Lock()
		logged := strings.Contains(e.agentLog.String(), "policy reload refused")
		e.logMu.Unlock()
		if logged {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("SIGHUP: no refusal logged")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if out, _ := e.ctl("decide", "pg", "install.privileged", "pkg"); !strings.HasPrefix(out, "deny") {
		t.Fatalf("after a refused SIGHUP reload: %q", out)
	}

	// restart with the widened directory: refused; accepted with the flag
	e.stopAgent(syscall.SIGTERM)
	cmd := exec.Command(filepath.Join(e.bin, "shinken-agent"), "-config", "", "-state-dir", filepath.Join(e.dir, "state"), "-socket", e.socket,
		"-metrics-addr", e.metrics, "-policy-dir", pdir, "-manifest-dir", filepath.Join(e.dir, "manifests"),
		"-cgroup-parent", e.parent, "-pin-path", e.pin, "-dns-listen", "0.0.0.0:0", "-dns-upstreams", e.upstream)
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "accept-policy-widening") {
		t.Fatalf("restart with a widened policy directory: %v\n%s", err, out)
	}
	e.extra = []string{"-accept-policy-widening"}
	e.startAgent()
	if out := e.mustCtl("decide", "pg", "install.privileged", "pkg"); !strings.HasPrefix(out, "allow (decided by admin.sudo)") {
		t.Fatalf("after the accepted restart: %q", out)
	}
}
