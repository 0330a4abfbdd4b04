module github.com/shinken-agent/shinken

go 1.26.8

require (
	github.com/cedar-policy/cedar-go v1.9.1
	github.com/chromedp/cdproto v0.160.1
	github.com/chromedp/chromedp v0.23.1
	github.com/cilium/ebpf v0.22.0
	github.com/containerd/cgroups/v3 v3.1.3
	github.com/elastic/go-seccomp-bpf v1.6.0
	github.com/landlock-lsm/go-landlock v0.11.2
	github.com/miekg/dns v1.1.73
	github.com/moby/sys/mountinfo v0.7.3
	github.com/prometheus/client_golang v1.25.0
	github.com/prometheus/common v0.72.0
	golang.org/x/net v0.59.0
	golang.org/x/sys v0.50.0
)

require (
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/containerd/log v0.1.0 // indirect
	github.com/coreos/go-systemd/v22 v22.5.0 // indirect
	github.com/go-json-experiment/json v1.27.2 // indirect
	github.com/godbus/dbus/v5 v5.1.0 // indirect
	github.com/kylelemons/godebug v1.1.0 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/opencontainers/runtime-spec v1.3.0 // indirect
	github.com/prometheus/client_model v0.6.3 // indirect
	github.com/prometheus/procfs v0.22.0 // indirect
	github.com/sirupsen/logrus v1.9.4 // indirect
	golang.org/x/exp v0.0.0-20241108190413-2d47ceb2692f // indirect
	google.golang.org/protobuf v1.36.12 // indirect
	kernel.org/pub/linux/libs/security/libcap/psx v1.2.78 // indirect
)

tool github.com/cilium/ebpf/cmd/bpf2go
