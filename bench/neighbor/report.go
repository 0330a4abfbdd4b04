//go:build linux

package main

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/shinken-agent/shinken/bench/internal/benchkit"
)

func one(m map[string][]float64, k string) float64 {
	if v := m[k]; len(v) == 1 {
		return v[0]
	}
	return 0
}

// dnsMs is B's DNS latencies of a phase in ms, a lost or failed query
// counted as the timeout (1000 ms), sorted; and the lost and failed count.
func dnsMs(p *phase) ([]float64, int, int) {
	var v []float64
	for _, k := range []string{"cached", "fresh"} {
		for _, ns := range p.probe[k] {
			v = append(v, ns/1e6)
		}
	}
	bad := int(one(p.probe, "lost_cached") + one(p.probe, "lost_fresh") + one(p.probe, "err_cached") + one(p.probe, "err_fresh"))
	for i := 0; i < bad; i++ {
		v = append(v, float64(probeTimeout.Milliseconds()))
	}
	sort.Float64s(v)
	return v, bad, int(one(p.probe, "sent"))
}

func kindMs(p *phase, k string) []float64 {
	var v []float64
	for _, ns := range p.probe[k] {
		v = append(v, ns/1e6)
	}
	sort.Float64s(v)
	return v
}

func sorted(v []float64) []float64 {
	out := append([]float64(nil), v...)
	sort.Float64s(out)
	return out
}

