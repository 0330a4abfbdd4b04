package dataplane

import (
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/shinken-agent/shinken/agent/backend"
)

// probe builds the enforcement report from what this host and this
// dataplane actually have: the flow mode Open resolved, the kernel release,
// the LSMs and the Landlock ABI the kernel answers with. Called once, at the
// end of Open.
func (d *Dataplane) probe() backend.Report {
	r := backend.Report{OS: "linux", Backend: "dataplane (BPF cgroup hooks)", Facts: map[string]string{}}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		r.Facts["kernel"] = unix.ByteSliceToString(u.Release[:])
	}
	r.Facts["cgroup_parent"] = d.parent
	r.Facts["pin_path"] = d.cfg.PinPath
	r.Facts["adopted"] = fmt.Sprint(d.adopted)
	r.Facts["flow_mode"] = d.cfg.FlowMode.String()
	r.Facts["session_pids_max"] = d.pidsMaxFact()
	r.Facts["flow_mode_means"] = FlowModeMeans(d.cfg.FlowMode)
	r.Facts["denial_event_budget"] = d.EventBudget()
	lsms, lsmErr := os.ReadFile("/sys/kernel/security/lsm")
	if lsmErr == nil {
		r.Facts["lsm"] = strings.TrimSpace(string(lsms))
	}
	if d.lsmOn() {
		r.Facts["fs_lsm"] = "attached: " + FSLSMHooks
	} else {
		r.Facts["fs_lsm"] = "not attached: " + fmt.Sprint(d.lsm.err)
	}
	if d.execLSMOn() {
		r.Facts["exec_lsm"] = "attached: bprm_check_security"
	} else {
		r.Facts["exec_lsm"] = "not attached: " + fmt.Sprint(d.xlsm.err)
	}
	abi, llErr := landlockABI()
	if llErr == nil {
		r.Facts["landlock_abi"] = fmt.Sprint(abi)
	} else {
		r.Facts["landlock_abi"] = "unavailable: " + llErr.Error()
	}

	egress := backend.Strength{Class: backend.ClassNetEgress, Level: backend.RevocableInKernel}
	switch d.cfg.FlowMode {
	case FlowSweep:
		egress.Mechanism = "BPF cgroup/connect4|6 + sendmsg4|6 allowlist per session, checked against the grant's caretaker handle at use; handshakes checked at cgroup_skb ingress; open flows destroyed by iter/tcp+udp bpf_sock_destroy sweeps on revoke"
		egress.Reason = "a flow whose handle expires while no agent runs lives until an agent starts (its sweep runs then)"
	case FlowPacket:
		egress.Mechanism = "BPF cgroup/connect4|6 + sendmsg4|6 allowlist per session, checked against the grant's caretaker handle at use; every packet of an open flow re-checked at cgroup_skb"
	default:
		egress = backend.Strength{Class: backend.ClassNetEgress, Level: backend.Unavailable, Mechanism: "none", Reason: "flow mode " + d.cfg.FlowMode.String() + " was not resolved"}
	}
	r.Classes = append(r.Classes, egress)

	// net.inbound: the same ingress hook in both modes, the same handles.
	inbound := backend.Strength{Class: backend.ClassNetInbound, Level: backend.RevocableInKernel}
	switch d.cfg.FlowMode {
	case FlowSweep:
		inbound.Mechanism = "BPF cgroup_skb/ingress: a SYN to a session listener, or a datagram to an unconnected session UDP socket that is no reply to the session's egress, must match an inbound rule (source prefix, local port) under a live caretaker handle; accepted flows destroyed by the iter/tcp sweep on revoke"
		inbound.Reason = "a flow whose handle expires while no agent runs lives until an agent starts (its sweep runs then)"
	case FlowPacket:
		inbound.Mechanism = "BPF cgroup_skb/ingress: a SYN to a session listener, or a datagram to an unconnected session UDP socket that is no reply to the session's egress, must match an inbound rule (source prefix, local port) under a live caretaker handle; every packet of an accepted flow re-checked at cgroup_skb"
	default:
		inbound = backend.Strength{Class: backend.ClassNetInbound, Level: backend.Unavailable, Mechanism: "none", Reason: egress.Reason}
	}
	r.Classes = append(r.Classes, inbound)

	fs := d.fsRow(abi, llErr)
	r.Classes = append(r.Classes, fs,
		backend.Strength{Class: backend.ClassClipboard, Level: backend.Unavailable, Mechanism: "none", Reason: "a desktop-substrate control: a Linux host has no clipboard to gate"},
		backend.Strength{Class: backend.ClassGPU, Level: backend.Unavailable, Mechanism: "none", Reason: "cgroup/dev device grants and NVML metering are not wired in this build (an unmetered device class is not grantable)"},
		backend.Strength{Class: backend.ClassInstall, Level: backend.Unavailable, Mechanism: "none", Reason: "the capability broker is not built"},
		d.persistRow(d.fsViewRow(abi, llErr)),
		backend.Strength{Class: backend.ClassCredentials, Level: backend.Unavailable, Mechanism: "none", Reason: "the credential broker is not built"},
		backend.Strength{Class: backend.ClassPeripheral, Level: backend.Unavailable, Mechanism: "none", Reason: "cgroup/dev rules for camera, microphone and USB are not wired in this build"},
		d.procRow(),
	)
	if d.boundaryReport(&r) {
		r.Boundary = append(r.Boundary, d.quotaRows()...)
		return r
	}
	r.Boundary = append(r.Boundary, d.quotaRows()...)
	r.Boundary = append(r.Boundary, backend.Strength{Class: "uid", Level: backend.FixedAtExec,
		Mechanism: fmt.Sprintf("session processes run as uid %d (nobody) unless the operator names another", Nobody),
		Reason:    "every session shares that uid, so same-uid rights (signals, ptrace, /proc, pidfd_getfd) cross sessions"})
	return r
}

// landlockABI asks the kernel for its Landlock ABI version.
func landlockABI() (int, error) {
	const createRulesetVersion = 1 << 0 // LANDLOCK_CREATE_RULESET_VERSION
	v, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, createRulesetVersion)
	if errno != 0 {
		return 0, errno
	}
	return int(v), nil
}

// FlowModeMeans says, for status and logs, what flow mode m guarantees about
// flows open when their grant dies.
func FlowModeMeans(m FlowMode) string {
	switch m {
	case FlowSweep:
		return "a revoke destroys the session's open sockets whose peer no live grant covers before it returns (socket iterators + bpf_sock_destroy); a handle deadline does the same when it passes while the agent runs, or when the agent next starts; new connections are checked at connect/sendmsg and handshakes at ingress; no hook runs per data packet"
	case FlowPacket:
		return "cgroup_skb checks every data packet of a session socket against the handle its flow was allowed under and drops it once that handle is dead or expired, with or without the agent running"
	}
	return "unknown"
}
