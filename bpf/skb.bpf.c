// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The packet hooks (cgroup_skb):
 *
 *   cgroup_skb/ingress  both flow modes: every new inbound flow to a session
 *                       socket must be admitted by an inbound rule under a
 *                       live handle (check_inbound): a SYN to a session
 *                       listener, a datagram to an unconnected session UDP
 *                       socket (unless it comes from a peer and port the
 *                       session may send to: a reply). Sweep mode also
 *                       checks the SYN-ACK that completes a session's
 *                       connect against the egress map (check_handshake).
 *   cgroup_skb/egress   PACKET mode only (user space attaches it there)
 *
 * In PACKET mode (check_skb) egress checks every active open and data packet,
 * and ingress every data packet, against the handle the flow was allowed
 * under (kept per socket cookie in shk_flows). Part of the one object built
 * from shinken.bpf.c.
 */

#include "common.bpf.h"
#include "session.bpf.h"
#include "handle.bpf.h"
#include "egress_map.bpf.h"
#include "flows.bpf.h"
#include "dns.bpf.h"
#include "events.bpf.h"

/* Whether cgroup_skb programs may name the sending task (the pid and comm
 * helpers there need Linux 6.x; Debian 12's 6.1 refuses them). Set by user
 * space from a feature probe; when 0 the calls are dead code the verifier
 * never checks, and packet denials carry pid 0 and no comm. */
const volatile __u32 shk_skb_task_info = 0;

/* What check_skb needs of a packet. */
struct pkt {
	__u32 peer[4];   /* the remote end: destination on egress, source on ingress */
	__u16 peer_port; /* host order */
	__u16 local_port; /* host order: the session socket's own port */
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
	p->local_port = egress ? ((__u16)th[0] << 8 | th[1]) : ((__u16)th[2] << 8 | th[3]);
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
 * Both modes, ingress: a new inbound flow, parsed into p (a SYN to a session
 * listener, a datagram to an unconnected session UDP socket). It is admitted
 * only by an inbound rule of the session (source prefix, local port) under a
 * live handle; egress grants never admit a peer in. A datagram is also let
 * in when it comes from a peer and port the session may send to (a reply to
 * its own egress), or from its resolver. A TCP flow admitted here lives on
 * under the inbound rule: the sweep and the packet checks look for egress or
 * inbound rules (SHK_DIR_OUT | SHK_DIR_IN). An approve-once inbound grant
 * admits one connection (or one datagram). Refusals count and report
 * SHK_REASON_NO_INBOUND with the peer's address and the session's port (the
 * scope a grant would need).
 */
static __always_inline int check_inbound(struct __sk_buff *skb, const struct pkt *p)
{
	struct shk_flow ref = {};
	struct shk_session *s;
	__u64 cgid;

	cgid = skb_session_cgroup(skb);
	s = session_of(&cgid);
	if (!s) {
		report(cgid, 0, 0, SHK_REASON_UNKNOWN_SESSION, p->family, p->proto, p->local_port, p->peer,
		       p->family == AF_INET6 ? 4 : 1, 0);
		return 0;
	}
	if (p->proto == IPPROTO_UDP) {
		if (resolver_peer(p->family, p->peer, p->peer_port))
			return 1; /* the session's own resolver answering */
		if (lookup_dirs(s->index, p->family, p->peer, IPPROTO_UDP, p->peer_port, 0, SHK_DIR_OUT, SHK_USE_FLOW,
				&ref) == SHK_REASON_NONE &&
		    !denied(p->family, p->peer, p->peer_port))
			return 1; /* from where the session may send: a reply */
	}
	if (lookup_dirs(s->index, p->family, p->peer, p->proto, 0, p->local_port, SHK_DIR_IN, SHK_USE_CONSUME, &ref) ==
	    SHK_REASON_NONE)
		return 1;
	report(cgid, s->index, 0, SHK_REASON_NO_INBOUND, p->family, p->proto, p->local_port, p->peer,
	       p->family == AF_INET6 ? 4 : 1, 0);
	return 0;
}

/* Whether an ingress packet starts a new inbound flow that check_inbound
 * must admit: a TCP SYN, or a datagram to an unconnected UDP socket
 * (a connected one only ever receives from the peer its connect was
 * allowed to; the kernel delivers nothing else to it). */
static __always_inline int new_inbound(const struct bpf_sock *sk, const struct pkt *p)
{
	if (p->proto == IPPROTO_TCP)
		return p->syn;
	return p->proto == IPPROTO_UDP && sk->state != 1 /* TCP_ESTABLISHED: connected */;
}

/*
 * Sweep mode, ingress: the packets that start a flow. An inbound SYN or
 * datagram goes to check_inbound. The SYN-ACK completing a session's connect
 * is checked again (handles only): a connect allowed just before a revoke,
 * whose socket a concurrent sweep could not see yet, never becomes
 * established. Every other packet passes; flows are cut by the sweep.
 */
static __always_inline int check_handshake(struct __sk_buff *skb, struct bpf_sock *sk)
{
	struct shk_flow ref = {};
	struct shk_session *s;
	struct pkt p = {};
	__u32 why;
	__u64 cgid;

	if (sk->protocol != IPPROTO_TCP && sk->protocol != IPPROTO_UDP)
		return 1;
	if (sk->protocol == IPPROTO_UDP && sk->state == 1 /* connected */)
		return 1; /* the kernel delivers only its connect-checked peer's */
	if (parse(skb, 0, &p) < 0 || p.proto != sk->protocol) {
		why = SHK_REASON_UNCHECKED;
		cgid = skb_session_cgroup(skb);
		goto deny;
	}
	if (new_inbound(sk, &p))
		return check_inbound(skb, &p);
	if (!p.synack)
		return 1;
	cgid = skb_session_cgroup(skb);
	s = session_of(&cgid);
	if (!s) {
		why = SHK_REASON_UNKNOWN_SESSION;
		goto deny;
	}
	/* The handshake of a connect already allowed checks handles (and the
	 * deny table: a forbid written since the connect, whose socket the
	 * sweep that followed could not see yet). */
	if (denied(p.family, p.peer, p.peer_port))
		why = SHK_REASON_FORBIDDEN;
	else
		why = lookup(s->index, p.family, p.peer, IPPROTO_TCP, p.peer_port, 0, SHK_USE_FLOW, &ref);
	if (why == SHK_REASON_NONE)
		return 1;
	if (resolver_peer(p.family, p.peer, p.peer_port))
		return 1; /* the session's own resolver (redirected DNS over TCP) */
	why = SHK_REASON_FLOW_REVOKED;
deny:
	s = session_of(&cgid);
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
	/* Unconnected UDP: every send was checked by sendmsg4|6; a datagram
	 * in is a new inbound flow (or a reply), like a SYN to a listener. */
	if (sk->protocol == IPPROTO_UDP && sk->state != 1 /* TCP_ESTABLISHED: connected */ && egress)
		return 1;
	if (parse(skb, egress, &p) < 0 || p.proto != sk->protocol) {
		why = SHK_REASON_UNCHECKED;
		goto deny;
	}
	if (!egress && new_inbound(sk, &p))
		return check_inbound(skb, &p);
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
		    lc->cgroup_id == skb_session_cgroup(skb)) {
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
	    shk_handle_check(f->handle, f->generation, SHK_USE_FLOW) == SHK_REASON_NONE)
		return 1;

