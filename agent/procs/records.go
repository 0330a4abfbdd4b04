package procs

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/shinken-agent/shinken/agent/api/wire"
)

// The files of a process's directory (Config.Dir/ID): meta.json is the
// agent's (written before the shim starts), the rest the shim's.
const (
	metaFile    = "meta.json"
	startedFile = "started.json"
	exitFile    = "exit.json"
	outFile     = "stdout.ring"
	errFile     = "stderr.ring"
	ctlFile     = "ctl.sock"
	shimLog     = "shim.log"
	indexFile   = "rings.idx" // the rings' ends and write limits (ring.go)
)

// meta is what the agent asks of a process and its shim.
type meta struct {
	ID          string         `json:"id"`
	Session     string         `json:"session"`
	Argv        []string       `json:"argv"`
	TTY         *wire.TermSize `json:"tty,omitempty"`
	Stdin       []byte         `json:"stdin,omitempty"`
	Interactive bool           `json:"interactive,omitempty"`
	Deadline    *time.Time     `json:"deadline,omitempty"`
	RingBytes   uint64         `json:"ring_bytes"`
	Tree        string         `json:"tree,omitempty"`
	Created     time.Time      `json:"created"`
	// Prepared is the backend's prepared launch (its Args); Files the
	// number of its descriptors, at the shim's fds 4...
	Prepared []string `json:"prepared"`
	Files    int      `json:"files"`
}

// startedRecord is written by the shim once the process runs.
type startedRecord struct {
	HostPID int       `json:"host_pid"`
	PID     int       `json:"pid"` // in the session's PID namespace
	Started time.Time `json:"started"`
}

// exitRecord is written by the shim when the process has ended and its
// output is in the rings: the final ends of both.
type exitRecord struct {
	ExitCode *int      `json:"exit_code,omitempty"`
	Signal   string    `json:"signal,omitempty"`
	Reason   string    `json:"reason"`
	Ended    time.Time `json:"ended"`
	Stdout   uint64    `json:"stdout"`
	Stderr   uint64    `json:"stderr"`
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// writeJSON writes v to path atomically (a temporary file, renamed): a
// reader sees the whole record or none. Not synced: the records must
// survive the agent's death (and the shim's), which the page cache gives;
// a power loss or a host crash ends every process and shim with it, and a
// record torn by one reads as missing (a start that never finished, or a
// process lost), which Open already handles. An fsync here cost 0.5–2 ms
// of every start on this machine's disk.
func writeJSON(path string, v any) error {
	f, err := os.OpenFile(path+tmpSuffix, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	return writeJSONInto(f, path, v)
}

// tmpSuffix names the temporary file writeJSON renames to its path.
const tmpSuffix = ".tmp"

// writeJSONInto is writeJSON into f, the temporary file path+tmpSuffix
// opened (empty) ahead; it closes f.
func writeJSONInto(f *os.File, path string, v any) error {
	tmp := path + tmpSuffix
	b, err := json.Marshal(v)
	if err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("procs: write %s: %w", filepath.Base(path), err)
	}
	return nil
}

// ParseSignal reads a signal name (TERM, SIGTERM) or number (1-64).
func ParseSignal(s string) (syscall.Signal, error) {
	name := strings.TrimPrefix(strings.ToUpper(s), "SIG")
	if sig, ok := signalNames[name]; ok {
		return sig, nil
	}
	if n, err := strconv.Atoi(s); err == nil && n >= 1 && n <= 64 {
		return syscall.Signal(n), nil
	}
	return 0, fmt.Errorf("unknown signal %q", s)
}

func signalName(sig syscall.Signal) string {
	for n, s := range signalNames {
		if s == sig {
			return n
		}
	}
	return strconv.Itoa(int(sig))
}

// staged is what a spare shim made ahead in its directory: the two ring
// files, the ring index, the control socket's listener and the started
// record's temporary file (the start then writes and renames it: it
// creates no file between the launch and the report).
type staged struct {
	rings   [2]*os.File
	idx     *ringIndex
	ln      net.Listener
	started *os.File
}

// stage makes in dir the rings, the ring index, the control socket and
// the started record's temporary file (a spare does, before its job).
func stage(dir string) (*staged, error) {
	var pre staged
	for i, name := range []string{outFile, errFile} {
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			return nil, err
		}
		pre.rings[i] = f
	}
	idx, err := createIndex(dir)
	if err != nil {
		return nil, err
	}
	pre.idx = idx
	ln, err := net.Listen("unix", filepath.Join(dir, ctlFile))
	if err != nil {
		return nil, err
	}
	// A spare's directory is renamed to the process's: the socket moves
	// with it, and nothing is to be removed under the old name.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	pre.ln = ln
	if pre.started, err = os.OpenFile(filepath.Join(dir, startedFile+tmpSuffix), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600); err != nil {
		return nil, err
	}
	return &pre, nil
}
