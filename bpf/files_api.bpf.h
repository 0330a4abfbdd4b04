/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The ABI of the fs.scope LSM programs (files.bpf.c) shared with dataplane/
 * (files_lsm_linux.go): their own object (shkfs), which shares shk_sessions,
 * shk_handles, shk_counters, shk_stats and shk_events with the main one.
 */
#pragma once

#include <linux/types.h>

/* Dentries one check visits: the object's own and up to SHK_FS_MAX_DEPTH-1
 * ancestors. A path that meets no entry within them without reaching its
 * filesystem's root is refused (SHK_REASON_FS_DEPTH): an entry further up
 * could be a deny. */
#define SHK_FS_MAX_DEPTH 16

/* Rules one (session, inode) entry holds (one per grant naming the path,
 * its accesses folded together: user space refuses more). */
#define SHK_FS_MAX_RULES 8

/* Access bits. WRITE: open for writing, truncate, create, link or rename
 * into a directory; DELETE: unlink, rmdir, rename away; neither implies
 * READ. DENY: a deny rule (nothing from this rule's grant here; other
 * grants' rules on the inode still give theirs). */
#define SHK_FS_READ 1
#define SHK_FS_WRITE 2
#define SHK_FS_DELETE 4
#define SHK_FS_DENY 8
#define SHK_FS_ALL (SHK_FS_READ | SHK_FS_WRITE | SHK_FS_DELETE)

/* Key of shk_fs_inodes: one granted (or denied) root of one session, by
 * the inode its path named when the grant was made. dev is the kernel's
 * encoding (major << 20 | minor) of the inode's superblock device. */
struct shk_fs_key {
	__u32 session;
	__u32 dev;
	__u64 ino;
};

struct shk_fs_rule {
	__u32 handle;
	__u32 generation;
	__u32 access; /* SHK_FS_* */
	__u32 pad;
};

struct shk_fs_value {
	__u32 nrules;
	__u32 pad;
	struct shk_fs_rule rules[SHK_FS_MAX_RULES];
};

/* Value of shk_fs_sessions, indexed by session index: on = 1 while the
 * session holds fs entries (a session with on = 0 is never checked);
 * outside = the access allowed where no live entry covers a path:
 * SHK_FS_ALL where the session's mount view decides there, SHK_FS_READ
 * where nothing else confines the session's writes. */
struct shk_fs_session {
	__u32 on;
	__u32 outside;
};
