// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

/*
 * fs.scope in the kernel, where BPF LSM is active: its own object (shkfs),
 * loaded and attached only where the kernel lets LSM programs attach, so a
 * host without BPF LSM still loads the main object. It shares shk_sessions,
 * shk_handles, shk_counters, shk_stats and shk_events with the main object
 * (the loader hands it those maps).
 *
 *   lsm/file_open        an open for reading (exec too) or writing
 *   lsm/file_permission  every read and write on an open descriptor, so a
 *                        revoke also stops descriptors opened before it
 *   lsm/path_truncate    truncate
 *   lsm/path_mknod|mkdir|symlink  creating in a directory (an O_CREAT open
 *                        passes path_mknod too)
 *   lsm/path_link        a hard link: write in the new directory, and the
 *                        source must be readable and writable here already
 *   lsm/path_unlink|rmdir  deleting
 *   lsm/path_rename      delete at the old place, write in the new one (and
 *                        delete what is replaced)
 *
 * Each is a thin entry point over fs_check: the session of the acting task
 * (cgroup id -> shk_sessions, as the egress hooks), its fs record
 * (shk_fs_sessions: a session without fs entries is never checked), then a
 * walk up the dentry's parents, at most SHK_FS_MAX_DEPTH dentries, looking
 * each inode up in shk_fs_inodes under the session. The nearest entry with
 * a live rule (the shared handle check) decides: the access of its live
 * rules together must hold what is needed, a grant's deny rule giving
 * nothing of that grant there (one rule per grant and inode); an entry
 * whose rules are all dead is passed over (its grant was revoked: what
 * stands above it decides). Past the filesystem's root with no entry: the
 * session's outside access decides. Neither deeper than the bound: refused.
 * Keyed by inode, the walk sees where an object is now (a rename moves it,
 * the walk follows), through whichever mount or bind it was reached (the
 * dentry tree is the filesystem's), and never crosses into the filesystem
 * a directory is mounted on (an entry covers its own filesystem only).
 */

#include "common.bpf.h"
#include "files_api.bpf.h"
#include "session.bpf.h"
#include "handle.bpf.h"
#include "events.bpf.h"

/* The kernel structures read, with CO-RE relocations. */
struct super_block {
	__u32 s_dev;
} __attribute__((preserve_access_index));

struct inode {
	unsigned short i_mode;
	unsigned long i_ino;
	struct super_block *i_sb;
} __attribute__((preserve_access_index));

struct dentry {
	struct dentry *d_parent;
	struct inode *d_inode;
} __attribute__((preserve_access_index));

struct vfsmount;

struct path {
	struct vfsmount *mnt;
	struct dentry *dentry;
} __attribute__((preserve_access_index));

struct file {
	struct path f_path;
	unsigned int f_mode;
} __attribute__((preserve_access_index));

#define SHK_EACCES 13
#define SHK_FMODE_READ 0x1
#define SHK_FMODE_WRITE 0x2
#define SHK_FMODE_EXEC 0x20
#define SHK_MAY_WRITE 0x2
#define SHK_MAY_READ 0x4
#define SHK_MAY_APPEND 0x8
#define SHK_S_IFMT 00170000
#define SHK_S_IFREG 0100000
#define SHK_S_IFDIR 0040000

/* (session, dev, ino) -> rules (shk_fs_inodes). Sized by user space. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct shk_fs_key);
	__type(value, struct shk_fs_value);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} shk_fs_inodes SEC(".maps");

/* Session index -> its fs record. Sized by user space (max sessions). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct shk_fs_session);
	__uint(max_entries, 65536);
} shk_fs_sessions SEC(".maps");

/* [0]: sessions with fs entries now. 0: every hook returns at once, so a
 * host whose sessions hold no fs entries pays one array lookup per hook. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1);
} shk_fs_on SEC(".maps");

/* Export the ABI types for bpf2go. */
const struct shk_fs_key *unused_fs_key __attribute__((unused));
const struct shk_fs_value *unused_fs_value __attribute__((unused));
const struct shk_fs_session *unused_fs_session __attribute__((unused));

