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
