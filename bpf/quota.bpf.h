/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The host's shared socket resources, per session: how many inet sockets a
 * session may have open (counted at cgroup/sock_create, dropped at
 * cgroup/sock_release) and how many port holds its sockets may have
 * (ports.bpf.h: one per bound or listening or sending socket), so that one
 * session cannot take the host's sockets or its local port range.
 *
 * A socket is counted to the session whose task created it, for as long as
 * it lives, wherever its descriptor goes (SCM_RIGHTS to another session or
 * to the host changes nothing): the socket's storage remembers the session
 * cgroup it was counted to, and only such a socket un-counts at release.
 * A socket the hook did not see is never counted and never un-counts: one
 * made before the creating task joined the session (or before the hooks were
 * attached), one accepted from a listener (the kernel clones it, no
 * sock_create), and every socket family cgroup/sock_create does not run for
 * (AF_UNIX, AF_NETLINK, socketpair): those are bounded by RLIMIT_NOFILE and
 * the session's process bound only.
 *
 * Taking is lock-free: add one, and if the old count was already at the
 * limit, take it back and refuse. A release racing a create can make that
 * create fail at the limit; the count never passes it.
 */
#pragma once

#include "common.bpf.h"

/* The limits, set by user space before load; 0 = no limit. */
const volatile __u32 shk_max_socks = 0;
const volatile __u32 shk_max_ports = 0;

/* Session cgroup id -> struct shk_quota. Sized by user space (max sessions);
 * an entry is made by the first socket of a session, deleted by user space
 * with the session. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u64);
	__type(value, struct shk_quota);
	__uint(max_entries, 65536);
} shk_quotas SEC(".maps");

/* The use entry of session cgroup cgid, made if missing; NULL when the map
 * is full. */
static __always_inline struct shk_quota *use_of(__u64 cgid)
{
	struct shk_quota *u = bpf_map_lookup_elem(&shk_quotas, &cgid);
	struct shk_quota zero = {};

	if (u)
		return u;
	bpf_map_update_elem(&shk_quotas, &cgid, &zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(&shk_quotas, &cgid);
}

/* Takes one of *n against limit max (0: none). Returns 0, or -1 (at the
 * limit: nothing taken). */
static __always_inline int use_take(__s32 *n, __u32 max)
{
	if (__sync_fetch_and_add(n, 1) >= (__s32)max && max) {
		__sync_fetch_and_add(n, -1);
		return -1;
	}
	return 0;
}

/* Gives back one of the ports of session cgroup cgid (if it has an entry:
 * one deleted with its session is not made again). */
static __always_inline void use_drop_port(__u64 cgid)
{
	struct shk_quota *u = bpf_map_lookup_elem(&shk_quotas, &cgid);

	if (u)
		__sync_fetch_and_add(&u->ports, -1);
}

/* Gives back the socket count of session cgroup cgid. */
static __always_inline void sock_uncount(__u64 cgid)
{
	struct shk_quota *u = bpf_map_lookup_elem(&shk_quotas, &cgid);

	if (u)
		__sync_fetch_and_add(&u->socks, -1);
}
