// Package sandbox is the host=sandbox runtime of execmesh: it turns an exec
// request into the argv, environment and working directory that the session
// core spawns (session.ExecRequest Argv, Env, Workdir). It starts nothing
// itself; yield, timeouts, PTYs and kills stay with the session core.
//
// # Modes
//
// With ModeOff (the default) there is no sandbox runtime: Prepare returns
// no Argv, and the gateway refuses host=sandbox calls rather than run them
// with less policy than host=gateway's. With ModeBwrap a command runs under
// bubblewrap (bwrap, Debian package "bubblewrap"); New fails with
// ErrNotInstalled when bwrap is missing, and Runtime.Available reports, once
// per Runtime, whether bwrap can actually build a sandbox here (it cannot
// when user namespaces are disabled).
//
// # What a sandboxed command sees
//
//   - The host's root file system, read-only (--ro-bind / /).
//   - A fresh /dev and a /proc of its own pid namespace, so host processes
//     are invisible; a private, writable, empty /tmp.
//   - Its agent's workspace <root>/<agentId>, read-write, at the same
//     absolute path as on the host. Keeping the path means the cwd reported
//     in results, paths printed by tools and paths the agent passes back as
//     workdir all mean the same thing inside and outside; the workspace is
//     mounted after /tmp so a root under /tmp stays visible. The workspace
//     root itself is replaced by an empty read-only directory, so one agent
//     cannot read or write another's workspace, and so are the Config.Hide
//     directories: by default the gateway's state dir, which holds tokens
//     and keys, and /run, because read-only does not stop connecting to a
//     Unix socket such as /run/docker.sock (the resolv.conf target stays
//     visible). Everything else the gateway's user can read stays readable:
//     hide more (for example ~/.ssh, or directories holding other sockets)
//     through Config.Hide.
//   - Config.ReadOnlyBinds and ReadWriteBinds, mounted after the workspace
//     (so a destination may lie inside it).
//   - Its own pid, ipc and uts namespaces, and its own network namespace
//     with only a loopback device unless Config.Network is true.
//   - HOME set to the workspace, PATH set to DefaultPath, then the
//     Config.Env variables, then the request env (which wins),
//     OPENCLAW_SHELL=exec, and TERM=xterm-256color for PTY runs unless set.
//
// The command runs as /bin/sh -lc <command>, so /etc/profile applies. The
// profile resets PATH, so a requested env PATH and Request.PathPrepend are
// applied after it: their entries travel in the internal variable
// OPENCLAW_PREPEND_PATH and the command text gets PathPrefix in front. The
// PATH value is never pasted into the command text, so a value such as
// "$(touch /tmp/x)" stays a literal directory name.
//
// The environment is passed as --setenv arguments, because bwrap runs with
// --clearenv. Like every argument, they can be read in /proc/<pid>/cmdline of
// the bwrap process by other users of the host (unless /proc is mounted with
// hidepid); do not pass secrets to sandboxed commands on shared machines.
//
// # Working directory
//
// An empty workdir is the workspace; a relative one is joined to it; an
// absolute one must lie inside it. A ".." segment, a path (or a symlink
// target) outside the workspace, a missing path or a non-directory gives a
// *WorkdirError, whose text is OpenClaw's failed-workdir text: the caller
// returns it as a failed result and runs nothing. "~" is not expanded.
//
// # Process lifetime, sessions and terminals
//
// The session core holds a session's processes as for every host (see
// session.Containment): bwrap is the command it starts, cloned into the
// session's cgroup where cgroups are used, so the outer bwrap, its init
// and everything the command starts inside the sandbox belong to that
// group, and a kill ends them all (SIGTERM, cgroup.kill after the grace);
// usage and limits cover the sandboxed processes too. Independently of
// that, bwrap runs the command under its own init in a new pid namespace
// with --die-with-parent: when the outer bwrap dies, that init gets
// SIGKILL and the kernel kills every process left in the namespace,
// background jobs and setsid escapees included, which is what holds the
// tree in process-group containment. There is no grace period inside the
// sandbox: SIGTERM to the outer bwrap ends the tree at once. A command
// killed by a signal inside the sandbox is reported by bwrap as exit code
// 128+signal.
//
// Pipe runs get --new-session, so the command cannot reach the gateway's
// controlling terminal (TIOCSTI injection). PTY runs omit it: a new session
// would have no controlling terminal and no job control, and the terminal is
// the session's own PTY anyway. A consequence: the outer bwrap is in the
// terminal's foreground process group with the command, so Ctrl-C, Ctrl-Z
// or Ctrl-\ sent to a PTY session (process send-keys) signal bwrap too, and
// Ctrl-C ends the whole sandbox instead of interrupting, say, a REPL. The
// shell's job control (sh -m) cannot fix this: the outer group lies outside
// the pid namespace, and the shell fails (exit 2) when it hands the terminal
// back at exit.
package sandbox
