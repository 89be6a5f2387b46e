package approvals

import (
	"fmt"
	"slices"
	"strings"
)

// Carriers are allowlisted programs that can run other programs, or write
// files where their job is reading, through their options, their config or
// their subcommands: `find -exec`, `git grep -O'cmd'`, `tar
// --to-command=cmd`, `sed 'e id'`, `awk 'BEGIN{system("id")}'`. Such an
// invocation is judged by what it would run: it is not auto-allowed, like
// any command that runs a program not on the allowlist (ReasonCommandCarrier
// with the option and what it does as the detail). The same program used
// for its job (`find . -name x`, `git log`, `tar -xzf a.tgz`, `sed -n 1p`,
// `awk '{print $1}'`) is trusted by path as before.
//
// Every tool with rules has an option table (options.go): long options are
// resolved against it before any rule applies, so abbreviations such as
// `--upload-pa=` or `--to-c` are seen as the options they stand for.
// Rules are by the executable's kind (its real base name without a version
// suffix, as for shells), so a link to git named g is checked as git.
//
// Some doors are closed at run time instead, by the environment a host
// gives every command it runs under security allowlist (AllowlistEnv):
// pagers never get a shell (PAGER=cat, GIT_PAGER=cat, MANPAGER=cat,
// LESSSECURE=1 for less started any other way), editors are ":", and git
// runs without repository hooks or fsmonitor. Programs whose shell escape
// cannot be closed that way are refused: editors (vi, vim, ex, nano,
// emacs, ed, …) read commands such as :!sh from their terminal or stdin
// whatever their arguments; more, pg and most have a ! command in a
// terminal (EvalOptions.PTY).

// carrierArgs returns why running argv (argv[0] the program, of kind name)
// is not the program's plain job, or "". It is applied by the written name
// during analysis and again by the real name during evaluation.
func carrierArgs(name string, argv []string) string {
	args := argv[1:]
	switch name {
	case "find", "gfind":
		return findRisk(args)
	case "git":
		return gitCarrier(argv)
	case "tar", "gtar", "bsdtar":
		return tarRisk(args)
	case "sed", "gsed":
		return sedRisk(args)
	case "awk", "gawk", "mawk", "nawk", "original-awk":
		return awkRisk(args)
	case "less":
		return lessRisk(args)
	case "man":
		return manOptions.parse(args).problem
	}
	return ""
}

// isEditor: interactive programs that run what is typed into them (vi's
// :!sh, ed's !sh, emacs' M-!), from a terminal or from stdin, whatever
// their arguments say. Allowlisting one by path would allow a shell.
func isEditor(name string) bool {
	switch name {
	case "vi", "vim", "nvim", "ex", "view", "rvim", "rview", "vimdiff", "gvim", "gview",
		"evim", "eview", "gvimdiff", "nvi", "elvis", "vile", "ed", "red", "emacs",
		"emacsclient", "nano", "pico", "rnano", "joe", "jed", "mcedit", "micro", "kak", "hx":
		return true
	}
	return false
}

// isTerminalPager: pagers with a shell escape (!cmd) in a terminal that no
// environment variable turns off (less has LESSSECURE, which AllowlistEnv
// sets). Without a terminal they copy their input and are harmless.
func isTerminalPager(name string) bool {
	switch name {
	case "more", "pg", "most":
		return true
	}
	return false
}

var findRisks = map[string]string{
	"-exec":    "runs a command for each file",
	"-execdir": "runs a command for each file",
	"-ok":      "runs a command for each file",
	"-okdir":   "runs a command for each file",
	"-fprint":  "writes a file",
	"-fprint0": "writes a file",
	"-fprintf": "writes a file",
	"-fls":     "writes a file",
	"-delete":  "deletes files",
}

// findRisk: find's primaries are whole words (no abbreviations); any word
// that is a risky primary counts, even where find would read it as the
// value of another primary (`-name -delete`): refusing that is harmless.
func findRisk(args []string) string {
	for _, t := range args {
		if why, ok := findRisks[t]; ok {
			return "find " + t + ": " + why
		}
	}
	return ""
}

