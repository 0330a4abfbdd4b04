// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

/*
 * Shinken egress enforcement. Attached once, at the sessions' parent cgroup:
 *
 *   cgroup/connect4|6   every TCP connect and UDP connect
 *   cgroup/sendmsg4|6   every unconnected UDP send
 *   cgroup_skb/egress   every packet of a session socket: flows opened under a
 *   cgroup_skb/ingress  handle that has since died are dropped, and packets no
 *                       connect/sendmsg check covered (raw, ICMP, a SYN whose
 *                       connect was never checked) are dropped
 *   cgroup/sock_release forgets a closed socket's flow
 *   cgroup/recvmsg4|6   DNS replies (and getpeername4|6 on a DNS socket) show
 *   cgroup/getpeername4|6  the server the session asked
 *
 * With DNS redirection on, every UDP/TCP query to port 53 goes to the agent's
 * resolver at the session's own loopback address (SHK_DNS_BASE + index).
 *
 * A destination is allowed when an entry of the session's egress map covers
 * it with a matching protocol and port, the entry has not expired, and the
 * entry's caretaker handle and each of its ancestors is live and unexpired.
 * Everything else is denied: EPERM to the caller, a per-CPU counter per
 * session and reason, and (best effort) an event on the ring buffer.
 */

#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/socket.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "shinken_api.bpf.h"

#ifndef AF_INET
#define AF_INET 2
#endif
#ifndef AF_INET6
#define AF_INET6 10
#endif
#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD

char LICENSE[] SEC("license") = "Dual BSD/GPL";

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

/* Caretaker handles by slot. Sized by user space (max handles). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct shk_handle);
	__uint(max_entries, 262144);
} shk_handles SEC(".maps");

/* (session, IPv4 prefix) -> rules. Sized by user space (max entries). */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct shk_egress4_key);
	__type(value, struct shk_egress_value);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 1048576);
} shk_egress4 SEC(".maps");

/* (session, IPv6 prefix) -> rules. Sized by user space (max entries). */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct shk_egress6_key);
	__type(value, struct shk_egress_value);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 1048576);
} shk_egress6 SEC(".maps");

/* Socket cookie -> the handle a connection was allowed under. Written at
 * connect, deleted at socket release, read for every packet of the flow.
 * Sized by user space (max concurrent session flows); a connect that finds
 * it full is denied. Not preallocated: the kernel's per-CPU element caches
 * hand a closing socket's element to the next connect while it is still hot. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u64);
	__type(value, struct shk_flow);
	__uint(max_entries, 262144);
} shk_flows SEC(".maps");

/* Global configuration, one entry (struct shk_config). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct shk_config);
	__uint(max_entries, 1);
} shk_settings SEC(".maps");

/* Denials per (session index * SHK_NR_REASONS + reason). Sized by user space
 * to max sessions * SHK_NR_REASONS. Never lossy, unlike the ring buffer. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 65536 * SHK_NR_REASONS);
} shk_counters SEC(".maps");

/* Global statistics, enum shk_stat. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, SHK_NR_STATS);
} shk_stats SEC(".maps");

/* Denial events (struct shk_event). Sized by user space (bytes). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} shk_events SEC(".maps");

/* Export the ABI types for bpf2go. */
const struct shk_event *unused_event __attribute__((unused));

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

static __always_inline void count(__u32 session, __u32 reason)
{
	__u32 key = session * SHK_NR_REASONS + reason;
	__u64 *c = bpf_map_lookup_elem(&shk_counters, &key);

	if (c)
		*c += 1;
}

