//go:build unix

package main

import (
	"os"
	"os/signal"

	"golang.org/x/sys/unix"
)

// termSize is the size of the terminal on fd (ok false if it is none).
func termSize(fd int) (rows, cols uint16, ok bool) {
	ws, err := unix.IoctlGetWinsize(fd, unix.TIOCGWINSZ)
	if err != nil || ws.Row == 0 {
		return 0, 0, false
	}
	return ws.Row, ws.Col, true
}

// makeRaw puts the terminal on fd in raw mode (as cfmakeraw) and returns
// what restores it.
func makeRaw(fd int) (func(), error) {
	old, err := unix.IoctlGetTermios(fd, ioctlGetTermios)
	if err != nil {
		return nil, err
	}
	t := *old
	t.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
	t.Oflag &^= unix.OPOST
	t.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
	t.Cflag &^= unix.CSIZE | unix.PARENB
	t.Cflag |= unix.CS8
	t.Cc[unix.VMIN], t.Cc[unix.VTIME] = 1, 0
	if err := unix.IoctlSetTermios(fd, ioctlSetTermios, &t); err != nil {
		return nil, err
	}
	return func() { unix.IoctlSetTermios(fd, ioctlSetTermios, old) }, nil
}

// onResize calls f each time the terminal is resized (SIGWINCH), until stop.
func onResize(f func()) (stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, unix.SIGWINCH)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-ch:
				f()
			case <-done:
				return
			}
		}
	}()
	return func() { signal.Stop(ch); close(done) }
}

// signalNumber is the number of a signal named as the API names it (TERM).
func signalNumber(name string) int { return int(unix.SignalNum("SIG" + name)) }
