module github.com/shinken-agent/shinken

go 1.26.8

require (
	github.com/cilium/ebpf v0.22.0
	github.com/miekg/dns v1.1.73
	golang.org/x/net v0.57.0
	golang.org/x/sys v0.50.0
)

tool github.com/cilium/ebpf/cmd/bpf2go
