/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The ABI that the kernel programs of bpf/ and the Go side in dataplane/ share.
 * Every struct here is exported through bpf2go (-type) and its Go layout is
 * checked by dataplane tests. Change a field and both sides change together.
 */
#pragma once

#include <linux/types.h>

/* Slot 0 of shk_handles is never issued: a zero reference means "none". */
#define SHK_HANDLE_NONE 0

/* Depth of the handle parent chain the kernel walks (a handle plus up to
 * SHK_MAX_CHAIN-1 ancestors). User space refuses to issue deeper handles. */
#define SHK_MAX_CHAIN 8

/* Rules one egress prefix entry of one session can hold. */
#define SHK_MAX_RULES 4

/* Covering prefixes one lookup visits, longest first. User space refuses an
 * entry that would be covered by more prefixes than this. */
#define SHK_MAX_COVER 8

/* Denial reasons; index of the counters and the reason field of events.
 * Mirrored by dataplane.Reason. */
enum shk_reason {
	SHK_REASON_NONE = 0,
	SHK_REASON_NO_RULE = 1,
	SHK_REASON_HANDLE_REVOKED = 2,
	SHK_REASON_HANDLE_EXPIRED = 3,
	SHK_REASON_RULE_EXPIRED = 4,
	SHK_REASON_UNKNOWN_SESSION = 5,
	SHK_REASON_UNCHECKED = 6,
	SHK_REASON_FLOW_REVOKED = 7,
	SHK_REASON_NO_INBOUND = 8, /* a new inbound flow no inbound grant admits */
	SHK_REASON_FORBIDDEN = 9,  /* the deny table (an admin or hard-deny forbid) */
	SHK_REASON_SOCKET_LIMIT = 10, /* a socket past the session's socket limit (quota.bpf.h) */
	SHK_REASON_PORT_LIMIT = 11,   /* a port hold past the session's bound-port limit */
	SHK_REASON_FS_OUTSIDE = 12, /* fs.scope: no live entry covers the path and the session's outside access lacks it (files.bpf.c) */
	SHK_REASON_FS_DENIED = 13,  /* fs.scope: the nearest entry with a live rule is a deny, or lacks the access */
	SHK_REASON_FS_DEPTH = 14,   /* fs.scope: no entry within SHK_FS_MAX_DEPTH dentries and the filesystem's root not reached */
	SHK_REASON_EXEC_DENIED = 15, /* process: the exec gate (user space, fanotify) refused an exec-open; no program counts it, the agent adds it to shk_counters */
	SHK_NR_REASONS = 16,
};

/* How flows already open are cut when their authority dies (load-time
 * constant shk_flow_mode; see flows.bpf.h). Mirrored by dataplane.FlowMode. */
enum shk_flow_mode {
	SHK_FLOW_SWEEP = 1,  /* socket iterators destroy them, on request */
	SHK_FLOW_PACKET = 2, /* cgroup_skb drops their next packet */
};

enum shk_handle_state {
	SHK_HANDLE_FREE = 0,
	SHK_HANDLE_LIVE = 1,
	SHK_HANDLE_REVOKED = 2,
	/* Approve-once: live for exactly one new use. The first allowed connect
	 * or unconnected send under it moves it to USED with one atomic
	 * compare-and-swap in the kernel (two racing connects: exactly one
	 * wins); the flow it opened lives on, no new use is allowed. */
	SHK_HANDLE_ONCE = 3,
	SHK_HANDLE_USED = 4,
};

/* What a handle check is for (shk_handle_check's use argument). */
enum shk_use {
	SHK_USE_FLOW = 0,    /* a flow already allowed: LIVE, ONCE and USED pass */
	SHK_USE_NEW = 1,     /* a new flow, without consuming: LIVE and ONCE pass */
	SHK_USE_CONSUME = 2, /* a new flow that consumes an ONCE handle (connect, send) */
};

/* One caretaker handle: value of the shk_handles array, indexed by slot.
 * Set by user space only. Revoke is one write of the state word (REVOKED):
 * an atomic exchange by shk_revoke (flowmark.bpf.h). */
