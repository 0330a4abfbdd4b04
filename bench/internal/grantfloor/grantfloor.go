//go:build linux

// Package grantfloor is the grant floor: what a grant costs this machine
// with no agent code at all, for the benches that time grants beside it
// (bench-agent's grant_floor_p99_ms, bench-neighbor's grant floor control).
//
// A child process (the bench's own binary, started by Start with a flag of
// the bench's that makes it call Register and serve) answers POST
// /v1/requests on a unix socket with net/http's server, as the daemon's API
// does for a grant: it decodes the body, writes the grant's records as the
// agent does (the request's audit record and three journal intents
// unsynced, then grant.issue's record), makes them durable the way a grant
// does (the log's fdatasync on another goroutine beside the journal's live
// record, write + fsync), and answers with a grant's JSON. The bench asks
// it with the same client and body as a grant, one floor request after
// each timed grant, so the two see the same load. No Cedar, no proof, no
// signature, no kernel write: the difference between a grant's time and
// the floor's is the agent's. The child runs in a session of its own at
// the agent's CPU weight (its autogroup's nice copied from the agent's),
// as the daemon does, so that under load it waits for a CPU as the agent
// would.
package grantfloor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shinken-agent/shinken/agent"
	"github.com/shinken-agent/shinken/agent/api"
	"github.com/shinken-agent/shinken/agent/audit"
)

// Register opens the floor's files in dir (floor.log, floor.journal) and
// serves POST /v1/requests on mux: records of auditBytes and journalBytes
// (each at least 2, newline included). It returns the log file, which the
// caller may append to as well (bench-agent's exec floor syncs its record
// there).
func Register(mux *http.ServeMux, dir string, auditBytes, journalBytes int) (*os.File, error) {
	jf, err := os.OpenFile(filepath.Join(dir, "floor.journal"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	lf, err := os.OpenFile(filepath.Join(dir, "floor.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		jf.Close()
		return nil, err
	}
	line := func(n int) []byte {
		b := bytes.Repeat([]byte("x"), n)
		b[n-1] = '\n'
		return b
	}
	jrec, lrec := line(max(2, journalBytes)), line(max(2, auditBytes))
	mux.Handle("POST /v1/requests", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body api.RequestBody
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil || len(body.Requests) != 1 {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		write := func(f *os.File, b []byte) bool {
			if _, err := f.Write(b); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return false
			}
			return true
		}
		// The request's record, the three intents, grant.issue's record.
		if !write(lf, lrec) || !write(jf, jrec) || !write(jf, jrec) || !write(jf, jrec) || !write(lf, lrec) {
			return
		}
		done := make(chan error, 1)
		go func() { done <- unix.Fdatasync(int(lf.Fd())) }()
		jerr := error(nil)
		if write(jf, jrec) {
			jerr = jf.Sync()
		}
		if err := <-done; err != nil || jerr != nil {
			http.Error(w, fmt.Sprint(err, jerr), http.StatusInternalServerError)
			return
		}
		g := &agent.Grant{Handle: "shk_" + string(bytes.Repeat([]byte("0"), 52)), ID: string(bytes.Repeat([]byte("0"), 32)),
			Session: body.Requests[0].Session, Tier: agent.TierAuto, Lifecycle: agent.LifecycleSession}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode([]api.RequestResult{{Outcome: "granted", Grant: g, Status: http.StatusCreated}})
	}))
	return lf, nil
}

// Serve is the child's side: Register on a new mux, more (when not nil)
// adding its own handlers with the log file, then net/http's server on the
// unix socket sock until the process is killed.
func Serve(sock string, auditBytes, journalBytes int, more func(*http.ServeMux, *os.File)) error {
	mux := http.NewServeMux()
	lf, err := Register(mux, filepath.Dir(sock), auditBytes, journalBytes)
	if err != nil {
		return err
	}
	if more != nil {
		more(mux, lf)
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return err
	}
	return http.Serve(ln, mux)
}

// Sizes is the record sizes to give the floor: the mean line of the
// daemon's audit log and state journal in stateDir, or an error when either
// has none yet.
func Sizes(stateDir string) (auditBytes, journalBytes int, err error) {
	auditBytes, journalBytes = meanLine(filepath.Join(stateDir, audit.LogFile)), meanLine(filepath.Join(stateDir, "state.journal"))
	if auditBytes == 0 || journalBytes == 0 {
		return 0, 0, fmt.Errorf("grant floor: no audit log or state journal lines in %s", stateDir)
	}
	return auditBytes, journalBytes, nil
}

// meanLine is the mean length of path's lines (0 when it has none).
func meanLine(path string) int {
	b, err := os.ReadFile(path)
	if n := bytes.Count(b, []byte("\n")); err == nil && n > 0 {
		return len(b) / n
	}
	return 0
}

// Floor is a running floor child and its client.
type Floor struct {
	cmd *exec.Cmd
	// HC reaches the child's socket: ask it as the daemon is asked.
	HC *http.Client
	// Autogroup is what /proc says of the child's autogroup.
	Autogroup string
}

// Start runs this executable with args (which make it serve the floor on
// sock: its own flag, then Register and http.Serve), in a session of its
// own whose autogroup nice is agentPID's (the daemon's CPU weight), and
// waits up to 5 s for sock.
func Start(sock string, agentPID int, args ...string) (*Floor, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	nice, err := autogroupNice(agentPID)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, args...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	f := &Floor{cmd: cmd, HC: &http.Client{Transport: &http.Transport{Dial: func(_, _ string) (net.Conn, error) { return net.Dial("unix", sock) }, MaxIdleConnsPerHost: 16}}}
	ag := fmt.Sprintf("/proc/%d/autogroup", cmd.Process.Pid)
	if err := os.WriteFile(ag, []byte(nice), 0); err != nil {
		f.Stop()
		return nil, fmt.Errorf("grant floor: autogroup nice %s: %w", nice, err)
	}
	if b, err := os.ReadFile(ag); err == nil {
		f.Autogroup = strings.TrimSpace(string(b))
	}
	for i := 0; i < 200; i++ {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return f, nil
		}
		time.Sleep(25 * time.Millisecond)
	}
	f.Stop()
	return nil, fmt.Errorf("grant floor: %s did not listen within 5 s", sock)
}

// Stop kills the child and waits for it.
func (f *Floor) Stop() {
	f.cmd.Process.Kill()
	f.cmd.Wait()
}

// autogroupNice is the nice of pid's autogroup ("/autogroup-N nice X").
func autogroupNice(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/autogroup", pid))
	if err != nil {
		return "", fmt.Errorf("grant floor: the agent's autogroup: %w", err)
	}
	f := strings.Fields(string(b))
	if len(f) != 3 || f[1] != "nice" {
		return "", fmt.Errorf("grant floor: the agent's autogroup: %q", b)
	}
	return f[2], nil
}
