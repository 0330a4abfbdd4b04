// Package procs is the session runtime: processes in a session as objects
// with an id, held by a small per-process shim outside the agent, so that
// a process and its output outlive the client that started it and the
// agent itself.
//
// The path of a process, from start to end:
//
//  1. Manager.Start validates the request and asks the Door (the agent's
//     PrepareLaunch: the process.run record first, then the backend's
//     backend.Preparer) for a prepared launch: the launcher's arguments,
//     the descriptors it needs (on Linux the launcher binary, the process's
//     own cgroup below the session's, the session holder's pidfd) and that
//     cgroup's path.
//  2. It writes meta.json in STATE_DIR/procs/ID and hands the process to a
//     spare shim (spare.go: one started ahead, waiting on a socket pair;
//     the job is the directory and, as descriptors, the status pipe, the
//     shim's log and the prepared launch's), or, with none ready, waits
//     for one still starting, or, with none, starts a shim (the agent's
//     binary re-executed, or cmd/shinken-shim: ShimMain) passing the
//     descriptors. Either way the shim runs in a
//     session of its own; the agent is not the shim's reaper after a
//     restart, and nothing the agent's process group receives reaches it.
//  3. The shim marks what it inherited close-on-exec, makes the stdio
//     pipes (or, with a terminal, lets backend.StartFunc open one from the
//     session's own devpts), starts the launch (it is the process's
//     parent), writes started.json and reports on its status pipe.
//  4. While the process runs, the shim copies stdout and stderr into two
//     ring files (ring.go: byte offset o at position o mod RingBytes),
//     keeps each ring's end and write limit in rings.idx (one shared page:
//     the limit is raised before each write, so a reader that loads it
//     after reading knows what may have been overwritten meanwhile) and
//     tells every connected agent the new ends over ctl.sock; the agent
//     sends stdin, resize, signals, kill and the offsets of the slowest
//     live reader (a Follower: the shim then reads no more than the ring
//     can keep past them) the other way.
//  5. At the process's deadline, or on a kill, the shim kills its cgroup;
//     when the first process ends, it kills what is left of the tree,
//     drains the pipes, writes exit.json with the final ends, removes the
//     cgroup and exits; a spare shim instead lets go of the job and, the
//     agent willing, becomes a spare again (spare.go).
//
// Readers (logs, attach: Proc.Read and Proc.Next) read the ring files
// directly, drop what the write limit says may have been overwritten while
// they read, and are told how many bytes they asked for are gone: a byte
// returned is always the byte at its offset. Open (a
// restarted agent) re-adopts every process from its directory: the running
// ones through their shims' sockets, the ended ones from exit.json.
//
// It may be imported by the agent's API (agent/api) and the daemon; it
// reaches the OS through agent/backend only.
package procs
