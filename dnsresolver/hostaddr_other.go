//go:build !linux

package dnsresolver

import "context"

// WatchHostAddrs needs netlink: on other systems it leaves h as it is (a
// daemon may feed it with Set) and returns ErrNotSupported.
func WatchHostAddrs(ctx context.Context, h *HostAddrs) error { return ErrNotSupported }
