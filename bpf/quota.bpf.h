/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The host's shared socket resources, per session: how many inet sockets a
 * session may have open (counted at cgroup/sock_create, dropped at
 * cgroup/sock_release) and how many port holds its sockets may have
 * (ports.bpf.h: one per bound or listening or sending socket), so that one
 * session cannot take the host's sockets or its local port range.
 *
 * A socket is counted to the session of the cgroup it was created in, for
 * as long as it lives, wherever its descriptor goes: cgroup/sock_create adds
 * one to the session of the socket's own cgroup (sk->sk_cgrp_data, which the
 * kernel sets from the creating task and keeps for the socket's life), and
 * cgroup/sock_release takes one from the session of that same cgroup, read
 * from the socket, never from the task that closes it (SCM_RIGHTS to another
 * session or to the host, or a task moved to another cgroup, changes
 * nothing). The common socket (TCP or UDP) keeps no per-socket state for
 * it: creating socket storage cost more than the rest of sock_create.
 *
 * So the exceptions are marked instead: every socket that reaches
 * sock_release without having passed sock_create must not un-count.
 *  - a connection accepted from a listener (the kernel clones it, no
 *    sock_create; the clone carries the listener's cgroup): sockops
 *    PASSIVE_ESTABLISHED_CB, which the kernel runs for each such child
 *    before accept() can return it, gives it storage saying SHK_NOT_COUNTED;
 *    if that storage cannot be made, the child is counted there instead, so
 *    its release still balances (a child never accepted is freed without
 *    sock_release: that costs its session one count until the session ends,
 *    never a count it did not pay for). Children never accepted get no
 *    sock_release and need nothing.
 *  - every other kind of inet socket (MPTCP, whose accepted sockets are
 *    clones sockops never sees; SCTP, whose accept makes a socket without
 *    sock_create; raw, ICMP, UDP-Lite in packet mode): counted in its
 *    storage as before (st->counted), and only such storage un-counts it.
 *  - a socket counted by an older agent (storage counted for every socket):
 *    its storage says so and is honoured, exactly once; and every session
 *    TCP socket whose storage says nothing was not counted by that agent
 *    (an accepted connection): shk_mark_uncounted (sweep.bpf.c) marks it
 *    SHK_NOT_COUNTED when this agent takes over, before its sock_create is
 *    attached.
 * A socket made before the creating task joined the session carries the
 * cgroup it was made in: its release un-counts there, never here. A socket
 * made in a session cgroup while no hook was attached (none of this
 * agent's: links are pinned and stay attached across restarts; only a
 * first install over live sessions) was never counted and un-counts at its
 * release: at most one extra socket per such socket. Every socket family
 * cgroup/sock_create does not run for (AF_UNIX, AF_NETLINK, socketpair) is
 * bounded by RLIMIT_NOFILE and the session's process bound only.
 *
 * Taking is lock-free: add one, and if the old count was already at the
 * limit, take it back and refuse. A release racing a create can make that
 * create fail at the limit; the count never passes it.
 */
#pragma once

#include "common.bpf.h"
#include "core.bpf.h"
#include "session.bpf.h"

/* The limits, set by user space before load; 0 = no limit. */
const volatile __u32 shk_max_socks = 0;
const volatile __u32 shk_max_ports = 0;

/* st->counted of a socket the kernel cloned (an accepted connection): not
 * counted, never un-counted. No cgroup id is all ones. */
#define SHK_NOT_COUNTED (~0ULL)

/* ctx_session_cgroup's answer when the socket's cgroup could not be read. */
#define SHK_CG_UNREAD (~0ULL - 1)

/* Whether sock_create counts a socket of this kind without storage: TCP and
 * UDP, whose only sockets that reach sock_release without sock_create are
 * TCP's accepted children (marked SHK_NOT_COUNTED). */
#define sock_plain_kind(sk)                                                        \
	(((sk)->type == SOCK_STREAM && (sk)->protocol == IPPROTO_TCP) ||           \
	 ((sk)->type == SOCK_DGRAM && (sk)->protocol == IPPROTO_UDP))

/* Made (and pinned) by an agent that counts sockets without storage; its
 * absence beside pinned maps an agent adopts says the agent before kept
 * every count in storage (dataplane/quota_linux.go: shk_mark_uncounted,
 * sweep.bpf.c, then marks what that agent did not count). Holds nothing. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1);
} shk_sockcount SEC(".maps");

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

/*
 * bpf_cast_to_kern_ctx (Linux 6.2+): the program's context as the kernel's
 * own struct (for a cgroup/sock program its struct sock), a BTF pointer the
 * verifier lets the program read with plain loads. Weak: where the kernel
 * lacks it (Debian 12's 6.1) the loader (cilium/ebpf) makes its address 0,
 * and the verifier drops the branch that would call it.
 */
extern void *bpf_cast_to_kern_ctx(void *obj) __ksym __weak;

/* Whether the running kernel has the weak kfunc sym: libbpf 1.2's
 * bpf_ksym_exists, which Debian 12's libbpf 1.1 does not have. */
#define shk_ksym_exists(sym) (!!(sym))

/* How many levels below the sessions' level kern_session_cgroup walks up
 * (a session's run cgroups are one level below it). */
#define SHK_CG_DEPTH 16

/* The session cgroup of a socket the program holds as a kernel BTF pointer
 * (what bpf_cast_to_kern_ctx, bpf_skc_to_tcp_sock and the socket
 * iterators give), by plain loads: the socket's cgroup, then its parents
 * up to the sessions' level (the verifier allows no variable index into
 * cgroup->ancestors through such a pointer, so the parents are walked).
 * 0 for a socket made outside the sessions; SHK_CG_UNREAD for one made
 * deeper than SHK_CG_DEPTH below a session's cgroup (no session has it:
 * session_of and the quota table find nothing), which sock_create refuses
 * and sock_release never un-counts. In sock_create and sock_release about
 * 100 ns less per sock_create and sock_release than the helper calls
 * (bench/README.md, issue 21). */
static __always_inline __u64 kern_session_cgroup(struct sock *sk)
{
	struct cgroup *cg = sk->sk_cgrp_data.cgroup;
	struct kernfs_node *kn;

	if (!cg)
		return SHK_CG_UNREAD;
	if (cg->level < (int)shk_session_level)
		return 0;
	for (int i = 0; i < SHK_CG_DEPTH && cg && cg->level > (int)shk_session_level; i++) {
		struct cgroup_subsys_state *up = cg->self.parent;

		cg = up ? up->cgroup : 0;
	}
	if (!cg || cg->level != (int)shk_session_level)
		return SHK_CG_UNREAD;
	kn = cg->kn;
	if (!kn)
		return SHK_CG_UNREAD;
	return kn->id;
}

/*
 * The session cgroup of the socket of a cgroup/sock program (its context is
 * the kernel's struct sock): the ancestor at the sessions' level of the
 * cgroup the socket was created in, 0 (a socket made outside the sessions),
 * or SHK_CG_UNREAD when a read failed (never seen: the socket and its
 * cgroups are live kernel memory; sock_create refuses such a socket rather
 * than let it go uncounted). Where the kernel has bpf_cast_to_kern_ctx, by
 * plain loads (kern_session_cgroup); otherwise read with
 * bpf_probe_read_kernel (in bpf_base_func_proto for a loader with
 * CAP_PERFMON or CAP_SYS_ADMIN and no lockdown of kernel reads): these
 * programs get neither a BTF pointer to their socket on Linux 6.1 nor a
 * helper that names the socket's cgroup. The socket holds a reference on
 * its cgroup, and a cgroup on its ancestors, for the socket's life.
 */
static __always_inline __u64 probe_session_cgroup(struct sock *sk)
{
	struct kernfs_node *kn = 0;
	struct cgroup *cg = 0;
	int level = -1;
	__u64 id = 0;

	if (bpf_probe_read_kernel(&cg, sizeof(cg), &sk->sk_cgrp_data.cgroup) || !cg)
		return SHK_CG_UNREAD;
	if (bpf_probe_read_kernel(&level, sizeof(level), &cg->level))
		return SHK_CG_UNREAD;
	if (level < (int)shk_session_level)
		return 0;
	if (level > (int)shk_session_level &&
	    (bpf_probe_read_kernel(&cg, sizeof(cg), &cg->ancestors[shk_session_level]) || !cg))
		return SHK_CG_UNREAD;
	if (bpf_probe_read_kernel(&kn, sizeof(kn), &cg->kn) || !kn)
		return SHK_CG_UNREAD;
	if (bpf_probe_read_kernel(&id, sizeof(id), &kn->id))
		return SHK_CG_UNREAD;
	return id;
}

static __always_inline __u64 ctx_session_cgroup(struct bpf_sock *ctx)
{
	if (shk_ksym_exists(bpf_cast_to_kern_ctx))
		return kern_session_cgroup(bpf_cast_to_kern_ctx(ctx));
	return probe_session_cgroup((struct sock *)ctx);
}
