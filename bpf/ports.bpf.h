/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Sweep mode: which local ports session sockets hold, so that the sk_lookup
 * program (inbound.bpf.c), which sees a new inbound flow's addresses and
 * ports but not the socket the kernel will pick, knows whose inbound rules
 * decide it.
 *
 * shk_ports maps (protocol, local address, local port) to the session cgroup
 * holding it and how many of its sockets do. The address is the one the
 * socket is bound to, IPv4 as v4-mapped IPv6, the unspecified address for
 * a wildcard bind (::ffff:0.0.0.0 for IPv4, :: for IPv6). A socket holds
 * its entry from its bind (cgroup/post_bind4|6), its listen on an autobound
 * port (sock_ops TCP_LISTEN_CB) or its first unconnected send from an
 * autobound port (sendmsg4|6), until it is released (cgroup/sock_release);
 * shk_socks remembers, per socket, the entry it holds.
 *
 * An entry is shared by the sockets of one session only: a session socket
 * binding what another session holds is refused. Taking and dropping a hold
 * are lock-free: refs > 0 is held, and the socket that drops the last hold
 * marks the entry dying (-1) before it deletes it, so that no hold is ever
 * taken on an entry about to go.
 */
#pragma once

#include "common.bpf.h"
#include "quota.bpf.h"

/* Reads a context field as a value the compiler cannot re-derive: clang
 * otherwise selects between &ctx->x_ip4 and &ctx->x_ip6[0] and loads through
 * the result, a modified context pointer the verifier refuses. */
#define ctx_u32(x)                                  \
	({                                          \
		__u32 __v = (x);                    \
		asm volatile("" : "+r"(__v));       \
		__v;                                \
	})

/* The address of a socket or flow end, (family, ip4, ip6[4]) of a context,
 * as a port key's address. */
#define ctx_addr(k, fam, ip4, ip6)                                               \
	do {                                                                     \
		__u32 __a4 = ctx_u32(ip4), __a0 = ctx_u32((ip6)[0]), __a1 = ctx_u32((ip6)[1]), \
		      __a2 = ctx_u32((ip6)[2]), __a3 = ctx_u32((ip6)[3]);      \
		if ((fam) == AF_INET) {                                          \
			(k)->addr[0] = 0;                                        \
			(k)->addr[1] = 0;                                        \
			(k)->addr[2] = bpf_htonl(0xffff);                        \
			(k)->addr[3] = __a4;                                     \
		} else {                                                         \
			(k)->addr[0] = __a0;                                     \
			(k)->addr[1] = __a1;                                     \
			(k)->addr[2] = __a2;                                     \
			(k)->addr[3] = __a3;                                     \
		}                                                                \
	} while (0)

struct shk_port_key {
	__u32 addr[4]; /* network order; IPv4 as ::ffff:a.b.c.d */
	__u16 port;    /* host order */
	__u8 proto;
	__u8 pad;
};

struct shk_port {
	__u64 cgid; /* the session cgroup holding it */
	__s32 refs; /* sockets holding it; 0 or -1: being deleted */
	__u32 pad;
};

/* Sized by user space (four per session, at least 65536); allocated as
 * holds are taken, not up front. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct shk_port_key);
	__type(value, struct shk_port);
	__uint(max_entries, 65536);
} shk_ports SEC(".maps");

/* Holds per (protocol, port) whatever the address: sk_lookup's first test,
 * one array read, so that a new flow to a port no session socket holds (the
 * host's own traffic) costs no hash lookup. Index: port, plus 65536 for UDP.
 * Raised before a hold is taken, lowered after it is dropped: never below
 * the holds in shk_ports. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __s32);
	__uint(max_entries, 2 * 65536);
} shk_port_used SEC(".maps");

static __always_inline __s32 *port_used(__u16 port, __u8 proto)
{
	__u32 i = (__u32)port + (proto == IPPROTO_UDP ? 65536 : 0);

	return bpf_map_lookup_elem(&shk_port_used, &i);
}

/* What a socket holds in shk_ports. Never BPF_F_CLONE: a connection
 * accepted from a listener would inherit the listener's hold and drop it
 * when it closes, leaving the listener unchecked. */
struct shk_sock {
	struct shk_port_key key;
	__u32 held;
	__u64 counted; /* the session cgroup it is counted to (quota.bpf.h), 0 = none */
};

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct shk_sock);
} shk_socks SEC(".maps");

/* The same from the one address field a context lets a program read
 * (post_bind4 has only src_ip4, post_bind6 only src_ip6). */
#define ctx_addr4(k, ip4)                                \
	do {                                             \
		(k)->addr[0] = 0;                        \
		(k)->addr[1] = 0;                        \
		(k)->addr[2] = bpf_htonl(0xffff);        \
		(k)->addr[3] = (ip4);                    \
	} while (0)
#define ctx_addr6(k, ip6)                                \
	do {                                             \
		(k)->addr[0] = ctx_u32((ip6)[0]);        \
		(k)->addr[1] = ctx_u32((ip6)[1]);        \
		(k)->addr[2] = ctx_u32((ip6)[2]);        \
		(k)->addr[3] = ctx_u32((ip6)[3]);        \
	} while (0)

