package backend

import (
	"errors"
	"io"
	"os"
)

// SessionFiles is an optional role: files in and out of a session's
// workspace, read and written as the session itself would, through its
// own view (its mount namespace: fs scope, read-only mode, protected
// paths and masks as its processes see them) and with its own uid and
// gid, never as the agent. Rel is a path relative to Root (the
// workspace's directory in the view), resolved beneath it with no
// symbolic link in any component; a path that would leave Root is
// refused (ErrFileOutside).
type SessionFiles interface {
	// OpenFile opens the regular file root/rel for reading.
	OpenFile(session, root, rel string) (*os.File, error)
	// WriteFile streams r into root/rel: into a new name in the same
	// directory, renamed into place once r has ended and commit (given
	// the byte count) returned nil. On any error, and past max bytes
	// (ErrFileTooLarge; max 0: no limit), nothing is left.
	WriteFile(session, root, rel string, r io.Reader, max int64, commit func(n int64) error) (int64, error)
}

// Errors of SessionFiles.
var (
	// ErrFileOutside: the path leaves the workspace (.., a symbolic link).
	ErrFileOutside = errors.New("path leaves the workspace (.. or a symbolic link)")
	// ErrFileDenied: the session's view refuses it (read-only, protected,
	// not the session's to read or write).
	ErrFileDenied = errors.New("the session's view refuses it (read-only workspace, protected path or permissions)")
	// ErrFileNotFound: no such file (or directory on the way) in the view.
	ErrFileNotFound = errors.New("no such file in the session's workspace")
	// ErrFileNotRegular: a directory, device, FIFO or socket.
	ErrFileNotRegular = errors.New("not a regular file")
	// ErrFileTooLarge: more bytes than the limit.
	ErrFileTooLarge = errors.New("file past the size limit")
)
