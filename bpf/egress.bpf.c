// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

/*
 * Shinken egress enforcement. Attached once, at the sessions' parent cgroup:
 *
 *   cgroup/connect4|6   every TCP connect and UDP connect
 *   cgroup/sendmsg4|6   every unconnected UDP send
 *   cgroup_skb/ingress  every TCP handshake of a session socket: an inbound
 *                       SYN (someone connecting to a session's listener) and
 *                       the SYN-ACK that completes a session's connect must
 *                       be covered by the egress map under a live handle
 *   cgroup/recvmsg4|6   DNS replies (and getpeername4|6 on a DNS socket) show
 *   cgroup/getpeername4|6  the server the session asked
 *
 * Flows already open when their authority dies are cut in one of two ways,
 * chosen at load (shk_flow_mode):
 *
 *   SWEEP   (kernels with the bpf_sock_destroy kfunc) iter/tcp and iter/udp
 *           walk every TCP and UDP socket when user space asks (after each
 *           revoke, at each handle deadline) and destroy each session socket
 *           whose peer no live grant covers any more. No per-packet hook.
 *   PACKET  cgroup_skb/egress checks every active open and data packet, and
 *           ingress every data packet, against the handle the flow was
 *           allowed under (kept per socket cookie in shk_flows).
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
#include <linux/in6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "shinken_api.bpf.h"

#ifndef AF_INET
#define AF_INET 2
#endif
#ifndef AF_INET6
#define AF_INET6 10
#endif
#define SOCK_STREAM 1
#define SOCK_DGRAM 2
#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Level of the session cgroups in the cgroup2 hierarchy (the parent's level
 * plus one). Set by user space before load. */
const volatile __u32 shk_session_level = 0;

/* How open flows are cut when their authority dies (enum shk_flow_mode). Set
 * by user space before load. */
const volatile __u32 shk_flow_mode = SHK_FLOW_SWEEP;

/* Whether cgroup_skb programs may name the sending task (the pid and comm
 * helpers there need Linux 6.x; Debian 12's 6.1 refuses them). Set by user
 * space from a feature probe; when 0 the calls are dead code the verifier
 * never checks, and packet denials carry pid 0 and no comm. */
const volatile __u32 shk_skb_task_info = 0;

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

/* Exact (/32, /128) entries live in hashes, shorter prefixes in the tries:
 * most entries are single addresses (DNS answers), and a hash lookup costs a
 * fraction of a trie walk over a million keys. Same keys and values as the
 * tries (prefixlen 64 / 160). Sized by user space like the tries. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct shk_egress4_key);
	__type(value, struct shk_egress_value);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 1048576);
} shk_exact4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct shk_egress6_key);
	__type(value, struct shk_egress_value);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 1048576);
} shk_exact6 SEC(".maps");

/* Socket cookie -> the handle a flow's packets are checked against (see
 * struct shk_flow). An LRU: records of closed sockets age out without a
 * release hook, and a record evicted from a live flow is rebuilt from the
 * egress map at its next data packet. Sized by user space. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(map_flags, BPF_F_NO_COMMON_LRU);
	__type(key, __u64);
	__type(value, struct shk_flow);
	__uint(max_entries, 262144);
} shk_flows SEC(".maps");

/* The last TCP connect allowed on each CPU (struct shk_lastconn). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct shk_lastconn);
	__uint(max_entries, 1);
} shk_lastconns SEC(".maps");

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
				       int rule_expiry, __u32 best, struct shk_flow *ref)
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
		if (r->expires_ns && rule_expiry && bpf_ktime_get_boot_ns() >= r->expires_ns) {
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

static __always_inline __u32 lookup4(__u32 session, __u32 daddr, __u8 proto, __u16 dport, int rule_expiry,
				     struct shk_flow *ref)
{
	struct shk_egress4_key key = { .prefixlen = 32 + 32, .session = session };
	__u32 best = SHK_REASON_NO_RULE;

	struct shk_egress_value *x;

	__builtin_memcpy(key.addr, &daddr, 4);
	x = bpf_map_lookup_elem(&shk_exact4, &key);
	if (x) {
		best = try_rules(x, proto, dport, rule_expiry, best, ref);
		if (best == SHK_REASON_NONE)
			return best;
	}
	for (int i = 0; i < SHK_MAX_COVER; i++) {
		struct shk_egress_value *v = bpf_map_lookup_elem(&shk_egress4, &key);

		if (!v)
			break;
		best = try_rules(v, proto, dport, rule_expiry, best, ref);
		if (best == SHK_REASON_NONE)
			return best;
		if (v->prefixlen == 0 || v->prefixlen > 32)
			break;
		key.prefixlen = 32 + v->prefixlen - 1;
	}
	return best;
}

static __always_inline __u32 lookup6(__u32 session, const __u32 *daddr, __u8 proto, __u16 dport, int rule_expiry,
				     struct shk_flow *ref)
{
	struct shk_egress6_key key = { .prefixlen = 32 + 128, .session = session };
	__u32 best = SHK_REASON_NO_RULE;

	struct shk_egress_value *x;

	__builtin_memcpy(key.addr, daddr, 16);
	x = bpf_map_lookup_elem(&shk_exact6, &key);
	if (x) {
		best = try_rules(x, proto, dport, rule_expiry, best, ref);
		if (best == SHK_REASON_NONE)
			return best;
	}
	for (int i = 0; i < SHK_MAX_COVER; i++) {
		struct shk_egress_value *v = bpf_map_lookup_elem(&shk_egress6, &key);

		if (!v)
			break;
		best = try_rules(v, proto, dport, rule_expiry, best, ref);
		if (best == SHK_REASON_NONE)
			return best;
		if (v->prefixlen == 0 || v->prefixlen > 128)
			break;
		key.prefixlen = 32 + v->prefixlen - 1;
	}
	return best;
}

/* lookup4 or lookup6, by family (IPv4 in addr[0]). */
static __always_inline __u32 lookup(__u32 session, __u16 family, const __u32 *addr, __u8 proto, __u16 dport,
				    int rule_expiry, struct shk_flow *ref)
{
	if (family == AF_INET)
		return lookup4(session, addr[0], proto, dport, rule_expiry, ref);
	return lookup6(session, addr, proto, dport, rule_expiry, ref);
}

