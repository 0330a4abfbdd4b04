package agent

import (
	"net/netip"
	"time"

	"github.com/shinken-agent/shinken/agent/backend"
)

// The denial circuit breaker counts kernel denials too (a connect or send
// the kernel refused), not only use-time decisions: code that probes
// destinations it was never granted trips it the same way. One refused
// destination counts once per reason and kernelDenialWindow: a program
// retrying it in a tight loop (a flood of identical denials) counts as
// one denial every ten seconds, so it still trips the breaker when it
// keeps grinding, while distinct destinations (or files: an exec of a
// program off the allowlist, a file outside fs.scope) each count at once.

// kernelDenialWindow is how long one (session, reason, destination)
// counts once on the breaker.
const kernelDenialWindow = 10 * time.Second

// kernelDenialSeen bounds the destinations remembered per session per
// window; past it every denial counts (the breaker trips sooner, never
// later).
const kernelDenialSeen = 256

// kdKey is what one denial was of: a destination, or a file (fs.scope,
// and the process class's exec denials: device and inode).
type kdKey struct {
	reason backend.Reason
	dst    netip.AddrPort
	dev    uint32
	ino    uint64
}

// kdWindow is one session's destinations already counted in this window.
type kdWindow struct {
	start time.Time
	seen  map[kdKey]struct{}
}

// breakerReason says whether a kernel denial of this reason is the
// session's own attempt, which counts on its breaker. A peer refused at the
// session's listener (no_inbound) is someone else's attempt: counting it
// would let anyone who can send the host packets trip (terminate) a
// session. A packet of a flow whose grant died after it opened
// (flow_revoked) is no new attempt either. A socket or port past the
// session's limit (socket_limit, port_limit) is a quota reached, not an
// attempt at something ungranted: the kernel already refuses it.
func breakerReason(r backend.Reason) bool {
	switch r {
	case backend.ReasonNone, backend.ReasonNoInbound, backend.ReasonFlowRevoked, backend.ReasonSocketLimit, backend.ReasonPortLimit:
		return false
	}
	return true
}

// countKernelDenial counts one kernel denial on the session's breaker (once
// per destination and reason a window) and reports whether it tripped it
// now. a.bmu guards the windows.
func (a *Agent) countKernelDenial(session string, ev backend.Event) bool {
	if !breakerReason(ev.Reason) {
		return false
	}
	now := a.cfg.Now()
	k := kdKey{ev.Reason, ev.Dst, ev.Dev, ev.Inode}
	a.bmu.Lock()
	w := a.kdWins[session]
	if w == nil || now.Sub(w.start) >= kernelDenialWindow || now.Before(w.start) {
		if a.breaker[session] == nil {
			delete(a.kdWins, session)
			a.bmu.Unlock()
			return false // no such session (or ended): nothing to count
		}
		w = &kdWindow{start: now, seen: map[kdKey]struct{}{}}
		a.kdWins[session] = w
	}
	if _, dup := w.seen[k]; dup {
		a.bmu.Unlock()
		return false
	}
	if len(w.seen) < kernelDenialSeen {
		w.seen[k] = struct{}{}
	}
	a.bmu.Unlock()
	return a.countDenial(session)
}
