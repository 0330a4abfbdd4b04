// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Sweep mode: new inbound flows, with no program on the packet path.
 *
 *   sk_lookup            (attached to the agent's network namespace) every
 *                        new inbound flow to a port a session socket holds:
 *                        a SYN (any TCP packet no established socket takes)
 *                        or a datagram no connected UDP socket takes; it is
 *                        admitted by check_inbound (skb.bpf.c) or dropped
 *                        (the peer sees a reset or a port unreachable)
 *   cgroup/post_bind4|6  a session socket's bind takes a hold on its port
 *   sockops              TCP_LISTEN_CB: a listen on an autobound port, same;
 *                        PASSIVE_ESTABLISHED_CB (both modes): an accepted
 *                        connection is marked not counted (quota.bpf.h)
 *   cgroup/sock_release  a session socket's close drops its hold and its
 *                        count (quota.bpf.h) (attached in both modes)
 *   (sendmsg4|6, sock_addr.bpf.c: an unconnected send from an autobound
 *   UDP port takes a hold)
 *
 * Why sk_lookup (chosen over checking SYNs and datagrams in cgroup_skb, or
 * marking decided sockets in socket storage): the kernel runs it only when it
 * looks up a listening TCP socket or an unconnected UDP socket, never for a
 * packet of an established flow, so an open stream pays nothing; it may drop
 * (SK_DROP). What it does not see is the socket that would receive: hence the
 * port holds (ports.bpf.h). Packet mode keeps cgroup_skb/ingress for this.
 *
 * What a session could try, and what answers it:
 *  - listen or receive on a port it never bound: autobind happens in listen
 *    (TCP_LISTEN_CB) or in an unconnected send (sendmsg4|6): both hold.
 *  - share a port with another session (SO_REUSEADDR/SO_REUSEPORT) to be
 *    judged by that session's rules: refused at bind and send.
 *  - close one of two sockets sharing a port to drop the other's check: the
 *    hold is counted per socket.
 *  - open a listener before the hooks were there (an older agent, packet
 *    mode): iter/tcp and iter/udp take its hold when user space attaches
 *    (sweep.bpf.c, shk_hold_tcp|udp).
 * Known limits (the threat model in README): datagrams the kernel delivers
 * without a socket lookup (broadcast, multicast) are not checked; a host
 * socket sharing a session socket's address and port (SO_REUSEADDR or
 * SO_REUSEPORT, or a session socket on the wildcard) is judged by the
 * session's inbound rules; the moment between a bind and its post_bind hook
 * (the kernel hashes the socket first) is not covered; every TCP packet that
 * reaches the listener lookup counts as a new flow (an approve-once grant
 * can be spent by a stray segment). Part of the one object built from
 * shinken.bpf.c.
 */

#include "common.bpf.h"
#include "core.bpf.h"
#include "session.bpf.h"
#include "ports.bpf.h"
#include "events.bpf.h"
#include "quota.bpf.h"

/* A session socket's bind: it holds its port from now on. Refused when
 * another session holds the same address and port (or no hold can be
 * taken). */
