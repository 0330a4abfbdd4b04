/*
 * shinken-exec: the session launcher for session processes, in C.
 *
 * shinken-agent starts it, from a thread that joined the session's mount,
 * IPC and PID namespaces, directly in the session's (or the run's) cgroup,
 * as root, with the spec package dataplane/boundary/child writes
 * (child.Launch.Args):
 *
 *   argv[0] "shinken-session-launch"
 *   argv[1] "v1,UID,GID,PRIVILEGED,STATUS,EXEFD,LANDLOCK,DROPENV"
 *   argv[2] the seccomp filter: struct sock_filter array, hex
 *   argv[3] the target's path (resolved inside the session)
 *   argv[4...] the target's argv
 *
 * It locks securebits, empties the capability bounding set, becomes
 * UID:GID with no supplementary groups, clears every capability set and the
 * ambient set, sets no_new_privs, enters a Landlock domain with the given
 * IPC scopes, installs the filter and executes the target. Any failure is
 * written to the status pipe (fd STATUS, close-on-exec: it closes with no
 * byte written when the exec succeeds) and ends the process with 127: the
 * target never runs unless every step succeeded. It is what the Go launcher
 * (child.launch) does, without the Go runtime's start-up; it is a separate
 * static binary because Go cannot run code between fork and exec. It has no
 * mode for the session init (cmd/shinken-launch does that).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_landlock_create_ruleset
#define SYS_landlock_create_ruleset 444
#define SYS_landlock_restrict_self 446
#endif

/* Securebits (linux/securebits.h): the same set as child.secureAll. */
#define SECURE_ALL ((1 << 0) | (1 << 1) | (1 << 2) | (1 << 3) | (1 << 5) | (1 << 6) | (1 << 7))

#define LAUNCH_ARG0 "shinken-session-launch"
#define START_ENV "GOMAXPROCS=1" /* child.StartEnv */
#define MAX_FILTER 4096          /* instructions: BPF_MAXINSNS */

extern char **environ;

static int status_fd = -1;

/* fail reports the reason on the status pipe (if known) and exits 127. */
__attribute__((format(printf, 1, 2), noreturn)) static void fail(const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	if (status_fd >= 0 && n > 0) {
		size_t len = (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1;
		ssize_t w = write(status_fd, msg, len);
		(void)w;
	}
	_exit(127);
}

/* errstr is errstr() as Go writes it (lower case first letter), so
 * that both launchers report the same text. */
static const char *errstr(void)
{
	static char buf[128];
	snprintf(buf, sizeof buf, "%s", strerror(errno));
	if (buf[0] >= 'A' && buf[0] <= 'Z')
		buf[0] = (char)(buf[0] - 'A' + 'a');
	return buf;
}

/* parse_int reads a decimal in [min, max] followed by term, and moves *s
 * past both. */
static int parse_int(const char **s, char term, long long min, long long max, long long *out)
{
	const char *p = *s;
	int neg = 0;
	long long v = 0;
	if (*p == '-') {
		neg = 1;
		p++;
	}
	if (*p < '0' || *p > '9')
		return -1;
	for (; *p >= '0' && *p <= '9'; p++) {
		v = v * 10 + (*p - '0');
		if (v > (1LL << 40))
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

static struct sock_filter filter[MAX_FILTER];

/* decode_filter reads the hex filter into filter; returns its length. */
static long decode_filter(const char *hex)
{
	size_t n = strlen(hex);
	if (n % 16 != 0 || n / 16 > MAX_FILTER)
		return -1;
	unsigned char *b = (unsigned char *)filter;
	for (size_t i = 0; i < n; i += 2) {
		int hi = hexval(hex[i]), lo = hexval(hex[i + 1]);
		if (hi < 0 || lo < 0)
			return -1;
		b[i / 2] = (unsigned char)(hi << 4 | lo);
	}
	/* The agent writes each instruction little-endian (code u16, jt,
	 * jf u8, k u32): the layout of struct sock_filter on the
	 * little-endian architectures the agent builds for. */
	return (long)(n / 16);
}

static void drop_privileges(uid_t uid, gid_t gid)
{
	if (uid == 0)
		fail("boundary: uid 0 without privileged");
	if (prctl(PR_SET_SECUREBITS, SECURE_ALL, 0, 0, 0) != 0)
		fail("securebits: %s", errstr());
	/* Every capability the kernel knows: PR_CAPBSET_READ fails with
	 * EINVAL past the last one. */
	int c;
	for (c = 0; prctl(PR_CAPBSET_READ, c, 0, 0, 0) >= 0; c++)
		if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) != 0)
			fail("drop capability %d from the bounding set: %s", c, errstr());
	if (errno != EINVAL || c <= CAP_SETPCAP)
		fail("read the bounding set at capability %d: %s", c, errstr());
	/* Raw syscalls: one thread, no libc set*id broadcast needed. */
	if (syscall(SYS_setgroups, 0, NULL) != 0)
		fail("setgroups: %s", errstr());
	if (syscall(SYS_setresgid, gid, gid, gid) != 0)
		fail("setresgid %u: %s", (unsigned)gid, errstr());
	if (syscall(SYS_setresuid, uid, uid, uid) != 0)
		fail("setresuid %u: %s", (unsigned)uid, errstr());
	/* SECBIT_NO_SETUID_FIXUP kept the capabilities through setresuid:
	 * clear them all (effective, permitted, inheritable). */
	struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
	struct __user_cap_data_struct data[2];
	memset(data, 0, sizeof data);
	if (syscall(SYS_capset, &hdr, data) != 0)
		fail("capset: %s", errstr());
	if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0)
		fail("clear ambient capabilities: %s", errstr());
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
		fail("no_new_privs: %s", errstr());
}

