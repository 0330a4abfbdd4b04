/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The caretaker handle check, the one check every hook makes before it
 * allows anything: an allowing entry (egress rule, flow record, and later a
 * device or LSM entry) carries a handle reference (slot, generation), and the
 * handle and each of its ancestors (the membrane: attenuated children point
 * at their parent) must be live and unexpired. Revoke is one write of a
 * struct shk_handle by user space; the next check fails.
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
 * Returns SHK_REASON_NONE when handle (slot, gen) and every ancestor is live
 * and unexpired, else why not. Reads the clock only when a deadline is set. Global, so the verifier checks it once.
 */
__noinline int shk_handle_check(__u32 slot, __u32 gen)
{
	__u64 now = 0;

	for (int i = 0; i < SHK_MAX_CHAIN; i++) {
		__u32 key = slot;
		struct shk_handle *h;

		if (slot == SHK_HANDLE_NONE)
			return SHK_REASON_HANDLE_REVOKED;
		h = bpf_map_lookup_elem(&shk_handles, &key);
		if (!h || h->generation != gen || h->state != SHK_HANDLE_LIVE)
			return SHK_REASON_HANDLE_REVOKED;
		if (h->expires_ns) {
			if (!now)
				now = bpf_ktime_get_boot_ns();
			if (now >= h->expires_ns)
				return SHK_REASON_HANDLE_EXPIRED;
		}
		if (h->parent == SHK_HANDLE_NONE)
			return SHK_REASON_NONE;
		slot = h->parent;
		gen = h->parent_generation;
	}
	/* Deeper than user space ever issues: fail closed. */
	return SHK_REASON_HANDLE_REVOKED;
}
