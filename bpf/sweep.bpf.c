// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Sweep mode: the socket iterators. On kernels with the bpf_sock_destroy
 * kfunc, iter/tcp and iter/udp walk every TCP and UDP socket when user space
 * asks (after a revoke of a handle a flow check tried, flowmark.bpf.h; at
 * each handle deadline) and destroy each session
 * socket whose peer no live grant covers any more (for TCP, an egress grant
 * of the peer's port or an inbound grant of the socket's own port). No per-packet hook. The
 * kernel structures they read are declared in core.bpf.h with CO-RE
 * relocations. The lookup that finds a socket covered marks the handle that
 * covers it (flowmark.bpf.h), so that handle's revoke sweeps in turn. Part
 * of the one object built from shinken.bpf.c.
 */

#include "common.bpf.h"
#include "core.bpf.h"
#include "session.bpf.h"
#include "handle.bpf.h"
#include "egress_map.bpf.h"
#include "dns.bpf.h"
#include "events.bpf.h"
#include "ports.bpf.h"
#include "quota.bpf.h"

/* The iterators' contexts, with CO-RE relocations like core.bpf.h. */
struct bpf_iter_meta {
	void *seq;
} __attribute__((preserve_access_index));

struct bpf_iter__tcp {
	struct bpf_iter_meta *meta;
	struct sock_common *sk_common;
} __attribute__((preserve_access_index));

struct bpf_iter__udp {
	struct bpf_iter_meta *meta;
	struct udp_sock *udp_sk;
} __attribute__((preserve_access_index));

/* Weak: kernels before 6.5 lack it, and the programs must still load there
 * (user space then runs in packet mode and never runs the iterators). */
extern int bpf_sock_destroy(struct sock_common *sk) __ksym __weak;

/*
 * One socket of the host. Destroys it when it belongs to a session, has a
 * peer (connected UDP, or TCP in any state with one), and no live grant covers
 * that peer any more (rule deadlines, the DNS TTLs, bound new connections
 * only: handles are what is checked). Writes the session index of each
 * destroyed socket to the iterator's output.
 */
static __always_inline int sweep(struct bpf_iter_meta *meta, struct sock_common *victim, struct sock *sk,
				 __u8 proto)
{
	struct sock_common *skc = &sk->__sk_common;
	struct shk_flow ref = {};
	struct shk_session *s;
	struct cgroup *cg;
	__u32 peer[4] = {}, why;
	__u16 family, dport, lport;
	__u64 cgid;

	if (proto == IPPROTO_TCP) {
		if (skc->skc_state == SHK_TCP_LISTEN || skc->skc_state == SHK_TCP_CLOSE)
			return 0;
	} else if (skc->skc_state != SHK_TCP_ESTABLISHED || !skc->skc_dport) {
		return 0; /* unconnected: each send is checked by sendmsg4|6 */
	}
	/* The socket's cgroup, or its ancestor at the sessions' level. */
	cg = sk->sk_cgrp_data.cgroup;
	for (int i = 0; i < 16 && cg && cg->level > (int)shk_session_level; i++) {
		struct cgroup_subsys_state *up = cg->self.parent;

		cg = up ? up->cgroup : 0;
	}
	if (!cg || cg->level != (int)shk_session_level)
		return 0;
	cgid = cg->kn->id;
	s = session_of(&cgid);
	if (!s)
		return 0;

	family = skc->skc_family;
	dport = bpf_ntohs(skc->skc_dport);
	lport = skc->skc_num; /* host order */
	if (family == AF_INET) {
		peer[0] = skc->skc_daddr;
	} else if (family == AF_INET6) {
		peer[0] = skc->skc_v6_daddr.in6_u.u6_addr32[0];
		peer[1] = skc->skc_v6_daddr.in6_u.u6_addr32[1];
		peer[2] = skc->skc_v6_daddr.in6_u.u6_addr32[2];
		peer[3] = skc->skc_v6_daddr.in6_u.u6_addr32[3];
		if (is_v4mapped(peer)) {
			peer[0] = peer[3];
			family = AF_INET;
		}
	} else {
		return 0;
	}
	/* A TCP flow may have been accepted under an inbound grant (source
	 * prefix, local port): it lives while an egress or an inbound rule
	 * covers it. Connected UDP is egress only. */
	/* A peer the deny table names is reached by no egress rule: such a
	 * TCP flow lives only under an inbound rule. */
	if (denied(family, peer, dport)) {
		if (proto == IPPROTO_TCP)
			why = lookup_dirs(s->index, family, peer, proto, dport, lport, SHK_DIR_IN, SHK_USE_FLOW, &ref);
		else
			why = SHK_REASON_FORBIDDEN;
	} else if (proto == IPPROTO_TCP)
		why = lookup_dirs(s->index, family, peer, proto, dport, lport, SHK_DIR_OUT | SHK_DIR_IN, SHK_USE_FLOW,
				  &ref);
	else
		why = lookup(s->index, family, peer, proto, dport, 0, SHK_USE_FLOW, &ref);
	if (why == SHK_REASON_NONE || resolver_peer(family, peer, dport))
		return 0; /* covered, or redirected DNS to the session's own resolver */
	if (!bpf_sock_destroy)
		return 0; /* no such kfunc: user space runs packet mode, never this */
	bpf_sock_destroy(victim); /* the iterator's own, trusted pointer */
	report(cgid, s->index, 0, SHK_REASON_FLOW_REVOKED, family, proto, dport, peer, family == AF_INET6 ? 4 : 1, 0);
	bpf_seq_write(meta->seq, &s->index, sizeof(s->index));
	return 0;
}