struct shk_handle {
	__u32 state;             /* enum shk_handle_state */
	__u32 generation;        /* bumped each time the slot is issued */
	__u32 parent;            /* parent slot, SHK_HANDLE_NONE for a root */
	__u32 parent_generation; /* generation the parent had when this was issued */
	__u64 expires_ns;        /* CLOCK_BOOTTIME deadline, 0 = never */
};

/* The context of shk_revoke (flowmark.bpf.h), run by user space. */
struct shk_revoke_args {
	__u32 slot;       /* in: the handle */
	__u32 generation; /* in */
	__u32 flows;      /* out: 1 when a flow check tried a rule under it or a descendant */
};

/* Value of shk_sessions, keyed by the session cgroup's id (__u64). */
struct shk_session {
	__u32 index; /* dense session index, 1.. ; 0 is "no session" */
	__u32 flags; /* reserved, 0 */
};

/* One allow rule on a prefix. */
struct shk_rule {
	__u32 handle;      /* handle slot */
	__u32 generation;  /* handle generation the rule was issued under */
	__u64 expires_ns;  /* CLOCK_BOOTTIME deadline of the rule itself (DNS TTL), 0 = never */
	__u16 port_lo;     /* inclusive, host order; 0/0 = any port */
	__u16 port_hi;
	__u8 proto;        /* 0 any, 6 tcp, 17 udp */
	__u8 flags;        /* SHK_RULE_* */
	__u8 pad[2];
};

/* The rule is an admin-named exception to the never-list (user space also
 * writes its shk_never_oks entry); kept on the rule for the snapshot. */
#define SHK_RULE_NEVER_OK 1
/* An inbound rule: the entry's prefix is where a peer connects from, the
 * port range the session's local port it connects to. Egress checks
 * (connect, send) never match it; the ingress checks of new inbound flows
 * (a SYN to a session listener, a datagram to an unconnected session
 * socket) match nothing else. */
#define SHK_RULE_INBOUND 2

/* Key of shk_never_oks: an admin-named never-listed destination of one
 * session. Value: the handle of the grant naming it. */
struct shk_never_ok_key {
	__u32 session;
	__u16 port;   /* network order, 0 = every port */
	__u16 family; /* AF_INET / AF_INET6 */
	__u32 addr[4]; /* IPv4 in addr[0], network order */
};

struct shk_never_ok {
	__u32 handle;
	__u32 generation;
};

/* Never-list keys: (port, prefix). prefixlen counts the 16 port bits plus the
 * address bits; port 0 stands for every port (a second lookup). Value: a
 * reserved word. Checked at connect and send before any grant: a destination
 * here is refused unless shk_never_oks holds an admin-named exception. */
struct shk_never4_key {
	__u32 prefixlen;
	__u16 port; /* network order, 0 = any */
	__u8 addr[4];
};

struct shk_never6_key {
	__u32 prefixlen;
	__u16 port; /* network order, 0 = any */
	__u8 addr[16];
};

/* Which never-list lookups a destination can need (shk_never_hints, one
 * entry, written by user space from what shk_never4|6 hold). A set bit says
 * no entry can match, so that lookup is skipped; a clear bit (and an entry
 * never written: all zero) skips nothing. port_clear: bit p (of
 * port_clear[p / 8]) when no entry of either family names port p (the
 * port-specific lookup); v4_clear, v6_clear: bit b when no every-port entry
 * of the family covers an address whose first byte is b (the port-0
 * lookup). */
struct shk_never_hint {
	__u8 port_clear[8192];
	__u8 v4_clear[32];
	__u8 v6_clear[32];
};

/* The deny table (shk_deny4|6): destinations no grant reaches, compiled by
 * user space from the admin and hard-deny forbids whose condition is a
 * destination. Keyed by address prefix (prefixlen: the address bits); the
 * value is a bitmap of the ports refused there (bit p of ports[p / 8]),
 * those of every shorter entry covering it included (user space pushes
 * them down), so one longest-prefix lookup and one bit test answer. */
struct shk_deny {
	__u8 ports[8192];
};

struct shk_deny4_key {
	__u32 prefixlen;
	__u8 addr[4];
};

struct shk_deny6_key {
	__u32 prefixlen;
	__u8 addr[16];
};

/* Value of shk_egress4/6. The kernel does a longest-prefix lookup, tries the
 * rules, and if none allows, looks again for the next shorter covering
 * prefix (prefixlen tells how long this entry's prefix is). */
