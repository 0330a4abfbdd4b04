//go:build linux

package main

// The session runtime's figures (issue 20): exec_first_byte_p99_ms (from
// POST .../processes of `echo` to the first byte of its output on an
// attach stream), attach_stream_mib_s and attach_stream_ratio (stdout of a
// `cat` of a large file through attach, against reading the file
// directly), and processes_per_session_held (idle processes, each with an
// attach stream open, spread over the sessions: the daemon's resident
// memory and the shims' Pss per process held).

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"
	"github.com/shinken-agent/shinken/agent/api/wire"
)

var (
	flagExec      = flag.Int("exec", 500, "timed exec of echo (start + attach + first byte), one at a time, spread over the sessions (0: none)")
	flagAttachMiB = flag.Int("attach-mib", 256, "size of the file cat streams through attach (0: none)")
	flagHeld      = flag.Int("held", 1000, "idle processes held with an attach stream open, spread over the sessions (0: none)")
)

func startProc(hc *http.Client, session string, argv ...string) (wire.Process, error) {
	var p wire.Process
	code, _, err := post(hc, "/v1/sessions/"+session+"/processes", wire.ProcessStart{Argv: argv}, &p)
	if err == nil && code != http.StatusCreated {
		err = fmt.Errorf("start in %s: HTTP %d", session, code)
	}
	return p, err
}

func dialAttach(ctx context.Context, hc *http.Client, session, id string) (*websocket.Conn, error) {
	c, _, err := websocket.Dial(ctx, fmt.Sprintf("ws://shinken/v1/sessions/%s/processes/%s/attach?from=0", session, id),
		&websocket.DialOptions{HTTPClient: hc, Subprotocols: []string{wire.AttachProtocol}})
	if err != nil {
		return nil, err
	}
	c.SetReadLimit(1 << 20)
	return c, nil
}

// timeExecFirstByte: n times, start echo in session s<i mod sessions>,
// attach and wait for its first stdout byte. Times in ms.
func timeExecFirstByte(hc *http.Client, sessions, n int) ([]float64, error) {
	var out []float64
	for i := 0; i < n; i++ {
		s := "s" + strconv.Itoa(i%sessions)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		t0 := time.Now()
		p, err := startProc(hc, s, "/bin/echo", "x")
		if err != nil {
			cancel()
			return nil, err
		}
		c, err := dialAttach(ctx, hc, s, p.ID)
		if err != nil {
			cancel()
			return nil, err
		}
		for {
			_, m, err := c.Read(ctx)
			if err != nil {
				c.CloseNow()
				cancel()
				return nil, fmt.Errorf("exec %s in %s: no output: %w", p.ID, s, err)
			}
			if len(m) > 1 && m[0] == wire.ChanStdout {
				out = append(out, float64(time.Since(t0).Microseconds())/1e3)
				break
			}
		}
		c.CloseNow()
		cancel()
	}
	return out, nil
}

// attachStream: a file of mib MiB (outside the state directory, readable
// by the session), read directly (cat to /dev/null on the host) and through
// a process's attach stream. It returns both rates in MiB/s and the bytes
// the ring dropped before the stream read them (the ring does not hold the
// writer back).
func attachStream(hc *http.Client, session string, mib int) (direct, attach float64, dropped uint64, err error) {
	dir, err := os.MkdirTemp("/var/tmp", "shinken-bench-attach-")
	if err != nil {
		return 0, 0, 0, err
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	path := filepath.Join(dir, "big")
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return 0, 0, 0, err
	}
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = byte('a' + i%26)
	}
	for i := 0; i < mib; i++ {
		f.Write(chunk)
	}
	f.Close()
	size := float64(mib)
	t0 := time.Now()
	rf, _ := os.Open(path)
	io.Copy(io.Discard, rf)
	rf.Close()
	direct = size / time.Since(t0).Seconds()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	t0 = time.Now()
	p, err := startProc(hc, session, "/bin/cat", path)
	if err != nil {
		return 0, 0, 0, err
	}
	c, err := dialAttach(ctx, hc, session, p.ID)
	if err != nil {
		return 0, 0, 0, err
	}
	defer c.CloseNow()
	var got uint64
	for {
		_, m, err := c.Read(ctx)
		if err != nil {
			return 0, 0, 0, fmt.Errorf("attach of cat: %w", err)
		}
		switch m[0] {
		case wire.ChanStdout:
			got += uint64(len(m) - 1)
		case wire.ChanInfo:
			var info wire.AttachInfo
			if json.Unmarshal(m[1:], &info) == nil {
				dropped += info.Dropped
			}
		case wire.ChanStatus:
			attach = float64(got) / (1 << 20) / time.Since(t0).Seconds()
			return direct, attach, dropped, nil
		}
	}
}

// holdProcs starts n idle processes across the sessions, each with an
// attach stream open, and reads the daemon's RSS growth and the shims'
// Pss. It kills them afterwards.
func holdProcs(hc *http.Client, agentPid, sessions, n int, stateDir string) (agentKiB, shimKiB float64, err error) {
	before := rssMiB(agentPid)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type held struct{ session, id string }
	var hs []held
	defer func() {
		for _, h := range hs {
			req, _ := http.NewRequest("DELETE", "http://shinken/v1/sessions/"+h.session+"/processes/"+h.id, nil)
			if resp, err := hc.Do(req); err == nil {
				resp.Body.Close()
			}
		}
	}()
	for i := 0; i < n; i++ {
		s := "s" + strconv.Itoa(i%sessions)
		p, err := startProc(hc, s, "/bin/sleep", "3600")
		if err != nil {
			return 0, 0, err
		}
		hs = append(hs, held{s, p.ID})
		c, err := dialAttach(ctx, hc, s, p.ID)
		if err != nil {
			return 0, 0, err
		}
		defer c.CloseNow()
		go func() {
			for {
				if _, _, err := c.Read(ctx); err != nil {
					return
				}
			}
		}()
	}
	time.Sleep(time.Second)
	agentKiB = (rssMiB(agentPid) - before) * 1024 / float64(n)
	var pss float64
	shims := 0
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !strings.HasPrefix(string(cmdline), "shinken-process-shim\x00"+stateDir) {
			continue
		}
		for _, l := range strings.Split(readTrim("/proc/"+e.Name()+"/smaps_rollup"), "\n") {
			if fs := strings.Fields(l); len(fs) >= 2 && fs[0] == "Pss:" {
				v, _ := strconv.ParseFloat(fs[1], 64)
				pss += v
				shims++
			}
		}
	}
	if shims < n {
		return 0, 0, fmt.Errorf("held %d processes but found %d shims", n, shims)
	}
	return agentKiB, pss / float64(shims), nil
}