SEC("iter/tcp")
int shk_sweep_tcp(struct bpf_iter__tcp *ctx)
{
	struct sock_common *skc = ctx->sk_common;
	struct tcp_sock *tp;

	if (!skc)
		return 0;
	tp = bpf_skc_to_tcp_sock(skc);
	if (!tp)
		return 0; /* request and timewait sockets carry no data */
	return sweep(ctx->meta, skc, (struct sock *)tp, IPPROTO_TCP);
}

SEC("iter/udp")
int shk_sweep_udp(struct bpf_iter__udp *ctx)
{
	struct udp_sock *u = ctx->udp_sk;

	if (!u)
		return 0;
	return sweep(ctx->meta, (struct sock_common *)u, (struct sock *)u, IPPROTO_UDP);
}

/*
 * Sweep mode, once when user space attaches the hooks: every session socket
 * already listening (TCP) or bound and unconnected (UDP) takes the hold on
 * its port (ports.bpf.h) that no hook took for it (it was made under an older
 * agent, or in packet mode), so that sk_lookup checks what comes in to it.
 */
static __always_inline int hold_existing(struct sock *sk, __u8 proto)
{
	struct sock_common *skc = &sk->__sk_common;
	struct shk_port_key k = {};
	struct shk_sock *st;
	__u64 cgid;

	if (!skc->skc_num)
		return 0;
	cgid = kern_session_cgroup(sk);
	if (!session_of(&cgid))
		return 0;
	if (skc->skc_family == AF_INET) {
		k.addr[2] = bpf_htonl(0xffff);
		k.addr[3] = skc->skc_rcv_saddr;
	} else if (skc->skc_family == AF_INET6) {
		k.addr[0] = skc->skc_v6_rcv_saddr.in6_u.u6_addr32[0];
		k.addr[1] = skc->skc_v6_rcv_saddr.in6_u.u6_addr32[1];
		k.addr[2] = skc->skc_v6_rcv_saddr.in6_u.u6_addr32[2];
		k.addr[3] = skc->skc_v6_rcv_saddr.in6_u.u6_addr32[3];
	} else {
		return 0;
	}
	k.port = skc->skc_num;
	k.proto = proto;
	st = bpf_sk_storage_get(&shk_socks, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!st || st->held)
		return 0;
	hold_for(st, &k, cgid, 0); /* never refused: the socket exists already */
	return 0;
}

SEC("iter/tcp")
int shk_hold_tcp(struct bpf_iter__tcp *ctx)
{
	struct sock_common *skc = ctx->sk_common;
	struct tcp_sock *tp;

	if (!skc)
		return 0;
	tp = bpf_skc_to_tcp_sock(skc);
	if (!tp || ((struct sock *)tp)->__sk_common.skc_state != SHK_TCP_LISTEN)
		return 0;
	return hold_existing((struct sock *)tp, IPPROTO_TCP);
}

SEC("iter/udp")
int shk_hold_udp(struct bpf_iter__udp *ctx)
{
	struct udp_sock *u = ctx->udp_sk;

	if (!u || ((struct sock *)u)->__sk_common.skc_state == SHK_TCP_ESTABLISHED)
		return 0; /* connected: receives from its checked peer only */
	return hold_existing((struct sock *)u, IPPROTO_UDP);
}

/* An agent taking over from one that kept every socket count in storage
 * (quota.bpf.h): a session TCP socket whose storage says nothing about a
 * count was not counted (an accepted connection, or one made while no hook
 * was attached), so it is marked SHK_NOT_COUNTED before this agent's
 * sock_create, which counts TCP without storage, is attached. Run once, by
 * user space, in both flow modes. */
SEC("iter/tcp")
int shk_mark_uncounted(struct bpf_iter__tcp *ctx)
{
	struct sock_common *skc = ctx->sk_common;
	struct shk_sock *st;
	struct tcp_sock *tp;
	__u64 cgid;

	if (!skc)
		return 0;
	tp = bpf_skc_to_tcp_sock(skc);
	if (!tp)
		return 0;
	cgid = kern_session_cgroup((struct sock *)tp);
	if (!session_of(&cgid))
		return 0;
	st = bpf_sk_storage_get(&shk_socks, tp, 0, 0);
	if (st && st->counted)
		return 0;
	st = bpf_sk_storage_get(&shk_socks, tp, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (st && !st->counted)
		st->counted = SHK_NOT_COUNTED;
	return 0;
}