// GNU tar. Operands are member and file names, so an unknown option is
// read as a flag; the table holds every risky option and the options with
// a value, so that the archive given to -f can be checked.
var tarOptions = optionSet{tool: "tar", abbrev: true, opts: []option{
	{long: "to-command", arg: argRequired, risk: "runs a command for each member"},
	{long: "checkpoint-action", arg: argRequired, risk: "can run a command (exec=)"},
	{long: "use-compress-program", short: 'I', arg: argRequired, risk: "runs a command"},
	{long: "rsh-command", arg: argRequired, risk: "runs a command"},
	{long: "rmt-command", arg: argRequired, risk: "runs a command"},
	{long: "info-script", short: 'F', arg: argRequired, risk: "runs a script"},
	{long: "new-volume-script", arg: argRequired, risk: "runs a script"},
	{long: "multi-volume", short: 'M', risk: "prompts for volumes with a ! shell escape"},
	{long: "index-file", arg: argRequired, risk: "writes a file"},
	{long: "volno-file", arg: argRequired, risk: "writes a file"},
	{long: "file", short: 'f', arg: argRequired},
	{long: "directory", short: 'C', arg: argRequired},
	{long: "files-from", short: 'T', arg: argRequired},
	{long: "exclude-from", short: 'X', arg: argRequired},
	{long: "listed-incremental", short: 'g', arg: argRequired},
	{long: "blocking-factor", short: 'b', arg: argRequired},
	{long: "format", short: 'H', arg: argRequired},
	{long: "label", short: 'V', arg: argRequired},
	{long: "starting-file", short: 'K', arg: argRequired},
	{long: "tape-length", short: 'L', arg: argRequired},
	{long: "newer", short: 'N', arg: argRequired},
	{long: "force-local"},
	// Harmless options whose names begin risky ones: an exact name wins
	// over an abbreviation.
	{long: "checkpoint", arg: argOptional},
}}

func tarRisk(args []string) string {
	args = tarOldStyle(args)
	p := tarOptions.parse(args)
	if p.problem != "" {
		return p.problem
	}
	if p.has("force-local", 0) {
		return ""
	}
	for _, f := range p.values("file", 'f') {
		if host, _, ok := strings.Cut(f, ":"); ok && !strings.Contains(host, "/") {
			return fmt.Sprintf("tar -f %s: a remote archive, opened through rsh or ssh", f)
		}
	}
	return ""
}

// tarOldStyle rewrites tar's traditional first argument (`tar cvfI a.tar
// cmd`: letters without a dash, their values in the following words, in
// order) into dashed options.
func tarOldStyle(args []string) []string {
	if len(args) == 0 || args[0] == "" || strings.HasPrefix(args[0], "-") {
		return args
	}
	var out []string
	rest := args[1:]
	for i := 0; i < len(args[0]); i++ {
		c := args[0][i]
		out = append(out, "-"+string(c))
		if o, ok := tarOptions.byShort(c); ok && o.arg == argRequired && len(rest) > 0 {
			out = append(out, rest[0])
			rest = rest[1:]
		}
	}
	return append(out, rest...)
}

// GNU sed 4.x: every option, so an unknown one is refused (it might take a
// value and change which word is the script).
var sedOptions = optionSet{tool: "sed", complete: true, abbrev: true, opts: []option{
	{long: "quiet", short: 'n'}, {long: "silent"}, {long: "debug"},
	{long: "expression", short: 'e', arg: argRequired},
	{long: "file", short: 'f', arg: argRequired, risk: "reads its script from a file, which is not judged"},
	{long: "follow-symlinks"},
	{long: "in-place", short: 'i', arg: argOptional, risk: "edits files in place"},
	{long: "line-length", short: 'l', arg: argRequired},
	{long: "null-data", short: 'z'}, {long: "zero-terminated"},
	{long: "posix"}, {long: "regexp-extended", short: 'E'}, {short: 'r'},
	{long: "separate", short: 's'}, {long: "sandbox"}, {long: "unbuffered", short: 'u'},
	{long: "binary", short: 'b'}, {long: "help"}, {long: "version"},
}}

func sedRisk(args []string) string {
	p := sedOptions.parse(args)
	if p.problem != "" {
		return p.problem
	}
	scripts := p.values("expression", 'e')
	if len(scripts) == 0 {
		if len(p.operands) == 0 {
			return "" // sed without a script prints usage
		}
		scripts = p.operands[:1]
	}
	return sedScriptRisk(strings.Join(scripts, "\n"))
}

// awk: gawk's options (mawk and busybox awk accept a subset). Options end
// at the program text.
var awkOptions = optionSet{tool: "awk", complete: true, abbrev: true, stopAtOperand: true, opts: []option{
	{long: "field-separator", short: 'F', arg: argRequired},
	{long: "assign", short: 'v', arg: argRequired},
	{long: "characters-as-bytes", short: 'b'}, {long: "traditional", short: 'c'},
	{long: "copyright", short: 'C'},
	{long: "dump-variables", short: 'd', arg: argOptional, risk: "writes a file"},
	{long: "debug", short: 'D', arg: argOptional, risk: "starts a debugger that reads commands"},
	{long: "source", short: 'e', arg: argRequired},
	{long: "exec", short: 'E', arg: argRequired, risk: "reads its program from a file, which is not judged"},
	{long: "file", short: 'f', arg: argRequired, risk: "reads its program from a file, which is not judged"},
	{long: "gen-pot", short: 'g'}, {long: "help", short: 'h'},
	{long: "include", short: 'i', arg: argRequired, risk: "includes awk source from a file"},
	{long: "trace", short: 'I'}, {long: "csv", short: 'k'},
	{long: "load", short: 'l', arg: argRequired, risk: "loads a shared library"},
	{long: "lint", short: 'L', arg: argOptional}, {long: "bignum", short: 'M'},
	{long: "use-lc-numeric", short: 'N'}, {long: "non-decimal-data", short: 'n'},
	{long: "pretty-print", short: 'o', arg: argOptional, risk: "writes a file"},
	{long: "optimize", short: 'O'},
	{long: "profile", short: 'p', arg: argOptional, risk: "writes a file"},
	{long: "posix", short: 'P'}, {long: "re-interval", short: 'r'},
	{long: "no-optimize", short: 's'}, {long: "sandbox", short: 'S'},
	{long: "lint-old", short: 't'}, {long: "version", short: 'V'},
	{short: 'W', arg: argRequired},
}}

