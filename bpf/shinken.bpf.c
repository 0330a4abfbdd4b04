// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

/*
 * Shinken egress enforcement. Attached once, at the sessions' parent cgroup:
 *
 *   cgroup/connect4|6   every TCP connect and UDP connect
 *   cgroup/sendmsg4|6   every unconnected UDP send
 *   cgroup/recvmsg4|6   DNS replies (and getpeername4|6 on a DNS socket) show
 *   cgroup/getpeername4|6  the server the session asked
 *
 * New inbound flows (a SYN to a session listener, a datagram to an
 * unconnected session UDP socket) must be admitted by an inbound rule: in
 * SWEEP mode by sk_lookup (attached to the agent's network namespace) for
 * the ports session sockets hold (post_bind4|6, sockops, sock_release,
 * sendmsg4|6: inbound.bpf.c, ports.bpf.h); in PACKET mode by
 * cgroup_skb/ingress.
 *
 * Flows already open when their authority dies are cut in one of two ways,
 * chosen at load (shk_flow_mode):
 *
 *   SWEEP   (kernels with the bpf_sock_destroy kfunc) iter/tcp and iter/udp
 *           walk every TCP and UDP socket when user space asks (after a
 *           revoke of a handle a flow check tried (flowmark.bpf.h), its
 *           follow-ups, at each handle deadline) and destroy each
 *           session socket whose peer no live grant covers any more. No
 *           program runs per packet of an established flow.
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
 *
 * This file is the one translation unit bpf2go compiles (dataplane/gen.go):
 * one object, so every program shares the same maps without pinning them
 * by hand. Each program family is its own file, included below; each
 * includes the building blocks it uses (each header includes what it needs
 * and is included once):
 *
 *   shinken_api.bpf.h  the ABI shared with dataplane/ (bpf2go -type)
 *   common.bpf.h       kernel and libbpf headers, constants, the license
 *   session.bpf.h      shk_sessions, shk_session_level: the acting session
 *   handle.bpf.h       shk_handles, shk_handle_check: the membrane walk
 *   flowmark.bpf.h     shk_handle_flows, shk_flow_mark, shk_revoke: which
 *                      handles a flow may be open under (sweep mode skips
 *                      the walk after a revoke of one no flow check tried)
 *   egress_map.bpf.h   shk_egress4|6, shk_exact4|6, lookup()
 *   flows.bpf.h        shk_flow_mode, shk_flows, shk_lastconns
 *   ports.bpf.h        shk_ports, shk_socks: the ports session sockets hold
 *   quota.bpf.h        shk_quotas, shk_max_socks|ports: per-session socket and
 *                      port-hold limits
 *   dns.bpf.h          shk_settings, redirecting DNS to the resolver
 *   events.bpf.h       shk_counters, shk_stats, shk_events, shk_budgets,
 *                      shk_suppressed, shk_denied: count(), report(), the
 *                      event budget, the denied marker
 *   core.bpf.h         the kernel structures read with CO-RE
 *
 * A new hook (cgroup/dev, BPF LSM) is a new family file that includes
 * session.bpf.h, handle.bpf.h and events.bpf.h (and core.bpf.h for kernel
 * structures), added to the list below. The order of the list and of each
 * file's includes fixes the order of programs, maps and load-time constants
 * in the object: nothing depends on it, but the committed object changes
 * with it.
 */

#include "sock_addr.bpf.c" /* connect4|6, sendmsg4|6, sock_create */
#include "dns.bpf.c"       /* recvmsg4|6, getpeername4|6 */
#include "skb.bpf.c"       /* cgroup_skb ingress|egress */
#include "inbound.bpf.c"   /* sk_lookup, post_bind4|6, sockops, sock_release */
#include "sweep.bpf.c"     /* iter/tcp, iter/udp */
