//go:build linux

// Command fs is the file-scope benchmark (make bench-fs). It starts the real
// shinken-agent on private directories and, through its API, makes three
// sessions:
//
//   - fs: a workspace in workspace-write mode and an fs.scope grant
//     (write on a tree inside it) in force, so its mount view holds the
//     workspace's and the grant's idmapped binds;
//   - base: the same kind of session with no workspace and no grant (the
//     plain read-only host view);
//   - gv: a workspace in read-only mode, for grant to visible.
//
// In interleaved rounds (fs, base, then base, fs, ...) a worker (this binary,
// run in the session through the API) times open+read+close of a small
// file in the granted tree, `git status` in a 10,000-file repository in the
// granted tree (committed once), and fork+exec+wait of /bin/true. The ratio
// of a round is base time / fs time (1.0: no cost; the goal is >= 0.90);
// the figure is the median of the per-round ratios.
//
// Grant to visible: a worker in gv retries open(O_CREAT) of a probe file
// every 50 µs (once the bench says the last grant is revoked); the bench
// notes CLOCK_MONOTONIC, asks for the fs.scope
// write grant through the API (POST /v1/requests), waits for the probe on
// the host, revokes (POST /v1/grants/revoke) and grants again. The worker
// reports when each open succeeded; the figure is that minus the time
// before the grant's request.
//
// It prints which mechanism enforces fs.scope and the exec allowlist (the
// agent's probe facts fs_lsm and exec_lsm), then the figures as name=value
// lines, each name after -prefix. bench/fs/vm (make bench-fs-vm) runs it in
// .ci/vmtest's VM, where the BPF LSM programs attach, with -prefix vm_.
//
// It removes everything it made.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/shinken-agent/shinken/agent/api/wire"
	"github.com/shinken-agent/shinken/agent/capability"
	"github.com/shinken-agent/shinken/bench/internal/benchkit"
)

