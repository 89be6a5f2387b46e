package approvals

// Reasons say why a command cannot be auto-allowed in allowlist mode. They
// are stable strings meant for tests, logs and approval prompts; a human
// explanation goes in the accompanying Detail. Where OpenClaw 2026.9.6 has a
// name for the same risk (shell_analysis.json), the same string is used.
//
// Analysis reasons describe the command text; evaluation reasons describe
// what the command's executables resolve to on this host.
const (
	// ReasonEmpty: nothing to run (empty text, blanks, only comments).
	ReasonEmpty = "no commands to authorize"
	// ReasonEmptyArgv: AnalyzeArgv got no non-blank argument.
	ReasonEmptyArgv = "empty argv"
	// ReasonSyntax: the text does not parse as bash, or uses syntax the
	// analyser does not know (any unknown node is refused).
	ReasonSyntax = "syntax-error"
	// ReasonUnterminated: the text ends inside a quote, escape, heredoc or
	// other construct (mvdan.cc/sh reports the parse as incomplete).
	ReasonUnterminated = "unterminated shell quote/escape"
	// ReasonLineContinuation: a backslash-newline outside single quotes.
	// Shells splice these before tokenising, in places where parsers
	// disagree (`"$\<LF>(id)"` is a command substitution to bash), so
	// they are refused rather than interpreted.
	ReasonLineContinuation = "line-continuation"
	// ReasonCommandSubstitution: $(…) or `…`, quoted or not.
	ReasonCommandSubstitution = "command-substitution"
	// ReasonProcessSubstitution: <(…) or >(…).
	ReasonProcessSubstitution = "process-substitution"
	// ReasonRedirect: any redirection (>, >>, <, 2>&1, &>, <>, >|) and |&.
	ReasonRedirect = "redirect"
	// ReasonHeredoc: << or <<- here-documents, quoted delimiter or not.
	ReasonHeredoc = "heredoc"
	// ReasonHereString: <<< here-strings.
	ReasonHereString = "here-string"
	// ReasonDynamicExecutable: the command word itself is not a literal.
	ReasonDynamicExecutable = "dynamic-executable"
	// ReasonFunctionDefinition: f() { …; }.
	ReasonFunctionDefinition = "function-definition"

	// ReasonChain: more than one pipeline (;, &&, ||, newline).
	ReasonChain = "chaining"
	// ReasonBackground: a trailing &, coproc or disown.
	ReasonBackground = "background"
	// ReasonSubshell: ( … ).
	ReasonSubshell = "subshell"
	// ReasonGroup: { …; }.
	ReasonGroup = "group"
	// ReasonIf, ReasonFor, ReasonWhile, ReasonUntil, ReasonCase: compound
	// commands.
	ReasonIf    = "if"
	ReasonFor   = "for"
	ReasonWhile = "while"
	ReasonUntil = "until"
	ReasonCase  = "case"
	// ReasonNegation: ! pipeline.
	ReasonNegation = "negation"
	// ReasonCompound: other shell-level commands: time, (( )), let, [[ ]].
	ReasonCompound = "compound-command"

	// ReasonAssignment: NAME=value before a command, a bare assignment, or
	// env NAME=value. The environment of an auto-allowed command is never
	// changed by its text (IFS=, PATH=, LD_PRELOAD=, BASH_ENV=, …).
	ReasonAssignment = "env-assignment"
	// ReasonEval: eval.
	ReasonEval = "eval"
	// ReasonSource: source or . (runs a file as shell code).
	ReasonSource = "source"
	// ReasonBuiltin: a shell builtin that changes shell state or runs
	// nothing external (cd, export, alias, hash, command -v, bare exec, …).
	ReasonBuiltin = "shell-builtin"
	// ReasonPrivilege: sudo, doas, su, pkexec, runuser.
	ReasonPrivilege = "privilege-escalation"
	// ReasonShellWrapper: a shell that would read commands from stdin or a
	// script file, or a shell invocation the analyser cannot follow
	// (unknown options, unsupported shells such as fish).
	ReasonShellWrapper = "shell-wrapper"
	// ReasonWrapper: a dispatch wrapper (env, nice, timeout, stdbuf, flock,
	// nohup, time, command, exec, busybox) used with options or operands
	// the analyser does not accept, or around a whole pipeline.
	ReasonWrapper = "unsupported-wrapper"
	// ReasonWrapperDepth: more than MaxWrapperDepth nested wrappers.
	ReasonWrapperDepth = "wrapper-depth"
	// ReasonDynamicArgument: an argument whose value the shell computes:
	// $VAR, ${…}, $((…)), globs (* ? […]), brace expansion, ~user,
	// $'…' and $"…" quoting.
	ReasonDynamicArgument = "dynamic-argument"

	// ReasonUnconfined: the host cannot confine the run in the kernel
	// (DESIGN.md §3.4), so only a pipeline of safe bins runs without an
	// approval; the detail says why there is no confinement.
	ReasonUnconfined = "no-kernel-confinement"

	// ReasonUnresolved: the executable is not an existing executable
	// regular file (relative paths against the workdir, bare names on the
	// absolute PATH entries).
	ReasonUnresolved = "unresolved-executable"
	// ReasonUnsafeExecutable: the executable resolves to a shell, a dispatch
	// wrapper, a command carrier or a privilege tool, whatever it is named.
	ReasonUnsafeExecutable = "unsafe-executable"
	// ReasonUntrustedWrapper: a kept wrapper (nice, timeout, …) does not
	// resolve to that tool in a trusted directory or an allowlisted path.
	ReasonUntrustedWrapper = "untrusted-wrapper"
	// ReasonSafeBin: the executable is a configured safe bin but this use
	// is not stdin-only (file operands, unknown or denied flags) or it is
	// not in a trusted directory.
	ReasonSafeBin = "safe-bin-violation"
	// ReasonAllowlistMiss: the executable resolves but no allowlist entry
	// matches its real path and it is not a safe bin.
	ReasonAllowlistMiss = "allowlist-miss"
)