/* The verdict of one inode's entry: FS_NEXT (no entry, or only dead rules:
 * look further up), FS_ALLOW or FS_REFUSE; bits 8..15 hold the handle
 * check's reason of a dead rule seen. Global: verified once. */
#define FS_NEXT 0
#define FS_ALLOW 1
#define FS_REFUSE 2

__noinline int fs_entry(__u32 session, __u32 dev, __u64 ino, __u32 need, __u32 use)
{
	struct shk_fs_key k = {.session = session, .dev = dev, .ino = ino};
	struct shk_fs_value *v = bpf_map_lookup_elem(&shk_fs_inodes, &k);
	__u32 have = 0;
	int live = 0, dead = 0;

	if (!v)
		return FS_NEXT;
	for (int j = 0; j < SHK_FS_MAX_RULES; j++) {
		struct shk_fs_rule *r = &v->rules[j];
		int why;

		if (j >= v->nrules)
			break;
		why = shk_handle_check(r->handle, r->generation, use);
		if (why != SHK_REASON_NONE) {
			dead = why;
			continue;
		}
		live = 1;
		/* A deny takes its own grant's rights here (user space folds
		 * one grant's entries on one inode into one rule), not another
		 * grant's: as FileRightsAt, whose nesting is per grant. */
		if (!(r->access & SHK_FS_DENY))
			have |= r->access;
	}
	/* The live rules together: read from one grant, write from another;
	 * only denies (or nothing that holds need): refused. */
	if (live)
		return (have & need) == need ? FS_ALLOW : FS_REFUSE;
	return FS_NEXT | ((dead & 0xff) << 8);
}

/* The session of the acting task and its fs record, or NULL: no check. */
static __always_inline const struct shk_fs_session *fs_session(__u64 *cgid, __u32 *index)
{
	__u32 zero = 0;
	__u32 *on = bpf_map_lookup_elem(&shk_fs_on, &zero);
	struct shk_session *s;
	struct shk_fs_session *fss;

	if (!on || !*on)
		return 0;
	*cgid = session_cgroup();
	s = session_of(cgid);
	if (!s)
		return 0;
	*index = s->index;
	fss = bpf_map_lookup_elem(&shk_fs_sessions, index);
	if (!fss || !fss->on)
		return 0;
	return fss;
}

/* Decides need (SHK_FS_*) on dentry d for the acting task: 0 or -EACCES
 * (counted and reported with the reason, the inode in the event's daddr). */
static __always_inline int fs_check(struct dentry *d, __u32 need, __u32 use)
{
	const struct shk_fs_session *fss;
	__u64 cgid = 0, ino = 0;
	__u32 index = 0, dev = 0, reason = SHK_REASON_FS_DEPTH, dead = 0;
	__u32 where[4] = {};

	if (!need || !d)
		return 0;
	fss = fs_session(&cgid, &index);
	if (!fss)
		return 0;
	for (int i = 0; i < SHK_FS_MAX_DEPTH; i++) {
		struct inode *in = d->d_inode;
		struct dentry *up;

		if (in) {
			__u64 n = in->i_ino;
			__u32 dv = in->i_sb->s_dev;
			int r;

			if (i == 0) {
				ino = n;
				dev = dv;
			}
			r = fs_entry(index, dv, n, need, use);
			if ((r & 0xff) == FS_ALLOW)
				return 0;
			if ((r & 0xff) == FS_REFUSE) {
				reason = SHK_REASON_FS_DENIED;
				goto refuse;
			}
			if (r >> 8)
				dead = r >> 8;
		}
		up = d->d_parent;
		if (!up || up == d) {
			/* The filesystem's root: no live entry covers d. */
			if ((fss->outside & need) == need)
				return 0;
			reason = dead ? dead : SHK_REASON_FS_OUTSIDE;
			goto refuse;
		}
		d = up;
	}
refuse:
	where[0] = (__u32)ino;
	where[1] = (__u32)(ino >> 32);
	where[2] = dev;
	report(cgid, index, bpf_get_current_pid_tgid() >> 32, reason, 0, (__u8)need, 0, where, 4, 1);
	return -SHK_EACCES;
}

