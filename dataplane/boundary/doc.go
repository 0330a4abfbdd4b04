// Package boundary keeps one session from using, reading or signalling
// another session's authority (issue 12).
//
// Each session gets its own uid and gid (Config.UID: a pure function of the
// dataplane's session index), and its own PID, mount, IPC and cgroup
// namespaces, created once, at the session's first operation that needs
// them (lazy start, lazy_linux.go: Create makes none, so an idle session
// costs no process and no namespace; a launch, a file get or put, or a
// process grant starts the holder, exactly once; what the view is made of
// is laid out then) (the cgroup namespace
// is rooted at the session cgroup, and the session's cgroup2 mounts are
// made from it, read-only: it lists its own subtree, not the other
// sessions). A thread of the agent that ends with the work (package
// throwaway: never the main thread, which Go would keep, tainted, for the
// agent's life)
// unshares a new mount namespace, makes the host's root read-only
// (recursively), a private /tmp and /dev/shm (tmpfs of Config.TmpfsBytes
// each) and a minimal /dev there,
// starts catatonit -P from that thread with
// CLONE_NEWPID|CLONE_NEWIPC|CLONE_NEWCGROUP straight into the session
// cgroup, mounts cgroup2 from catatonit's cgroup namespace and a proc of
// its PID namespace on /proc (procfs's pidns option, Linux 6.15); where the kernel
// lacks it, the launcher binary (cmd/shinken-launch, package child; the
// agent's own binary if the launcher is missing, as the report says) in
// "session-init" mode, started with CLONE_NEWPID|CLONE_NEWNS|CLONE_NEWIPC|
// CLONE_NEWCGROUP,
// does the mounts from inside and executes catatonit. Either way the agent
// then gives the session's user a name and a home in that mount namespace
// (identity_linux.go: read-only /etc/passwd and /etc/group of its own,
// /tmp/home). catatonit is a
// single-threaded pid-1 reaper that holds the namespaces (one tiny process
// per session: this host's pid_max is 32768 and the product runs 10,000
// sessions). The agent keeps no descriptor of a holder it started (a
// pidfd is opened at each use: see holder); after a restart it finds each
// holder again in the session cgroup (the process whose NSpid ends in 1)
// and keeps a pidfd of those; a session with none found is adopted
// without one, as after Create.
//
// Which operations need the session's namespaces (and so its holder):
//
//   - Launch and Prepare (every process that enters the session: the
//     agent's run and exec, and the shims of agent/procs, which receive the
//     holder's pidfd from Prepare) join its PID, mount and IPC namespaces;
//   - OpenFile and WriteFile (the files API) join its mount namespace as
//     its uid;
//   - CheckPrograms, SetProcess and ProgramFiles resolve programs in its
//     view; the exec gate marks the view's mounts and sets
//     vm.memfd_noexec in its PID namespace;
//   - a view change (SetWorkspace, SetFiles: workspace, fs.scope grants and
//     revokes, persistence overlays, masks, /run sockets) changes the
//     holder's mounts when there is a holder, and only the recorded spec
//     when there is none;
//   - the session's Landlock ruleset is built in its mount namespace (at a
//     launch, or ahead after a start by another operation).
//
// What does not: Create, Adopt of a holderless session, Release, BoundProcess
// (the cgroup and the uid's RLIMIT_NPROC), HasMountAt (no holder, no mount),
// pause and resume (the session cgroup's cgroup.freeze), the kernel
// entries (egress, devices, handles: keyed on the session cgroup).
//
// Launch is the one path by which a process enters a session: on a locked
// OS thread the agent unshares CLONE_FS, joins the holder's namespaces with
// setns(pidfd), and starts the C launcher (cmd/shinken-exec) from that
// thread (the child inherits the mount and IPC namespaces and the PID
// namespace for children), directly in the session cgroup or, for a run, in
// a new cgroup of its own below it (killed whole with cgroup.kill). The
// child, still root, locks securebits, drops the capability bounding set,
// switches to the session uid, clears every capability set, sets
// no_new_privs, enters a Landlock domain (IPC scoping, ABI 6, and the
// credential baseline of landlock_linux.go: every filesystem right denied
// beneath the credential locations) and the seccomp filter the agent
// assembled, and executes the target. The tainted thread is never
// unlocked: Go ends it with the goroutine.
//
// Why a launcher in C: Go cannot run code between fork and exec, so every
// launch executes a launcher first, and a Go launcher's runtime start-up
// (about 1 ms here) was most of a launch: `run SESSION -- /bin/true` took
// about 4 times a plain spawn. The C launcher is freestanding (no libc: raw
// system calls on amd64 and arm64, under 400 lines, a 10 KB static binary):
// even a static glibc's start-up cost about 0.3 ms per launch here (its CPU
// feature probing executes cpuid, which traps in a VM). Started and waited
// for on its own it takes about 0.2 ms, a quarter of /bin/true (the Go
// launcher: 1.7 ms). It is built by make with clang from
// committed source (never a committed binary). It does the
// launch mode only: the session init (mounts, then catatonit) is done once
// per session, where start-up time matters less, by the Go launcher
// (cmd/shinken-launch, package child).
//
// The Go launcher's launch mode stays as the fallback when the C launcher
// is missing or unsafe (a `go build` without make, a host without clang):
// the agent then still confines every process, only slower, and Launcher()
// (the report's session_launcher) says so. That keeps two implementations
// of the confinement steps; both are held to the same tests (the suite
// uses the C launcher, TestGoLaunchMode runs the protection tests again
// through the Go launch mode), and each step is short enough to compare
// line by line (child.launch and cmd/shinken-exec/shinken-exec.c).
//
// Binaries that use the package (the agent, test binaries) call Main first
// thing in main or TestMain, so that they can stand in for the launcher.
package boundary
