package api

// GET /v1/sessions/{id}/processes/{pid}/attach: a WebSocket (subprotocol
// wire.AttachProtocol) framed as Kubernetes' v5.channel.k8s.io: one channel
// byte, then the payload (wire.Chan*). Output is replayed from the offsets
// asked for (from=N for stdout, from_stderr=N), then followed live; an
// AttachInfo on ChanInfo says where each stream starts and, when the ring
// has dropped bytes the client asked for, how many. Stdin, resize and
// stdin close go the other way. Any number of clients may attach to one
// process; a client that goes away takes nothing with it: the process runs
// on, and a later attach from the offset the client got to receives exactly
// the bytes it missed. The last message is an AttachStatus on ChanStatus
// once the process has ended and its output is sent.
//
// The Origin check is coder/websocket's: a request whose Origin header
// names another host than the one it was sent to is refused (a browser
// page cannot drive a session's terminal cross-site); clients that are not
// browsers send none.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/shinken-agent/shinken/agent"
	"github.com/shinken-agent/shinken/agent/api/wire"
	"github.com/shinken-agent/shinken/agent/procs"
)

func (s *Server) attach(w http.ResponseWriter, r *http.Request) {
	p := s.proc(w, r)
	if p == nil {
		return
	}
	var from [2]uint64
	for i, k := range []string{"from", "from_stderr"} {
		if v := r.URL.Query().Get(k); v != "" {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				writeErr(w, http.StatusBadRequest, fmt.Errorf("%w: %s %q", agent.ErrInvalidRequest, k, v))
				return
			}
			from[i] = n
		}
	}
	s.stream(w, r, p, from)
}

// stream upgrades the request to the attach WebSocket and runs it for p
// from the offsets from (stdout, stderr) until the process has ended and
// its output is sent, or the client goes away.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, p *procs.Proc, from [2]uint64) {
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{wire.AttachProtocol}})
	if err != nil {
		return // Accept has answered
	}
	defer c.CloseNow()
	c.SetReadLimit(1<<20 + 1)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	var wmu sync.Mutex
	// sendMsg writes one message: its channel byte and payload.
	sendMsg := func(m []byte) error {
		wmu.Lock()
		defer wmu.Unlock()
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		defer wcancel()
		return c.Write(wctx, websocket.MessageBinary, m)
	}
	sendJSON := func(ch byte, v any) error {
		b, _ := json.Marshal(v)
		return sendMsg(append([]byte{ch}, b...))
	}
	go func() { // client → process
		defer cancel()
		for {
			_, m, err := c.Read(ctx)
			if err != nil || len(m) == 0 {
				return
			}
			switch m[0] {
			case wire.ChanStdin:
				err = p.Stdin(m[1:])
			case wire.ChanResize:
				var ts wire.TermSize
				if err = json.Unmarshal(m[1:], &ts); err == nil {
					err = p.Resize(ts)
				}
			case wire.ChanClose:
				if len(m) == 2 && m[1] == wire.ChanStdin {
					err = p.CloseStdin()
				}
			}
			if err != nil {
				sendJSON(wire.ChanInfo, map[string]string{"error": err.Error()})
			}
		}
	}()
	streams := []int{0, 1}
	if p.View().TTY {
		streams = streams[:1] // a terminal has one stream
	}
	// While attached, the process waits for this client rather than
	// have its output dropped (procs.Follower); from before the ring's
	// start holds nothing back.
	v0 := p.View()
	hold := from
	for i, end := range [2]uint64{v0.Stdout, v0.Stderr} {
		hold[i] = max(hold[i], end-min(end, v0.RingBytes))
	}
	fl := p.Follow(hold)
	defer fl.Release()
	var wg sync.WaitGroup
	errc := make(chan error, len(streams))
	for _, i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errc <- s.followStream(ctx, p, i, from[i], fl, sendMsg, sendJSON)
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		if err != nil {
			return // the client went away, or the write failed: the process runs on
		}
	}
	v := p.View()
	st := wire.AttachStatus{Status: "Failure", ExitCode: v.ExitCode, Signal: v.Signal, Reason: v.Reason}
	if v.ExitCode != nil && *v.ExitCode == 0 {
		st.Status = "Success"
	}
	if v.State == wire.ProcLost {
		st.Message = "the process's shim is gone without recording an exit"
	}
	if sendJSON(wire.ChanStatus, st) == nil {
		c.Close(websocket.StatusNormalClosure, "")
	}
}

// attachFrameBytes bounds the output one message carries, so that a
// message, its channel byte included, is at most 1 MiB (what clients are
// told to read): a fast writer's output then costs few messages and
// wake-ups (256 KiB messages moved 10-20 % less through attach:
// bench/README.md, the twenty-third session).
const attachFrameBytes = 1<<20 - 1

// attachFirstFrameBytes is a stream's first buffer: most processes write
// little (a buffer of attachFrameBytes per stream and attach was most of
// what the agent allocated while short processes were started and
// attached one after another); a read that fills it doubles it, up to
// attachFrameBytes.
const attachFirstFrameBytes = 4 << 10

// followStream sends stream i from off until the process has ended and all
// of it is sent (nil), or ctx ends or a write fails (the error). One buffer
// serves every message: the channel byte, then the bytes read into it.
func (s *Server) followStream(ctx context.Context, p *procs.Proc, i int, off uint64, fl *procs.Follower, sendMsg func([]byte) error, sendJSON func(byte, any) error) error {
	name := [2]string{"stdout", "stderr"}[i]
	ch := [2]byte{wire.ChanStdout, wire.ChanStderr}[i]
	msg := make([]byte, 1+attachFirstFrameBytes)
	msg[0] = ch
	first := true
	for {
		c, ok, err := p.NextInto(ctx, i, off, msg[1:])
		if err != nil {
			return err
		}
		if first || c.Offset > off {
			if err := sendJSON(wire.ChanInfo, wire.AttachInfo{Stream: name, Offset: c.Offset, Dropped: c.Offset - off}); err != nil {
				return err
			}
			first = false
		}
		if !ok {
			return nil
		}
		n := copy(msg[1:], c.Data) // the same bytes, moved to the front when the ring dropped some
		// The bytes are the agent's now: the hold moves past them before
		// they are sent, so the shim refills the ring while the client
		// reads this message rather than after it (stop-and-wait when a
		// message is as large as the ring).
		off = c.Offset + uint64(n)
		fl.Advance(i, off)
		if err := sendMsg(msg[:1+n]); err != nil {
			return err
		}
		if n == len(msg)-1 && n < attachFrameBytes {
			msg = make([]byte, 1+min(2*n, attachFrameBytes))
			msg[0] = ch
		}
	}
}
