/*
 * shinken-exec: the session launcher for session processes, in C.
 *
 * shinken-agent starts it, from a thread that joined the session's mount,
 * IPC and PID namespaces, directly in the session's (or the run's) cgroup,
 * as root, with the spec package dataplane/boundary/child writes
 * (child.Launch.Args):
 *
 *   argv[0] "shinken-session-launch"
 *   argv[1] "v3,UID,GID,PRIVILEGED,STATUS,EXEFD,LANDLOCK,DROPENV,NPROC,FS"
 *           (or v4, the same and RULESET; or v2, the same less FS, or v1,
 *           less NPROC too)
 *   argv[2] the seccomp filter: struct sock_filter array, lower-case hex
 *   argv[3] v3 and v4: the Landlock rules, paths joined by newlines
 *           (v4: empty; the rules are in the ruleset at fd RULESET, which
 *           the agent built for the session and caches: entered with
 *           landlock_restrict_self, close-on-exec from the start and
 *           closed once entered, so the target never holds it)
 *   then the target's path (resolved inside the session)
 *   and the target's argv
 *
 * It sets RLIMIT_NPROC to NPROC (when not 0; before setresuid, so that
 * execve fails with EAGAIN if the uid already has NPROC tasks), locks
 * securebits, empties the capability bounding set, becomes
 * UID:GID with no supplementary groups, clears every capability set and the
 * ambient set, sets no_new_privs, enters a Landlock domain with the given
 * IPC scopes (and with FS: handling those filesystem rights, allowed beneath
 * each rule, the credential locations left out), installs the filter and executes the target: what the Go
 * launcher's launch mode (child.launch) does, in the same order. Any
 * failure ends the process (exit 127) before the target runs, and is
 * reported on the status pipe (fd STATUS, close-on-exec: it closes with no
 * byte written when the exec succeeds) as "WHAT\0ERRNO", which the agent
 * turns into an error. Every descriptor from the lowest of STATUS, EXEFD
 * and RULESET up is closed at exec (close_range, CLOSE_RANGE_CLOEXEC): the
 * target holds 0, 1, 2 and the descriptors the agent passed below them,
 * nothing the agent inherited.
 *
 * Freestanding (no libc, raw system calls, amd64 and arm64): a static
 * glibc spends about 0.3 ms of every launch in its start-up (CPU feature
 * probing with cpuid, which traps in a VM, and relocations), as much as the
 * rest of the launcher. It has no mode for the session init
 * (cmd/shinken-launch does that).
 */

typedef unsigned long u64;
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

#if defined(__x86_64__)
enum { O_NOFOLLOW = 0400000 };
enum { NR_write = 1, NR_close = 3, NR_openat = 257, NR_fcntl = 72, NR_prctl = 157, NR_prlimit64 = 302, NR_setgroups = 116, NR_setresuid = 117,
       NR_setresgid = 119, NR_capset = 126, NR_seccomp = 317, NR_execve = 59, NR_exit_group = 231 };
static long sys6(long n, long a, long b, long c, long d, long e)
{
	register long r10 __asm__("r10") = d;
	register long r8 __asm__("r8") = e;
	long ret;
	__asm__ volatile("syscall"
			 : "=a"(ret)
			 : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8)
			 : "rcx", "r11", "memory");
	return ret;
}
/* The kernel enters with argc at the stack pointer. */
__asm__(".text\n.global _start\n_start:\n\txor %ebp, %ebp\n\tmov %rsp, %rdi\n\tand $-16, %rsp\n\tcall start\n\thlt\n");
#elif defined(__aarch64__)
enum { O_NOFOLLOW = 0100000 };
enum { NR_write = 64, NR_close = 57, NR_openat = 56, NR_fcntl = 25, NR_prctl = 167, NR_prlimit64 = 261, NR_setgroups = 159, NR_setresuid = 147,
       NR_setresgid = 149, NR_capset = 91, NR_seccomp = 277, NR_execve = 221, NR_exit_group = 94 };
static long sys6(long n, long a, long b, long c, long d, long e)
{
	register long x8 __asm__("x8") = n;
	register long x0 __asm__("x0") = a;
	register long x1 __asm__("x1") = b;
	register long x2 __asm__("x2") = c;
	register long x3 __asm__("x3") = d;
	register long x4 __asm__("x4") = e;
	__asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4) : "memory");
	return x0;
}
__asm__(".text\n.global _start\n_start:\n\tmov x29, #0\n\tmov x30, #0\n\tmov x0, sp\n\tbl start\n\tbrk #0\n");
#else
#error "shinken-exec: amd64 and arm64 only (elsewhere the agent uses the Go launcher)"
#endif