// Problem is one reason found in a command, with a human detail such as the
// operator, the word or the wrapper involved.
type Problem struct {
	Reason string `json:"reason"`
	Detail string `json:"detail,omitempty"`
}

// String renders the problem as "reason (detail)".
func (p Problem) String() string {
	if p.Detail == "" {
		return p.Reason
	}
	return p.Reason + " (" + p.Detail + ")"
}

// reasonClass orders reasons when a command has several problems: the
// primary reason is the first problem of the most serious class, in source
// order. Risks that change what runs or where data goes come first, then
// unsupported shapes, then command-level refusals, then dynamic arguments
// (which is how OpenClaw picks its reason, too).
func reasonClass(reason string) int {
	switch reason {
	case ReasonEmpty, ReasonEmptyArgv, ReasonSyntax, ReasonUnterminated:
		return 0
	case ReasonLineContinuation, ReasonCommandSubstitution, ReasonProcessSubstitution,
		ReasonRedirect, ReasonHeredoc, ReasonHereString, ReasonDynamicExecutable,
		ReasonFunctionDefinition:
		return 1
	case ReasonBackground, ReasonSubshell, ReasonGroup, ReasonIf, ReasonFor,
		ReasonWhile, ReasonUntil, ReasonCase, ReasonNegation, ReasonCompound, ReasonChain:
		return 2
	case ReasonDynamicArgument:
		return 4
	default:
		return 3
	}
}

// primary picks the reported problem among several.
func primary(ps []Problem) Problem {
	best := -1
	for i, p := range ps {
		if best < 0 || reasonClass(p.Reason) < reasonClass(ps[best].Reason) {
			best = i
		}
	}
	if best < 0 {
		return Problem{}
	}
	return ps[best]
}
