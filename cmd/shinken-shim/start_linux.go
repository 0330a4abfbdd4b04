package main

import (
	"github.com/shinken-agent/shinken/agent/backend"
	"github.com/shinken-agent/shinken/dataplane/boundary"
)

// start is the Linux backend's StartFunc (agent/backend/host.Start is the
// same function, reached through the whole dataplane): importing the
// boundary alone keeps cilium/ebpf's and the dataplane's initialisation out
// of every shim's start and memory.
var start backend.StartFunc = boundary.StartPrepared
