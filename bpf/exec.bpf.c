// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

/*
 * The process class's exec allowlist in the kernel, where BPF LSM is
 * active: its own object (shkexec), loaded and attached only where the
 * kernel lets LSM programs attach, so a host without BPF LSM still loads
 * the main object (and gates execs with the agent's fanotify group). It
 * shares shk_sessions, shk_handles, shk_counters, shk_stats and shk_events
 * with the main object (the loader hands it those maps).
 *
 *   lsm/bprm_check_security  every exec: the program, then each script
 *                            interpreter of the chain (#!); an ELF
 *                            interpreter (ld.so) the kernel opens for a
 *                            program is not an exec and passes no check
 *
 * The session of the acting task (cgroup ancestor -> shk_sessions, as the
 * egress hooks); if it is gated (shk_exec_gated by session index: it has
 * held a process grant), the file executed (bprm->file's inode: the
 * kernel's s_dev and i_ino) must have an entry in shk_exec_files under the
 * session with a live rule (the shared handle check); else -EACCES,
 * counted and reported as SHK_REASON_EXEC_DENIED with the inode in the
 * event's daddr (as fs.scope's). A revoke is the one handle write: the
 * next exec under it fails, with no agent in the path.
 *
 * A task of real uid 0 is not checked: the agent's launch step runs as
 * root in the session's cgroup until the launcher takes the session's
 * uid; a session's own tasks run as its uid under no_new_privs and never
 * become uid 0 (the fanotify gate judges by uid the same way).
 */

#include "common.bpf.h"
#include "session.bpf.h"
#include "handle.bpf.h"
#include "events.bpf.h"

/* The kernel structures read, with CO-RE relocations. */
struct super_block {
	__u32 s_dev;
} __attribute__((preserve_access_index));

struct inode {
	unsigned long i_ino;
	struct super_block *i_sb;
} __attribute__((preserve_access_index));

struct file {
	struct inode *f_inode;
} __attribute__((preserve_access_index));

struct linux_binprm {
	struct file *file;
} __attribute__((preserve_access_index));

#define SHK_EACCES 13

/* Grants naming one file in one session. */
#define SHK_EXEC_MAX_RULES 8

struct shk_exec_key {
	__u32 session; /* session index */
	__u32 dev;     /* the kernel's s_dev (major << 20 | minor) */
	__u64 ino;
};

struct shk_exec_rule {
	__u32 handle;
	__u32 generation;
};

struct shk_exec_value {
	__u32 nrules;
	__u32 pad;
	struct shk_exec_rule rules[SHK_EXEC_MAX_RULES];
};

/* (session, dev, ino) -> the grants that list it. Sized by user space. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct shk_exec_key);
	__type(value, struct shk_exec_value);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} shk_exec_files SEC(".maps");

/* Session index -> 1 when gated. Sized by user space (max sessions). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 65536);
} shk_exec_gated SEC(".maps");

/* [0]: gated sessions now. 0: the hook returns at once. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1);
} shk_exec_on SEC(".maps");

/* Export the ABI types for bpf2go. */
const struct shk_exec_key *unused_exec_key __attribute__((unused));
const struct shk_exec_value *unused_exec_value __attribute__((unused));

/* SHK_REASON_NONE when an entry of (session, dev, ino) has a live rule. */
__noinline int exec_allowed(__u32 session, __u32 dev, __u64 ino)
{
	struct shk_exec_key k = {.session = session, .dev = dev, .ino = ino};
	struct shk_exec_value *v = bpf_map_lookup_elem(&shk_exec_files, &k);

	if (!v)
		return SHK_REASON_EXEC_DENIED;
	for (int j = 0; j < SHK_EXEC_MAX_RULES; j++) {
		if (j >= v->nrules)
			break;
		if (shk_handle_check(v->rules[j].handle, v->rules[j].generation, SHK_USE_NEW) == SHK_REASON_NONE)
			return SHK_REASON_NONE;
	}
	return SHK_REASON_EXEC_DENIED;
}

SEC("lsm/bprm_check_security")
int shk_bprm_check(unsigned long long *ctx)
{
	struct linux_binprm *bprm = (struct linux_binprm *)ctx[0];
	__u32 zero = 0, index, dev;
	__u32 *on, *gated;
	__u32 where[4] = {};
	struct shk_session *s;
	struct inode *in;
	__u64 cgid, ino;

	on = bpf_map_lookup_elem(&shk_exec_on, &zero);
	if (!on || !*on)
		return 0;
	if ((__u32)bpf_get_current_uid_gid() == 0)
		return 0;
	cgid = session_cgroup();
	s = session_of(&cgid);
	if (!s)
		return 0;
	index = s->index;
	gated = bpf_map_lookup_elem(&shk_exec_gated, &index);
	if (!gated || !*gated)
		return 0;
	in = bprm->file->f_inode;
	ino = in->i_ino;
	dev = in->i_sb->s_dev;
	if (exec_allowed(index, dev, ino) == SHK_REASON_NONE)
		return 0;
	where[0] = (__u32)ino;
	where[1] = (__u32)(ino >> 32);
	where[2] = dev;
	report(cgid, index, bpf_get_current_pid_tgid() >> 32, SHK_REASON_EXEC_DENIED, 0, 0, 0, where, 4, 1);
	return -SHK_EACCES;
}