/* Whether a peer is a session resolver's address and port (redirected DNS):
 * traffic a connect hook already re-aimed, never judged by the egress map. */
static __always_inline int resolver_peer(__u16 family, const __u32 *peer, __u16 port)
{
	__u32 zero = 0;
	struct shk_config *cfg;

	if (family != AF_INET || (bpf_ntohl(peer[0]) & 0xff800000) != SHK_DNS_BASE)
		return 0;
	cfg = bpf_map_lookup_elem(&shk_settings, &zero);
	return cfg && cfg->dns_port && port == cfg->dns_port;
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
static __always_inline int own_resolver(__u16 dport)
{
	__u32 zero = 0;
	struct shk_config *cfg = bpf_map_lookup_elem(&shk_settings, &zero);

	if (!cfg || !cfg->dns_port || dport != cfg->dns_port)
		return -1;
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
	__u64 cgid;
	__u32 why, pid;
	__u16 dport, family = v6 ? AF_INET6 : AF_INET;
	__u8 proto = ctx->protocol;
	int mapped = 0;

	cgid = bpf_get_current_ancestor_cgroup_id(shk_session_level);
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
		pid = bpf_get_current_pid_tgid() >> 32;
		report(cgid, 0, pid, SHK_REASON_UNKNOWN_SESSION, family, proto, dport, daddr,
		       family == AF_INET6 ? 4 : 1, 1);
		return 0;
	}

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

	why = lookup(s->index, family, daddr, proto, dport, 1, &ref);
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
 * Sweep mode: a session may create TCP, MPTCP and UDP sockets only. Every
 * other inet socket (raw, ICMP "ping" datagram sockets, UDP-Lite, SCTP) would
 * carry packets that no connect or sendmsg hook checks and that the socket
 * iterators do not see; packet mode drops their packets instead.
 */
SEC("cgroup/sock_create")
int shk_sock_create(struct bpf_sock *sk)
{
	struct shk_session *s;
	__u64 cgid;

	if (shk_flow_mode == SHK_FLOW_PACKET)
		return 1;
	if (sk->type == SOCK_STREAM && (sk->protocol == IPPROTO_TCP || sk->protocol == IPPROTO_MPTCP))
		return 1;
	if (sk->type == SOCK_DGRAM && sk->protocol == IPPROTO_UDP)
		return 1;
	cgid = bpf_get_current_ancestor_cgroup_id(shk_session_level);
	s = bpf_map_lookup_elem(&shk_sessions, &cgid);
	report(cgid, s ? s->index : 0, bpf_get_current_pid_tgid() >> 32, SHK_REASON_UNCHECKED, sk->family,
	       (__u8)sk->protocol, 0, 0, 1, 1);
	return 0;
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

/* What check_skb needs of a packet. */
struct pkt {
	__u32 peer[4];   /* the remote end: destination on egress, source on ingress */
	__u16 peer_port; /* host order */
	__u16 family;
	__u8 proto;
	__u8 syn;        /* TCP SYN without ACK */
	__u8 synack;     /* TCP SYN with ACK */
	__u8 data;       /* carries payload (UDP: always) */
};

/* Parses the IP and TCP/UDP headers. Returns -1 for what cannot be parsed.
 * Reads the headers in place when they are in the linear part of the skb
 * (always, for locally built packets), else copies them out. */
static __always_inline int parse(struct __sk_buff *skb, int egress, struct pkt *p)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	__u8 buf[40 + 14];
	__u8 *hdr = data, *th;
	__u32 l4, plen, need;

	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		if (hdr + 20 > (__u8 *)end) {
			if (bpf_skb_load_bytes(skb, 0, buf, 20))
				return -1;
			hdr = buf;
		}
		l4 = (hdr[0] & 0x0f) * 4;
		if (l4 < 20 || l4 > 40)
			return -1;
		p->family = AF_INET;
		p->proto = hdr[9];
		__builtin_memcpy(&p->peer[0], egress ? &hdr[16] : &hdr[12], 4);
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		if (hdr + 40 > (__u8 *)end) {
			if (bpf_skb_load_bytes(skb, 0, buf, 40))
				return -1;
			hdr = buf;
		}
		p->family = AF_INET6;
		p->proto = hdr[6]; /* extension headers: not TCP/UDP, treated as such */
		__builtin_memcpy(p->peer, egress ? &hdr[24] : &hdr[8], 16);
		l4 = 40;
	} else {
		return -1;
	}
	/* skb->len, not the header's length field: GSO and BIG TCP packets
	 * carry 0 there. cgroup_skb sees the packet from the network header. */
	if (skb->len < l4)
		return -1;
	plen = skb->len - l4;
	if (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP)
		return 0;
	need = p->proto == IPPROTO_TCP ? 14 : 4;
	th = (__u8 *)data + l4;
	if (th + 14 > (__u8 *)end) {
		if (bpf_skb_load_bytes(skb, l4, buf, need))
			return -1;
		th = buf;
	}
	p->peer_port = egress ? ((__u16)th[2] << 8 | th[3]) : ((__u16)th[0] << 8 | th[1]);
	if (p->proto == IPPROTO_TCP) {
		p->syn = (th[13] & 0x02) && !(th[13] & 0x10);
		p->synack = (th[13] & 0x12) == 0x12;
		p->data = plen > (__u32)(th[12] >> 4) * 4;
	} else {
		p->data = 1;
	}
	return 0;
}

