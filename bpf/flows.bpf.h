/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Per-socket memory and the flow mode: how flows already open are cut when
 * their authority dies (shk_flow_mode), the per-socket-cookie records of
 * shk_flows (the handle a packet-mode flow was allowed under, and where a
 * redirected DNS query was meant to go), and shk_lastconns (the connect the
 * connect hook allowed last on each CPU, so its SYN needs no second lookup).
 */
#pragma once

#include "common.bpf.h"

/* How open flows are cut when their authority dies (enum shk_flow_mode). Set
 * by user space before load. */
const volatile __u32 shk_flow_mode = SHK_FLOW_SWEEP;

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
