/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The caretaker handle check, the one check every hook makes before it
 * allows anything: an allowing entry (egress rule, flow record, and later a
 * device or LSM entry) carries a handle reference (slot, generation), and the
 * handle and each of its ancestors (the membrane: attenuated children point
 * at their parent) must be live and unexpired. Revoke is one write of a
 * handle's state word (an atomic exchange, shk_revoke in flowmark.bpf.h,
 * run by user space); the next check fails.
 */
#pragma once

#include "common.bpf.h"

/* Caretaker handles by slot. Sized by user space (max handles). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct shk_handle);
	__uint(max_entries, 262144);
} shk_handles SEC(".maps");

/*
 * Returns SHK_REASON_NONE when handle (slot, gen) and every ancestor is alive
 * for the use (enum shk_use) and unexpired, else why not. An approve-once
 * handle (ONCE) serves one new use: SHK_USE_CONSUME moves it to USED with a
 * compare-and-swap on its state word, so of two racing connects exactly one
 * passes; a USED handle (or ancestor) passes for flows it already opened
 * only. Reads the clock only when a deadline is set. Global, so the verifier
 * checks it once.
 */
__noinline int shk_handle_check(__u32 slot, __u32 gen, __u32 use)
{
	__u64 now = 0;

	for (int i = 0; i < SHK_MAX_CHAIN; i++) {
		__u32 key = slot;
		struct shk_handle *h;
		__u32 st;

		if (slot == SHK_HANDLE_NONE)
			return SHK_REASON_HANDLE_REVOKED;
		h = bpf_map_lookup_elem(&shk_handles, &key);
		if (!h || h->generation != gen)
			return SHK_REASON_HANDLE_REVOKED;
		st = h->state;
		if (st != SHK_HANDLE_LIVE && st != SHK_HANDLE_ONCE && st != SHK_HANDLE_USED)
			return SHK_REASON_HANDLE_REVOKED;
		if (st == SHK_HANDLE_USED && use != SHK_USE_FLOW)
			return SHK_REASON_HANDLE_REVOKED; /* its one use is spent */
		if (h->expires_ns) {
			if (!now)
				now = bpf_ktime_get_boot_ns();
			if (now >= h->expires_ns)
				return SHK_REASON_HANDLE_EXPIRED;
		}
		/* The allowing handle itself (i == 0) is consumed, ancestors are
		 * not. (If an ancestor then turns out dead, the use is refused
		 * and the once handle is spent: it was dead through it anyway.) */
		if (i == 0 && st == SHK_HANDLE_ONCE && use == SHK_USE_CONSUME &&
		    __sync_val_compare_and_swap(&h->state, SHK_HANDLE_ONCE, SHK_HANDLE_USED) != SHK_HANDLE_ONCE)
			return SHK_REASON_HANDLE_REVOKED; /* another use won the race */
		if (h->parent == SHK_HANDLE_NONE)
			return SHK_REASON_NONE;
		slot = h->parent;
		gen = h->parent_generation;
	}
	/* Deeper than user space ever issues: fail closed. */
	return SHK_REASON_HANDLE_REVOKED;
}
