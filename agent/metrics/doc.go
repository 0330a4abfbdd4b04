// Package metrics is Shinken's Prometheus telemetry (issue 5 item 6): a
// registry holding a scrape-time collector over the kernel's denial
// counters and the ordinary metrics the daemon updates as it works.
//
// Only cmd/shinken-agent (which serves Handler on its metrics port) and
// agent/ packages that record what they do import it; it imports agent/backend
// for the session and reason types only, and reads the kernel through the
// Source interface, which every backend.Backend implements.
//
// # Metrics
//
// Read from the kernel at scrape time (nothing is cached between scrapes):
//
//	shinken_denials_total{session,class,reason}     counter  per-CPU kernel counters, summed
//	shinken_denials_unattributed_total{class,reason} counter  denials the kernel could not tie to a session (index 0)
//	shinken_sessions                                 gauge    sessions the dataplane knows
//	shinken_ringbuf_drops_total                      counter  denial events the ring buffer had no room for
//	shinken_denial_events_suppressed_total{session}  counter  denial events the session's in-kernel budget did not send (backends with one: backend.SuppressedEvents)
//	shinken_dataplane_read_errors_total              counter  scrape-time kernel reads that failed
//
// Updated by the daemon through the methods of *Metrics:
//
//	shinken_grants_live{class}            gauge      SetGrantsLive
//	shinken_handles_live                  gauge      SetHandlesLive
//	shinken_revokes_total                 counter    ObserveRevoke
//	shinken_revoke_duration_seconds       histogram  ObserveRevoke
//	shinken_decision_duration_seconds     histogram  ObserveDecision
//	shinken_map_entries{map}              gauge      SetMap
//	shinken_map_entries_limit{map}        gauge      SetMap
//	shinken_dns_queries_total{result}     counter    IncDNSQuery
//
// plus the standard go_* and process_* collectors (the daemon's resident
// memory is process_resident_memory_bytes).
//
// # Denials
//
// Denial counts come from the kernel's per-CPU counters, never from the
// ring buffer, so a ring-buffer overflow loses events but no counts.
// class is "net.inbound" for no_inbound (a peer refused at a session's
// listener or unconnected UDP socket) and "net.egress" for every other
// reason; reason is backend.Reason.String(). Only reasons with a non-zero
// count are exported: at 10,000 sessions and eight reasons, exporting zeros would be
// 70,000 series, most of them forever zero. The consequence is the usual
// one for a counter born at its first increment: rate() over the window in
// which a series appears misses that first step; increase() on a longer
// window, or the absolute value, is exact.
//
// A session's series exist exactly while the dataplane lists the session:
// each scrape builds them afresh from Sessions(), so a destroyed session's
// series disappear at the next scrape and are never stale. The dataplane
// zeroes a session index's counters when it hands the index out again, so a
// new session never inherits an old one's counts. One race remains: a
// session destroyed and its index reused by a new session between this
// scrape's Sessions() and Counters() calls would report the new session's
// (fresh, near-zero) counts under the old name for that one scrape.
package metrics
