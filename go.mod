module github.com/shinken-agent/shinken

go 1.26.8

require (
	github.com/cilium/ebpf v0.22.0
	golang.org/x/net v0.59.0
	golang.org/x/sys v0.50.0
)

require (
	github.com/prometheus/client_golang v1.25.0 // indirect
	golang.org/x/sync v0.22.0 // indirect
)

tool github.com/cilium/ebpf/cmd/bpf2go
