package dataplane

// Enforcement says which mechanism enforces a capability class on this host
// and how strongly. The agent logs it at start and will serve it on its API.
type Enforcement struct {
	Class     string `json:"class"`
	Mechanism string `json:"mechanism"`
	Level     string `json:"level"` // "kernel", "none"
	Note      string `json:"note,omitempty"`
}

// Report lists what this build of the dataplane enforces. Classes without a
// kernel mechanism yet are listed as "none" so nobody mistakes them for
// enforced.
func Report() []Enforcement {
	return []Enforcement{
		{Class: "net.egress", Mechanism: "cgroup/connect4|6, sendmsg4|6, cgroup_skb ingress/egress (BPF)", Level: "kernel",
			Note: "per-session LPM allowlist; caretaker handles checked at connect, send and per packet of open flows"},
		{Class: "net.egress domains", Mechanism: "DNS redirect (cgroup/connect, sendmsg, recvmsg, getpeername) to the agent's allowlisting resolver", Level: "kernel",
			Note: "when the daemon runs its resolver (SetDNSRedirect); answers become egress entries before they are returned"},
		{Class: "fs.scope", Mechanism: "none yet", Level: "none", Note: "Landlock not wired in: not grantable"},
		{Class: "gpu", Mechanism: "none yet", Level: "none", Note: "cgroup/dev not wired in: not grantable"},
		{Class: "peripheral", Mechanism: "none yet", Level: "none", Note: "cgroup/dev not wired in: not grantable"},
	}
}
