/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The egress map: which destinations a session may reach, and which peers
 * may open flows to it (inbound rules, SHK_RULE_INBOUND: the prefix is the
 * source, the ports the session's own). Entries are keyed
 * by (session, prefix); each holds up to SHK_MAX_RULES rules (protocol, port
 * range, optional deadline, caretaker handle). lookup() finds the longest
 * covering entry, tries its rules, then the next shorter covering entry, and
 * returns SHK_REASON_NONE with the allowing handle, or why not. Used by the
 * connect/send hooks, the packet hooks and the socket iterators alike.
 */
#pragma once

#include "common.bpf.h"
#include "handle.bpf.h"
#include "flowmark.bpf.h"

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

/* The never-list: link-local and cloud metadata addresses, the agent's own
 * listeners (set by user space). Tiny; an LPM trie per family. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct shk_never4_key);
	__type(value, __u32);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 256);
} shk_never4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct shk_never6_key);
	__type(value, __u32);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 256);
} shk_never6 SEC(".maps");

/* struct shk_never_hint: which never-list lookups can match. Not pinned:
 * each load starts from all zero (skip nothing) until user space writes it
 * (dataplane/never_linux.go). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct shk_never_hint);
	__uint(max_entries, 1);
} shk_never_hints SEC(".maps");

/* Admin-named exceptions to the never-list: (session, family, port, address)
 * -> the handle of the grant that names it. Port 0: every port. Sized like
 * the never-list per session; user space writes one with each NeverOK rule. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct shk_never_ok_key);
	__type(value, struct shk_never_ok);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 65536);
} shk_never_oks SEC(".maps");

/* The exception for a never-listed destination: SHK_REASON_NONE when an
 * admin-named grant of the session covers (addr, port) under a live handle
 * (an approve-once one is consumed), else why not. IPv4 in addr[0]. */
static __always_inline __u32 never_exception(__u32 session, __u16 family, const __u32 *addr, __u16 dport)
{
	struct shk_never_ok_key k = { .session = session, .port = bpf_htons(dport), .family = family };
	struct shk_never_ok *v;

	k.addr[0] = addr[0];
	if (family == AF_INET6) {
		k.addr[1] = addr[1];
		k.addr[2] = addr[2];
		k.addr[3] = addr[3];
	}
	v = bpf_map_lookup_elem(&shk_never_oks, &k);
	if (!v) {
		k.port = 0;
		v = bpf_map_lookup_elem(&shk_never_oks, &k);
	}
	if (!v)
		return SHK_REASON_NO_RULE;
	shk_flow_mark(v->handle, v->generation);
	return shk_handle_check(v->handle, v->generation, SHK_USE_CONSUME);
}

/* Bit idx of a hint bitmap of n bytes (a power of two). The index is masked
 * in the program (clang would drop the mask when it knows the range):
 * older verifiers (6.1) do not follow a value's bounds through a byte swap. */
#define hint_bit(bits, n, i)                              \
	({                                                \
		__u32 __i = (i);                          \
		asm volatile("" : "+r"(__i));             \
		((bits)[(__i >> 3) & ((n) - 1)] >> (__i & 7)) & 1; \
	})

/* Whether (addr, port) is never-listed: an entry for that port or for every
 * port (port 0) covers it. IPv4 in addr[0]. Each of the two lookups is made
 * only where shk_never_hints says it can match: most destinations (a port no
 * entry names, a first byte no every-port entry covers) need neither. */
static __always_inline int never_listed(__u16 family, const __u32 *addr, __u16 dport)
{
	__u32 zero = 0;
	struct shk_never_hint *h = bpf_map_lookup_elem(&shk_never_hints, &zero);
	int by_port = 1, any_port = 1;

	if (h) {
		by_port = !hint_bit(h->port_clear, 8192, dport);
		/* The address's first byte: the low byte of the network-order
		 * word. */
		if (family == AF_INET)
			any_port = !hint_bit(h->v4_clear, 32, addr[0] & 0xff);
		else
			any_port = !hint_bit(h->v6_clear, 32, addr[0] & 0xff);
	}
	if (family == AF_INET) {
		struct shk_never4_key k = { .prefixlen = 16 + 32, .port = bpf_htons(dport) };

		__builtin_memcpy(k.addr, addr, 4);
		if (by_port && bpf_map_lookup_elem(&shk_never4, &k))
			return 1;
		k.port = 0;
		return any_port && bpf_map_lookup_elem(&shk_never4, &k) != 0;
	} else {
		struct shk_never6_key k = { .prefixlen = 16 + 128, .port = bpf_htons(dport) };

		__builtin_memcpy(k.addr, addr, 16);
		if (by_port && bpf_map_lookup_elem(&shk_never6, &k))
			return 1;
		k.port = 0;
		return any_port && bpf_map_lookup_elem(&shk_never6, &k) != 0;
	}
}

/* The deny table (struct shk_deny): an LPM trie per family, written by
 * user space with each policy apply. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct shk_deny4_key);
	__type(value, struct shk_deny);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 1024);
} shk_deny4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct shk_deny6_key);
	__type(value, struct shk_deny);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 1024);
} shk_deny6 SEC(".maps");

/* Whether a forbid refuses (addr, dport) whatever the grants say: one
 * longest-prefix lookup (the entry holds the ports of every entry covering
 * it) and one bit test, no loop. IPv4 in addr[0]. */
static __always_inline int denied(__u16 family, const __u32 *addr, __u16 dport)
{
	struct shk_deny *v;
	__u32 idx;

	if (family == AF_INET) {
		struct shk_deny4_key k = { .prefixlen = 32 };

		__builtin_memcpy(k.addr, addr, 4);
		v = bpf_map_lookup_elem(&shk_deny4, &k);
	} else {
		struct shk_deny6_key k = { .prefixlen = 128 };

		__builtin_memcpy(k.addr, addr, 16);
		v = bpf_map_lookup_elem(&shk_deny6, &k);
	}
	if (!v)
		return 0;
	/* The mask stays in the program (clang would drop it, dport being
	 * 16 bits): older verifiers (6.1) do not follow a value's bounds
	 * through the byte swap that made dport. */
	idx = dport;
	asm volatile("" : "+r"(idx));
	return (v->ports[(idx >> 3) & 8191] >> (idx & 7)) & 1;
}

/* Which rules a lookup tries (its dirs argument): egress rules match the
 * peer's port, inbound rules (SHK_RULE_INBOUND, keyed by the source prefix)
 * the session's local port. Both: a flow lives while either covers it. */
#define SHK_DIR_OUT 1
#define SHK_DIR_IN 2

/*
 * Try the rules of one entry. Returns NONE and fills *ref on a match that is
 * allowed; otherwise the most telling reason seen so far. dport is the peer's
 * port, lport the session's own (inbound rules); dirs is a constant at every
 * call site, so an egress-only lookup pays one flag test per rule.
 */
static __always_inline __u32 try_rules(const struct shk_egress_value *v, __u8 proto, __u16 dport, __u16 lport,
				       __u32 dirs, int rule_expiry, __u32 use, __u32 best, struct shk_flow *ref)
{
	for (int i = 0; i < SHK_MAX_RULES; i++) {
		const struct shk_rule *r;
		__u16 port;
		__u32 why;

		if (i >= v->nrules)
			break;
		r = &v->rules[i];
		if (r->flags & SHK_RULE_INBOUND) {
			if (!(dirs & SHK_DIR_IN))
				continue;
			port = lport;
		} else {
			if (!(dirs & SHK_DIR_OUT))
				continue;
			port = dport;
		}
		if (r->proto && r->proto != proto)
			continue;
		if (!(r->port_lo == 0 && r->port_hi == 0) && (port < r->port_lo || port > r->port_hi))
			continue;
		if (r->expires_ns && rule_expiry && bpf_ktime_get_boot_ns() >= r->expires_ns) {
			if (best == SHK_REASON_NO_RULE)
				best = SHK_REASON_RULE_EXPIRED;
			continue;
		}
		shk_flow_mark(r->handle, r->generation); /* before the state reads: flowmark.bpf.h */
		why = shk_handle_check(r->handle, r->generation, use);
		if (why == SHK_REASON_NONE) {
			ref->handle = r->handle;
			ref->generation = r->generation;
			return SHK_REASON_NONE;
		}
		best = why;
	}
	return best;
}

static __always_inline __u32 lookup4(__u32 session, __u32 daddr, __u8 proto, __u16 dport, __u16 lport,
				     __u32 dirs, int rule_expiry, __u32 use, struct shk_flow *ref)
{
	struct shk_egress4_key key = { .prefixlen = 32 + 32, .session = session };
	__u32 best = SHK_REASON_NO_RULE;

	struct shk_egress_value *x;

	__builtin_memcpy(key.addr, &daddr, 4);
	x = bpf_map_lookup_elem(&shk_exact4, &key);
	if (x) {
		best = try_rules(x, proto, dport, lport, dirs, rule_expiry, use, best, ref);
		if (best == SHK_REASON_NONE)
			return best;
	}
	for (int i = 0; i < SHK_MAX_COVER; i++) {
		struct shk_egress_value *v = bpf_map_lookup_elem(&shk_egress4, &key);

		if (!v)
			break;
		best = try_rules(v, proto, dport, lport, dirs, rule_expiry, use, best, ref);
		if (best == SHK_REASON_NONE)
			return best;
		if (v->prefixlen == 0 || v->prefixlen > 32)
			break;
		key.prefixlen = 32 + v->prefixlen - 1;
	}
	return best;
}

static __always_inline __u32 lookup6(__u32 session, const __u32 *daddr, __u8 proto, __u16 dport, __u16 lport,
				     __u32 dirs, int rule_expiry, __u32 use, struct shk_flow *ref)
{
	struct shk_egress6_key key = { .prefixlen = 32 + 128, .session = session };
	__u32 best = SHK_REASON_NO_RULE;

	struct shk_egress_value *x;

	__builtin_memcpy(key.addr, daddr, 16);
	x = bpf_map_lookup_elem(&shk_exact6, &key);
	if (x) {
		best = try_rules(x, proto, dport, lport, dirs, rule_expiry, use, best, ref);
		if (best == SHK_REASON_NONE)
			return best;
	}
	for (int i = 0; i < SHK_MAX_COVER; i++) {
		struct shk_egress_value *v = bpf_map_lookup_elem(&shk_egress6, &key);

		if (!v)
			break;
		best = try_rules(v, proto, dport, lport, dirs, rule_expiry, use, best, ref);
		if (best == SHK_REASON_NONE)
			return best;
		if (v->prefixlen == 0 || v->prefixlen > 128)
			break;
		key.prefixlen = 32 + v->prefixlen - 1;
	}
	return best;
}

/* lookup4 or lookup6, by family (IPv4 in addr[0]); use is what the handle
 * check is for (enum shk_use). Egress rules only. */
static __always_inline __u32 lookup(__u32 session, __u16 family, const __u32 *addr, __u8 proto, __u16 dport,
				    int rule_expiry, __u32 use, struct shk_flow *ref)
{
	if (family == AF_INET)
		return lookup4(session, addr[0], proto, dport, 0, SHK_DIR_OUT, rule_expiry, use, ref);
	return lookup6(session, addr, proto, dport, 0, SHK_DIR_OUT, rule_expiry, use, ref);
}

/* lookup with a choice of rules (dirs, SHK_DIR_*): addr and dport are the
 * peer's, lport the session's own port. Inbound rules carry no deadline. */
static __always_inline __u32 lookup_dirs(__u32 session, __u16 family, const __u32 *addr, __u8 proto, __u16 dport,
					 __u16 lport, __u32 dirs, __u32 use, struct shk_flow *ref)
{
	if (family == AF_INET)
		return lookup4(session, addr[0], proto, dport, lport, dirs, 0, use, ref);
	return lookup6(session, addr, proto, dport, lport, dirs, 0, use, ref);
}

/* Whether an IPv6 address (four words) is v4-mapped, ::ffff:a.b.c.d. */
static __always_inline int is_v4mapped(const __u32 *a)
{
	return a[0] == 0 && a[1] == 0 && a[2] == bpf_htonl(0x0000ffff);
}
