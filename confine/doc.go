// Package confine runs a command under the kernel confinement of security
// allowlist (DESIGN.md §3.4): what it may execute, where it may write and
// what of the daemon's own state it may see are decided before the first
// exec and inherited by every descendant, whatever the programs do with
// their options, config files, environment, helpers or plugins.
//
// The daemon is never confined itself. It starts the command through a
// helper, the same binary entered at RunHelperIfRequested, in a new mount
// namespace (and a user namespace when the daemon is not root). The helper,
// on one locked OS thread:
//
//  1. masks the daemon's state (Spec.Hide) with empty read-only mounts;
//  2. sets no_new_privs and restricts itself with Landlock: EXECUTE only on
//     the files of Spec.Exec (bound to the inode the daemon checked) and
//     beneath Spec.ExecDirs, write access only beneath Spec.Write;
//  3. installs a seccomp filter that hands every execve and execveat of the
//     tree to a Supervisor in the daemon, which refuses a direct run of an
//     ELF interpreter (ld.so PROGRAM would load any readable program by
//     mmap, which Landlock does not check) and names every refused path on
//     the session's stderr;
//  4. runs the pipeline: one segment in its own place, several with pipes
//     between them, never through a shell the plan did not name.
//
// Landlock is the guarantee; the supervisor adds the interpreter rule and
// the messages. If the supervisor goes away, the kernel fails every later
// exec of the tree (ENOSYS): the tree can only lose rights.
package confine
