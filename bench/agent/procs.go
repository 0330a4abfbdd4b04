//go:build linux

package main

// The session runtime's figures (issue 20): exec_first_byte_p99_ms (from
// POST .../processes of `echo` to the first byte of its output on an
// attach stream), attach_stream_mib_s and attach_stream_ratio (stdout of a
// `cat` of a large file through attach, against the same `cat`'s stdout
// read through a plain pipe), and processes_per_session_held (idle processes, each with an
// attach stream open, spread over the sessions: the daemon's resident
// memory and the shims' Pss per process held).

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"
	"github.com/shinken-agent/shinken/agent/api/wire"
	"github.com/shinken-agent/shinken/bench/internal/benchkit"
)

var (
	flagExec      = flag.Int("exec", 500, "timed exec of echo (start + attach + first byte), one at a time, spread over the sessions (0: none)")
	flagExecVia   = flag.String("exec-via", "exec", "how the timed exec starts and attaches: exec (one request, GET .../exec, as shinkenctl exec does) or start-attach (POST .../processes, then GET .../attach)")
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

// dialExec starts argv in session and attaches to it in one request (GET
// /v1/sessions/{id}/exec, as shinkenctl exec does); it returns the stream
// and the process's id.
func dialExec(ctx context.Context, hc *http.Client, session string, argv ...string) (*websocket.Conn, string, error) {
	start, _ := json.Marshal(wire.ProcessStart{Argv: argv})
	c, resp, err := websocket.Dial(ctx, fmt.Sprintf("ws://shinken/v1/sessions/%s/exec?%s", session, url.Values{"start": {string(start)}}.Encode()),
		&websocket.DialOptions{HTTPClient: hc, Subprotocols: []string{wire.AttachProtocol}})
	if err != nil {
		return nil, "", fmt.Errorf("exec in %s: %w", session, err)
	}
	c.SetReadLimit(1 << 20)
	return c, resp.Header.Get("X-Shinken-Process"), nil
}

// timeExecFirstByte: n times, start echo in session s<i mod sessions>,
// attach and wait for its first stdout byte: in one request (exec, as
// shinkenctl exec does) or, with startAttach, a start request and then an
// attach. Times in ms: the whole, and its first part (the start request's
// answer, or exec's upgrade).
func timeExecFirstByte(hc *http.Client, sessions, n int, startAttach bool) (out, starts []float64, err error) {
	for i := 0; i < n; i++ {
		s := "s" + strconv.Itoa(i%sessions)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		t0 := time.Now()
		var c *websocket.Conn
		var id string
		if startAttach {
			p, err := startProc(hc, s, "/bin/echo", "x")
			if err != nil {
				cancel()
				return nil, nil, err
			}
			starts = append(starts, float64(time.Since(t0).Microseconds())/1e3)
			id = p.ID
			c, err = dialAttach(ctx, hc, s, p.ID)
		} else {
			c, id, err = dialExec(ctx, hc, s, "/bin/echo", "x")
			starts = append(starts, float64(time.Since(t0).Microseconds())/1e3)
		}
		if err != nil {
			cancel()
			return nil, nil, err
		}
		for {
			_, m, err := c.Read(ctx)
			if err != nil {
				c.CloseNow()
				cancel()
				return nil, nil, fmt.Errorf("exec %s in %s: no output: %w", id, s, err)
			}
			if len(m) > 1 && m[0] == wire.ChanStdout {
				out = append(out, float64(time.Since(t0).Microseconds())/1e3)
				break
			}
		}
		c.CloseNow()
		cancel()
	}
	return out, starts, nil
}

// attachRounds: the stream and its baselines are each timed this many
// times, interleaved, and the medians reported (one run of a few hundred
// MiB is at the mercy of whatever else the machine does for that second).
const attachRounds = 3

// streamRates are the figures of attachStream, in MiB/s (medians).
type streamRates struct {
	// Pipe: the same `cat` on the host, its stdout a plain pipe read by
	// the bench into a 1 MiB buffer (what "reading it directly" means in
	// the issue: the output of the process, with no agent between).
	Pipe float64
	// DevNull: `cat file > /dev/null` on the host: the file read from the
	// page cache, its output not copied anywhere (printed beside, not the
	// ratio's baseline).
	DevNull float64
	// Attach: the same `cat` in the session, its stdout read through an
	// attach stream (from the line that lets it run to the exit status:
	// catAttach).
	Attach  float64
	Dropped uint64 // bytes the ring dropped before the stream read them
}

// attachStream: a file of mib MiB (outside the state directory, readable
// by the session), cat through a plain pipe, cat to /dev/null and cat
// through a process's attach stream, attachRounds times each.
func attachStream(hc *http.Client, session string, mib int) (r streamRates, err error) {
	dir, err := os.MkdirTemp("/var/tmp", "shinken-bench-attach-")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	path := filepath.Join(dir, "big")
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return r, err
	}
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = byte('a' + i%26)
	}
	for i := 0; i < mib; i++ {
		f.Write(chunk)
	}
	f.Close()
	size := uint64(mib) << 20
	buf := make([]byte, 1<<20)
	var pipe, null, att []float64
	for round := 0; round < attachRounds; round++ {
		v, err := catPipe(path, size, buf)
		if err != nil {
			return r, err
		}
		pipe = append(pipe, v)
		if v, err = catDevNull(path, size); err != nil {
			return r, err
		}
		null = append(null, v)
		v, dropped, err := catAttach(hc, session, path, size, buf)
		if err != nil {
			return r, err
		}
		att = append(att, v)
		r.Dropped += dropped
	}
	// Each round's figures too: the medians hide whether one round or
	// two were slow (bench/README.md: a slow mode of the stream, not
	// explained yet).
	fmt.Printf("cat rounds, MiB/s: plain pipe %.0f, through attach %.0f\n", pipe, att)
	return streamRates{Pipe: median(pipe), DevNull: median(null), Attach: median(att), Dropped: r.Dropped}, nil
}

