package approvals

import (
	"fmt"
	"slices"
	"strings"
)

// git is the carrier with the most doors, in four places:
//
//   - Its own options: -c and --config-env set any configuration (an alias
//     "!cmd", core.pager, core.sshCommand), --exec-path= moves where git
//     finds its commands. They are refused, and so is any top-level option
//     git does not have (git matches them exactly; an unknown one would
//     make the analyser misread which word is the subcommand).
//   - The subcommand: one that is not a git builtin is an alias (which
//     can be "!cmd" in any config git reads) or an external git-<name>
//     program found on PATH, so only builtins are auto-allowed, and of
//     those not the ones whose job is to run other programs (difftool,
//     mergetool, filter-branch, daemon, hook, credential, …).
//   - Subcommand options, resolved with parse-options' abbreviations
//     (`--upload-pa=` is --upload-pack): clone/fetch/pull/ls-remote -u
//     --upload-pack, push --receive-pack and --exec, rebase -x/--exec,
//     grep -O/--open-files-in-pager, --output of the diff family, clone
//     and init --template and clone --config (they plant hooks and
//     config), bisect run, submodule foreach, config writes and --edit,
//     help --web and --info. Transport URLs of the form <helper>::<address>
//     (ext::sh -c …) anywhere in the arguments are refused.
//   - The repository's own configuration, which an earlier command may
//     have written: see gitRepoRisk, applied during evaluation.
//
// Pagers, editors, hooks and fsmonitor are closed at run time by
// AllowlistEnv, whatever the configuration says.

// gitGlobalValueOptions take a value as the next word (or after "=").
var gitGlobalValueOptions = []string{"-C", "--git-dir", "--work-tree", "--namespace", "--attr-source", "--list-cmds"}

// gitGlobalFlags are git's top-level options without a value.
var gitGlobalFlags = []string{"-p", "--paginate", "-P", "--no-pager", "--no-replace-objects",
	"--no-lazy-fetch", "--no-optional-locks", "--no-advice", "--bare", "--literal-pathspecs",
	"--glob-pathspecs", "--noglob-pathspecs", "--icase-pathspecs", "--html-path", "--man-path",
	"--info-path", "--version", "-v", "--help", "-h", "--exec-path"}

// gitBuiltins are the git commands that may be auto-allowed (subject to
// the option rules). Everything else is an alias, an external command, or
// a command that runs programs by design.
var gitBuiltins = []string{"add", "am", "annotate", "apply", "archive", "bisect", "blame", "branch",
	"bugreport", "bundle", "cat-file", "check-attr", "check-ignore", "check-mailmap",
	"check-ref-format", "checkout", "checkout-index", "cherry", "cherry-pick", "clean", "clone",
	"column", "commit", "commit-graph", "commit-tree", "config", "count-objects", "describe",
	"diagnose", "diff", "diff-files", "diff-index", "diff-tree", "fast-export", "fast-import",
	"fetch", "fetch-pack", "fmt-merge-msg", "for-each-ref", "format-patch", "fsck", "fsck-objects",
	"gc", "get-tar-commit-id", "grep", "hash-object", "help", "index-pack", "init", "init-db",
	"interpret-trailers", "log", "ls-files", "ls-remote", "ls-tree", "mailinfo", "mailsplit",
	"merge", "merge-base", "merge-file", "merge-ours", "merge-recursive", "merge-recursive-ours",
	"merge-recursive-theirs", "merge-subtree", "merge-tree", "mktag", "mktree", "multi-pack-index",
	"mv", "name-rev", "notes", "pack-objects", "pack-redundant", "pack-refs", "patch-id", "pickaxe",
	"prune", "prune-packed", "pull", "push", "range-diff", "read-tree", "rebase", "reflog", "refs",
	"remote", "repack", "replace", "replay", "rerere", "reset", "restore", "rev-list", "rev-parse",
	"revert", "rm", "send-pack", "shortlog", "show", "show-branch", "show-index", "show-ref",
	"sparse-checkout", "stage", "stash", "status", "stripspace", "submodule", "switch",
	"symbolic-ref", "tag", "unpack-file", "unpack-objects", "update-index", "update-ref",
	"update-server-info", "var", "verify-commit", "verify-pack", "verify-tag", "version",
	"whatchanged", "worktree", "write-tree"}