static __always_inline void report(__u64 cgid, __u32 session, __u32 pid, __u32 reason,
				   __u16 family, __u8 proto, __u16 dport, const __u32 *daddr,
				   int nwords, int with_comm)
{
	struct shk_event *e;

	count(session, reason);
	e = bpf_ringbuf_reserve(&shk_events, sizeof(*e), 0);
	if (!e) {
		__u32 key = SHK_STAT_RINGBUF_DROPS;
		__u64 *c = bpf_map_lookup_elem(&shk_stats, &key);

		if (c)
			*c += 1;
		return;
	}
	__builtin_memset(e, 0, sizeof(*e));
	e->ts_ns = bpf_ktime_get_boot_ns();
	e->cgroup_id = cgid;
	e->session = session;
	e->pid = pid;
	e->reason = reason;
	e->family = family;
	e->dport = dport;
	e->proto = proto;
	if (daddr) {
		__u32 *d = (__u32 *)e->daddr;

		d[0] = daddr[0];
		if (nwords == 4) {
			d[1] = daddr[1];
			d[2] = daddr[2];
			d[3] = daddr[3];
		}
	}
	if (with_comm)
		bpf_get_current_comm(e->comm, sizeof(e->comm));
	bpf_ringbuf_submit(e, 0);
}

/*
 * Try the rules of one entry. Returns NONE and fills *ref on a match that is
 * allowed; otherwise the most telling reason seen so far.
 */
static __always_inline __u32 try_rules(const struct shk_egress_value *v, __u8 proto, __u16 dport,
				       __u64 now, __u32 best, struct shk_flow *ref)
{
	for (int i = 0; i < SHK_MAX_RULES; i++) {
		const struct shk_rule *r;
		__u32 why;

		if (i >= v->nrules)
			break;
		r = &v->rules[i];
		if (r->proto && r->proto != proto)
			continue;
		if (!(r->port_lo == 0 && r->port_hi == 0) && (dport < r->port_lo || dport > r->port_hi))
			continue;
		if (r->expires_ns && now >= r->expires_ns) {
			if (best == SHK_REASON_NO_RULE)
				best = SHK_REASON_RULE_EXPIRED;
			continue;
		}
		why = shk_handle_check(r->handle, r->generation);
		if (why == SHK_REASON_NONE) {
			ref->handle = r->handle;
			ref->generation = r->generation;
			return SHK_REASON_NONE;
		}
		best = why;
	}
	return best;
}

static __always_inline __u32 lookup4(__u32 session, __u32 daddr, __u8 proto, __u16 dport, __u64 now,
				     struct shk_flow *ref)
{
	struct shk_egress4_key key = { .prefixlen = 32 + 32, .session = session };
	__u32 best = SHK_REASON_NO_RULE;

	__builtin_memcpy(key.addr, &daddr, 4);
	for (int i = 0; i < SHK_MAX_COVER; i++) {
		struct shk_egress_value *v = bpf_map_lookup_elem(&shk_egress4, &key);

		if (!v)
			break;
		best = try_rules(v, proto, dport, now, best, ref);
		if (best == SHK_REASON_NONE)
			return best;
		if (v->prefixlen == 0 || v->prefixlen > 32)
			break;
		key.prefixlen = 32 + v->prefixlen - 1;
	}
	return best;
}

static __always_inline __u32 lookup6(__u32 session, const __u32 *daddr, __u8 proto, __u16 dport, __u64 now,
				     struct shk_flow *ref)
{
	struct shk_egress6_key key = { .prefixlen = 32 + 128, .session = session };
	__u32 best = SHK_REASON_NO_RULE;

	__builtin_memcpy(key.addr, daddr, 16);
	for (int i = 0; i < SHK_MAX_COVER; i++) {
		struct shk_egress_value *v = bpf_map_lookup_elem(&shk_egress6, &key);

		if (!v)
			break;
		best = try_rules(v, proto, dport, now, best, ref);
		if (best == SHK_REASON_NONE)
			return best;
		if (v->prefixlen == 0 || v->prefixlen > 128)
			break;
		key.prefixlen = 32 + v->prefixlen - 1;
	}
	return best;
}

static __always_inline int is_v4mapped(const __u32 *a)
{
	return a[0] == 0 && a[1] == 0 && a[2] == bpf_htonl(0x0000ffff);
}

/*
 * Every DNS query of a session, to any address on port 53, goes to the
 * agent's resolver at the session's own loopback address, so the resolver
 * knows which session asks without trusting anything the session sends.
 * Returns -1 when redirection is off (DNS is then ordinary egress), else the
 * verdict.
 */