	cgid = skb_session_cgroup(skb);
	s = session_of(&cgid);
	if (!s) {
		why = SHK_REASON_UNKNOWN_SESSION;
		goto deny;
	}
	index = s->index;
	/* Rule deadlines (DNS TTLs) bound new connections, not open flows:
	 * only handles are checked here. An active open is egress alone; a
	 * TCP flow lives while an egress or an inbound rule covers it (it may
	 * have been accepted under an inbound grant); connected UDP is egress. */
	/* A peer the deny table names is reached by no egress rule (an
	 * inbound grant still admits it in): checked here, where a flow has no
	 * verdict yet, never on the recorded-handle path above (user space
	 * drops the records of flows to newly forbidden peers). */
	if (denied(p.family, p.peer, p.peer_port)) {
		if (p.syn || p.proto != IPPROTO_TCP)
			why = SHK_REASON_FORBIDDEN;
		else
			why = lookup_dirs(index, p.family, p.peer, p.proto, p.peer_port, p.local_port, SHK_DIR_IN,
					  SHK_USE_FLOW, &ref);
	} else if (p.syn || p.proto != IPPROTO_TCP)
		why = lookup(index, p.family, p.peer, p.proto, p.peer_port, 0, SHK_USE_FLOW, &ref);
	else
		why = lookup_dirs(index, p.family, p.peer, p.proto, p.peer_port, p.local_port, SHK_DIR_OUT | SHK_DIR_IN,
				  SHK_USE_FLOW, &ref);
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
	cgid = skb_session_cgroup(skb);
	if (!index) {
		s = session_of(&cgid);
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