// gitRunners are git commands whose job is to run other programs (tools,
// helpers, servers, hooks, commands in other repositories).
var gitRunners = map[string]string{
	"difftool": "runs a diff tool", "mergetool": "runs a merge tool",
	"filter-branch": "runs shell filters", "daemon": "runs a server with hooks",
	"hook": "runs hooks", "credential": "runs credential helpers",
	"credential-store": "is a credential helper", "credential-cache": "is a credential helper",
	"maintenance": "schedules and runs tasks", "for-each-repo": "runs git in other repositories",
	"merge-index": "runs a merge program", "instaweb": "runs a web server and a browser",
	"web--browse": "runs a browser", "send-email": "runs mail programs", "imap-send": "runs a tunnel command",
	"shell": "runs commands", "upload-pack": "runs transport hooks", "receive-pack": "runs hooks",
	"upload-archive": "serves archives", "fsmonitor--daemon": "runs a daemon",
	"submodule--helper": "is internal", "bisect--helper": "is internal",
}

// gitURLCommands take repository URLs, where <helper>::<address> runs the
// program git-remote-<helper>.
var gitURLCommands = []string{"clone", "fetch", "pull", "push", "ls-remote", "remote", "submodule",
	"archive", "fetch-pack", "send-pack"}

// gitSubRisk lists, per subcommand, the long options (parse-options names)
// and short letters that make it run a program or write where it should
// not. Abbreviations of the long names count.
type gitSubRisk struct {
	long  map[string]string
	short map[byte]string
}

var gitDiffOutput = map[string]string{"output": "writes its output to a file"}

var gitSubRisks = map[string]gitSubRisk{
	"clone": {long: map[string]string{"upload-pack": "runs a command as the remote's upload-pack",
		"template": "copies hooks and config from a directory", "config": "writes configuration (aliases, hooks) into the new repository"},
		short: map[byte]string{'u': "runs a command as the remote's upload-pack", 'c': "writes configuration into the new repository"}},
	"fetch":      {long: map[string]string{"upload-pack": "runs a command as the remote's upload-pack"}},
	"pull":       {long: map[string]string{"upload-pack": "runs a command as the remote's upload-pack"}},
	"ls-remote":  {long: map[string]string{"upload-pack": "runs a command as the remote's upload-pack"}, short: map[byte]string{'u': "runs a command as the remote's upload-pack"}},
	"fetch-pack": {long: map[string]string{"upload-pack": "runs a command as the remote's upload-pack", "exec": "runs a command as the remote's upload-pack"}},
	"push":       {long: map[string]string{"receive-pack": "runs a command as the remote's receive-pack", "exec": "runs a command as the remote's receive-pack"}},
	"send-pack":  {long: map[string]string{"receive-pack": "runs a command as the remote's receive-pack", "exec": "runs a command as the remote's receive-pack"}},
	"archive":    {long: map[string]string{"exec": "runs a command as the remote's upload-archive"}},
	"rebase":     {long: map[string]string{"exec": "runs a command after each commit"}, short: map[byte]string{'x': "runs a command after each commit"}},
	"grep":       {long: map[string]string{"open-files-in-pager": "runs a pager command"}, short: map[byte]string{'O': "runs a pager command"}},
	"init":       {long: map[string]string{"template": "copies hooks and config from a directory"}},
	"init-db":    {long: map[string]string{"template": "copies hooks and config from a directory"}},
	"help":       {long: map[string]string{"web": "runs a browser", "info": "runs info"}, short: map[byte]string{'w': "runs a browser", 'i': "runs info"}},
	"config":     {long: map[string]string{"edit": "runs an editor"}, short: map[byte]string{'e': "runs an editor"}},
	"diff":       {long: gitDiffOutput}, "log": {long: gitDiffOutput}, "show": {long: gitDiffOutput},
	"whatchanged": {long: gitDiffOutput}, "diff-files": {long: gitDiffOutput}, "diff-index": {long: gitDiffOutput},
	"diff-tree": {long: gitDiffOutput}, "range-diff": {long: gitDiffOutput}, "stash": {long: gitDiffOutput},
	"reflog": {long: gitDiffOutput}, "format-patch": {long: gitDiffOutput},
}

