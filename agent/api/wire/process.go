package wire

import "time"

// ---- processes (/v1/sessions/{id}/processes) ----

// ProcessStart starts a process in a session (POST .../processes). It
// lives until it exits, its own deadline passes, it is killed, or its
// session ends; never because a client went away or the agent restarted.
type ProcessStart struct {
	Argv []string `json:"argv"`
	// Env replaces the default environment (PATH, HOME, SHINKEN_SESSION).
	Env []string `json:"env,omitempty"`
	// Cwd inside the session; "" is /.
	Cwd string `json:"cwd,omitempty"`
	// UID and GID: 0 is the session's own, and no other is accepted.
	UID uint32 `json:"uid,omitempty"`
	GID uint32 `json:"gid,omitempty"`
	// TTY gives the process a terminal of this size (stdout and stderr
	// are then one stream, stdout).
	TTY *TermSize `json:"tty,omitempty"`
	// Stdin is written to the process's stdin when it starts.
	Stdin *string `json:"stdin,omitempty"`
	// Interactive keeps stdin open for attached clients (until one sends
	// stdin close); otherwise stdin ends after Stdin (or at once).
	Interactive bool `json:"interactive,omitempty"`
	// DeadlineS kills the process tree after this many seconds; 0: none.
	DeadlineS float64 `json:"deadline_s,omitempty"`
}

// TermSize is a terminal's size in characters.
type TermSize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// Process states.
const (
	ProcRunning = "running"
	ProcExited  = "exited"
	// ProcLost: its shim is gone without recording an exit (killed from
	// outside); its output up to then is still readable.
	ProcLost = "lost"
)

// Process is one process of a session, as listed.
type Process struct {
	ID      string   `json:"id"`
	Session string   `json:"session"`
	Argv    []string `json:"argv"`
	// PID in the session's PID namespace (0 before it started).
	PID      int        `json:"pid,omitempty"`
	State    string     `json:"state"`
	TTY      bool       `json:"tty,omitempty"`
	Started  time.Time  `json:"started"`
	Ended    *time.Time `json:"ended,omitempty"`
	ExitCode *int       `json:"exit_code,omitempty"`
	// Signal that ended it ("KILL", "TERM" ...), if one did.
	Signal string `json:"signal,omitempty"`
	// Reason it ended: "exit", "signal", "deadline", "killed".
	Reason string `json:"reason,omitempty"`
	// Stdout and Stderr are the byte offsets written so far (the ends of
	// the streams); each keeps the last RingBytes.
	Stdout    uint64     `json:"stdout"`
	Stderr    uint64     `json:"stderr"`
	RingBytes uint64     `json:"ring_bytes"`
	Deadline  *time.Time `json:"deadline,omitempty"`
}

// ProcessSignal is the body of POST .../processes/{pid}/signal: a name
// (TERM, INT, KILL, HUP, QUIT, USR1, USR2, STOP, CONT, WINCH) or a number.
type ProcessSignal struct {
	Signal string `json:"signal"`
}

// Channels of the attach stream (GET .../processes/{pid}/attach, a
// WebSocket with subprotocol AttachProtocol). As in Kubernetes'
// v5.channel.k8s.io, every binary message is one channel byte and its
// payload.
const (
	AttachProtocol = "v1.attach.shinken"

	ChanStdin  = 0   // client → agent: bytes for the process's stdin
	ChanStdout = 1   // agent → client: stdout (the terminal, with a TTY)
	ChanStderr = 2   // agent → client: stderr
	ChanStatus = 3   // agent → client: AttachStatus JSON, the last message
	ChanResize = 4   // client → agent: TermSize JSON
	ChanInfo   = 5   // agent → client: AttachInfo JSON, where a stream (re)starts
	ChanClose  = 255 // client → agent: payload ChanStdin: close stdin
)

// AttachInfo says where the bytes of a stream that follow begin: Offset is
// the byte offset of the next byte sent; Dropped > 0 says the bounded ring
// had already lost that many bytes the client asked for (they are gone).
type AttachInfo struct {
	Stream  string `json:"stream"`
	Offset  uint64 `json:"offset"`
	Dropped uint64 `json:"dropped,omitempty"`
}

// AttachStatus ends an attach stream: the process ended (State exited or
// lost), or the attach was refused part way.
type AttachStatus struct {
	Status   string `json:"status"` // "Success" (exit code 0) or "Failure"
	ExitCode *int   `json:"exit_code,omitempty"`
	Signal   string `json:"signal,omitempty"`
	Reason   string `json:"reason,omitempty"`
	Message  string `json:"message,omitempty"`
}

// PauseState is the answer of POST /v1/sessions/{id}/pause|resume.
type PauseState struct {
	Session string `json:"session"`
	Paused  bool   `json:"paused"`
}
