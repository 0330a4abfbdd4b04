//go:build linux

package main

import (
	"io"
	"net"
)

// The discard end of the stream rounds (the accept-and-close server of the
// connect rounds is connrounds.Server).

func discard(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				io.Copy(io.Discard, c)
				c.Close()
			}()
		}
	}()
	return ln, nil
}