// gitInvocation is git's command line, split.
type gitInvocation struct {
	dirs   []string // -C directories, in order
	gitDir string   // --git-dir
	sub    string
	args   []string // after the subcommand
}

// parseGitGlobal splits git's top-level options from the subcommand. It
// returns why the options are refused, if they are.
func parseGitGlobal(argv []string) (gitInvocation, string) {
	var inv gitInvocation
	i := 1
	for ; i < len(argv); i++ {
		t := argv[i]
		if !strings.HasPrefix(t, "-") {
			break
		}
		name, value, hasValue := strings.Cut(t, "=")
		switch {
		case strings.HasPrefix(t, "-c"):
			return inv, "git -c: sets any configuration (aliases, pagers, hooks)"
		case name == "--config-env":
			return inv, "git --config-env: sets any configuration (aliases, pagers, hooks)"
		case name == "--exec-path" && hasValue:
			return inv, "git --exec-path=: runs git commands from another directory"
		case slices.Contains(gitGlobalFlags, t):
			continue
		case slices.Contains(gitGlobalValueOptions, name):
			if !hasValue {
				if name == "-C" && len(t) > 2 {
					return inv, "git option " + t + " is not known"
				}
				if i+1 >= len(argv) {
					return inv, "git " + name + " without a value"
				}
				i++
				value = argv[i]
			}
			switch name {
			case "-C":
				inv.dirs = append(inv.dirs, value)
			case "--git-dir":
				inv.gitDir = value
			}
			continue
		default:
			return inv, "git option " + t + " is not known"
		}
	}
	if i < len(argv) {
		inv.sub = argv[i]
		inv.args = argv[i+1:]
	}
	return inv, ""
}

// gitCarrier returns why a git command line runs something besides git, or
// "". Repository configuration is checked separately (gitRepoRisk).
func gitCarrier(argv []string) string {
	inv, why := parseGitGlobal(argv)
	if why != "" || inv.sub == "" {
		return why
	}
	sub, rest := inv.sub, inv.args
	if r, ok := gitRunners[sub]; ok {
		return "git " + sub + " " + r
	}
	if !slices.Contains(gitBuiltins, sub) {
		return fmt.Sprintf("git %s is not a git builtin: an alias (which may run a command) or an external git-%s program", sub, sub)
	}
	if slices.Contains(gitURLCommands, sub) {
		for _, t := range rest {
			if scheme, _, ok := strings.Cut(t, "::"); ok && isTransportName(lastField(scheme)) {
				return "git " + sub + " " + t + ": a remote-helper transport runs a program"
			}
		}
	}
	risk := gitSubRisks[sub]
	for _, t := range rest {
		if t == "--" {
			break
		}
		switch {
		case strings.HasPrefix(t, "--"):
			name, _, _ := strings.Cut(t[2:], "=")
			if strings.HasPrefix(name, "no-") {
				continue // negations reset options
			}
			for long, why := range risk.long {
				if name != "" && strings.HasPrefix(long, name) {
					w := "git " + sub + " --" + long
					if name != long {
						w += " (written --" + name + ")"
					}
					return w + ": " + why
				}
			}
		case len(t) > 1 && t[0] == '-':
			for j := 1; j < len(t); j++ {
				if why, ok := risk.short[t[j]]; ok {
					return fmt.Sprintf("git %s -%c: %s", sub, t[j], why)
				}
			}
		}
	}
	switch sub {
	case "bisect":
		if len(rest) > 0 && rest[0] == "run" {
			return "git bisect run: runs a command"
		}
	case "submodule":
		if slices.Contains(rest, "foreach") {
			return "git submodule foreach: runs a command in each submodule"
		}
	case "config":
		return gitConfigWrite(rest)
	}
	return ""
}

// lastField is what follows the last "=" of an option word
// (--upload-pack=x, --remote=ext::…), or the word.
func lastField(s string) string {
	if i := strings.LastIndexByte(s, '='); i >= 0 {
		return s[i+1:]
	}
	return s
}

