package main

// The session runtime's verbs: exec, start, ps, logs, attach, kill, pause,
// resume (agent/api's /v1/sessions/{id}/processes and attach stream).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/shinken-agent/shinken/agent/api/wire"
	"github.com/shinken-agent/shinken/agent/backend"
)

// procFlags parses what exec and start share: -i, -t (or -it), -e K=V,
// -w DIR, -deadline S, -uid/-gid; then SESSION -- CMD...
type procFlags struct {
	interactive, tty bool
	req              wire.ProcessStart
	session          string
}

func parseProcFlags(verb string, args []string) (procFlags, error) {
	var p procFlags
	usage := fmt.Errorf("usage: %s [-i] [-t] [-e NAME=VALUE]... [-w DIR] [-deadline SECS] SESSION -- CMD [ARG...]", verb)
	i := 0
	for ; i < len(args) && strings.HasPrefix(args[i], "-") && args[i] != "--"; i++ {
		a := strings.TrimLeft(args[i], "-")
		val := func() (string, error) {
			if i+1 >= len(args) {
				return "", usage
			}
			i++
			return args[i], nil
		}
		switch a {
		case "i", "stdin":
			p.interactive = true
		case "t", "tty":
			p.tty = true
		case "it", "ti":
			p.interactive, p.tty = true, true
		case "e", "env":
			v, err := val()
			if err != nil {
				return p, err
			}
			p.req.Env = append(p.req.Env, v)
		case "w", "workdir":
			v, err := val()
			if err != nil {
				return p, err
			}
			p.req.Cwd = v
		case "deadline":
			v, err := val()
			if err != nil {
				return p, err
			}
			if p.req.DeadlineS, err = strconv.ParseFloat(v, 64); err != nil {
				return p, fmt.Errorf("-deadline %q: %w", v, err)
			}
		case "uid", "gid":
			v, err := val()
			if err != nil {
				return p, err
			}
			n, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				return p, fmt.Errorf("-%s %q: %w", a, v, err)
			}
			if a == "uid" {
				p.req.UID = uint32(n)
			} else {
				p.req.GID = uint32(n)
			}
		default:
			return p, fmt.Errorf("%s: unknown flag %s; %v", verb, args[i], usage)
		}
	}
	rest := args[i:]
	if len(rest) < 3 || rest[1] != "--" {
		return p, usage
	}
	p.session, p.req.Argv = rest[0], rest[2:]
	p.req.Interactive = p.interactive
	if p.req.Env != nil {
		// -e adds to the default environment.
		p.req.Env = append(backend.DefaultEnv(p.session), p.req.Env...)
	}
	if p.tty {
		rows, cols, ok := termSize(int(os.Stdin.Fd()))
		if !ok {
			rows, cols = 24, 80
		}
		p.req.TTY = &wire.TermSize{Rows: rows, Cols: cols}
		if p.req.Env == nil {
			term := os.Getenv("TERM")
			if term == "" {
				term = "xterm"
			}
			p.req.Env = append(backend.DefaultEnv(p.session), "TERM="+term)
		}
	}
	return p, nil
}

func (c *client) startProc(p procFlags) (wire.Process, error) {
	var v wire.Process
	_, err := c.call("POST", "/v1/sessions/"+url.PathEscape(p.session)+"/processes", p.req, &v)
	return v, err
}

// exec starts a process and attaches to it: its output on ours, our stdin
// to it with -i (a terminal in raw mode with -t, resized with ours), and
// its exit code as ours (128+N for a signal N).
func (c *client) exec(args []string) error {
	p, err := parseProcFlags("exec", args)
	if err != nil {
		return err
	}
	// One request: the agent starts the process and upgrades the same
	// request to its attach stream (GET /v1/sessions/{id}/exec).
	start, err := json.Marshal(p.req)
	if err != nil {
		return err
	}
	u := fmt.Sprintf("ws://shinken/v1/sessions/%s/exec?%s", url.PathEscape(p.session), url.Values{"start": {string(start)}}.Encode())
	return c.stream(u, p.interactive, p.tty)
}

func (c *client) start(args []string) error {
	p, err := parseProcFlags("start", args)
	if err != nil {
		return err
	}
	v, err := c.startProc(p)
	if err != nil {
		return err
	}
	if c.output == "json" {
		c.printJSON(v)
		return nil
	}
	fmt.Println(v.ID)
	return nil
}