static __always_inline int post_bind(struct bpf_sock *sk, int v6)
{
	struct shk_port_key k;
	struct shk_session *s;
	struct shk_sock *st;
	__u64 cgid;
	int r;

	if (shk_flow_mode != SHK_FLOW_SWEEP)
		return 1;
	if ((sk->protocol != IPPROTO_TCP && sk->protocol != IPPROTO_UDP) || !sk->src_port)
		return 1; /* IP_BIND_ADDRESS_NO_PORT: the port comes with connect (or listen) */
	cgid = session_cgroup();
	s = session_of(&cgid);
	if (!s)
		return 1;
	st = bpf_sk_storage_get(&shk_socks, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (st && st->held)
		return 1;
	if (v6)
		ctx_addr6(&k, sk->src_ip6);
	else
		ctx_addr4(&k, sk->src_ip4);
	k.port = sk->src_port;
	k.proto = sk->protocol;
	k.pad = 0;
	r = st ? hold_for(st, &k, cgid, shk_max_ports) : -1;
	if (r == 0)
		return 1;
	report(cgid, s->index, bpf_get_current_pid_tgid() >> 32,
	       r == -2 ? SHK_REASON_PORT_LIMIT : SHK_REASON_NO_INBOUND, AF_INET6, sk->protocol, sk->src_port, k.addr,
	       4, 1);
	return 0;
}

SEC("cgroup/post_bind4")
int shk_post_bind4(struct bpf_sock *sk)
{
	return post_bind(sk, 0);
}

SEC("cgroup/post_bind6")
int shk_post_bind6(struct bpf_sock *sk)
{
	return post_bind(sk, 1);
}

static __always_inline int sock_release(struct bpf_sock *sk, int stored)
{
	struct shk_sock *st;
	__u64 cgid;

	/* Both modes: a hold taken in sweep mode is dropped in packet mode
	 * too, so that an agent returning to sweep mode finds none stale. */
	st = bpf_sk_storage_get(&shk_socks, sk, 0, 0);
	if (st) {
		if (st->held) {
			st->held = 0;
			port_drop(&st->key);
		}
		cgid = st->counted;
		st->counted = 0;
		if (cgid == SHK_NOT_COUNTED)
			return 1; /* an accepted connection */
		if (cgid) {
			sock_uncount(cgid); /* counted in storage (quota.bpf.h) */
			return 1;
		}
	}
	if (stored || !sock_plain_kind(sk))
		return 1;
	cgid = ctx_session_cgroup(sk);
	if (cgid && cgid != SHK_CG_UNREAD)
		sock_uncount(cgid);
	return 1;
}

SEC("cgroup/sock_release")
int shk_sock_release(struct bpf_sock *sk)
{
	return sock_release(sk, 0);
}

/* shk_sock_create_stored's release (sock_addr.bpf.c). */
SEC("cgroup/sock_release")
int shk_sock_release_stored(struct bpf_sock *sk)
{
	return sock_release(sk, 1);
}

/* A connection accepted from a session's listener: the kernel cloned it, no
 * sock_create counted it, so its storage says SHK_NOT_COUNTED before
 * accept() can return it (quota.bpf.h); storage that cannot be made counts
 * it instead, so its release still balances. */
static __always_inline void mark_child(struct bpf_sock *sk)
{
	struct shk_sock *st = bpf_sk_storage_get(&shk_socks, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	struct shk_quota *u;
	struct tcp_sock *tp;
	__u64 cgid;

	if (st) {
		st->counted = SHK_NOT_COUNTED;
		return;
	}
	tp = bpf_skc_to_tcp_sock(sk);
	if (!tp)
		return;
	cgid = kern_session_cgroup((struct sock *)tp);
	u = bpf_map_lookup_elem(&shk_quotas, &cgid);
	if (u)
		__sync_fetch_and_add(&u->socks, 1);
}

/* Both modes: PASSIVE_ESTABLISHED_CB marks an accepted connection (above).
 * Sweep mode: a listen on a port the socket did not bind (the kernel
 * autobinds it in listen) holds the port from now on. sock_ops cannot
 * refuse the listen; a hold that cannot be taken is reported. The hold is
 * counted against the session's port limit but never refused for it: a
 * listener without a hold would be unchecked (sk_lookup passes a port no
 * session holds), so the limit yields here; such ports stay bounded by the
 * socket limit. Every other sock_ops callback (a few per connection, none
 * per packet) returns at once. */
SEC("sockops")
int shk_sockops(struct bpf_sock_ops *ops)
{
	struct shk_port_key k;
	struct shk_session *s;
	struct bpf_sock *sk;
	struct shk_sock *st;
	struct tcp_sock *tp;
	__u64 cgid;
	int r;

	if (ops->op == BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB) {
		sk = ops->sk;
		if (sk)
			mark_child(sk);
		return 1;
	}
	if (ops->op != BPF_SOCK_OPS_TCP_LISTEN_CB || shk_flow_mode != SHK_FLOW_SWEEP)
		return 1;
	sk = ops->sk;
	if (!sk)
		return 1;
	st = bpf_sk_storage_get(&shk_socks, sk, 0, 0);
	if (st && st->held)
		return 1; /* bound: held since its bind */
	tp = bpf_skc_to_tcp_sock(sk);
	if (!tp)
		return 1;
	cgid = kern_session_cgroup((struct sock *)tp);
	s = session_of(&cgid);
	if (!s)
		return 1;
	port_key(&k, ops->family, ops->local_ip4, ops->local_ip6, ops->local_port, IPPROTO_TCP);
	st = bpf_sk_storage_get(&shk_socks, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	r = st ? hold_for(st, &k, cgid, 0) : -1;
	if (r == 0)
		return 1;
	report(cgid, s->index, 0, SHK_REASON_NO_INBOUND, AF_INET6, IPPROTO_TCP, ops->local_port, k.addr, 4, 0);
	return 1;
}

/* A new inbound flow: when a session socket holds its local address and
 * port, that session's inbound rules decide (check_inbound). */
SEC("sk_lookup")
int shk_sk_lookup(struct bpf_sk_lookup *ctx)
{
	struct shk_port_key k;
	struct shk_port *h;
	struct pkt p = {};
	__u32 family = ctx->family;

	if (ctx->protocol != IPPROTO_TCP && ctx->protocol != IPPROTO_UDP)
		return SK_PASS;
	port_key(&k, family, ctx->local_ip4, ctx->local_ip6, ctx->local_port, ctx->protocol);
	h = port_holder(&k, family);
	if (!h)
		return SK_PASS;
	/* The peer, as check_inbound wants it (IPv4 in peer[0]). */
	ctx_addr(&k, family, ctx->remote_ip4, ctx->remote_ip6);
	p.family = family;
	p.proto = ctx->protocol;
	p.local_port = ctx->local_port;
	p.peer_port = bpf_ntohs(ctx->remote_port);
	if (family == AF_INET) {
		p.peer[0] = k.addr[3];
	} else {
		p.peer[0] = k.addr[0];
		p.peer[1] = k.addr[1];
		p.peer[2] = k.addr[2];
		p.peer[3] = k.addr[3];
	}
	return check_inbound(h->cgid, &p) ? SK_PASS : SK_DROP;
}