// isTransportName: the <helper> of a <helper>::<address> URL.
func isTransportName(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.' || c == '_') {
			return false
		}
	}
	return true
}

// git config's options, by what they do. A write (set, add, unset, rename
// or remove a section, edit) plants an alias, pager or hook that runs at a
// later, innocent-looking git call.
var (
	gitConfigReads     = []string{"get", "get-all", "get-regexp", "get-urlmatch", "get-color", "get-colorbool", "list"}
	gitConfigWrites    = []string{"add", "replace-all", "unset", "unset-all", "rename-section", "remove-section", "edit"}
	gitConfigModifiers = []string{"global", "system", "local", "worktree", "file", "blob",
		"includes", "no-includes", "show-origin", "show-scope", "name-only", "null", "type", "bool",
		"int", "bool-or-int", "path", "expiry-date", "default", "all", "regexp", "value", "url",
		"fixed-value", "comment"}
	gitConfigValued = []string{"file", "blob", "type", "default", "value", "url", "comment"}
	// gitConfigSubcommands are the first words of the newer syntax
	// (git config get|list|set|unset|rename-section|remove-section|edit).
	gitConfigSubWrites = []string{"set", "unset", "rename-section", "remove-section", "edit"}
)

// prefixed returns the entries of list that name abbreviates, or only the
// exact one.
func prefixed(list []string, name string) []string {
	if slices.Contains(list, name) {
		return []string{name}
	}
	var out []string
	for _, l := range list {
		if strings.HasPrefix(l, name) {
			out = append(out, l)
		}
	}
	return out
}

// gitConfigWrite tells git config reads from writes, with parse-options'
// abbreviations, failing closed: a read is one read action (an option of
// the old syntax, or the first word of the new one: `git config get`,
// `git config list`) with only modifiers, or the old syntax without an
// action and exactly one name. Anything else counts as a write.
func gitConfigWrite(args []string) string {
	const write = "git config: writes configuration (aliases, pagers and hooks run at later git calls)"
	var actions, operands []string
	for i := 0; i < len(args); i++ {
		t := args[i]
		switch {
		case t == "--":
			operands = append(operands, args[i+1:]...)
			i = len(args)
		case strings.HasPrefix(t, "--"):
			name, _, hasValue := strings.Cut(t[2:], "=")
			if name == "" {
				return write
			}
			exact := slices.Contains(gitConfigReads, name) || slices.Contains(gitConfigModifiers, name)
			if !exact && len(prefixed(gitConfigWrites, name)) > 0 || slices.Contains(gitConfigWrites, name) {
				return write
			}
			reads, mods := prefixed(gitConfigReads, name), prefixed(gitConfigModifiers, name)
			if exact {
				if slices.Contains(gitConfigReads, name) {
					reads, mods = []string{name}, nil
				} else {
					reads, mods = nil, []string{name}
				}
			}
			switch {
			case len(reads) > 0 && len(mods) == 0:
				actions = append(actions, reads[0])
			case len(reads) == 0 && len(mods) == 1:
				if slices.Contains(gitConfigValued, mods[0]) && !hasValue {
					i++
				}
			default:
				return write // unknown, or ambiguous between a read and a modifier
			}
		case t == "-l":
			actions = append(actions, "list")
		case t == "-f":
			i++
		case t == "-z":
		case strings.HasPrefix(t, "-"):
			return write
		default:
			operands = append(operands, t)
		}
	}
	if len(actions) > 1 {
		return write
	}
	if len(actions) == 0 && len(operands) > 0 {
		switch first := operands[0]; {
		case slices.Contains(gitConfigSubWrites, first):
			return write
		case first == "list":
			if len(operands) != 1 {
				return write
			}
			return ""
		case first == "get":
			if len(operands) != 2 {
				return write
			}
			return ""
		}
	}
	switch {
	case len(actions) == 0:
		if len(operands) != 1 {
			return write // `git config name value [pattern]` sets
		}
	case actions[0] == "list":
		if len(operands) != 0 {
			return write
		}
	case actions[0] == "get-urlmatch":
		if len(operands) != 2 {
			return write
		}
	default:
		if len(operands) < 1 || len(operands) > 2 {
			return write
		}
	}
	return ""
}