static __always_inline int redirect_dns(struct bpf_sock_addr *ctx, __u32 index, int v6, int connect)
{
	__u32 zero = 0;
	struct shk_config *cfg = bpf_map_lookup_elem(&shk_settings, &zero);
	struct shk_flow *f, nf = {};
	__u64 cookie;
	__u32 ip;

	if (!cfg || !cfg->dns_port)
		return -1;
	/* An unconnected IPv6 send cannot be re-aimed at the IPv4 resolver
	 * (the kernel has passed its v4-mapped branch by now): refuse it.
	 * Connected IPv6 sockets (glibc's resolver connects) do reach it. */
	if (v6 && !connect)
		return 0;
	cookie = bpf_get_socket_cookie(ctx);
	f = bpf_map_lookup_elem(&shk_flows, &cookie);
	if (!f) {
		/* Not yet known: insert, then work on the map's copy. */
		if (bpf_map_update_elem(&shk_flows, &cookie, &nf, BPF_NOEXIST) &&
		    !bpf_map_lookup_elem(&shk_flows, &cookie))
			return 0; /* no room to restore the reply's source: fail closed */
		f = bpf_map_lookup_elem(&shk_flows, &cookie);
		if (!f)
			return 0;
	}
	if (connect) {
		/* The socket now talks to the resolver only. */
		f->handle = SHK_HANDLE_NONE;
		f->generation = SHK_FLOW_DNS_GENERATION;
	}
	f->dns_port = (__u16)ctx->user_port;
	if (v6) {
		f->dns_family = AF_INET6;
		f->dns_addr[0] = ctx->user_ip6[0];
		f->dns_addr[1] = ctx->user_ip6[1];
		f->dns_addr[2] = ctx->user_ip6[2];
		f->dns_addr[3] = ctx->user_ip6[3];
	} else {
		f->dns_family = AF_INET;
		f->dns_addr[0] = ctx->user_ip4;
	}
	ip = bpf_htonl(SHK_DNS_BASE + index);
	if (v6) {
		/* v4-mapped: dual-stack sockets reach the IPv4 resolver; a
		 * V6ONLY socket cannot, and its DNS fails closed. */
		ctx->user_ip6[0] = 0;
		ctx->user_ip6[1] = 0;
		ctx->user_ip6[2] = bpf_htonl(0x0000ffff);
		ctx->user_ip6[3] = ip;
	} else {
		ctx->user_ip4 = ip;
	}
	ctx->user_port = bpf_htons(cfg->dns_port);
	return 1;
}

/*
 * A send aimed at the session's own resolver address and port is a query that
 * was already redirected (an IPv6 socket's v4-mapped send re-enters the IPv4
 * hook) or one made there directly: let it through.
 */
static __always_inline int own_resolver(struct bpf_sock_addr *ctx, __u16 dport, int connect)
{
	__u32 zero = 0;
	struct shk_config *cfg = bpf_map_lookup_elem(&shk_settings, &zero);

	if (!cfg || !cfg->dns_port || dport != cfg->dns_port)
		return -1;
	if (connect) {
		__u64 cookie = bpf_get_socket_cookie(ctx);
		struct shk_flow *f = bpf_map_lookup_elem(&shk_flows, &cookie);
		struct shk_flow nf = { .handle = SHK_HANDLE_NONE, .generation = SHK_FLOW_DNS_GENERATION };

		if (f) {
			f->handle = SHK_HANDLE_NONE;
			f->generation = SHK_FLOW_DNS_GENERATION;
		} else if (bpf_map_update_elem(&shk_flows, &cookie, &nf, BPF_ANY)) {
			return 0;
		}
	}
	return 1;
}