static __always_inline int same_peer(const struct shk_flow *f, const struct pkt *p)
{
	return f->peer_family == p->family && f->peer_port == p->peer_port && f->peer[0] == p->peer[0] &&
	       (p->family == AF_INET ||
		(f->peer[1] == p->peer[1] && f->peer[2] == p->peer[2] && f->peer[3] == p->peer[3]));
}

/*
 * Sweep mode, ingress: the two packets that start a TCP flow. An inbound SYN
 * (a peer connecting to a session's listener) must come from a peer the
 * session may reach, or accepted sockets would be an egress channel no
 * connect hook sees. The SYN-ACK completing a session's connect is checked
 * again (handles only): a connect allowed just before a revoke, whose socket
 * a concurrent sweep could not see yet, never becomes established. Every
 * other packet passes; flows are cut by the sweep.
 */
static __always_inline int check_handshake(struct __sk_buff *skb, struct bpf_sock *sk)
{
	struct shk_flow ref = {};
	struct shk_session *s;
	struct pkt p = {};
	__u32 why;
	__u64 cgid;

	if (sk->protocol != IPPROTO_TCP)
		return 1; /* inbound datagrams are not egress; every send is checked */
	if (parse(skb, 0, &p) < 0 || p.proto != IPPROTO_TCP) {
		why = SHK_REASON_UNCHECKED;
		cgid = bpf_skb_ancestor_cgroup_id(skb, shk_session_level);
		goto deny;
	}
	if (!p.syn && !p.synack)
		return 1;
	cgid = bpf_skb_ancestor_cgroup_id(skb, shk_session_level);
	s = bpf_map_lookup_elem(&shk_sessions, &cgid);
	if (!s) {
		why = SHK_REASON_UNKNOWN_SESSION;
		goto deny;
	}
	/* A new inbound flow is bounded by rule deadlines like a connect; the
	 * handshake of a connect already allowed checks handles only. */
	why = lookup(s->index, p.family, p.peer, IPPROTO_TCP, p.peer_port, p.syn, &ref);
	if (why == SHK_REASON_NONE)
		return 1;
	if (resolver_peer(p.family, p.peer, p.peer_port))
		return 1; /* the session's own resolver (redirected DNS over TCP) */
	if (p.synack)
		why = SHK_REASON_FLOW_REVOKED;
	report(cgid, s->index, 0, why, p.family, p.proto, p.peer_port, p.peer, p.family == AF_INET6 ? 4 : 1, 0);
	return 0;
deny:
	s = bpf_map_lookup_elem(&shk_sessions, &cgid);
	report(cgid, s ? s->index : 0, 0, why, p.family, p.proto, p.peer_port, p.peer, p.family == AF_INET6 ? 4 : 1,
	       0);
	return 0;
}

