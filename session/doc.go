// Package session is execmesh's session core: it runs shell commands for
// the exec tool and answers the process tool, exactly as OpenClaw's
// gateway does, on whatever host it runs on (the gateway itself for
// host=gateway and host=sandbox, every node agent for host=node). It knows
// nothing of HTTP or NATS.
//
// A Manager runs each command through the user's shell (see ResolveShell)
// with OPENCLAW_SHELL=exec in its environment, on pipes with stdin at EOF
// or on a 120×30 pseudo-terminal; a command that is one program with
// plain arguments is handed to the shell as `exec <command>`, so that it
// runs in the shell's place (execCommand in shell.go). Manager.Exec waits
// up to the yield window: a command that ends in time gives a completed
// or failed result; otherwise the command becomes a background session
// with a readable id (nimble-coral) that Manager.Process lists, polls,
// logs, writes to, sends keys to, kills, clears and removes. Results carry OpenClaw's texts,
// statuses and details, so agents written for OpenClaw work unchanged
// (conformance fixtures in testdata/conformance).
//
// Output is sanitized by a streaming ANSI/VT parser, one per stream:
// control sequences are removed, other control characters shown as \xNN,
// invalid UTF-8 replaced by U+FFFD, cursor-position requests answered on
// PTYs. Each session keeps its newest 200000 characters, plus up to 30000
// unread characters per stream for poll, both counted in UTF-16 units as
// OpenClaw counts them; the caps drop the oldest text and never slow the
// command down.
//
// Every command runs in its own process group (PTY commands lead their own
// session) and, where the host has a writable cgroup v2 subtree, in a
// cgroup of its own that it is cloned into (see Containment and
// contain.go). Kill, remove, timeouts and Close end the whole tree,
// including processes that left the group with setsid: SIGTERM (and
// SIGCONT) to every process of it, then after Config.KillGrace cgroup.kill,
// or, without cgroups, SIGKILL to what a fresh, stop-and-reread pass over
// /proc finds. One Reaper per process takes the leaders' exit statuses
// (O(1) per exit) and reaps orphans without stealing exit statuses from
// os/exec. Results and exit events report what a session's processes
// cost (details.usage: CPU time from cpu.stat, memory and pids peaks
// where those controllers are enabled), and ExecRequest.Limits sets
// memory.max, pids.max and cpu.max where they are delegated. With
// Config.StateDir a restarted daemon ends what a crashed run left and
// reports the sessions it lost (Config.OnLost).
//
// Finished background sessions are kept for Config.JobTTL (at most 50, and
// 2,000,000 characters in all); foreground sessions are not kept. When a
// background session exits, Config.OnExit receives a protocol.ExitEvent
// whose Text, when Notify is set, is the exec.exit system event (see
// NotifyText).
package session
