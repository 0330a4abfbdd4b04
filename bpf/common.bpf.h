/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * What every Shinken BPF source includes first: the kernel UAPI and libbpf
 * headers, the ABI shared with dataplane/ (shinken_api.bpf.h), the few kernel
 * constants those headers do not give a BPF build, and the license of every
 * object built from bpf/.
 */
#pragma once

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
