// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The egress check at connect and send, and which sockets a session may open:
 *
 *   cgroup/connect4|6   every TCP connect and UDP connect
 *   cgroup/sendmsg4|6   every unconnected UDP send (sweep mode: the sending
 *                       socket holds its port, ports.bpf.h)
 *   cgroup/sock_create  the session's socket limit (quota.bpf.h); sweep
 *                       mode: only TCP, MPTCP and UDP sockets
 *
 * A destination is allowed when no forbid names it (the deny table) and the
 * egress map covers it under a live handle (egress_map.bpf.h); a DNS query (port 53) is re-aimed at the session's
 * resolver instead (dns.bpf.h). Part of the one object built from
 * shinken.bpf.c.
 */

#include "common.bpf.h"
#include "session.bpf.h"
#include "handle.bpf.h"
#include "egress_map.bpf.h"
#include "flows.bpf.h"
#include "ports.bpf.h"
#include "dns.bpf.h"
#include "events.bpf.h"

/*
 * An unspecified destination is loopback. The kernel turns 0.0.0.0 (and
 * ::ffff:0.0.0.0) into 127.0.0.1, or into the address the socket is bound
 * to, and :: into ::1 (or ::ffff:127.0.0.1), after these hooks have run:
 * judged as written, a connect to 0.0.0.0:P would pass a 0.0.0.0/0 grant
 * and reach a never-listed listener on 127.0.0.1:P. So the hook rewrites
 * it to 127.0.0.1 (::ffff:127.0.0.1, ::1) before deciding: the address it
 * checks is the one the kernel uses, whatever the socket is bound to (a
 * socket bound to another local address then reaches 127.0.0.1, not that
 * address). daddr is updated the same way (IPv4 in daddr[0]).
 */
static __always_inline void unspecified_to_loopback(struct bpf_sock_addr *ctx, int v6, int mapped, __u32 *daddr)
{
	if (!v6) {
		if (daddr[0] == 0) {
			daddr[0] = bpf_htonl(0x7f000001);
			ctx->user_ip4 = daddr[0];
		}
	} else if (mapped) {
		if (daddr[0] == 0) {
			daddr[0] = bpf_htonl(0x7f000001);
			ctx->user_ip6[3] = daddr[0];
		}
	} else if ((daddr[0] | daddr[1] | daddr[2] | daddr[3]) == 0) {
		daddr[3] = bpf_htonl(1);
		ctx->user_ip6[3] = daddr[3];
	}
}

/*
 * The one decision of every connect and unconnected send. connect says
 * whether to remember the allowing handle on the socket.
 */
static __always_inline int check_sock_addr(struct bpf_sock_addr *ctx, int v6, int connect)
{
	struct shk_flow ref = {};
	struct shk_session *s;
	__u32 daddr[4] = {};
	__u64 cgid;
	__u32 why, pid;
	__u16 dport, family = v6 ? AF_INET6 : AF_INET;
	__u8 proto = ctx->protocol;
	int mapped = 0;

	cgid = session_cgroup();
	dport = bpf_ntohs((__u16)ctx->user_port);
	if (v6) {
		daddr[0] = ctx->user_ip6[0];
		daddr[1] = ctx->user_ip6[1];
		daddr[2] = ctx->user_ip6[2];
		daddr[3] = ctx->user_ip6[3];
		mapped = is_v4mapped(daddr);
		if (mapped) {
			daddr[0] = daddr[3];
			family = AF_INET;
		}
	} else {
		daddr[0] = ctx->user_ip4;
	}

	s = session_of(&cgid);
	if (!s) {
		pid = bpf_get_current_pid_tgid() >> 32;
		report(cgid, 0, pid, SHK_REASON_UNKNOWN_SESSION, family, proto, dport, daddr,
		       family == AF_INET6 ? 4 : 1, 1);
		return 0;
	}
	/* Sweep mode: an unconnected UDP socket that sends can receive; its
	 * port must be held (ports.bpf.h) for sk_lookup to check what comes in. */
	if (shk_flow_mode == SHK_FLOW_SWEEP && !connect && proto == IPPROTO_UDP) {
		int r = hold_sender(ctx->sk, cgid);

		if (r < 0) {
			pid = bpf_get_current_pid_tgid() >> 32;
			report(cgid, s->index, pid, r == -2 ? SHK_REASON_PORT_LIMIT : SHK_REASON_NO_INBOUND, family,
			       proto, dport, daddr, family == AF_INET6 ? 4 : 1, 1);
			return 0;
		}
	}
	unspecified_to_loopback(ctx, v6, mapped, daddr);

	if (proto == IPPROTO_UDP || proto == IPPROTO_TCP) {
		int r = -1;

		if (dport == 53)
			r = redirect_dns(ctx, s->index, v6, connect);
		else if (family == AF_INET && daddr[0] == bpf_htonl(SHK_DNS_BASE + s->index))
			r = own_resolver(dport);
		else if (family == AF_INET && (bpf_ntohl(daddr[0]) & 0xff800000) == SHK_DNS_BASE) {
			/* Another session's resolver address: never, whatever a
			 * broad grant says, so no session can ask as another. */
			pid = bpf_get_current_pid_tgid() >> 32;
			report(cgid, s->index, pid, SHK_REASON_NO_RULE, family, proto, dport, daddr, 1, 1);
			return 0;
		}
		if (r >= 0)
			return r;
	}

	/* The deny table (admin and hard-deny forbids) comes first: no grant
	 * and no never-list exception reaches what a forbid names. Then the
	 * never-list: a 0.0.0.0/0 grant does not reach the metadata service or
	 * the agent's own listeners; only an admin-named exception of this
	 * session does. */
	if (denied(family, daddr, dport))
		why = SHK_REASON_FORBIDDEN;
	else if (never_listed(family, daddr, dport))
		why = never_exception(s->index, family, daddr, dport);
	else
		why = lookup(s->index, family, daddr, proto, dport, 1, SHK_USE_CONSUME, &ref);
	if (why != SHK_REASON_NONE) {
		pid = bpf_get_current_pid_tgid() >> 32;
		report(cgid, s->index, pid, why, family, proto, dport, daddr, family == AF_INET6 ? 4 : 1, 1);
		return 0;
	}
	if (shk_flow_mode == SHK_FLOW_PACKET && connect && proto == IPPROTO_TCP) {
		__u32 zero = 0;
		struct shk_lastconn *lc = bpf_map_lookup_elem(&shk_lastconns, &zero);

		if (lc) {
			lc->cgroup_id = cgid;
			lc->daddr[0] = daddr[0];
			lc->daddr[1] = daddr[1];
			lc->daddr[2] = daddr[2];
			lc->daddr[3] = daddr[3];
			lc->dport = dport;
			lc->family = family;
			lc->valid = 1;
		}
	}
	return 1;
}

