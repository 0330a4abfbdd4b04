package audit

import (
	"os"

	"golang.org/x/sys/unix"
)

// fdatasync makes f's data durable, and the metadata needed to read it
// back (on Linux that includes a grown file size), but not its times.
func fdatasync(f *os.File) error {
	for {
		err := unix.Fdatasync(int(f.Fd()))
		if err != unix.EINTR {
			return err
		}
	}
}
