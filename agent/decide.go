package agent

import "net/netip"

// DecideUse answers a use-time request (Decide: the base and admin policies,
// hard-deny forbids included, plus the session's live grants, whose policies
// exist exactly while their handles are live and unexpired) and names the
// rule that decided.
func (a *Agent) DecideUse(session string, r UseRequest) (UseDecision, error) {
	d, err := a.Decide(session, r)
	if err != nil {
		return UseDecision{}, err
	}
	return UseDecision{Session: session, Request: r, Allowed: d.Allowed, Reasons: d.Reasons, Errors: d.Errors, DecidedBy: d.DecidedBy()}, nil
}

// kernelDestination is the address a connect or send to ip reaches: an
// unspecified address (0.0.0.0, ::ffff:0.0.0.0, ::) is loopback, as the
// kernel's hooks rewrite it before they decide (bpf/sock_addr.bpf.c), so a
// use-time decision is asked about the address the kernel checks.
func kernelDestination(ip netip.Addr) netip.Addr {
	switch {
	case !ip.IsValid() || !ip.Unmap().IsUnspecified():
		return ip
	case ip.Is4() || ip.Is4In6():
		return netip.AddrFrom4([4]byte{127, 0, 0, 1})
	}
	return netip.IPv6Loopback()
}
