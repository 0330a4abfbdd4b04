//go:build !linux

package main

import "github.com/shinken-agent/shinken/agent/backend"

// start is nil: no backend here prepares launches (agent/backend/host).
var start backend.StartFunc