var (
	flagBin        = flag.String("bin", "bin", "directory holding shinken-agent (and its launchers)")
	flagRounds     = flag.Int("rounds", 20, "interleaved rounds per session")
	flagOpens      = flag.Int("opens", 2000, "open+read+close per round")
	flagGits       = flag.Int("gits", 3, "git status per round")
	flagExecs      = flag.Int("execs", 100, "exec of /bin/true per round")
	flagFiles      = flag.Int("files", 10000, "files in the git workspace")
	flagGrants     = flag.Int("grants", 200, "timed grant-to-visible rounds")
	flagAgentStart = flag.Duration("agent-start", 30*time.Second, "how long the agent may take to answer its socket (bench/fs/vm: longer, BPF objects load slowly under emulation)")
	flagAccept     = flag.String("boundary-accept", "", "comma-separated session-boundary mechanisms whose weaker level the agent accepts (its boundary_accept; bench/fs/vm: \"landlock scoping\", which Linux 6.1 lacks)")
	flagPrefix     = flag.String("prefix", "", "put before every name=value line's name (bench/fs/vm: vm_)")
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "worker" {
		workerMain()
	}
	flag.Parse()
	log.SetFlags(0)
	if os.Geteuid() != 0 {
		log.Fatal("bench-fs needs root")
	}
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

type bench struct {
	hc  *http.Client
	dir string
	exe string // the worker, readable by the sessions
}

func run() error {
	// Not under /tmp: a session's /tmp is its own.
	dir, err := os.MkdirTemp("/var/tmp", "shinken-bench-fs-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	tag := filepath.Base(dir)[len("shinken-bench-fs-"):]
	// The agent's own directories apart: they are credential locations,
	// which no workspace may contain.
	priv, err := os.MkdirTemp("", "shinken-bench-fs-agent-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(priv)
	b := &bench{dir: dir, exe: filepath.Join(dir, "worker")}
	if err := copyFile("/proc/self/exe", b.exe, 0o755); err != nil {
		return err
	}
	ws, gvws := filepath.Join(dir, "ws"), filepath.Join(dir, "gv")
	tree := filepath.Join(ws, "tree")
	small, repo, gvdir := filepath.Join(tree, "small"), filepath.Join(tree, "repo"), filepath.Join(gvws, "w")
	for _, d := range []string{tree, gvdir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := os.WriteFile(small, bytes.Repeat([]byte("x"), 512), 0o644); err != nil {
		return err
	}
	if err := makeRepo(repo, *flagFiles); err != nil {
		return err
	}

	parent, pin := "shinken-bench-fs-"+tag, "/sys/fs/bpf/shinken-bench-fs-"+tag
	sock := filepath.Join(priv, "agent.sock")
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	metricsAddr := ln.Addr().String()
	ln.Close()
	agentBin := filepath.Join(*flagBin, "shinken-agent")
	os.MkdirAll(filepath.Join(priv, "manifests"), 0o755)
	manifest := fmt.Sprintf("image bench\nallow fs.scope read=%s,%s write=%s,%s delete=%s\n", ws, gvws, ws, gvws, ws)
	os.WriteFile(filepath.Join(priv, "manifests", "bench.manifest"), []byte(manifest), 0o644)
	config := ""
	if *flagAccept != "" {
		config = filepath.Join(priv, "agent.json")
		j, err := json.Marshal(map[string][]string{"boundary_accept": strings.Split(*flagAccept, ",")})
		if err != nil {
			return err
		}
		if err := os.WriteFile(config, j, 0o600); err != nil {
			return err
		}
		fmt.Printf("boundary: weaker level accepted for %s\n", *flagAccept)
	}
	cmd := exec.Command(agentBin, "-config", config, "-state-dir", filepath.Join(priv, "state"), "-socket", sock,
		"-metrics-addr", metricsAddr, "-policy-dir", filepath.Join(priv, "policy"), "-manifest-dir", filepath.Join(priv, "manifests"),
		"-cgroup-parent", parent, "-pin-path", pin, "-dns-listen", "0.0.0.0:0", "-dns-upstreams", "127.0.0.1:9")
	var alog bytes.Buffer
	cmd.Stdout, cmd.Stderr = &alog, &alog
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		cmd.Process.Kill()
		<-exited
		if out, err := exec.Command(agentBin, "-cgroup-parent", parent, "-pin-path", pin, "-uninstall").CombinedOutput(); err != nil {
			log.Printf("uninstall: %v: %s", err, out)
		}
	}()
	b.hc = &http.Client{Transport: &http.Transport{Dial: func(_, _ string) (net.Conn, error) { return net.Dial("unix", sock) }}}
	up := false
	for start := time.Now(); time.Since(start) < *flagAgentStart && !up; {
		select {
		case err := <-exited:
			exited <- err // for the deferred cleanup
			return fmt.Errorf("agent exited before it answered (%v):\n%s", err, alog.String())
		default:
		}
		if resp, err := b.hc.Get("http://shinken/v1/status"); err == nil {
			resp.Body.Close()
			up = resp.StatusCode == 200
		}
		if !up {
			time.Sleep(50 * time.Millisecond)
		}
	}
	if !up {
		return fmt.Errorf("agent did not answer within %v (-agent-start):\n%s", *flagAgentStart, alog.String())
	}
	for _, s := range []capability.SessionSpec{
		{ID: "fs", Image: "bench", Workspace: ws, Mode: "workspace-write"},
		{ID: "base", Image: "bench"},
		{ID: "gv", Image: "bench", Workspace: gvws, Mode: "read-only"},
	} {
		if code, msg, err := b.post("/v1/sessions", s, nil); err != nil || code/100 != 2 {
			return fmt.Errorf("create session %s: HTTP %d %v: %s", s.ID, code, err, msg)
		}
	}
	// Delete too: git status replaces the index through index.lock, a
	// rename and an unlink, which BPF LSM checks apart from write (the
	// mount view cannot tell them apart).
	if _, err := b.grant("fs", capability.FSScope{Read: []string{tree}, Write: []string{tree}, Delete: []string{tree}}); err != nil {
		return err
	}

	host, _ := os.Hostname()
	fmt.Printf("machine: %s, %d CPUs, kernel %s, load average %s\n", host, numCPU(), benchkit.KernelRelease(), benchkit.LoadAvg())
	if err := b.mechanism(); err != nil {
		return err
	}
	fmt.Printf("rounds %d x (%d opens, %d git status, %d execs) per session, %d files in the repository, %d grants\n",
		*flagRounds, *flagOpens, *flagGits, *flagExecs, *flagFiles, *flagGrants)
	samples := map[string]map[string][]float64{"fs": {}, "base": {}}
	ratios := map[string][]float64{}
	for r := 0; r < *flagRounds; r++ {
		order := []string{"fs", "base"}
		if r%2 == 1 {
			order = []string{"base", "fs"}
		}
		means := map[string]map[string]float64{}
		for _, s := range order {
			out, err := b.runIn(s, "ops", small, repo, strconv.Itoa(*flagOpens), strconv.Itoa(*flagGits), strconv.Itoa(*flagExecs))
			if err != nil {
				return err
			}
			got, err := benchkit.ParseLines(out)
			if err != nil {
				return fmt.Errorf("session %s: %w", s, err)
			}
			means[s] = map[string]float64{}
			for op, v := range got {
				samples[s][op] = append(samples[s][op], v...)
				means[s][op] = benchkit.Mean(v)
			}
		}
		for _, op := range []string{"open", "git", "exec"} {
			ratios[op] = append(ratios[op], means["base"][op]/means["fs"][op])
		}
	}
	for _, op := range []string{"open", "git", "exec"} {
		for _, s := range []string{"base", "fs"} {
			v := samples[s][op]
			sort.Float64s(v)
			figure(s+"_"+op+"_p50_us", "%.1f", benchkit.Q(v, 0.5)/1e3)
			figure(s+"_"+op+"_p99_us", "%.1f", benchkit.Q(v, 0.99)/1e3)
		}
	}
	vis, err := b.grantToVisible(gvdir, *flagGrants)
	if err != nil {
		return err
	}
	sort.Float64s(vis)
	for _, op := range []string{"open", "git", "exec"} {
		sort.Float64s(ratios[op])
	}
	figure("git_status_ratio_vs_baseline", "%.3f", benchkit.Q(ratios["git"], 0.5))
	figure("fs_grant_to_visible_p50_ms", "%.3f", benchkit.Q(vis, 0.5))
	figure("fs_open_ratio_vs_baseline", "%.3f", benchkit.Q(ratios["open"], 0.5))
	figure("exec_ratio_vs_baseline", "%.3f", benchkit.Q(ratios["exec"], 0.5))
	figure("fs_grant_to_visible_p99_ms", "%.3f", benchkit.Q(vis, 0.99))
	return nil
}

// figure prints one name=value line, the name after -prefix.
func figure(name, format string, v float64) {
	fmt.Printf("%s%s="+format+"\n", *flagPrefix, name, v)
}

// mechanism prints which mechanism enforces fs.scope and the exec
// allowlist here, as the agent probed it (GET /v1/status): the mount view
// alone, or the BPF LSM programs too.
func (b *bench) mechanism() error {
	resp, err := b.hc.Get("http://shinken/v1/status")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var st struct {
		Backend struct {
			Facts map[string]string `json:"facts"`
		} `json:"backend"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return fmt.Errorf("status: %w", err)
	}
	if v, ok := st.Backend.Facts["lsm"]; ok {
		fmt.Printf("kernel LSMs: %s\n", v)
	}
	for _, k := range []string{"fs_lsm", "exec_lsm"} {
		v, ok := st.Backend.Facts[k]
		if !ok {
			return fmt.Errorf("status: no %s fact in the agent's probe report", k)
		}
		fmt.Printf("%s: %s\n", k, v)
	}
	return nil
}

// grantToVisible: see the package doc. Times in ms.
func (b *bench) grantToVisible(dir string, n int) ([]float64, error) {
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := b.runIn("gv", "visible", dir, strconv.Itoa(n+1))
		done <- result{out, err}
	}()
	var t0s []int64
	for i := 0; i <= n; i++ {
		g := fmt.Sprintf("%s/go-%d", dir, i)
		if err := os.WriteFile(g, nil, 0o644); err != nil {
			return nil, err
		}
		t0s = append(t0s, benchkit.MonoNS())
		h, err := b.grant("gv", capability.FSScope{Write: []string{dir}})
		if err != nil {
			return nil, err
		}
		p := fmt.Sprintf("%s/probe-%d", dir, i)
		deadline := time.Now().Add(30 * time.Second)
		for {
			if _, err := os.Lstat(p); err == nil {
				break
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("%s: not created 30 s after its grant", p)
			}
			time.Sleep(100 * time.Microsecond)
		}
		if code, msg, err := b.post("/v1/grants/revoke", wire.RevokeBody{Handle: h}, nil); err != nil || code != http.StatusOK {
			return nil, fmt.Errorf("revoke %s: HTTP %d %v: %s", h, code, err, msg)
		}
		os.Remove(p)
		os.Remove(g)
	}
	r := <-done
	if r.err != nil {
		return nil, r.err
	}
	got, err := benchkit.ParseLines(r.out)
	if err != nil {
		return nil, err
	}
	seen := got["seen"]
	if len(seen) != n+1 {
		return nil, fmt.Errorf("visible worker: %d times, want %d", len(seen), n+1)
	}
	var ms []float64
	for i := 1; i <= n; i++ { // the first grant is untimed: the worker may start after it
		ms = append(ms, (seen[i]-float64(t0s[i]))/1e6)
	}
	return ms, nil
}

// grant asks for fs.scope sc for session s and returns the handle; it must
// be granted at once (inside the workspace: the notify tier).
func (b *bench) grant(s string, sc capability.FSScope) (string, error) {
	req := capability.GrantRequest{Session: s, Lifecycle: capability.LifecycleSession, Capability: capability.Capability{Class: capability.ClassFSScope, FS: &sc}}
	var res []wire.RequestResult
	code, msg, err := b.post("/v1/requests", wire.RequestBody{Requests: []capability.GrantRequest{req}}, &res)
	if err != nil {
		return "", err
	}
	if len(res) != 1 || res[0].Outcome != "granted" || res[0].Grant == nil {
		return "", fmt.Errorf("grant fs.scope %+v to %s: HTTP %d: %s (want granted at once)", sc, s, code, msg)
	}
	return res[0].Grant.Handle, nil
}

// runIn runs the worker in session s and returns its stdout.
func (b *bench) runIn(s string, args ...string) (string, error) {
	var res wire.RunResult
	argv := append([]string{b.exe, "worker"}, args...)
	code, msg, err := b.post("/v1/sessions/"+s+"/run", wire.RunRequest{Argv: argv, TimeoutS: 600}, &res)
	if err != nil {
		return "", err
	}
	if code != http.StatusOK || res.ExitCode != 0 || res.Truncated {
		return "", fmt.Errorf("run in %s: HTTP %d, exit %d, truncated %v: %s %s", s, code, res.ExitCode, res.Truncated, res.Stderr, msg)
	}
	return res.Stdout, nil
}

func (b *bench) post(path string, body, out any) (int, []byte, error) {
	j, err := json.Marshal(body)
	if err != nil {
		return 0, nil, err
	}
	resp, err := b.hc.Post("http://shinken"+path, "application/json", bytes.NewReader(j))
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	msg, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, msg, err
	}
	if out != nil && resp.StatusCode/100 == 2 {
		if err := json.Unmarshal(msg, out); err != nil {
			return resp.StatusCode, msg, fmt.Errorf("%s: %v: %s", path, err, msg)
		}
	}
	return resp.StatusCode, msg, nil
}