struct shk_egress_value {
	__u32 prefixlen; /* address bits of this entry's prefix (0..32 / 0..128) */
	__u32 nrules;    /* valid entries of rules[] */
	struct shk_rule rules[SHK_MAX_RULES];
};

/* LPM keys: prefixlen counts the 32 session bits plus the address bits. */
struct shk_egress4_key {
	__u32 prefixlen;
	__u32 session;
	__u8 addr[4];
};

struct shk_egress6_key {
	__u32 prefixlen;
	__u32 session;
	__u8 addr[16];
};

/* Value of shk_flows, an LRU hash keyed by socket cookie. Packet mode: the
 * first data packet of a connected flow that the egress map allows records the handle
 * it was allowed under (and the peer), so later packets check only that
 * handle: a revoke cuts the flow at its next packet. An evicted record is
 * recreated by a fresh egress-map check, never assumed. DNS sockets also keep
 * where their last redirected query was meant to go, so replies can show that
 * source. handle 0 with generation 0: no flow verdict (DNS memory only). */
struct shk_flow {
	__u32 handle;
	__u32 generation;
	__u32 peer[4];      /* remote address the verdict is for; IPv4 in peer[0] */
	__u16 peer_port;    /* host order */
	__u16 peer_family;  /* AF_INET / AF_INET6 */
	__u32 dns_addr[4];  /* original DNS server; IPv4 in dns_addr[0] (network order) */
	__u16 dns_port;     /* network order */
	__u16 dns_family;   /* AF_INET / AF_INET6; 0 = no DNS query redirected */
};

/* The per-session resolver address is SHK_DNS_BASE + session index
 * (127.128.0.0/9: up to 2^23 sessions). */
#define SHK_DNS_BASE 0x7f800000

/* Value of shk_settings[0]. Set by user space; 0 disables DNS redirection. */
struct shk_config {
	__u16 dns_port; /* resolver port, host order; 0 = DNS is ordinary egress */
	__u16 pad;
	__u32 flags;    /* reserved, 0 */
};

/* Value of shk_lastconn (per-CPU, one entry; packet mode only): the TCP
 * connect the connect hook allowed last on this CPU. The SYN that connect() sends next, on the
 * same CPU, then needs no second egress-map lookup. Consumed by that SYN. */
struct shk_lastconn {
	__u64 cgroup_id; /* session cgroup of the connecting task */
	__u32 daddr[4];  /* IPv4 in daddr[0] */
	__u16 dport;     /* host order */
	__u16 family;
	__u32 valid;
};

/* One denial, sent best effort through shk_events. */
struct shk_event {
	__u64 ts_ns;     /* CLOCK_BOOTTIME */
	__u64 cgroup_id; /* the session cgroup (0 if unknown) */
	__u32 session;   /* session index, 0 if unknown */
	__u32 pid;       /* tgid */
	__u32 reason;    /* enum shk_reason */
	__u16 family;    /* AF_INET / AF_INET6 */
	__u16 dport;     /* host order */
	__u8 proto;
	__u8 pad[7];
	__u8 daddr[16];  /* IPv4 in the first 4 bytes */
	char comm[16];
};

/* Value of shk_quotas, keyed by the session cgroup's id (__u64): what one
 * session holds of the host's shared socket resources (quota.bpf.h). Set by
 * the kernel programs only; user space reads it and deletes it with the
 * session. */
struct shk_quota {
	__s32 socks; /* inet sockets the session created and has not released */
	__s32 ports; /* port holds its sockets have (ports.bpf.h), one per socket */
};

/* Value of shk_budgets, keyed by session index (0: what no session owns)
 * * 2 + bucket: one of the session's two denial-event budgets (events.bpf.h),
 * a GCRA token bucket in one word. Set by the kernel programs; user space zeroes it when it issues
 * the index. */
struct shk_budget {
	__u64 tat; /* theoretical arrival time of the next event (bpf_ktime_get_ns) */
};

/* Global statistics (per-CPU array shk_stats). */
enum shk_stat {
	SHK_STAT_RINGBUF_DROPS = 0,
	SHK_STAT_EVENTS_SUPPRESSED = 1, /* denial events past their session's budget (counted, not sent) */
	SHK_NR_STATS = 4,
};
