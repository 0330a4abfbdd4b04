package agent

// Files in and out of a session's workspace: the API moves the bytes
// through the backend's backend.SessionFiles (as the session, in its own
// view); the agent records each transfer in its one event stream.

import "fmt"

// Event kinds of file transfers.
const (
	// EventFilePut: a file written into a session's workspace (Detail: a
	// FileTransfer). A completed upload is recorded before it is renamed
	// into place: if the record cannot be written, nothing is left.
	EventFilePut = "file.put"
	// EventFileGet: a file read out of a session's workspace.
	EventFileGet = "file.get"
)

// FileTransfer is the Detail of a file.put or file.get event.
type FileTransfer struct {
	Path   string `json:"path"`             // absolute, in the session's view
	Bytes  int64  `json:"bytes"`            // moved (all of them when Outcome is "ok")
	SHA256 string `json:"sha256,omitempty"` // of the whole file, when Outcome is "ok"
	Error  string `json:"error,omitempty"`  // why it was refused or failed
}

// RecordFile records one transfer (kind EventFilePut or EventFileGet) of
// session by actor: outcome "ok", "refused" or "failed".
func (a *Agent) RecordFile(kind, session, actor, outcome string, t FileTransfer) error {
	if kind != EventFilePut && kind != EventFileGet {
		return fmt.Errorf("%w: file event %q", ErrInvalidRequest, kind)
	}
	return a.emit(Event{Kind: kind, Session: session, Actor: actor, Outcome: outcome, Detail: t})
}