static void landlock_scope(uint64_t scoped)
{
	struct {
		uint64_t fs, net, scoped;
	} attr = {0, 0, scoped};
	long fd = syscall(SYS_landlock_create_ruleset, &attr, sizeof attr, 0);
	if (fd < 0)
		fail("landlock scope: create ruleset: %s", errstr());
	if (syscall(SYS_landlock_restrict_self, fd, 0) != 0)
		fail("landlock scope: restrict self: %s", errstr());
	close((int)fd);
}

int main(int argc, char **argv)
{
	long long n[7];
	if (argc < 5 || strcmp(argv[0], LAUNCH_ARG0) != 0 || strncmp(argv[1], "v1,", 3) != 0) {
		fprintf(stderr, "shinken-exec: started by shinken-agent only (the session launcher)\n");
		return 2;
	}
	/* The same bounds as child.ParseLaunch. */
	static const long long lo[7] = {0, 0, 0, 3, -1, 0, 0};
	static const long long hi[7] = {0xffffffffLL, 0xffffffffLL, 1, 1 << 20, 1 << 20, 0xffffffffLL, 1};
	const char *p = argv[1] + 3;
	for (int i = 0; i < 7; i++) {
		if (parse_int(&p, i < 6 ? ',' : '\0', lo[i], hi[i], &n[i]) != 0) {
			fprintf(stderr, "shinken-exec: bad launch spec\n");
			return 2;
		}
	}
	status_fd = (int)n[3];
	if (fcntl(status_fd, F_SETFD, FD_CLOEXEC) != 0)
		_exit(127); /* no status pipe to report on */
	if (n[4] >= 0 && fcntl((int)n[4], F_SETFD, FD_CLOEXEC) != 0)
		fail("close-on-exec launcher fd: %s", errstr());
	long len = decode_filter(argv[2]);
	if (len < 0)
		fail("bad seccomp filter");
	if (n[2] != 1) {
		drop_privileges((uid_t)n[0], (gid_t)n[1]);
		if (n[5] != 0)
			landlock_scope((uint64_t)n[5]);
		if (len > 0) {
			struct sock_fprog prog = {.len = (unsigned short)len, .filter = filter};
			long r = syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog);
			if (r != 0)
				fail("seccomp(SET_MODE_FILTER, TSYNC): %s", r < 0 ? errstr() : "a thread cannot be synchronised");
		}
	}
	if (n[6] == 1) {
		/* The agent added START_ENV last, for the Go launcher alone. */
		int e = 0;
		while (environ[e] != NULL)
			e++;
		if (e > 0 && strcmp(environ[e - 1], START_ENV) == 0)
			environ[e - 1] = NULL;
	}
	execve(argv[3], argv + 4, environ);
	fail("exec %s: %s", argv[3], errstr());
	return 127;
}
