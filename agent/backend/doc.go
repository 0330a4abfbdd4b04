// Package backend is the seam between the control plane (package agent and
// everything above it) and the operating system that enforces grants.
//
// One interface, Backend, is implemented once per OS: on Linux by
// *dataplane.Dataplane (BPF maps and cgroup hooks, cgroups, namespaces,
// Landlock); elsewhere by Unsupported until the darwin/ and windows/ backends
// exist. The agent, its API, the DNS resolver and the daemon talk to the OS
// only through this package, so none of them imports a Linux package and
// every binary builds for every GOOS the project names.
//
// The package is standard library only. It holds the vocabulary both sides
// share: sessions, caretaker handle references, egress rules, denial
// reasons and events, and the enforcement levels of the design:
//
//   - revocable in-kernel: a map write; the next use fails, open flows cut too;
//   - revocable at next use: the next connect/open/exec fails, open objects live on;
//   - fixed at exec: applied when a process starts; changes reach new processes only;
//   - unavailable: refused, with the reason.
//
// Every level a backend reports comes from what it probed on this host when
// it opened, never from a constant.
package backend
