/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Denials, counted and reported: count() adds one to the per-CPU counter of
 * (session, reason), never lossy; report() counts and then sends a struct
 * shk_event on the ring buffer, best effort (a full ring buffer bumps
 * SHK_STAT_RINGBUF_DROPS instead).
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

/* Export the ABI types for bpf2go. */
const struct shk_event *unused_event __attribute__((unused));


static __always_inline void count(__u32 session, __u32 reason)
{
	__u32 key = session * SHK_NR_REASONS + reason;
	__u64 *c = bpf_map_lookup_elem(&shk_counters, &key);

	if (c)
		*c += 1;
}

static __always_inline void report(__u64 cgid, __u32 session, __u32 pid, __u32 reason,
				   __u16 family, __u8 proto, __u16 dport, const __u32 *daddr,
				   int nwords, int with_comm)
{
	struct shk_event *e;

	count(session, reason);
	e = bpf_ringbuf_reserve(&shk_events, sizeof(*e), 0);
	if (!e) {
		__u32 key = SHK_STAT_RINGBUF_DROPS;
		__u64 *c = bpf_map_lookup_elem(&shk_stats, &key);

		if (c)
			*c += 1;
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
