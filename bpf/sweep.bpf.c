// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Sweep mode: the socket iterators. On kernels with the bpf_sock_destroy
 * kfunc, iter/tcp and iter/udp walk every TCP and UDP socket when user space
 * asks (after each revoke, at each handle deadline) and destroy each session
 * socket whose peer no live grant covers any more (for TCP, an egress grant
 * of the peer's port or an inbound grant of the socket's own port). No per-packet hook. The
 * kernel structures they read are declared in core.bpf.h with CO-RE
 * relocations. Part of the one object built from shinken.bpf.c.
 */

#include "common.bpf.h"
#include "core.bpf.h"
#include "session.bpf.h"
#include "handle.bpf.h"
#include "egress_map.bpf.h"
#include "dns.bpf.h"
#include "events.bpf.h"

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
