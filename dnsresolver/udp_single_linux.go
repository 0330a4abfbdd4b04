//go:build linux && !(amd64 || arm64)

package dnsresolver

// serve is one UDP worker; without a known struct mmsghdr layout it reads one
// datagram per recvmsg(2).
func (u *udpSocket) serve(r *Resolver) { u.serveOne(r) }
