/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The few kernel structures the programs read directly, declared with CO-RE
 * relocations (preserve_access_index), so the loader fits the offsets to the
 * running kernel's BTF. Only the fields read are declared: add one here when
 * a program needs it (today the socket iterators of sweep.bpf.c read a
 * socket's peer, bound address, local port, state and cgroup).
 */
#pragma once

#include "common.bpf.h"

struct sock_common {
	__be32 skc_daddr;
	__be32 skc_rcv_saddr; /* the bound address */
	__be16 skc_dport;
	__u16 skc_num; /* the local port, host order */
	unsigned short skc_family;
	volatile unsigned char skc_state;
	struct in6_addr skc_v6_daddr;
	struct in6_addr skc_v6_rcv_saddr;
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
	struct cgroup *ancestors[]; /* by level, itself last (Linux 6.0+) */
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

/* TCP states (the kernel's include/net/tcp_states.h). */
#define SHK_TCP_ESTABLISHED 1
#define SHK_TCP_CLOSE 7
#define SHK_TCP_LISTEN 10
