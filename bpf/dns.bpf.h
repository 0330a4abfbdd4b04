/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * DNS redirection, the part the other families call: the connect and send
 * hooks re-aim every port-53 query at the session's own resolver address
 * (redirect_dns) and let sends to that address through (own_resolver); the
 * packet hooks and the socket iterators recognise that traffic
 * (resolver_peer) and never judge it by the egress map. The programs that
 * restore the original server on replies are in dns.bpf.c.
 */
#pragma once

#include "common.bpf.h"
#include "flows.bpf.h"

/* Global configuration, one entry (struct shk_config). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct shk_config);
	__uint(max_entries, 1);
} shk_settings SEC(".maps");

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
