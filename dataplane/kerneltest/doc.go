// Package kerneltest holds what the tests that use the real kernel share, in
// every package that has them (dataplane, dnsresolver, agent, agent/metrics,
// cmd/shinken-agent): the root check, names private to one test (a parent
// cgroup and a bpffs pin path that no running agent and no other test uses),
// opening a dataplane that is uninstalled when the test ends, and the TestMain
// that serves re-executed probe processes. It does not import dataplane, so
// the dataplane's own tests use it too. Only tests import it. Linux only.
package kerneltest
