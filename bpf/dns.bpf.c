// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * DNS restore: with DNS redirection on, a session's queries go to the agent's
 * resolver at the session's own loopback address (redirect_dns, dns.bpf.h,
 * called by the connect and send hooks of sock_addr.bpf.c). These programs
 * make the replies look as if they came from the server the session asked:
 *
 *   cgroup/recvmsg4|6      DNS replies (and getpeername4|6 on a DNS socket) show
 *   cgroup/getpeername4|6  the server the session asked
 *
 * Part of the one object built from shinken.bpf.c.
 */

#include "common.bpf.h"
#include "flows.bpf.h"
#include "dns.bpf.h"

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
