// Package dataplane is the Go side of Shinken's kernel enforcement: it loads
// the BPF programs of bpf/ (bpf2go output, committed), pins programs, links and
// maps under /sys/fs/bpf/shinken/, adopts what is already pinned when started
// again, manages session cgroups under the cgroup2 mount, the caretaker handle
// table, the egress allow maps, denial counters and the denial event ring.
//
// The kernel sees sessions, prefixes, ports and handle states only; names,
// tiers and policy live in agent/. Only agent/, dnsresolver/, cmd/ and bench/
// import this package.
package dataplane