func (c *client) ps(args []string) error {
	if len(args) != 1 {
		return errors.New("usage: ps SESSION")
	}
	var ps []wire.Process
	if _, err := c.call("GET", "/v1/sessions/"+url.PathEscape(args[0])+"/processes", nil, &ps); err != nil {
		return err
	}
	if c.output == "json" {
		c.printJSON(ps)
		return nil
	}
	var rows [][]string
	for _, p := range ps {
		exit := ""
		switch {
		case p.ExitCode != nil:
			exit = strconv.Itoa(*p.ExitCode)
		case p.Signal != "":
			exit = "SIG" + p.Signal
		}
		rows = append(rows, []string{p.ID, strconv.Itoa(p.PID), p.State, exit, p.Reason, p.Started.Local().Format(time.DateTime), strings.Join(p.Argv, " ")})
	}
	table("ID\tPID\tSTATE\tEXIT\tREASON\tSTARTED\tCOMMAND", rows)
	return nil
}

// logs prints a process's stdout (or -stderr) from -from N; -f follows it
// until the process ends. A note on stderr says where the bytes begin when
// the ring had dropped some, and where bytes were overwritten before they
// were sent (the stream then goes on after them).
func (c *client) logs(args []string) error {
	fs := newFlags("logs")
	follow := fs.Bool("f", false, "follow until the process ends")
	from := fs.Uint64("from", 0, "byte offset to start from")
	stderr := fs.Bool("stderr", false, "the stderr stream")
	pos, err := positionals(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return errors.New("usage: logs [-f] [-from N] [-stderr] SESSION PROCESS")
	}
	q := url.Values{"from": {strconv.FormatUint(*from, 10)}}
	if *follow {
		q.Set("follow", "1")
	}
	if *stderr {
		q.Set("stream", "stderr")
	}
	for {
		req, _ := http.NewRequest("GET", "http://shinken/v1/sessions/"+url.PathEscape(pos[0])+"/processes/"+url.PathEscape(pos[1])+"/logs?"+q.Encode(), nil)
		resp, err := c.hc.Do(req)
		if err != nil {
			return err
		}
		if err := respErr(resp); err != nil {
			resp.Body.Close()
			return err
		}
		if d := resp.Header.Get("X-Shinken-Dropped"); d != "" && d != "0" {
			fmt.Fprintf(os.Stderr, "shinkenctl: %s bytes before offset %s are no longer kept\n", d, resp.Header.Get("X-Shinken-Offset"))
		}
		n, err := io.Copy(os.Stdout, resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		gap := resp.Trailer.Get("X-Shinken-Gap")
		if gap == "" {
			return nil
		}
		start, err1 := strconv.ParseUint(resp.Header.Get("X-Shinken-Offset"), 10, 64)
		g, err2 := strconv.ParseUint(gap, 10, 64)
		if err1 != nil || err2 != nil {
			return fmt.Errorf("bad offset %q or gap %q from the agent", resp.Header.Get("X-Shinken-Offset"), gap)
		}
		fmt.Fprintf(os.Stderr, "shinkenctl: %d bytes at offset %d were overwritten before they were sent\n", g, start+uint64(n))
		q.Set("from", strconv.FormatUint(start+uint64(n)+g, 10))
	}
}

func (c *client) attach(args []string) error {
	fs := newFlags("attach")
	stdin := fs.Bool("i", false, "send our stdin to the process")
	tty := fs.Bool("t", false, "raw terminal mode (for a process with a terminal)")
	from := fs.Uint64("from", 0, "byte offset to replay from")
	pos, err := positionals(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return errors.New("usage: attach [-i] [-t] [-from N] SESSION PROCESS")
	}
	return c.attachTo(pos[0], pos[1], *stdin, *tty, *from)
}

func (c *client) kill(args []string) error {
	fs := newFlags("kill")
	sig := fs.String("s", "", "send this signal (TERM, INT, KILL, HUP ...) to the process instead of killing its whole tree")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 2 {
		return errors.New("usage: kill [-s SIGNAL] SESSION PROCESS")
	}
	path := "/v1/sessions/" + url.PathEscape(fs.Arg(0)) + "/processes/" + url.PathEscape(fs.Arg(1))
	var v wire.Process
	var err error
	if *sig != "" {
		_, err = c.call("POST", path+"/signal", wire.ProcessSignal{Signal: *sig}, &v)
	} else {
		_, err = c.call("DELETE", path, nil, &v)
	}
	if err != nil {
		return err
	}
	if c.output == "json" {
		c.printJSON(v)
		return nil
	}
	fmt.Println(v.ID, v.State, v.Reason)
	return nil
}

func (c *client) pause(args []string, paused bool) error {
	verb := map[bool]string{true: "pause", false: "resume"}[paused]
	if len(args) != 1 {
		return fmt.Errorf("usage: %s SESSION", verb)
	}
	var st wire.PauseState
	if _, err := c.call("POST", "/v1/sessions/"+url.PathEscape(args[0])+"/"+verb, nil, &st); err != nil {
		return err
	}
	if c.output == "json" {
		c.printJSON(st)
		return nil
	}
	fmt.Printf("%s paused=%v\n", st.Session, st.Paused)
	return nil
}

// attachTo streams a process's output to ours until it ends, then exits
// with its code.
func (c *client) attachTo(session, id string, stdin, tty bool, from uint64) error {
	return c.stream(fmt.Sprintf("ws://shinken/v1/sessions/%s/processes/%s/attach?from=%d", url.PathEscape(session), url.PathEscape(id), from), stdin, tty)
}

// stream runs the attach WebSocket at u (an attach, or an exec that starts
// the process first) until the process ends, then exits with its code.
func (c *client) stream(u string, stdin, tty bool) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: c.hc, Subprotocols: []string{wire.AttachProtocol}})
	if err != nil {
		if resp != nil && resp.StatusCode >= 300 {
			return respErr(resp) // the agent's own error, as for any call
		}
		return fmt.Errorf("attach: %w", err)
	}
	defer ws.CloseNow()
	ws.SetReadLimit(1 << 21)
	var wmu sync.Mutex
	send := func(ch byte, b []byte) error {
		wmu.Lock()
		defer wmu.Unlock()
		return ws.Write(ctx, websocket.MessageBinary, append([]byte{ch}, b...))
	}
	in := int(os.Stdin.Fd())
	if tty {
		if _, _, ok := termSize(in); ok {
			restore, err := makeRaw(in)
			if err != nil {
				return err
			}
			defer restore()
			resize := func() {
				if r, cl, ok := termSize(in); ok {
					b, _ := json.Marshal(wire.TermSize{Rows: r, Cols: cl})
					send(wire.ChanResize, b)
				}
			}
			defer onResize(resize)()
			resize()
		}
	}
	if stdin {
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := os.Stdin.Read(buf)
				if n > 0 && send(wire.ChanStdin, buf[:n]) != nil {
					return
				}
				if err != nil {
					send(wire.ChanClose, []byte{wire.ChanStdin})
					return
				}
			}
		}()
	}
	for {
		_, m, err := ws.Read(ctx)
		if err != nil {
			return fmt.Errorf("attach: stream ended before the process: %w", err)
		}
		if len(m) == 0 {
			continue
		}
		switch m[0] {
		case wire.ChanStdout:
			os.Stdout.Write(m[1:])
		case wire.ChanStderr:
			os.Stderr.Write(m[1:])
		case wire.ChanInfo:
			var info wire.AttachInfo
			if json.Unmarshal(m[1:], &info) == nil && info.Dropped > 0 {
				fmt.Fprintf(os.Stderr, "\r\nshinkenctl: %s: %d bytes dropped from the ring before offset %d\r\n", info.Stream, info.Dropped, info.Offset)
			}
		case wire.ChanStatus:
			var st wire.AttachStatus
			if err := json.Unmarshal(m[1:], &st); err != nil {
				return err
			}
			ws.Close(websocket.StatusNormalClosure, "")
			code := 1
			switch {
			case st.ExitCode != nil:
				code = *st.ExitCode
			case st.Signal != "":
				if n := signalNumber(st.Signal); n > 0 {
					code = 128 + n
				}
			}
			if code != 0 {
				return exitCode(code)
			}
			return nil
		}
	}
}

// exitCode ends shinkenctl with the process's exit code, quietly.
type exitCode int

func (e exitCode) Error() string { return "exit " + strconv.Itoa(int(e)) }

func (c *client) procVerb(verb string, args []string) error {
	switch verb {
	case "exec":
		return c.exec(args)
	case "start":
		return c.start(args)
	case "ps":
		return c.ps(args)
	case "logs":
		return c.logs(args)
	case "attach":
		return c.attach(args)
	case "kill":
		return c.kill(args)
	case "pause":
		return c.pause(args, true)
	}
	return c.pause(args, false)
}