func mibPerSec(n uint64, d time.Duration) float64 { return float64(n) / (1 << 20) / d.Seconds() }

// catPipe: `cat path` on the host, its stdout a pipe (the kernel's default
// size, as a shell's `cat file | reader` has) that the bench reads into
// buf, from the start of cat to its exit.
func catPipe(path string, size uint64, buf []byte) (float64, error) {
	t0 := time.Now()
	cmd := exec.Command("/bin/cat", path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	var got uint64
	for {
		n, err := out.Read(buf)
		got += uint64(n)
		if err != nil {
			break
		}
	}
	if err := cmd.Wait(); err != nil {
		return 0, fmt.Errorf("cat through a pipe: %w", err)
	}
	if got != size {
		return 0, fmt.Errorf("cat through a pipe: %d bytes, the file has %d", got, size)
	}
	return mibPerSec(got, time.Since(t0)), nil
}

// catDevNull: `cat path > /dev/null` on the host (cat's read of the page
// cache alone: its writes to /dev/null copy nothing).
func catDevNull(path string, size uint64) (float64, error) {
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return 0, err
	}
	defer null.Close()
	t0 := time.Now()
	cmd := exec.Command("/bin/cat", path)
	cmd.Stdout = null
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("cat to /dev/null: %w", err)
	}
	return mibPerSec(size, time.Since(t0)), nil
}

// catAttach: `cat path` in session, its stdout read through an attach
// stream from offset 0 until the exit status. So that the stream is timed
// and not the start, and no byte is written before the stream is attached
// (the ring keeps the last RingBytes of an unattached process, and an
// attached client holds it back), the process is `sh -c 'read _ && exec
// cat PATH'` with its stdin open: the bench attaches, and the clock starts
// when it sends the line that lets cat run. It returns the rate of the
// bytes delivered and the bytes the ring dropped before the stream read
// them (none expected).
func catAttach(hc *http.Client, session, path string, size uint64, buf []byte) (float64, uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var p wire.Process
	code, _, err := post(hc, "/v1/sessions/"+session+"/processes",
		wire.ProcessStart{Argv: []string{"/bin/sh", "-c", `read _ && exec /bin/cat "$0"`, path}, Interactive: true}, &p)
	if err == nil && code != http.StatusCreated {
		err = fmt.Errorf("start in %s: HTTP %d", session, code)
	}
	if err != nil {
		return 0, 0, err
	}
	c, err := dialAttach(ctx, hc, session, p.ID)
	if err != nil {
		return 0, 0, err
	}
	defer c.CloseNow()
	// The agent registers the stream's hold just after the handshake.
	time.Sleep(50 * time.Millisecond)
	t0 := time.Now()
	if err := c.Write(ctx, websocket.MessageBinary, []byte{wire.ChanStdin, '\n'}); err != nil {
		return 0, 0, err
	}
	if err := c.Write(ctx, websocket.MessageBinary, []byte{wire.ChanClose, wire.ChanStdin}); err != nil {
		return 0, 0, err
	}
	var got, dropped uint64
	// The client reads each message into one reused buffer (c.Read would
	// allocate and copy every message): the stream is timed, not the
	// client's allocator.
	for {
		_, r, err := c.Reader(ctx)
		if err != nil {
			return 0, 0, fmt.Errorf("attach of cat: %w", err)
		}
		n, err := io.ReadFull(r, buf)
		if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
			return 0, 0, fmt.Errorf("attach of cat: %w", err)
		}
		if n == 0 {
			continue
		}
		m := buf[:n]
		switch m[0] {
		case wire.ChanStdout:
			got += uint64(len(m) - 1)
		case wire.ChanInfo:
			var info wire.AttachInfo
			if json.Unmarshal(m[1:], &info) == nil {
				dropped += info.Dropped
			}
		case wire.ChanStatus:
			if got+dropped != size {
				return 0, 0, fmt.Errorf("attach of cat: %d bytes delivered and %d dropped, the file has %d", got, dropped, size)
			}
			return mibPerSec(got, time.Since(t0)), dropped, nil
		}
	}
}

// holdProcs starts n idle processes across the sessions, each with an
// attach stream open, and reads the daemon's RSS growth and the shims'
// Pss (the spares' included) per process. It kills them afterwards.
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
		if v, ok := benchkit.PssKiB(e.Name()); ok {
			pss += v
			shims++
		}
	}
	// The shims found include the spares the agent keeps ready (at most
	// two, agent/procs/spare.go): their memory is the runtime's too, so
	// the sum is shared out over the processes held.
	if shims < n {
		return 0, 0, fmt.Errorf("held %d processes but found %d shims", n, shims)
	}
	return agentKiB, pss / float64(n), nil
}
