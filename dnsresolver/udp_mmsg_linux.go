//go:build linux && (amd64 || arm64)

package dnsresolver

import (
	"net/netip"
	"runtime"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// yieldEvery is how often a busy worker yields its P (runtime.Gosched). A
// goroutine that only ever leaves and re-enters syscalls never passes through
// the scheduler, so after 10ms sysmon takes it for a hog: it preempts it,
// takes its P away in the middle of recvmmsg(2) and keeps polling every 20µs
// for a while after. Yielding well before that costs about a microsecond a
// millisecond.
const yieldEvery = 5 * time.Millisecond

// busyPollArm: a sleep shorter than busyPollArm × Config.UDPBusyPoll (wake-up
// included) arms the busy poll.
const busyPollArm = 4

// busyPollMaxBackoff bounds the busy wake-ups a worker waits for after
// polls that found nothing (doubling with each, halving with each that found
// queries): when queries come just too far apart for the poll, at most one
// wake-up in busyPollMaxBackoff polls in vain.
const busyPollMaxBackoff = 64

// udpBatch is how many datagrams one recvmmsg/sendmmsg moves at most.
const udpBatch = 16

// serve is one UDP worker: recvmmsg(2) with MSG_WAITFORONE blocks for one
// datagram and takes whatever else is queued, up to udpBatch; the replies
// that need no upstream leave in one sendmmsg(2), each from the address its
// query was sent to. A query the fast path can answer (fast.go) costs no
// allocation. While busy it polls before sleeping: see Config.UDPBusyPoll.
func (u *udpSocket) serve(r *Resolver) {
	var (
		bufs  [udpBatch][udpBufSize + 1]byte
		oobs  [udpBatch][128]byte
		names [udpBatch]unix.RawSockaddrInet4
		iovs  [udpBatch]unix.Iovec
		hdrs  [udpBatch]unix.Mmsghdr

		outIov   [udpBatch]unix.Iovec
		outHdrs  [udpBatch]unix.Mmsghdr
		outOOB   [udpBatch][pktinfoSpace]byte
		outNames [udpBatch]unix.RawSockaddrInet4
		outBufs  [udpBatch][]byte
		fastBufs [udpBatch][fastMaxReply]byte
		scratch  fastScratch
		yielded  time.Time
		poll     time.Duration // see Config.UDPBusyPoll
		backoff  = 1           // busy wake-ups needed to poll again
		credit   int           // busy wake-ups since the last poll
	)
	for !u.closed.Load() {
		for i := range hdrs {
			iovs[i].Base = &bufs[i][0]
			iovs[i].SetLen(len(bufs[i]))
			hdrs[i] = unix.Mmsghdr{}
			hdrs[i].Hdr.Name = (*byte)(unsafe.Pointer(&names[i]))
			hdrs[i].Hdr.Namelen = unix.SizeofSockaddrInet4
			hdrs[i].Hdr.Iov = &iovs[i]
			hdrs[i].Hdr.Iovlen = 1
			hdrs[i].Hdr.Control = &oobs[i][0]
			hdrs[i].Hdr.SetControllen(len(oobs[i]))
		}
		var (
			n     uintptr
			errno unix.Errno
		)
		if poll > 0 {
			// Busy: look for the next queries for a while before sleeping.
			// A non-blocking recvmmsg(2) never sleeps, so no entersyscall.
			deadline := time.Now().Add(poll)
			for {
				n, _, errno = unix.RawSyscall6(unix.SYS_RECVMMSG, uintptr(u.fd), uintptr(unsafe.Pointer(&hdrs[0])), udpBatch, unix.MSG_DONTWAIT, 0, 0)
				if errno != unix.EAGAIN || !time.Now().Before(deadline) {
					break
				}
			}
			if errno == unix.EAGAIN {
				// Nothing came: sleep, and wait for twice as many busy
				// wake-ups before polling again.
				poll, credit, backoff = 0, 0, min(2*backoff, busyPollMaxBackoff)
			} else {
				backoff = max(backoff/2, 1)
			}
		}
		if poll == 0 {
			slept := time.Now()
			n, _, errno = unix.Syscall6(unix.SYS_RECVMMSG, uintptr(u.fd), uintptr(unsafe.Pointer(&hdrs[0])), udpBatch, unix.MSG_WAITFORONE, 0, 0)
			// Busy: queries queued up while this worker slept, or one came
			// soon after it went to sleep.
			if errno == 0 && (n > 1 || n == 1 && time.Since(slept) < busyPollArm*r.cfg.UDPBusyPoll) {
				if credit++; credit >= backoff {
					poll, credit = r.cfg.UDPBusyPoll, 0
				}
			}
		}
		if errno != 0 {
			if errno != unix.EAGAIN && errno != unix.EINTR && !u.closed.Load() {
				r.log.Warn("udp read", "err", error(errno))
			}
			continue
		}
		u.received.Add(uint64(n))
		now := r.cfg.now()
		if now.Sub(yielded) >= yieldEvery {
			// See yieldEvery.
			runtime.Gosched()
			yielded = now
		}
		k, spawned := 0, false
		for i := range int(n) {
			h := &hdrs[i].Hdr
			ln := int(hdrs[i].Len)
			if ln > udpBufSize || h.Flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 || h.Namelen != unix.SizeofSockaddrInet4 || names[i].Family != unix.AF_INET {
				continue
			}
			// Without the destination address the session is unknown: drop.
			dst4, ok := pktinfoDst(oobs[i][:h.Controllen])
			if !ok {
				continue
			}
			idx, _ := SessionIndexFromAddr(netip.AddrFrom4(dst4))
			reply, limited := r.admit(idx, "udp", bufs[i][:ln], now, fastBufs[k][:0])
			if limited && reply == nil {
				continue
			}
			ok = limited
			if !ok {
				reply, ok = r.answerFast(&scratch, dst4, bufs[i][:ln], now, fastBufs[k][:0])
			}
			if !ok {
				port := int(names[i].Port>>8 | names[i].Port<<8)
				from := &unix.SockaddrInet4{Port: port, Addr: names[i].Addr}
				reply = u.handle(r, netip.AddrFrom4(dst4), from, bufs[i][:ln])
				if reply == nil {
					spawned = true // or dropped: a yield for nothing
					continue
				}
			}
			outBufs[k] = reply
			outNames[k] = names[i]
			setPktinfoSrc(&outOOB[k], dst4)
			k++
		}
		for i := range k {
			outIov[i].Base = &outBufs[i][0]
			outIov[i].SetLen(len(outBufs[i]))
			outHdrs[i] = unix.Mmsghdr{}
			outHdrs[i].Hdr.Name = (*byte)(unsafe.Pointer(&outNames[i]))
			outHdrs[i].Hdr.Namelen = unix.SizeofSockaddrInet4
			outHdrs[i].Hdr.Iov = &outIov[i]
			outHdrs[i].Hdr.Iovlen = 1
			outHdrs[i].Hdr.Control = &outOOB[i][0]
			outHdrs[i].Hdr.SetControllen(len(outOOB[i]))
		}
		for sent := 0; sent < k; {
			m, _, errno := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(u.fd), uintptr(unsafe.Pointer(&outHdrs[sent])), uintptr(k-sent), 0, 0, 0)
			if errno != 0 {
				if errno == unix.EINTR {
					continue
				}
				if !u.closed.Load() {
					r.log.Debug("udp write", "err", error(errno))
				}
				// Skip the datagram that failed; send the rest.
				sent++
				continue
			}
			sent += int(m)
		}
		clear(outBufs[:k])
		if spawned {
			// The goroutines this batch started (handle: the upstream, or
			// kernel writes) wait in this worker's P's run queue; the next
			// recvmmsg(2) would sleep holding that P until the runtime's
			// monitor takes it (up to 10 ms later). Yield it to them now.
			runtime.Gosched()
		}
	}
}
