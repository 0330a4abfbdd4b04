/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Flow marks: which handles a flow may be open under (sweep mode). After a
 * revoke, sweep mode destroys every session socket that no live grant covers
 * any more, and a sweep walks every TCP and UDP socket of the host (each
 * bucket of its hash tables: about half a millisecond on a host with no
 * sockets at all). A handle under which no check ever passed for a flow
 * (no connect, send or inbound flow admitted through one of its rules, and
 * no sweep found a socket one of them covers) cannot have anything to cut,
 * and user space skips the walk for its revoke.
 *
 * The mark is shk_handle_flows[slot] = the handle's generation. Every check
 * that can admit or keep a flow (try_rules and never_exception,
 * egress_map.bpf.h: connect, send, an inbound flow's admission, the
 * sweep's own check) marks the handle of the rule it tries and each
 * ancestor, then runs a full barrier, then reads their state words
 * (shk_handle_check). A revoke is shk_revoke: one atomic exchange of the
 * state word (a full barrier), then a read of the mark. Of a check and a
 * revoke that race, at least one sees the other's write (store buffering
 * with a full barrier on both sides): either the check finds the handle
 * revoked and refuses, or the revoke finds the mark and user space sweeps.
 * A sweep that keeps a socket alive marks the handle that covers it, so a
 * flow handed from a revoked grant to another grant covering the same peer
 * is cut by that grant's revoke in turn. A slot issued again gets a new
 * generation, so its old mark does not count for the new handle (a
 * generation that wraps back onto an old mark only costs a sweep).
 */
#pragma once

#include "common.bpf.h"
#include "handle.bpf.h"

/* Slot -> the generation of the handle a flow check passed under. Sized
 * by user space like shk_handles; pinned beside it. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 262144);
} shk_handle_flows SEC(".maps");

/*
 * Marks handle (slot, gen) and its ancestors as one a flow may be open
 * under, then runs a full barrier, before the caller reads their states. A
 * mark already made costs one read. Global, so the verifier checks it once.
 */
__noinline int shk_flow_mark(__u32 slot, __u32 gen)
{
	__u64 fence = 0;

	for (int i = 0; i < SHK_MAX_CHAIN; i++) {
		__u32 key = slot;
		struct shk_handle *h;
		__u32 *m;

		if (slot == SHK_HANDLE_NONE)
			break;
		h = bpf_map_lookup_elem(&shk_handles, &key);
		m = bpf_map_lookup_elem(&shk_handle_flows, &key);
		if (!h || !m || h->generation != gen)
			break; /* dead or recycled: the check refuses it */
		if (*m != gen)
			__sync_lock_test_and_set(m, gen);
		slot = h->parent;
		gen = h->parent_generation;
	}
	/* An exchange returns a value, and the kernel's memory model wants
	 * every value-returning atomic fully ordered: x86 xchg, arm64 swpal
	 * (or an exclusive pair and dmb); the powerpc and RISC-V JITs emit
	 * it so since Linux 6.10. The state reads that follow cannot pass
	 * the mark reads and writes above. */
	__sync_lock_test_and_set(&fence, 1);
	return 0;
}

/*
 * The revoke, run by user space (BPF_PROG_RUN) on the handle it checked
 * under its lock (not free, of this generation): the state word exchanged
 * for REVOKED, then whether a flow check tried a rule under it.
 */
SEC("syscall")
int shk_revoke(struct shk_revoke_args *a)
{
	__u32 key = a->slot;
	struct shk_handle *h = bpf_map_lookup_elem(&shk_handles, &key);
	__u32 *m = bpf_map_lookup_elem(&shk_handle_flows, &key);

	if (!h || !m)
		return -1;
	if (h->generation != a->generation)
		return -2;
	__sync_lock_test_and_set(&h->state, SHK_HANDLE_REVOKED);
	a->flows = *m == a->generation;
	return 0;
}
