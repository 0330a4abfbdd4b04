package dnsresolver

import (
	"bufio"
	"fmt"
	"io"
	"slices"
	"strings"
)

// WriteMetrics writes the counters in the Prometheus text exposition format
// (version 0.0.4), for the agent's /metrics handler. Labels are the session
// name and the denial reason only, never a query name. Sessions are sorted,
// so the output is stable.
func (r *Resolver) WriteMetrics(w io.Writer) error {
	st := r.Stats()
	names := make([]string, 0, len(st.Sessions))
	for n := range st.Sessions {
		names = append(names, n)
	}
	slices.Sort(names)
	bw := bufio.NewWriter(w)
	counter := func(metric, help string, get func(Counters) uint64) {
		fmt.Fprintf(bw, "# HELP %s %s\n# TYPE %s counter\n", metric, help, metric)
		fmt.Fprintf(bw, "%s{session=\"\"} %d\n", metric, get(st.Total)-sum(st.Sessions, get))
		for _, n := range names {
			fmt.Fprintf(bw, "%s{session=%q} %d\n", metric, escapeLabel(n), get(st.Sessions[n]))
		}
	}
	counter("shinken_dns_queries_total", "DNS queries received, by session (\"\": no known session).", func(c Counters) uint64 { return c.Queries })
	counter("shinken_dns_answered_total", "DNS queries answered NOERROR or NXDOMAIN.", func(c Counters) uint64 { return c.Answered })
	counter("shinken_dns_servfail_total", "DNS queries answered SERVFAIL (upstream failure, chain too long, entry write failed).", func(c Counters) uint64 { return c.ServFail })
	counter("shinken_dns_cache_hits_total", "DNS queries answered from the cache.", func(c Counters) uint64 { return c.CacheHits })
	counter("shinken_dns_entries_written_total", "Egress entries written to the kernel.", func(c Counters) uint64 { return c.EntriesWritten })
	counter("shinken_dns_entry_write_errors_total", "Egress entry writes that failed (the answer was withheld).", func(c Counters) uint64 { return c.WriteErrors })
	counter("shinken_dns_entry_writes_skipped_total", "Entry writes skipped: the same entry was already written.", func(c Counters) uint64 { return c.WritesSkipped })
	counter("shinken_dns_stripped_addresses_total", "Addresses dropped from answers: non-public, or the host's own.", func(c Counters) uint64 { return c.Stripped })
	counter("shinken_dns_host_addresses_stripped_total", "Addresses of the host itself dropped from answers (no grant named them).", func(c Counters) uint64 { return c.HostStripped })
	counter("shinken_dns_dropped_total", "UDP queries dropped because MaxInflight (or the session's PerSessionLimit) queries were pending.", func(c Counters) uint64 { return c.Dropped })
	counter("shinken_dns_rate_dropped_total", "Queries over the session's rate dropped without a reply (the session floods: penalty box).", func(c Counters) uint64 { return c.RateDropped })
	counter("shinken_dns_kernel_dropped_total", "UDP queries of a session in the penalty box over its rate, dropped in the kernel before the resolver read them (not in shinken_dns_queries_total).", func(c Counters) uint64 { return c.KernelDropped })
	counter("shinken_dns_write_limited_total", "Answers withheld (SERVFAIL) because the session was out of kernel-write tokens.", func(c Counters) uint64 { return c.WriteLimited })
	const m = "shinken_dns_refused_total"
	fmt.Fprintf(bw, "# HELP %s DNS queries refused, by session and reason.\n# TYPE %s counter\n", m, m)
	for reason := range NumReasons {
		get := func(c Counters) uint64 { return c.Denials[reason] }
		fmt.Fprintf(bw, "%s{session=\"\",reason=%q} %d\n", m, reason.String(), get(st.Total)-sum(st.Sessions, get))
		for _, n := range names {
			fmt.Fprintf(bw, "%s{session=%q,reason=%q} %d\n", m, escapeLabel(n), reason.String(), get(st.Sessions[n]))
		}
	}
	return bw.Flush()
}

func sum(m map[string]Counters, get func(Counters) uint64) uint64 {
	var s uint64
	for _, c := range m {
		s += get(c)
	}
	return s
}

// escapeLabel leaves what %q does not handle the Prometheus way: session
// names are [A-Za-z0-9_.-] (backend.ValidSessionName), so this is a guard.
func escapeLabel(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r > 0x7e {
			return '_'
		}
		return r
	}, s)
}