func report(phases []*phase) {
	var idleDNS, idleGrants, idleEcho, idleFloors []float64
	for _, p := range phases {
		if p.name == "idle" {
			idleEcho = append(idleEcho, kindMs(p, "echo")...)
			v, _, _ := dnsMs(p)
			idleDNS = append(idleDNS, v...)
			idleGrants = append(idleGrants, p.grants...)
			idleFloors = append(idleFloors, p.floors...)
		}
	}
	sort.Float64s(idleDNS)
	sort.Float64s(idleGrants)
	sort.Float64s(idleEcho)
	sort.Float64s(idleFloors)
	idleP99, idleGrantP99, idleEchoP99 := benchkit.Q(idleDNS, 0.99), benchkit.Q(idleGrants, 0.99), benchkit.Q(idleEcho, 0.99)
	idleFloorP99 := benchkit.Q(idleFloors, 0.99)
	rssBase := phases[0].host.rssMaxKiB
	fmt.Println()
	for _, p := range phases {
		v, bad, sent := dnsMs(p)
		g := sorted(p.grants)
		c, f := kindMs(p, "cached"), kindMs(p, "fresh")
		fmt.Printf("%-8s B DNS: %d sent, p50 %.3f p99 %.3f max %.3f ms (cached p50 %.3f p99 %.3f, new names p50 %.3f p99 %.3f), %d lost or failed, %d sends late; B grants: %d, p50 %.2f p99 %.2f max %.2f ms; agent RSS max %.1f MiB; ephemeral ports left min %d; host autobind failures %d; load %s\n",
			p.name, sent, benchkit.Q(v, 0.5), benchkit.Q(v, 0.99), benchkit.Q(v, 1), benchkit.Q(c, 0.5), benchkit.Q(c, 0.99), benchkit.Q(f, 0.5), benchkit.Q(f, 0.99), bad, int(one(p.probe, "late")),
			len(g), benchkit.Q(g, 0.5), benchkit.Q(g, 0.99), benchkit.Q(g, 1), float64(p.host.rssMaxKiB)/1024, p.host.portsLeftMin, p.host.autobindFailures, p.loadAfter)
		if p.probeErr != "" {
			fmt.Printf("         B's probe did not run, so its %d queries count as lost: %s\n", sent, p.probeErr)
		}
		e := kindMs(p, "echo")
		fmt.Printf("         control: B's UDP echo to a host server on loopback (no agent): p50 %.3f p99 %.3f max %.3f ms, %d lost\n", benchkit.Q(e, 0.5), benchkit.Q(e, 0.99), benchkit.Q(e, 1), int(one(p.probe, "lost_echo")))
		if fl := sorted(p.floors); len(fl) > 0 {
			fmt.Printf("         control: the grant floor (the same request to a bare server at the agent's CPU weight that writes and syncs a grant's records, no agent code; one after each of B's grants): %d, p50 %.2f p99 %.2f max %.2f ms\n", len(fl), benchkit.Q(fl, 0.5), benchkit.Q(fl, 0.99), benchkit.Q(fl, 1))
		}
		fmt.Printf("         host CPUs busy by kind: %s\n", p.host.hostCPU)
		fmt.Printf("         agent: CPU %.0f %% of one CPU, %s; ports A's sockets held at most %d; A's processes at most %d\n", 100*p.host.agentCPU, p.heap, p.host.aPortsMax, p.host.aProcsMax)
		if p.host.autobindFirstFail != "" {
			fmt.Printf("         host autobind error: %s\n", p.host.autobindFirstFail)
		}
		if p.name != "idle" {
			var types []string
			for k, v := range p.auditTypes {
				types = append(types, fmt.Sprintf("%s %d (%d B)", k, v[1], v[0]))
			}
			sort.Strings(types)
			fmt.Printf("         A (%.1f s): %s\n         A's audit records: %d bytes (%s); all records %d bytes\n",
				p.floodDur.Seconds(), strings.Join(strings.Split(strings.TrimSpace(p.floodOut), "\n"), ", "), p.auditOwn, strings.Join(types, ", "), p.auditAll)
		}
	}
	idleCPU, nIdle := 0.0, 0
	for _, p := range phases {
		if p.name == "idle" {
			idleCPU += p.host.agentCPU
			nIdle++
		}
	}
	fmt.Printf("\nidle (pooled, %d phases): B DNS p99 %.3f ms over %d queries, B grant p99 %.2f ms over %d, B's echo control p99 %.3f ms, the grant floor control p99 %.2f ms over %d; the agent's CPU %.0f %% of one CPU (mean)\n",
		nIdle, idleP99, len(idleDNS), idleGrantP99, len(idleGrants), idleEchoP99, idleFloorP99, len(idleFloors), 100*idleCPU/float64(nIdle))
	worstDNS, worstGrant, worstAudit, worstFloor := 0.0, 0.0, 0.0, 0.0
	var lostAll, sentAll int
	rssMax := int64(0)
	portsMin, rangeSize := math.MaxInt, 0
	for _, p := range phases {
		portsMin = min(portsMin, p.host.portsLeftMin)
		rangeSize = p.host.rangeSize
		if p.name == "idle" {
			continue
		}
		v, bad, sent := dnsMs(p)
		dr := benchkit.Q(v, 0.99) / idleP99
		gr := benchkit.Q(sorted(p.grants), 0.99) / idleGrantP99
		fr := benchkit.Q(sorted(p.floors), 0.99) / idleFloorP99
		ab := float64(p.auditOwn) * 60 / p.floodDur.Seconds()
		rss := float64(p.host.rssMaxKiB-rssBase) / 1024
		if p.name != "cpu" { // the control is no flood of the issue's
			rssMax = max(rssMax, p.host.rssMaxKiB)
			worstDNS, worstGrant, worstAudit = max(worstDNS, dr), max(worstGrant, gr), max(worstAudit, ab)
			if len(p.floors) > 0 {
				worstFloor = max(worstFloor, fr)
			}
			lostAll += bad
			sentAll += sent
		}
		fmt.Printf("flood_%s_agent_cpu_pct=%.0f\nflood_%s_a_ports_max=%d\nflood_%s_a_procs_max=%d\n", p.name, 100*p.host.agentCPU, p.name, p.host.aPortsMax, p.name, p.host.aProcsMax)
		fmt.Printf("flood_%s_echo_p99_ratio=%.2f\n", p.name, benchkit.Q(kindMs(p, "echo"), 0.99)/idleEchoP99)
		if len(p.floors) > 0 {
			fmt.Printf("flood_%s_grant_floor_p99_ratio=%.2f\n", p.name, fr)
		}
		fmt.Printf("flood_%s_dns_p99_ratio=%.2f\nflood_%s_dns_loss=%d/%d\nflood_%s_grant_p99_ratio=%.2f\nflood_%s_audit_bytes_per_minute=%.0f\nflood_%s_agent_rss_growth_mib=%.1f\nflood_%s_ports_left_min=%d\n",
			p.name, dr, p.name, bad, sent, p.name, gr, p.name, ab, p.name, rss, p.name, p.host.portsLeftMin)
	}
	fmt.Printf("neighbor_dns_lost_or_failed=%d/%d\n", lostAll, sentAll)
	fmt.Printf("host_ephemeral_ports_left_min_pct=%.1f\n", 100*float64(portsMin)/float64(rangeSize))
	fmt.Printf("neighbor_dns_p99_ratio=%.2f\n", worstDNS)
	fmt.Printf("neighbor_dns_loss=%.4f\n", float64(lostAll)/float64(max(1, sentAll)))
	fmt.Printf("neighbor_grant_p99_ratio=%.2f\n", worstGrant)
	if len(idleFloors) > 0 {
		// The control, not a goal: the same ratio for a server with no
		// agent code (the worst flood's, as neighbor_grant_p99_ratio).
		fmt.Printf("neighbor_grant_floor_p99_ratio=%.2f\n", worstFloor)
	}
	fmt.Printf("audit_bytes_per_flood_minute=%.0f\n", worstAudit)
	fmt.Printf("agent_rss_growth_mib=%.1f\n", float64(rssMax-rssBase)/1024)
	fmt.Printf("host_ephemeral_ports_left_min=%d\n", portsMin)
}