/* Regular files and directories only: devices are the device classes',
 * FIFOs and sockets carry no file content of the tree. */
static __always_inline int fs_content(struct dentry *d)
{
	struct inode *in = d ? d->d_inode : 0;
	unsigned short m;

	if (!in)
		return 0;
	m = in->i_mode & SHK_S_IFMT;
	return m == SHK_S_IFREG || m == SHK_S_IFDIR;
}

SEC("lsm/file_open")
int shk_file_open(unsigned long long *ctx)
{
	struct file *f = (struct file *)ctx[0];
	struct dentry *d = f->f_path.dentry;
	unsigned int mode = f->f_mode;
	__u32 need = 0;

	if (!fs_content(d))
		return 0;
	if (mode & (SHK_FMODE_READ | SHK_FMODE_EXEC))
		need |= SHK_FS_READ;
	if (mode & SHK_FMODE_WRITE)
		need |= SHK_FS_WRITE;
	return fs_check(d, need, SHK_USE_NEW);
}

SEC("lsm/file_permission")
int shk_file_permission(unsigned long long *ctx)
{
	struct file *f = (struct file *)ctx[0];
	int mask = (int)ctx[1];
	struct dentry *d = f->f_path.dentry;
	__u32 need = 0;

	if (mask & SHK_MAY_READ)
		need |= SHK_FS_READ;
	if (mask & (SHK_MAY_WRITE | SHK_MAY_APPEND))
		need |= SHK_FS_WRITE;
	if (!need || !fs_content(d))
		return 0;
	return fs_check(d, need, SHK_USE_FLOW);
}

SEC("lsm/path_truncate")
int shk_path_truncate(unsigned long long *ctx)
{
	const struct path *p = (const struct path *)ctx[0];

	return fs_check(p->dentry, SHK_FS_WRITE, SHK_USE_NEW);
}

/* Creating in directory dir: write there. */
static __always_inline int fs_create(const struct path *dir)
{
	return fs_check(dir->dentry, SHK_FS_WRITE, SHK_USE_NEW);
}

SEC("lsm/path_mknod")
int shk_path_mknod(unsigned long long *ctx)
{
	return fs_create((const struct path *)ctx[0]);
}

SEC("lsm/path_mkdir")
int shk_path_mkdir(unsigned long long *ctx)
{
	return fs_create((const struct path *)ctx[0]);
}

SEC("lsm/path_symlink")
int shk_path_symlink(unsigned long long *ctx)
{
	return fs_create((const struct path *)ctx[0]);
}

SEC("lsm/path_link")
int shk_path_link(unsigned long long *ctx)
{
	struct dentry *old = (struct dentry *)ctx[0];
	const struct path *dir = (const struct path *)ctx[1];
	int err = fs_check(old, SHK_FS_READ | SHK_FS_WRITE, SHK_USE_NEW);

	return err ? err : fs_create(dir);
}

SEC("lsm/path_unlink")
int shk_path_unlink(unsigned long long *ctx)
{
	return fs_check((struct dentry *)ctx[1], SHK_FS_DELETE, SHK_USE_NEW);
}

SEC("lsm/path_rmdir")
int shk_path_rmdir(unsigned long long *ctx)
{
	return fs_check((struct dentry *)ctx[1], SHK_FS_DELETE, SHK_USE_NEW);
}

SEC("lsm/path_rename")
int shk_path_rename(unsigned long long *ctx)
{
	const struct path *old_dir = (const struct path *)ctx[0];
	struct dentry *old = (struct dentry *)ctx[1];
	const struct path *new_dir = (const struct path *)ctx[2];
	struct dentry *repl = (struct dentry *)ctx[3];
	int err = fs_check(old, SHK_FS_DELETE, SHK_USE_NEW);

	if (!err)
		err = fs_create(new_dir);
	if (!err && repl && repl->d_inode) {
		/* Replaced (or, with RENAME_EXCHANGE, moved the other way). */
		err = fs_check(repl, SHK_FS_DELETE, SHK_USE_NEW);
		if (!err)
			err = fs_create(old_dir);
	}
	return err;
}