/* Replies from the resolver show the address the session sent its query to. */
static __always_inline int restore_dns(struct bpf_sock_addr *ctx, int v6)
{
	__u32 zero = 0;
	struct shk_config *cfg = bpf_map_lookup_elem(&shk_settings, &zero);
	struct shk_flow *orig;
	__u64 cookie;
	__u32 ip;

	if (!cfg || !cfg->dns_port || ctx->user_port != bpf_htons(cfg->dns_port))
		return 1;
	ip = v6 ? ctx->user_ip6[3] : ctx->user_ip4;
	if ((bpf_ntohl(ip) & 0xff800000) != SHK_DNS_BASE)
		return 1;
	if (v6 && (ctx->user_ip6[0] || ctx->user_ip6[1] || ctx->user_ip6[2] != bpf_htonl(0x0000ffff)))
		return 1;
	cookie = bpf_get_socket_cookie(ctx);
	orig = bpf_map_lookup_elem(&shk_flows, &cookie);
	if (!orig)
		return 1;
	if (v6) {
		if (orig->dns_family != AF_INET6)
			return 1;
		ctx->user_ip6[0] = orig->dns_addr[0];
		ctx->user_ip6[1] = orig->dns_addr[1];
		ctx->user_ip6[2] = orig->dns_addr[2];
		ctx->user_ip6[3] = orig->dns_addr[3];
	} else {
		if (orig->dns_family != AF_INET)
			return 1;
		ctx->user_ip4 = orig->dns_addr[0];
	}
	ctx->user_port = orig->dns_port;
	return 1;
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
	__u64 cgid, now;
	__u32 why, pid;
	__u16 dport, family = v6 ? AF_INET6 : AF_INET;
	__u8 proto = ctx->protocol;
	int mapped = 0;

	cgid = bpf_get_current_ancestor_cgroup_id(shk_session_level);
	pid = bpf_get_current_pid_tgid() >> 32;
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

	s = bpf_map_lookup_elem(&shk_sessions, &cgid);
	if (!s) {
		report(cgid, 0, pid, SHK_REASON_UNKNOWN_SESSION, family, proto, dport, daddr,
		       family == AF_INET6 ? 4 : 1, 1);
		return 0;
	}

	if (proto == IPPROTO_UDP || proto == IPPROTO_TCP) {
		int r = -1;

		if (dport == 53)
			r = redirect_dns(ctx, s->index, v6, connect);
		else if (family == AF_INET && daddr[0] == bpf_htonl(SHK_DNS_BASE + s->index))
			r = own_resolver(ctx, dport, connect);
		if (r >= 0)
			return r;
	}

	now = bpf_ktime_get_boot_ns();
	if (family == AF_INET)
		why = lookup4(s->index, daddr[0], proto, dport, now, &ref);
	else
		why = lookup6(s->index, daddr, proto, dport, now, &ref);
	if (why != SHK_REASON_NONE) {
		report(cgid, s->index, pid, why, family, proto, dport, daddr, family == AF_INET6 ? 4 : 1, 1);
		return 0;
	}

	if (connect) {
		__u64 cookie = bpf_get_socket_cookie(ctx);

		ref.pid = pid; /* a new destination: any DNS memory of the socket is void */
		/* No place to remember the handle: the flow could not be cut
		 * on revoke, so it is not allowed to start. */
		if (bpf_map_update_elem(&shk_flows, &cookie, &ref, BPF_ANY)) {
			report(cgid, s->index, pid, SHK_REASON_UNCHECKED, family, proto, dport, daddr,
			       family == AF_INET6 ? 4 : 1, 1);
			return 0;
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

SEC("cgroup/recvmsg4")
int shk_recvmsg4(struct bpf_sock_addr *ctx)
{
	return restore_dns(ctx, 0);
}

SEC("cgroup/recvmsg6")
int shk_recvmsg6(struct bpf_sock_addr *ctx)
{
	return restore_dns(ctx, 1);
}

SEC("cgroup/getpeername4")
int shk_getpeername4(struct bpf_sock_addr *ctx)
{
	return restore_dns(ctx, 0);
}

SEC("cgroup/getpeername6")
int shk_getpeername6(struct bpf_sock_addr *ctx)
{
	return restore_dns(ctx, 1);
}

/* Is the packet a TCP SYN without ACK (an active open)? */
static __always_inline int is_syn(struct __sk_buff *skb)
{
	__u8 flags = 0;
	__u32 off;

	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		__u8 vihl, proto;

		if (bpf_skb_load_bytes(skb, 0, &vihl, 1) || bpf_skb_load_bytes(skb, 9, &proto, 1))
			return 1;
		if (proto != IPPROTO_TCP)
			return 1;
		off = (vihl & 0x0f) * 4;
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		__u8 nexthdr;

		if (bpf_skb_load_bytes(skb, 6, &nexthdr, 1))
			return 1;
		if (nexthdr != IPPROTO_TCP)
			return 1; /* extension headers on a session SYN: treat as unchecked */
		off = 40;
	} else {
		return 1;
	}
	if (bpf_skb_load_bytes(skb, off + 13, &flags, 1))
		return 1;
	return (flags & 0x02) && !(flags & 0x10);
}

static __always_inline int check_skb(struct __sk_buff *skb, int egress)
{
	struct bpf_sock *sk = skb->sk;
	struct shk_flow *st;
	struct shk_session *s;
	__u64 cgid, cookie;
	__u32 why, index = 0;

	if (!sk)
		return 1;
	sk = bpf_sk_fullsock(sk);
	if (!sk)
		return 1; /* request and timewait sockets of accepted/closed flows */

	cookie = bpf_get_socket_cookie(skb);
	st = bpf_map_lookup_elem(&shk_flows, &cookie);
	if (st && st->handle == SHK_HANDLE_NONE) {
		if (st->generation == SHK_FLOW_DNS_GENERATION)
			return 1; /* a DNS query redirected to the resolver */
		st = 0; /* only DNS memory, no connect-time verdict */
	}
	if (st) {
		why = shk_handle_check(st->handle, st->generation);
		if (why == SHK_REASON_NONE)
			return 1;
		cgid = bpf_skb_ancestor_cgroup_id(skb, shk_session_level);
		s = bpf_map_lookup_elem(&shk_sessions, &cgid);
		if (s)
			index = s->index;
		if (!st->reported) {
			__u32 daddr[4] = {};
			__u16 family = sk->family;

			if (family == AF_INET6) {
				daddr[0] = sk->dst_ip6[0];
				daddr[1] = sk->dst_ip6[1];
				daddr[2] = sk->dst_ip6[2];
				daddr[3] = sk->dst_ip6[3];
				if (is_v4mapped(daddr)) {
					daddr[0] = daddr[3];
					family = AF_INET;
				}
			} else {
				daddr[0] = sk->dst_ip4;
			}
			st->reported = 1;
			report(cgid, index, st->pid, SHK_REASON_FLOW_REVOKED, family, sk->protocol,
			       bpf_ntohs(sk->dst_port), daddr, family == AF_INET6 ? 4 : 1, 0);
		} else {
			count(index, SHK_REASON_FLOW_REVOKED);
		}
		return 0;
	}

	/* No connect-time verdict on this socket. */
	if (sk->protocol == IPPROTO_UDP)
		return 1; /* unconnected sends are checked per call by sendmsg4/6 */
	if (sk->protocol == IPPROTO_TCP && (!egress || !is_syn(skb)))
		return 1; /* accepted flows; an active open always has storage */
	if (!egress && sk->protocol != IPPROTO_TCP)
		return 1; /* inbound datagrams are not egress */

	cgid = bpf_skb_ancestor_cgroup_id(skb, shk_session_level);
	s = bpf_map_lookup_elem(&shk_sessions, &cgid);
	if (s)
		index = s->index;
	count(index, SHK_REASON_UNCHECKED);
	return 0;
}

/* The socket is gone: forget its flow. */
SEC("cgroup/sock_release")
int shk_sock_release(struct bpf_sock *ctx)
{
	__u64 cookie = bpf_get_socket_cookie(ctx);

	bpf_map_delete_elem(&shk_flows, &cookie);
	return 1;
}

SEC("cgroup_skb/egress")
int shk_skb_egress(struct __sk_buff *skb)
{
	return check_skb(skb, 1);
}

SEC("cgroup_skb/ingress")
int shk_skb_ingress(struct __sk_buff *skb)
{
	return check_skb(skb, 0);
}
