module github.com/shinken-agent/shinken

go 1.26.8

require (
	github.com/cedar-policy/cedar-go v1.9.1
	github.com/cilium/ebpf v0.22.0
	github.com/miekg/dns v1.1.73
	golang.org/x/net v0.59.0
	golang.org/x/sys v0.50.0
)

require (
	github.com/go-json-experiment/json v1.27.2 // indirect
	golang.org/x/exp v0.0.0-20220921023135-46d9e7742f1e // indirect
)

tool github.com/cilium/ebpf/cmd/bpf2go