// awkWOptions are the -W options (mawk's, and gawk's -W spelling of its
// long options) that neither run, load nor write anything.
var awkWOptions = []string{"version", "v", "usage", "help", "dump", "interactive", "i",
	"posix_space", "posix", "traditional", "lint", "random", "sprintf", "re-interval", "copyright"}

func awkRisk(args []string) string {
	p := awkOptions.parse(args)
	if p.problem != "" {
		return p.problem
	}
	for _, w := range p.values("", 'W') {
		name, _, _ := strings.Cut(w, "=")
		if !slices.Contains(awkWOptions, name) {
			return "awk -W " + w + ": not a known harmless option"
		}
	}
	if p.has("sandbox", 'S') {
		return "" // gawk --sandbox: no system(), redirections, pipes or extensions
	}
	progs := p.values("source", 'e')
	if len(progs) == 0 {
		if len(p.operands) == 0 {
			return "" // usage
		}
		progs = p.operands[:1]
	}
	return awkProgramRisk(strings.Join(progs, "\n"))
}

// less: risky options only (operands are files). LESSSECURE=1, which
// AllowlistEnv sets, disables the shell, pipe, editor, log file and
// lesskey features at run time as well.
var lessOptions = optionSet{tool: "less", abbrev: true, opts: []option{
	{long: "log-file", short: 'o', arg: argRequired, risk: "writes a file"},
	{long: "LOG-FILE", short: 'O', arg: argRequired, risk: "writes a file"},
	{long: "lesskey-file", short: 'k', arg: argRequired, risk: "reads key bindings and environment settings from a file"},
	{long: "lesskey-src", arg: argRequired, risk: "reads key bindings and environment settings from a file"},
	{long: "lesskey-content", arg: argRequired, risk: "sets key bindings and environment settings"},
	{long: "buffers", short: 'b', arg: argRequired},
	{long: "max-back-scroll", short: 'h', arg: argRequired},
	{long: "jump-target", short: 'j', arg: argRequired},
	{long: "pattern", short: 'p', arg: argRequired},
	{long: "prompt", short: 'P', arg: argRequired},
	{long: "tag", short: 't', arg: argRequired},
	{long: "tag-file", short: 'T', arg: argRequired},
	{long: "tabs", short: 'x', arg: argRequired},
	{long: "max-forw-scroll", short: 'y', arg: argRequired},
	{long: "window", short: 'z', arg: argRequired},
	{long: "shift", short: '#', arg: argRequired},
	{long: "color", short: 'D', arg: argRequired},
}}

func lessRisk(args []string) string {
	p := lessOptions.parse(args)
	if p.problem != "" {
		return p.problem
	}
	for _, op := range p.operands {
		// +cmd runs a less command at start: searches (+/x, +?x) and
		// movement (+G, +F, +123) only.
		cmd, ok := strings.CutPrefix(op, "+")
		if !ok || strings.HasPrefix(cmd, "/") || strings.HasPrefix(cmd, "?") {
			continue
		}
		if strings.Trim(cmd, "0123456789GgFpP%") != "" {
			return "less +" + cmd + ": an initial command other than a search or a move"
		}
	}
	return ""
}

// man (man-db): risky options only; MANPAGER=cat and PAGER=cat, which
// AllowlistEnv sets, keep the pager from being a shell.
var manOptions = optionSet{tool: "man", abbrev: true, opts: []option{
	{long: "pager", short: 'P', arg: argRequired, risk: "runs a pager command"},
	{long: "html", short: 'H', arg: argOptional, risk: "runs a browser"},
	{long: "gxditview", short: 'X', arg: argOptional, risk: "runs a viewer"},
	{long: "config-file", short: 'C', arg: argRequired, risk: "reads a configuration that names programs"},
	{long: "manpath", short: 'M', arg: argRequired},
	{long: "sections", short: 'S', arg: argRequired},
	{long: "extension", short: 'e', arg: argRequired},
	{long: "locale", short: 'L', arg: argRequired},
	{long: "systems", short: 'm', arg: argRequired},
	{long: "preprocessor", short: 'p', arg: argRequired},
	{long: "encoding", short: 'E', arg: argRequired},
	{long: "recode", short: 'R', arg: argRequired},
	{long: "troff-device", short: 'T', arg: argOptional},
}}
