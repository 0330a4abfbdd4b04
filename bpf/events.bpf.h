/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Denials, counted and reported: count() adds one to the per-CPU counter of
 * (session, reason), never lossy; report() counts and then, if the session's
 * event budget allows, sends a struct shk_event on the ring buffer, best
 * effort (a full ring buffer bumps SHK_STAT_RINGBUF_DROPS instead).
 *
 * The event budget: each session (by index; index 0, what no session owns,
 * has one budget for all of it) may send at most shk_event_burst events at
 * once and shk_event_rate a second after that, whatever processes or CPUs
 * its denials come from, from each of two buckets: its own attempts, and
 * what others do to it (no_inbound: a peer refused at the session's
 * socket, which anyone who can send the host packets causes; flow_revoked:
 * a flow cut after its grant died). So no one outside the session can
 * spend the budget of its own attempts. An event past it is not sent; it
 * is counted in the session's shk_suppressed slot and in
 * SHK_STAT_EVENTS_SUPPRESSED, and its denial was counted in shk_counters
 * before the budget was asked, so a flood of denials costs the agent at
 * most the budget in events, while the counts stay exact.
 *
 * The budget is GCRA (the generic cell rate algorithm, a token bucket kept
 * in one word): shk_budgets[session * 2 + bucket].tat is when the bucket is
 * next full enough, moved by shk_event_interval_ns (1 s / rate) per event
 * sent; an event conforms when tat - now <= shk_event_tolerance_ns
 * ((burst - 1) * interval): at most burst + rate * t events in any window
 * of t seconds. Shared by every CPU, so a session cannot multiply its budget by
 * spreading over CPUs; an event sent moves tat with one compare-and-swap,
 * and an event refused reads it only (the flood path writes nothing shared
 * but its per-CPU counters). A lost race (another CPU of the same session
 * sent meanwhile) retries a few times, then suppresses: at worst an event
 * within budget is counted as suppressed, never one past it sent.
 *
 * The denied marker: count() first sets the session's bit in shk_denied
 * (bit session % 64 of word session / 64), once, on the session's first
 * denial (a set bit is only read after that, so a flood writes nothing
 * shared). A session's counters are all zero until its bit is set, so the
 * metrics scrape (dataplane CountersOf) reads the counters of marked
 * sessions only. User space clears the bit when it zeroes the index's
 * counters for a new session, sets it when it counts a denial itself
 * (exec_denied), and sets every bit when it adopts counters made before
 * the marker existed.
 */
#pragma once

#include "common.bpf.h"

/* Denials per (session index * SHK_NR_REASONS + reason). Sized by user space
 * to max sessions * SHK_NR_REASONS. Never lossy, unlike the ring buffer. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 65536 * SHK_NR_REASONS);
} shk_counters SEC(".maps");

/* Global statistics, enum shk_stat. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, SHK_NR_STATS);
} shk_stats SEC(".maps");

/* Denial events (struct shk_event). Sized by user space (bytes). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} shk_events SEC(".maps");

/* Denial-event budgets (struct shk_budget), two per session index: key
 * session * 2 + bucket (budget_bucket). Sized by user space to max
 * sessions * 2. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct shk_budget);
	__uint(max_entries, 65536 * 2);
} shk_budgets SEC(".maps");

/* Denial events past their session's budget, per session index. Sized by
 * user space to max sessions. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 65536);
} shk_suppressed SEC(".maps");

/* The denied marker (see above): bit session % 64 of word session / 64 is
 * set from the session's first denial on. Sized by user space to max
 * sessions / 64, rounded up; mmapped by user space, which clears and sets
 * bits with atomic operations, never a plain write of a word. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 65536 / 64);
} shk_denied SEC(".maps");

/* The budget, set by user space before load: 1 s / rate, and (burst - 1) *
 * that. Interval 0: no budget (every event is sent). */
const volatile __u64 shk_event_interval_ns = 0;
const volatile __u64 shk_event_tolerance_ns = 0;

/* Export the ABI types for bpf2go. */
const struct shk_event *unused_event __attribute__((unused));


/* Sets session's bit in shk_denied unless it is set already. */
static __always_inline void mark_denied(__u32 session)
{
	__u32 key = session / 64;
	__u64 bit = 1ULL << (session % 64);
	__u64 *w = bpf_map_lookup_elem(&shk_denied, &key);

	if (w && !(*(volatile __u64 *)w & bit))
		__sync_fetch_and_or(w, bit);
}

static __always_inline void count(__u32 session, __u32 reason)
{
	__u32 key = session * SHK_NR_REASONS + reason;
	__u64 *c;

	mark_denied(session); /* before the counter: a nonzero counter's bit is set */
	c = bpf_map_lookup_elem(&shk_counters, &key);
	if (c)
		*c += 1;
}

static __always_inline void stat_add(__u32 key)
{
	__u64 *c = bpf_map_lookup_elem(&shk_stats, &key);

	if (c)
		*c += 1;
}

/* The budget bucket of a denial: 1 for what others do to the session, 0
 * for its own attempts. */
static __always_inline __u32 budget_bucket(__u32 reason)
{
	return reason == SHK_REASON_NO_INBOUND || reason == SHK_REASON_FLOW_REVOKED;
}

/* Whether session may send one more event of this reason now (and if so,
 * takes it); if not, counts it suppressed. */
static __always_inline int event_budget(__u32 session, __u32 reason)
{
	struct shk_budget *b;
	__u64 now, tat, base, *n;
	__u32 key = session * 2 + budget_bucket(reason);

	if (!shk_event_interval_ns)
		return 1;
	b = bpf_map_lookup_elem(&shk_budgets, &key);
	if (!b)
		goto suppress; /* no such index: nothing to charge, nothing sent */
	now = bpf_ktime_get_ns();
#pragma unroll
	for (int i = 0; i < 4; i++) {
		tat = *(volatile __u64 *)&b->tat;
		base = tat > now ? tat : now;
		if (base - now > shk_event_tolerance_ns)
			goto suppress;
		if (__sync_val_compare_and_swap(&b->tat, tat, base + shk_event_interval_ns) == tat)
			return 1;
	}
suppress:
	n = bpf_map_lookup_elem(&shk_suppressed, &session);
	if (n)
		*n += 1;
	stat_add(SHK_STAT_EVENTS_SUPPRESSED);
	return 0;
}

static __always_inline void report(__u64 cgid, __u32 session, __u32 pid, __u32 reason,
				   __u16 family, __u8 proto, __u16 dport, const __u32 *daddr,
				   int nwords, int with_comm)
{
	struct shk_event *e;

	count(session, reason);
	if (!event_budget(session, reason))
		return;
	e = bpf_ringbuf_reserve(&shk_events, sizeof(*e), 0);
	if (!e) {
		stat_add(SHK_STAT_RINGBUF_DROPS);
		return;
	}
	__builtin_memset(e, 0, sizeof(*e));
	e->ts_ns = bpf_ktime_get_boot_ns();
	e->cgroup_id = cgid;
	e->session = session;
	e->pid = pid;
	e->reason = reason;
	e->family = family;
	e->dport = dport;
	e->proto = proto;
	if (daddr) {
		__u32 *d = (__u32 *)e->daddr;

		d[0] = daddr[0];
		if (nwords == 4) {
			d[1] = daddr[1];
			d[2] = daddr[2];
			d[3] = daddr[3];
		}
	}
	if (with_comm)
		bpf_get_current_comm(e->comm, sizeof(e->comm));
	bpf_ringbuf_submit(e, 0);
}