/* The key of a socket bound to (family, ip4 | ip6, port), read from a
 * context (struct bpf_sock, bpf_sock_ops, bpf_sk_lookup). */
#define port_key(k, fam, ip4, ip6, prt, prot)     \
	do {                                      \
		ctx_addr(k, fam, ip4, ip6);       \
		(k)->port = (prt);                \
		(k)->proto = (prot);              \
		(k)->pad = 0;                     \
	} while (0)

/* port_hold's entry in shk_ports. */
static __always_inline int port_take(const struct shk_port_key *k, __u64 cgid)
{
	for (int i = 0; i < 4; i++) {
		struct shk_port *v = bpf_map_lookup_elem(&shk_ports, k);

		if (v) {
			__s32 old = v->refs;

			if (old <= 0)
				continue; /* dying: its holder is deleting it */
			if (v->cgid != cgid)
				return -1;
			if (__sync_val_compare_and_swap(&v->refs, old, old + 1) == old)
				return 0;
		} else {
			struct shk_port n = {.cgid = cgid, .refs = 1};

			if (bpf_map_update_elem(&shk_ports, k, &n, BPF_NOEXIST) == 0)
				return 0;
		}
	}
	return -1;
}

/* Takes a hold on k for session cgroup cgid, counted against limit max (0:
 * counted, never refused). Returns 0; -2 when the session has max holds
 * already (quota.bpf.h); -1 when another session holds it or no hold could
 * be taken (the map is full, or the entry kept dying through every try). */
static __always_inline int port_hold(const struct shk_port_key *k, __u64 cgid, __u32 max)
{
	__s32 *used = port_used(k->port, k->proto);
	struct shk_quota *u = use_of(cgid);

	if (!used || !u)
		return -1;
	if (use_take(&u->ports, max) < 0)
		return -2;
	__sync_fetch_and_add(used, 1);
	if (port_take(k, cgid) == 0)
		return 0;
	__sync_fetch_and_add(used, -1);
	__sync_fetch_and_add(&u->ports, -1);
	return -1;
}

/* Drops a hold taken by port_hold. */
static __always_inline void port_drop(const struct shk_port_key *k)
{
	struct shk_port *v = bpf_map_lookup_elem(&shk_ports, k);

	__s32 *used;

	if (!v)
		return;
	use_drop_port(v->cgid); /* read while this hold keeps the entry */
	if (__sync_fetch_and_add(&v->refs, -1) == 1 && __sync_val_compare_and_swap(&v->refs, 0, -1) == 0)
		bpf_map_delete_elem(&shk_ports, k);
	used = port_used(k->port, k->proto);
	if (used)
		__sync_fetch_and_add(used, -1);
}

/* The session holding (proto, local address, port) of a new inbound flow
 * (its key k), or NULL: the exact address first, then the wildcards that
 * receive it. k is spent. */
static __always_inline struct shk_port *port_holder(struct shk_port_key *k, __u32 family)
{
	__s32 *used = port_used(k->port, k->proto);
	struct shk_port *v;

	if (!used || *used <= 0)
		return 0; /* no session socket holds this port on any address */
	v = bpf_map_lookup_elem(&shk_ports, k);
	if (v && v->refs > 0)
		return v;
	if (family == AF_INET) {
		k->addr[3] = 0; /* 0.0.0.0 */
		v = bpf_map_lookup_elem(&shk_ports, k);
		if (v && v->refs > 0)
			return v;
	}
	k->addr[0] = 0; /* :: (a dual-stack socket receives IPv4 too) */
	k->addr[1] = 0;
	k->addr[2] = 0;
	k->addr[3] = 0;
	v = bpf_map_lookup_elem(&shk_ports, k);
	if (v && v->refs > 0)
		return v;
	return 0;
}

/* Takes the hold of a socket (its storage st) on k for session cgroup cgid,
 * against limit max as port_hold. Returns 0, or port_hold's -1 or -2
 * (nothing held). */
static __always_inline int hold_for(struct shk_sock *st, const struct shk_port_key *k, __u64 cgid, __u32 max)
{
	int r = port_hold(k, cgid, max);

	if (r < 0)
		return r;
	st->key = *k;
	st->held = 1;
	return 0;
}

/* A session's unconnected send from socket sk (sendmsg4|6): the kernel has
 * bound it (autobind) before the hook runs, and from now on it can receive;
 * it holds its port unless it does already. Returns 0, or hold_for's -1 or
 * -2 (nothing held: the send is refused). */
static __always_inline int hold_sender(struct bpf_sock *sk, __u64 cgid)
{
	struct shk_port_key k;
	struct shk_sock *st;

	if (!sk->src_port)
		return 0;
	st = bpf_sk_storage_get(&shk_socks, sk, 0, 0);
	if (st && st->held)
		return 0;
	port_key(&k, sk->family, sk->src_ip4, sk->src_ip6, sk->src_port, IPPROTO_UDP);
	st = bpf_sk_storage_get(&shk_socks, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!st)
		return -1;
	return hold_for(st, &k, cgid, shk_max_ports);
}
