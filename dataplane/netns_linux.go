package dataplane

import (
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// The sk_lookup program (sweep mode's inbound check) is attached to the
// network namespace the agent runs in: the kernel runs it for every new
// inbound TCP flow and every datagram to an unconnected UDP socket there,
// and it decides those bound for ports session sockets hold. A session
// socket in another namespace is one the session made itself (with a user
// namespace): only the session's own processes can reach it.

// attachNetNs attaches prog to the calling thread's network namespace.
func attachNetNs(prog *ebpf.Program) (link.Link, error) {
	fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open network namespace: %w", err)
	}
	defer unix.Close(fd)
	return link.AttachNetNs(fd, prog)
}

// netnsAttached counts the attachments of prog to the calling thread's
// network namespace (1 when attached once).
func netnsAttached(prog *ebpf.Program) (int, error) {
	info, err := prog.Info()
	if err != nil {
		return 0, err
	}
	id, ok := info.ID()
	if !ok {
		return 0, fmt.Errorf("program ID unknown")
	}
	fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("open network namespace: %w", err)
	}
	defer unix.Close(fd)
	res, err := link.QueryPrograms(link.QueryOptions{Target: fd, Attach: ebpf.AttachSkLookup})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, p := range res.Programs {
		if p.ID == id {
			n++
		}
	}
	return n, nil
}