/* Generic numbers (the same on both). */
enum { NR_close_range = 436, NR_landlock_create_ruleset = 444, NR_landlock_add_rule = 445, NR_landlock_restrict_self = 446 };
enum { CLOSE_RANGE_CLOEXEC = 1 << 2 };
enum { ENOENT = 2, EINVAL = 22 };
enum { AT_FDCWD = -100, O_PATH = 010000000, O_CLOEXEC = 02000000, LANDLOCK_RULE_PATH_BENEATH = 1 };
/* child.fileRights: execute, write_file, read_file, truncate, ioctl_dev. */
enum { FILE_RIGHTS = (1 << 0) | (1 << 1) | (1 << 2) | (1 << 14) | (1 << 15), MAX_FS = (1 << 17) - 1 };
enum { F_SETFD = 2, FD_CLOEXEC = 1 };
enum {
	PR_CAPBSET_READ = 23, PR_CAPBSET_DROP = 24, PR_SET_SECUREBITS = 28, PR_SET_NO_NEW_PRIVS = 38,
	PR_CAP_AMBIENT = 47, PR_CAP_AMBIENT_CLEAR_ALL = 4, CAP_SETPCAP = 8
};
enum { SECCOMP_SET_MODE_FILTER = 1, SECCOMP_FILTER_FLAG_TSYNC = 1 };
enum { CAPABILITY_VERSION_3 = 0x20080522 };
/* Securebits (linux/securebits.h): the same set as child.secureAll. */
enum { SECURE_ALL = (1 << 0) | (1 << 1) | (1 << 2) | (1 << 3) | (1 << 5) | (1 << 6) | (1 << 7) };
enum { MAX_FILTER = 4096 }; /* BPF_MAXINSNS */
enum { RLIMIT_NPROC = 6, MAX_NPROC = 1 << 22 }; /* child.MaxNProc */

#define sys(n, a, b, c) sys6(n, (long)(a), (long)(b), (long)(c), 0, 0)

static int status_fd = -1;

static u64 len(const char *s)
{
	u64 n = 0;
	while (s[n] != '\0')
		n++;
	return n;
}

static int eq(const char *a, const char *b)
{
	for (; *a != '\0' && *a == *b; a++, b++)
		;
	return *a == *b;
}

/* fail reports "WHAT\0ERRNO" on the status pipe (when it is known) and
 * exits 127; the agent writes the error. */
__attribute__((noreturn)) static void fail(const char *what, long ret)
{
	char msg[256];
	u64 n = 0;
	for (; what[n] != '\0' && n < sizeof msg - 24; n++)
		msg[n] = what[n];
	msg[n++] = '\0';
	char digits[24];
	int d = 0;
	u64 e = ret < 0 && ret > -4096 ? (u64)-ret : 0;
	do {
		digits[d++] = (char)('0' + e % 10);
		e /= 10;
	} while (e != 0);
	while (d > 0)
		msg[n++] = digits[--d];
	if (status_fd >= 0)
		sys(NR_write, status_fd, msg, n);
	for (;;)
		sys(NR_exit_group, 127, 0, 0);
}

#define check(what, call)                \
	do {                             \
		long r_ = (call);        \
		if (r_ != 0)             \
			fail(what, r_);  \
	} while (0)

/* usage: not started by the agent; nothing is reported (no status pipe). */
__attribute__((noreturn)) static void usage(void)
{
	static const char m[] = "shinken-exec: started by shinken-agent only (the session launcher)\n";
	sys(NR_write, 2, m, sizeof m - 1);
	for (;;)
		sys(NR_exit_group, 2, 0, 0);
}

/* parse_int reads a decimal in [min, max] followed by term, and moves *s
 * past both (the same bounds as child.ParseLaunch, or narrower). */
