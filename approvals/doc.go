// Package approvals decides whether a shell command may run on a gateway or
// node host without asking a human: the exec-approvals file, policy
// resolution, shell command analysis, and allowlist and safe-bin evaluation
// of OpenClaw's exec tool, made stricter where OpenClaw had bypasses.
//
// # Flow
//
// A host (the gateway for host=gateway, a node agent for host=node) calls
// one function per command, Authorize, with everything it knows about the
// command, and does what the Authorization says:
//
//	levels := approvals.Configured(global, agent, approvals.DefaultSecurity(configuredHost, sandboxOn)).
//		Tighten(sessionDefaults).Tighten(perCall)             // a node: Tighten(its own limits)
//	f, _, err := approvals.Load(approvals.Path(stateDir))     // err: log it; f is usable
//	policy := approvals.Stricter(levels.Policy(), f.AgentPolicy(agentID))
//	auth, err := approvals.Authorize(approvals.Request{Host: host, Command: cmd, Cwd: cwd, Env: env, Policy: policy, …})
//	switch auth.Verdict {
//	case approvals.Allow:         // run auth.Argv (a plan) or the command as written (nil)
//	case approvals.NeedsApproval: // ask; keep auth.Binding; then Authorize again with Decision and Approved
//	case approvals.Deny:          // auth.Reason is the error text
//	}
//
// The security/ask ordering (Levels, Configured, Tighten, Stricter), the
// plan argv (PlanArgv), the environment of runs under allowlist
// (AllowlistEnv) and the approval binding exist only here. Analyze,
// Evaluate, Decide and Fallback are the steps Authorize takes, exported for
// tests and tools. Nothing in this package runs a command, and it keeps no
// global state.
//
// # Analysis
//
// Analyze parses the command with mvdan.cc/sh (bash dialect) and walks the
// syntax tree with type switches whose default refuses, so any node the
// analyser does not know makes the command not auto-allowable. A command is
// auto-allowable only if it is one pipeline of simple commands made of
// literal words. DESIGN.md §7 holds over OpenClaw: chaining (; && || and
// newlines), redirections (2>&1 and |& included), heredocs, here-strings,
// command and process substitution, background jobs, subshells, groups,
// functions, control flow, negation, assignments (IFS=, PATH=, env NAME=…),
// eval, source, state-changing builtins, parameter and arithmetic expansion,
// globs, brace expansion and line continuations are never auto-allowed.
// With ask on-miss or always they need approval like any miss; with ask off
// they are denied with "exec denied: allowlist miss". Each refusal carries a
// Reason constant and a Detail.
//
// Wrappers are judged by what they run, up to MaxWrapperDepth levels: env
// (options -i -u -C -v --, env -S strings that mean the same to env and to
// the shell), sh/bash/dash/zsh/ksh/… -c PAYLOAD (the payload is analysed as
// a command of its own; a shell without -c reads commands from stdin or a
// file and is refused), nice, nohup, timeout, stdbuf, flock (also -c), GNU
// time, command [-p], exec, busybox/toybox APPLET. env, command, exec,
// busybox and shells are dropped from the plan (what runs is the payload);
// nice, nohup, timeout, stdbuf, flock, time and env with options stay in
// front of the program, and must resolve to that tool in a trusted
// directory or to an allowlisted path. sudo and other privilege tools are
// refused even when allowlisted. Every other allowlisted program is
// trusted by path, as in OpenClaw (allowlisting an interpreter allows what
// it interprets). busybox APPLET is planned as the program named APPLET
// found on PATH, which is what gets checked and run.
//
// # What a program runs is the kernel's to decide
//
// Nothing here predicts what an allowlisted program would run through its
// options, config files, aliases, helpers or plugins: every list of that
// kind has a next entry. A run under security allowlist runs in the
// kernel confinement of package confine (DESIGN.md §3.4), which lets the
// whole tree execute only what ExecSet allows. Where a host cannot
// confine, Request.Unconfined makes every program that is not a safe bin
// need approval (ReasonUnconfined).
//
// # Binding
//
// A command that needs approval is bound to the SHA-256 of its
// executables and script operands (binding.go); an allow decision runs
// only if they still match: `approval no longer matches: <path> changed`.
//
// Quotes and escapes are resolved before anything is judged: `\ls`, `"ls"`
// and `l"s"` are all ls, resolved and matched like ls.
//
// # Evaluation
//
// Evaluate resolves each segment's executable to a real path (see
// Analysis.Evaluate for the rules) and matches it against the allowlist
// globs (§17.4: "*" stays within a path component, "**" crosses "/", "?" is
// one character other than "/", anchored, case-insensitive, "~" expanded;
// patterns without "/", "\" or "~" are ignored; the bare pattern "*"
// matches any resolvable executable) or accepts it as a safe bin: a
// configured name (DefaultSafeBins), real path in a trusted directory
// (DefaultTrustedDirs plus configured ones; never PATH), and arguments that
// pass the program's SafeBinProfile (stdin only: `head -c 5 /etc/shadow` is
// refused for its operand). A satisfied command comes with its plan:
// Evaluation.Argv and Evaluation.Rendered, every word single-quoted and every
// program replaced by its real absolute path, so what was approved is what
// runs (`env rg -n needle` → `'/usr/bin/rg' '-n' 'needle'`).
//
// # The approvals file
//
// Load, Parse, Save and Update handle <state-dir>/exec-approvals.json in
// OpenClaw's format. Saves are atomic (0600 temp file and rename, directory
// 0700), refuse symbolic links and hard-linked files (ErrUnsafePath), never
// replace a file that does not parse (ErrCorrupt), and use the content hash
// from Load for optimistic concurrency (ErrConflict).
package approvals
