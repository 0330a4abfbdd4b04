package main

import (
	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/dataplane/boundary/prepared"
)

// start is the Linux backend's StartFunc (agent/backend/host.Start and
// boundary.StartPrepared are the same function, reached through the whole
// dataplane or boundary): importing the boundary's prepared launches alone
// keeps cilium/ebpf's, the dataplane's and the boundary's initialisation
// (go-seccomp-bpf's tables, debug/elf, go-landlock and libcap's psx) out
// of every shim's start and memory.
var start backend.StartFunc = prepared.Start
