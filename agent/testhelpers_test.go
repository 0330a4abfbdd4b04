package agent

// Helpers the agent's tests share (their grammar and policy-engine
// counterparts are in agent/capability and agent/policy).

func fsCap(read, write, deny []string) Capability {
	return Capability{Class: ClassFSScope, FS: &FSScope{Read: read, Write: write, Deny: deny}}
}
