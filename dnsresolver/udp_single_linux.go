//go:build linux && !(amd64 || arm64)

package dnsresolver

// serve is one UDP worker; the batched recvmmsg(2) worker (udp_mmsg_linux.go)
// is built for 64-bit Linux only (its iovec/msghdr lengths are 64-bit), so here it reads one
// datagram per recvmsg(2).
func (u *udpSocket) serve(r *Resolver) { u.serveOne(r) }