/*
 * Packet mode: every packet of a session socket. Control packets of TCP flows (no payload,
 * no SYN) pass; an active open (SYN) and every data packet must be covered by
 * the egress map under a live handle, checked against the flow's recorded
 * handle once it has one.
 */
static __always_inline int check_skb(struct __sk_buff *skb, int egress)
{
	struct bpf_sock *sk = skb->sk;
	struct shk_flow ref = {}, *f;
	struct shk_session *s;
	struct pkt p = {};
	__u64 cgid, cookie;
	__u32 why, index = 0, zero = 0;

	if (!sk)
		return 1;
	sk = bpf_sk_fullsock(sk);
	if (!sk)
		return 1; /* request and timewait sockets */
	if (shk_flow_mode != SHK_FLOW_PACKET)
		return egress ? 1 : check_handshake(skb, sk);
	if (sk->protocol != IPPROTO_TCP && sk->protocol != IPPROTO_UDP) {
		if (!egress)
			return 1;
		why = SHK_REASON_UNCHECKED; /* raw, ICMP: no connect/sendmsg check covers them */
		goto deny;
	}
	/* Unconnected UDP: every send was checked by sendmsg4|6; inbound
	 * datagrams are not egress. */
	if (sk->protocol == IPPROTO_UDP && sk->state != 1 /* TCP_ESTABLISHED: connected */)
		return 1;
	if (parse(skb, egress, &p) < 0 || p.proto != sk->protocol) {
		why = SHK_REASON_UNCHECKED;
		goto deny;
	}
	if (p.proto == IPPROTO_TCP && !p.data && !(p.syn && egress))
		return 1; /* ACK, FIN, RST, SYN-ACK: no data moves */

	/* Traffic with the session's own resolver (redirected DNS). */
	if (resolver_peer(p.family, p.peer, p.peer_port))
		return 1;

	/* The SYN of the connect the connect hook just allowed on this CPU. */
	if (p.syn && !p.data) {
		struct shk_lastconn *lc = bpf_map_lookup_elem(&shk_lastconns, &zero);

		if (lc && lc->valid && lc->dport == p.peer_port && lc->family == p.family &&
		    lc->daddr[0] == p.peer[0] &&
		    (p.family == AF_INET ||
		     (lc->daddr[1] == p.peer[1] && lc->daddr[2] == p.peer[2] && lc->daddr[3] == p.peer[3])) &&
		    lc->cgroup_id == bpf_skb_ancestor_cgroup_id(skb, shk_session_level)) {
			lc->valid = 0;
			return 1;
		}
	}

	/* An active open carries no data: check it against the map, record
	 * nothing. Data packets use (and build) the flow's record. */
	f = 0;
	cookie = 0;
	if (p.data) {
		cookie = bpf_get_socket_cookie(skb);
		f = bpf_map_lookup_elem(&shk_flows, &cookie);
	}
	/* The handle the flow was allowed under is the fast path. When it has
	 * died, the egress map decides afresh below: a flow lives while some
	 * live grant covers it (a re-grant keeps a reconnected socket going). */
	if (f && f->handle != SHK_HANDLE_NONE && same_peer(f, &p) &&
	    shk_handle_check(f->handle, f->generation) == SHK_REASON_NONE)
		return 1;

	cgid = bpf_skb_ancestor_cgroup_id(skb, shk_session_level);
	s = bpf_map_lookup_elem(&shk_sessions, &cgid);
	if (!s) {
		why = SHK_REASON_UNKNOWN_SESSION;
		goto deny;
	}
	index = s->index;
	/* Rule deadlines (DNS TTLs) bound new connections, not open flows:
	 * only handles are checked here. */
	why = lookup(index, p.family, p.peer, p.proto, p.peer_port, 0, &ref);
	if (why != SHK_REASON_NONE) {
		why = p.syn ? SHK_REASON_UNCHECKED : SHK_REASON_FLOW_REVOKED;
		goto deny;
	}
	if (p.data) {
		/* Remember the verdict for this flow's next packets. */
		if (f) {
			f->handle = ref.handle;
			f->generation = ref.generation;
		} else {
			ref.peer_family = p.family;
			ref.peer_port = p.peer_port;
			__builtin_memcpy(ref.peer, p.peer, 16);
			bpf_map_update_elem(&shk_flows, &cookie, &ref, BPF_ANY);
			return 1;
		}
		f->peer_family = p.family;
		f->peer_port = p.peer_port;
		__builtin_memcpy(f->peer, p.peer, 16);
	}
	return 1;

deny:
	cgid = bpf_skb_ancestor_cgroup_id(skb, shk_session_level);
	if (!index) {
		s = bpf_map_lookup_elem(&shk_sessions, &cgid);
		if (s)
			index = s->index;
	}
	/* Egress packets are built in the sending task's context: name it
	 * (where the kernel lets cgroup_skb do so). Ingress runs in softirq
	 * context, where no task is ours. */
	report(cgid, index, egress && shk_skb_task_info ? bpf_get_current_pid_tgid() >> 32 : 0, why, p.family,
	       p.proto, p.peer_port, p.peer, p.family == AF_INET6 ? 4 : 1, egress && shk_skb_task_info);
	return 0;
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

/*
 * Sweep mode: the socket iterators. The few kernel structures they read are
 * declared here with CO-RE relocations (preserve_access_index), so the loader
 * fits the offsets to the running kernel's BTF.
 */
struct bpf_iter_meta {
	void *seq;
} __attribute__((preserve_access_index));

struct sock_common {
	__be32 skc_daddr;
	__be16 skc_dport;
	unsigned short skc_family;
	volatile unsigned char skc_state;
	struct in6_addr skc_v6_daddr;
} __attribute__((preserve_access_index));

struct kernfs_node {
	__u64 id;
} __attribute__((preserve_access_index));

struct cgroup;

struct cgroup_subsys_state {
	struct cgroup *cgroup;
	struct cgroup_subsys_state *parent;
} __attribute__((preserve_access_index));

struct cgroup {
	struct cgroup_subsys_state self;
	int level;
	struct kernfs_node *kn;
} __attribute__((preserve_access_index));

struct sock_cgroup_data {
	struct cgroup *cgroup;
} __attribute__((preserve_access_index));

struct sock {
	struct sock_common __sk_common;
	__u16 sk_protocol;
	struct sock_cgroup_data sk_cgrp_data;
} __attribute__((preserve_access_index));

struct tcp_sock;
struct udp_sock;

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

#define SHK_TCP_ESTABLISHED 1
#define SHK_TCP_CLOSE 7
#define SHK_TCP_LISTEN 10

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
	__u16 family, dport;
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
	s = bpf_map_lookup_elem(&shk_sessions, &cgid);
	if (!s)
		return 0;

	family = skc->skc_family;
	dport = bpf_ntohs(skc->skc_dport);
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
	why = lookup(s->index, family, peer, proto, dport, 0, &ref);
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
