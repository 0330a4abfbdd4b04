package procs

// The shim's control connections: the agent (one per agent that runs; a
// restarted agent connects again) reads the rings' ends and the exit from
// them and sends stdin, resizes, signals, kills and the holds of its live
// readers.

import (
	"encoding/binary"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/shinken-agent/shinken/agent/api/wire"
)

// serve takes the agent's control connections (one per agent that runs;
// a restarted agent connects again).
func (s *shim) serve(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go s.conn(c)
	}
}

func (s *shim) conn(c net.Conn) {
	defer c.Close()
	note := make(chan struct{}, 1)
	note <- struct{}{}
	s.mu.Lock()
	s.conns[note] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.conns, note)
		close(note)
		delete(s.holds, c) // the agent went away: nothing holds the process back
		s.room.Broadcast()
		s.mu.Unlock()
	}()
	go func() { // the writer: the latest ends, then the exit
		for range note {
			s.mu.Lock()
			var e [16]byte
			binary.BigEndian.PutUint64(e[:8], s.rings[0].end)
			binary.BigEndian.PutUint64(e[8:], s.rings[1].end)
			exit := s.exit
			s.mu.Unlock()
			c.SetWriteDeadline(time.Now().Add(5 * time.Second))
			if writeFrame(c, ctlEnds, e[:]) != nil {
				c.Close()
				return
			}
			if exit != nil {
				js, _ := json.Marshal(exit)
				writeFrame(c, ctlExit, js)
				c.Close()
				return
			}
		}
	}()
	for {
		typ, p, err := readFrame(c)
		if err != nil {
			return
		}
		switch typ {
		case ctlHold:
			s.mu.Lock()
			if len(p) == 16 {
				s.holds[c] = [2]uint64{binary.BigEndian.Uint64(p), binary.BigEndian.Uint64(p[8:])}
			} else {
				delete(s.holds, c)
			}
			s.room.Broadcast()
			s.mu.Unlock()
		case ctlStdin:
			s.queueStdin(p, false)
		case ctlStdinClose:
			s.queueStdin(nil, true)
		case ctlResize:
			var ts wire.TermSize
			if json.Unmarshal(p, &ts) == nil && s.pty != nil {
				setTermSize(s.pty, ts)
			}
		case ctlSignal:
			if len(p) == 4 {
				sig := binary.BigEndian.Uint32(p)
				if sig == killTreeSignal {
					s.kill("killed")
				} else {
					s.proc.Signal(syscall.Signal(sig))
				}
			}
		}
	}
}

// killTreeSignal, sent as a signal number, asks the shim to kill the
// process's whole tree (DELETE).
const killTreeSignal = 0xffffffff

func (s *shim) kill(reason string) {
	s.mu.Lock()
	if s.exit == nil && s.reason == "" {
		s.reason = reason
	}
	s.mu.Unlock()
	s.killTree()
}

func (s *shim) killTree() {
	if s.meta.Tree == "" || os.WriteFile(filepath.Join(s.meta.Tree, "cgroup.kill"), []byte("1"), 0) != nil {
		s.proc.Kill()
	}
}
