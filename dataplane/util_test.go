package dataplane

import (
	"net"
	"sort"
)

func sortStrings(s []string) { sort.Strings(s) }

func netDial(network, addr string) (net.Conn, error) { return net.Dial(network, addr) }