SEC("cgroup/connect4")
int shk_connect4(struct bpf_sock_addr *ctx)
{
	return check_sock_addr(ctx, 0, 1);
}

SEC("cgroup/connect6")
int shk_connect6(struct bpf_sock_addr *ctx)
{
	return check_sock_addr(ctx, 1, 1);
}

SEC("cgroup/sendmsg4")
int shk_sendmsg4(struct bpf_sock_addr *ctx)
{
	return check_sock_addr(ctx, 0, 0);
}

SEC("cgroup/sendmsg6")
int shk_sendmsg6(struct bpf_sock_addr *ctx)
{
	return check_sock_addr(ctx, 1, 0);
}

/*
 * Which sockets a session may open. Both modes: each inet socket of a
 * session is counted against its socket limit (quota.bpf.h), to the session
 * of the socket's own cgroup; past it, the socket() call fails with EPERM.
 * A TCP or UDP socket is counted with no per-socket state; any other kind
 * keeps its count in its storage. Sweep mode: a session may create TCP,
 * MPTCP and UDP sockets only. Every other inet socket (raw, ICMP "ping"
 * datagram sockets, UDP-Lite, SCTP) would carry packets that no connect or
 * sendmsg hook checks and that the socket iterators do not see; packet mode
 * drops their packets instead.
 */
static __always_inline int sock_create(struct bpf_sock *sk, int stored)
{
	struct shk_session *s;
	struct shk_sock *st;
	struct shk_quota *u;
	__u64 cgid;

	cgid = stored ? session_cgroup() : ctx_session_cgroup(sk);
	if (shk_flow_mode != SHK_FLOW_PACKET &&
	    !(sk->type == SOCK_STREAM && (sk->protocol == IPPROTO_TCP || sk->protocol == IPPROTO_MPTCP)) &&
	    !(sk->type == SOCK_DGRAM && sk->protocol == IPPROTO_UDP)) {
		s = session_of(&cgid);
		report(cgid, s ? s->index : 0, bpf_get_current_pid_tgid() >> 32, SHK_REASON_UNCHECKED, sk->family,
		       (__u8)sk->protocol, 0, 0, 1, 1);
		return 0;
	}
	/* A session's count entry exists from its first socket until user
	 * space deletes it after the session's processes are killed: found,
	 * it stands for the session lookup. */
	u = bpf_map_lookup_elem(&shk_quotas, &cgid);
	if (!u) {
		if (!session_of(&cgid)) {
			if (cgid != SHK_CG_UNREAD)
				return 1; /* the connect and send hooks refuse what it does */
			report(cgid, 0, bpf_get_current_pid_tgid() >> 32, SHK_REASON_UNKNOWN_SESSION, sk->family,
			       (__u8)sk->protocol, 0, 0, 1, 1);
			return 0;
		}
		u = use_of(cgid);
	}
	if (u && use_take(&u->socks, shk_max_socks) == 0) {
		if (!stored && sock_plain_kind(sk))
			return 1;
		st = bpf_sk_storage_get(&shk_socks, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
		if (st) {
			st->counted = cgid;
			return 1;
		}
		__sync_fetch_and_add(&u->socks, -1);
	}
	s = session_of(&cgid);
	report(cgid, s ? s->index : 0, bpf_get_current_pid_tgid() >> 32, SHK_REASON_SOCKET_LIMIT, sk->family,
	       (__u8)sk->protocol, 0, 0, 1, 1);
	return 0;
}

SEC("cgroup/sock_create")
int shk_sock_create(struct bpf_sock *sk)
{
	return sock_create(sk, 0);
}

/* The fallback where bpf_probe_read_kernel is not available to the loader
 * (quota.bpf.h): every counted socket keeps its count in its storage,
 * counted to the session of the creating task. User space loads it in
 * shk_sock_create's place and reports it. */
SEC("cgroup/sock_create")
int shk_sock_create_stored(struct bpf_sock *sk)
{
	return sock_create(sk, 1);
}
