/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Sessions: which session a task or a packet acts for. A session is a cgroup2
 * directory at level shk_session_level; shk_sessions maps its cgroup id to the
 * session (struct shk_session). A cgroup id not in the map is no session:
 * every hook that must decide denies it (SHK_REASON_UNKNOWN_SESSION).
 */
#pragma once

#include "common.bpf.h"

/* Level of the session cgroups in the cgroup2 hierarchy (the parent's level
 * plus one). Set by user space before load. */
const volatile __u32 shk_session_level = 0;

/* Session cgroup id -> session. Sized by user space (max sessions). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u64);
	__type(value, struct shk_session);
	__uint(max_entries, 65536);
} shk_sessions SEC(".maps");

/* The session cgroup of the current task: its ancestor at the sessions' level
 * (for hooks that run in the acting task's context: sock_addr, sock_create,
 * and later cgroup/dev and LSM hooks). */
static __always_inline __u64 session_cgroup(void)
{
	return bpf_get_current_ancestor_cgroup_id(shk_session_level);
}

/* The session cgroup of a packet's socket. */
static __always_inline __u64 skb_session_cgroup(struct __sk_buff *skb)
{
	return bpf_skb_ancestor_cgroup_id(skb, shk_session_level);
}

/* The session of a session cgroup id, or NULL. */
static __always_inline struct shk_session *session_of(const __u64 *cgid)
{
	return bpf_map_lookup_elem(&shk_sessions, cgid);
}
