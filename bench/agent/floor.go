//go:build linux

package main

// The floors: what a grant (grant_floor_p99_ms) and an exec
// (exec_first_byte_floor_p99_ms) cost this machine with no agent code at
// all. A child process (this binary, -floor-serve) serves both on a unix
// socket, in a session of its own at the agent's CPU weight. The grant
// floor is package grantfloor's (the grant's records written and synced as
// the agent does; see there).
//
// The exec floor is the same child answering GET /v1/sessions/{id}/exec,
// as the daemon does for the timed exec and with the same client: it
// appends one record to its log and makes it durable (fdatasync: the
// process.run record the agent syncs before a start), makes a cgroup of
// its own for the process (mkdir, as each session process gets a run
// cgroup), starts argv into it (CLONE_INTO_CGROUP, a session of its own,
// stdout a pipe), upgrades the request to a WebSocket with the attach
// subprotocol and sends what the pipe gives as stdout messages; once the
// process has ended it removes the cgroup. No shim, no launcher, no
// namespaces, no seccomp or Landlock, no ring file: the transport, the
// record's sync and a process start alone.

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/sys/unix"

	"github.com/shinken-agent/shinken/agent/api/wire"
	"github.com/shinken-agent/shinken/bench/internal/grantfloor"
	"github.com/shinken-agent/shinken/dataplane"
)

var (
	flagFloor        = flag.Bool("floor", true, "time the floors (no agent code): one request after each timed grant (grant_floor_p99_ms), and as many execs as -exec after the timed execs (exec_first_byte_floor_p99_ms)")
	flagFloorServe   = flag.String("floor-serve", "", "internal: serve the grant floor on this unix socket, its files beside it")
	flagFloorAudit   = flag.Int("floor-audit-bytes", 700, "internal: the floor's audit record size")
	flagFloorJournal = flag.Int("floor-journal-bytes", 1100, "internal: the floor's journal line size")
	flagFloorCgroup  = flag.String("floor-cgroup", "", "internal: the cgroup2 directory the exec floor makes its processes' cgroups in")
)

// serveFloor is the child: it serves until killed.
func serveFloor(sock string) error {
	return grantfloor.Serve(sock, *flagFloorAudit, *flagFloorJournal, func(mux *http.ServeMux, lf *os.File) {
		rec := bytes.Repeat([]byte("x"), max(2, *flagFloorAudit))
		rec[len(rec)-1] = '\n'
		mux.Handle("GET /v1/sessions/{id}/exec", &execFloor{log: lf, rec: rec, cgroup: *flagFloorCgroup})
	})
}

// execFloor serves the exec floor (see the top of this file).
type execFloor struct {
	log    *os.File
	rec    []byte
	cgroup string
	seq    atomic.Uint64
}

func (e *execFloor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req wire.ProcessStart
	if err := json.Unmarshal([]byte(r.URL.Query().Get("start")), &req); err != nil || len(req.Argv) == 0 {
		http.Error(w, "bad start", http.StatusBadRequest)
		return
	}
	if _, err := e.log.Write(e.rec); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if err := unix.Fdatasync(int(e.log.Fd())); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	id := strconv.FormatUint(e.seq.Add(1), 10)
	dir := filepath.Join(e.cgroup, "r"+id)
	if err := os.Mkdir(dir, 0o755); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	defer os.Remove(dir) // after the process has ended (Wait below)
	cg, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		unix.Close(cg)
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	defer pr.Close()
	cmd := &exec.Cmd{Path: req.Argv[0], Args: req.Argv, Stdout: pw, Dir: "/",
		SysProcAttr: &syscall.SysProcAttr{Setsid: true, UseCgroupFD: true, CgroupFD: cg}}
	err = cmd.Start()
	pw.Close()
	unix.Close(cg)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	defer cmd.Wait()
	w.Header().Set("X-Shinken-Process", id)
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{wire.AttachProtocol}})
	if err != nil {
		io.Copy(io.Discard, pr)
		return
	}
	defer c.CloseNow()
	buf := make([]byte, 64<<10)
	buf[0] = wire.ChanStdout
	sending := true
	for {
		n, err := pr.Read(buf[1:])
		if n > 0 && sending {
			// The client goes away after the first byte: read on to
			// the end regardless.
			sending = c.Write(r.Context(), websocket.MessageBinary, buf[:1+n]) == nil
		}
		if err != nil {
			return
		}
	}
}

// floor is the running child and its client.
type floor struct {
	*grantfloor.Floor
	cgroup string // the exec floor's cgroup directory
}

// startFloor starts the child in dir (on the state directory's file
// system) at the CPU weight of the agent (agentPID), its records as long
// as the mean line of the daemon's audit log and state journal in
// stateDir, and waits for its socket.
func startFloor(dir, stateDir string, agentPID int) (*floor, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	logLine, journal, err := grantfloor.Sizes(stateDir)
	if err != nil {
		return nil, err
	}
	fmt.Printf("grant floor: records of %d bytes (audit log) and %d (state journal), the daemon's mean lines\n", logLine, journal)
	root, err := dataplane.FindCgroup2Mount()
	if err != nil {
		return nil, err
	}
	cgroup := filepath.Join(root, fmt.Sprintf("shinken-bench-agent-floor-%d", os.Getpid()))
	if err := os.Mkdir(cgroup, 0o755); err != nil {
		return nil, err
	}
	sock := filepath.Join(dir, "floor.sock")
	f, err := grantfloor.Start(sock, agentPID, "-floor-serve", sock, "-floor-audit-bytes", fmt.Sprint(logLine), "-floor-journal-bytes", fmt.Sprint(journal), "-floor-cgroup", cgroup)
	if err != nil {
		removeTree(cgroup)
		return nil, err
	}
	fmt.Printf("floors: %s (the agent's CPU weight)\n", f.Autogroup)
	return &floor{Floor: f, cgroup: cgroup}, nil
}

func (f *floor) stop() {
	f.Stop()
	removeTree(f.cgroup)
}

// ask times one floor request shaped as grant i's to session.
func (f *floor) ask(session, i int) (time.Duration, error) {
	_, took, err := grantOne(f.HC, session, grantAddr(i))
	return took, err
}