static int parse_int(const char **s, char term, long min, long max, long *out)
{
	const char *p = *s;
	int neg = *p == '-';
	long v = 0;
	p += neg;
	if (*p < '0' || *p > '9')
		return -1;
	for (; *p >= '0' && *p <= '9'; p++) {
		v = v * 10 + (*p - '0');
		if (v > (1L << 40))
			return -1;
	}
	if (neg)
		v = -v;
	if (v < min || v > max || *p != term)
		return -1;
	*s = term != '\0' ? p + 1 : p;
	*out = v;
	return 0;
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

/* struct sock_filter: code u16, jt, jf u8, k u32; the agent writes each
 * little-endian, the byte order of amd64 and arm64. */
static u8 filter[MAX_FILTER * 8] __attribute__((aligned(8)));

/* decode_filter reads the hex filter into filter; returns its length in
 * instructions, or -1. */
static long decode_filter(const char *hex)
{
	u64 n = len(hex);
	if (n % 16 != 0 || n / 16 > MAX_FILTER)
		return -1;
	for (u64 i = 0; i < n; i += 2) {
		int hi = hexval(hex[i]), lo = hexval(hex[i + 1]);
		if (hi < 0 || lo < 0)
			return -1;
		filter[i / 2] = (u8)(hi << 4 | lo);
	}
	return (long)(n / 16);
}

static void drop_privileges(long uid, long gid)
{
	if (uid == 0)
		fail("boundary: uid 0 without privileged", 0);
	check("securebits", sys6(NR_prctl, PR_SET_SECUREBITS, SECURE_ALL, 0, 0, 0));
	/* Every capability the kernel knows: PR_CAPBSET_READ fails with
	 * EINVAL past the last one. */
	long c, r;
	for (c = 0; (r = sys6(NR_prctl, PR_CAPBSET_READ, c, 0, 0, 0)) >= 0; c++)
		check("drop a capability from the bounding set", sys6(NR_prctl, PR_CAPBSET_DROP, c, 0, 0, 0));
	if (r != -EINVAL || c <= CAP_SETPCAP)
		fail("read the bounding set", r);
	check("setgroups", sys(NR_setgroups, 0, 0, 0));
	check("setresgid", sys(NR_setresgid, gid, gid, gid));
	check("setresuid", sys(NR_setresuid, uid, uid, uid));
	/* SECBIT_NO_SETUID_FIXUP kept the capabilities through setresuid:
	 * clear them all (effective, permitted, inheritable). */
	struct {
		u32 version;
		int pid;
	} hdr = {CAPABILITY_VERSION_3, 0};
	u32 data[6] = {0, 0, 0, 0, 0, 0}; /* two struct __user_cap_data_struct */
	check("capset", sys(NR_capset, &hdr, data, 0));
	check("clear ambient capabilities", sys6(NR_prctl, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0));
	check("no_new_privs", sys6(NR_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0));
}

static void landlock_scope(u64 scoped)
{
	struct {
		u64 fs, net, scoped;
	} attr = {0, 0, scoped};
	long fd = sys(NR_landlock_create_ruleset, &attr, sizeof attr, 0);
	if (fd < 0)
		fail("landlock scope: create ruleset", fd);
	check("landlock scope: restrict self", sys(NR_landlock_restrict_self, fd, 0, 0));
	sys(NR_close, fd, 0, 0);
}

/* landlock_fs: child.landlockFS, the same steps. rules is FSRules joined
 * by newlines (edited in place); each is opened O_PATH without following a
 * symbolic link, here in the session's mount namespace. ENOENT (gone since
 * the agent listed it), or EINVAL also for the file rights (a symbolic
 * link): no rule, so less access, never more. */
/* landlock_enter: child.landlockEnter. */
static void landlock_enter(long fd)
{
	long r = sys(NR_landlock_restrict_self, fd, 0, 0);
	sys(NR_close, fd, 0, 0);
	if (r != 0)
		fail("landlock: restrict self (the session's ruleset)", r);
}

static void landlock_fs(u64 fs, u64 scoped, char *rules)
{
	struct {
		u64 fs, net, scoped;
	} attr = {fs, 0, scoped};
	long fd = sys(NR_landlock_create_ruleset, &attr, sizeof attr, 0);
	if (fd < 0)
		fail("landlock: create ruleset", fd);
	while (*rules != '\0') {
		char *r = rules;
		while (*rules != '\0' && *rules != '\n')
			rules++;
		if (*rules == '\n')
			*rules++ = '\0';
		long pfd = sys6(NR_openat, AT_FDCWD, (long)r, O_PATH | O_CLOEXEC | O_NOFOLLOW, 0, 0);
		if (pfd == -ENOENT)
			continue;
		if (pfd < 0)
			fail("landlock: open rule", pfd);
		struct {
			u64 allowed;
			int parent;
		} __attribute__((packed)) pb = {fs, (int)pfd};
		long e = sys6(NR_landlock_add_rule, fd, LANDLOCK_RULE_PATH_BENEATH, (long)&pb, 0, 0);
		if (e == -EINVAL && (fs & FILE_RIGHTS) != 0) {
			pb.allowed = fs & FILE_RIGHTS;
			e = sys6(NR_landlock_add_rule, fd, LANDLOCK_RULE_PATH_BENEATH, (long)&pb, 0, 0);
			if (e == -EINVAL)
				e = 0;
		}
		sys(NR_close, pfd, 0, 0);
		if (e != 0)
			fail("landlock: add rule", e);
	}
	check("landlock: restrict self", sys(NR_landlock_restrict_self, fd, 0, 0));
	sys(NR_close, fd, 0, 0);
}

__attribute__((noreturn, used)) void start(long *sp)
{
	long argc = sp[0];
	char **argv = (char **)(sp + 1), **envp = argv + argc + 1;
	long n[10] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
	static const long lo[10] = {0, 0, 0, 3, -1, 0, 0, 0, 0, 3};
	static const long hi[10] = {0xffffffffL, 0xffffffffL, 1, 1 << 20, 1 << 20, 0xffffffffL, 1, MAX_NPROC, MAX_FS, 1 << 20};
	if (argc < 5 || !eq(argv[0], "shinken-session-launch") || argv[1][0] != 'v' || argv[1][1] < '1' || argv[1][1] > '4' ||
	    argv[1][2] != ',')
		usage();
	int version = argv[1][1] - '0';
	int nf = version == 4 ? 10 : version == 3 ? 9 : version == 2 ? 8 : 7; /* v2 has no FS, v1 no NPROC */
	if (version >= 3 && argc < 6)
		usage();
	const char *p = argv[1] + 3;
	for (int i = 0; i < nf; i++)
		if (parse_int(&p, i < nf - 1 ? ',' : '\0', lo[i], hi[i], &n[i]) != 0)
			usage();
	/* v3, v4: argv[3] is the Landlock rules, the target's path follows. */
	char *rules = version >= 3 ? argv[3] : 0;
	char **target = version >= 3 ? argv + 4 : argv + 3;
	if (n[8] == 0 && rules != 0 && rules[0] != '\0')
		usage();
	long ruleset = version == 4 ? n[9] : -1;
	if (ruleset >= 0 && (n[8] == 0 || rules[0] != '\0'))
		usage();
	if (sys(NR_fcntl, n[3], F_SETFD, FD_CLOEXEC) != 0)
		fail("no status pipe", 0); /* nothing to report on: exit 127 */
	status_fd = (int)n[3];
	/* The session's ruleset: never the target's (rules added to it would
	 * reach the session's next launches). */
	if (ruleset >= 0)
		check("close-on-exec ruleset", sys(NR_fcntl, ruleset, F_SETFD, FD_CLOEXEC));
	if (n[4] >= 0)
		check("close-on-exec launcher fd", sys(NR_fcntl, n[4], F_SETFD, FD_CLOEXEC));
	/* The target keeps the descriptors below the launcher's own (the
	 * ruleset, status pipe and launcher binary come last: 0, 1, 2 and
	 * the ExtraFiles the agent was given to pass); every one from there
	 * up closes at exec, whatever the agent inherited without
	 * close-on-exec from its own parent (a directory descriptor would
	 * let openat leave the session's mount view). */
	long keep = n[3];
	if (ruleset >= 0 && ruleset < keep)
		keep = ruleset;
	if (n[4] >= 0 && n[4] < keep)
		keep = n[4];
	check("close inherited descriptors (close_range)", sys(NR_close_range, keep, 0xffffffffL, CLOSE_RANGE_CLOEXEC));
	long insns = decode_filter(argv[2]);
	if (insns < 0)
		fail("bad seccomp filter", 0);
	if (n[2] != 1) {
		if (n[7] != 0) {
			u64 lim[2] = {(u64)n[7], (u64)n[7]}; /* struct rlimit64 */
			check("RLIMIT_NPROC", sys6(NR_prlimit64, 0, RLIMIT_NPROC, (long)lim, 0, 0));
		}
		drop_privileges(n[0], n[1]);
		if (ruleset >= 0)
			landlock_enter(ruleset);
		else if (n[8] != 0)
			landlock_fs((u64)n[8], (u64)n[5], rules);
		else if (n[5] != 0)
			landlock_scope((u64)n[5]);
		if (insns > 0) {
			struct {
				u16 len;
				u8 *filter;
			} prog = {(u16)insns, filter};
			long r = sys(NR_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog);
			if (r != 0)
				fail("seccomp(SET_MODE_FILTER, TSYNC)", r < 0 ? r : -EINVAL);
		}
	}
	if (n[6] == 1) {
		/* The agent added child.StartEnv last, for the Go launcher. */
		long e = 0;
		while (envp[e] != 0)
			e++;
		if (e > 0 && eq(envp[e - 1], "GOMAXPROCS=1"))
			envp[e - 1] = 0;
	}
	long r = sys(NR_execve, target[0], target + 1, envp);
	/* "exec PATH", as the Go launcher says it. */
	char what[200] = "exec ";
	u64 k = 5;
	for (const char *s = target[0]; *s != '\0' && k < sizeof what - 1; s++)
		what[k++] = *s;
	what[k] = '\0';
	fail(what, r);
}
