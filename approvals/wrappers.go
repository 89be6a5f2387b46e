package approvals

import (
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"mvdan.cc/sh/v3/syntax"
)

// commandName is the lower-cased base name of a command word, the name
// wrappers are recognised by. Lower case because case-insensitive file
// systems run /usr/bin/env for `ENV`; treating `ENV` as env is only ever
// stricter. Dynamic words have no name.
func commandName(w word) string {
	if w.dynamic {
		return ""
	}
	return strings.ToLower(filepath.Base(w.text))
}

// kindName strips a trailing version from an executable's base name
// ("bash5.2" → "bash", "ksh93" → "ksh") so that versioned installs of shells
// and wrappers are still recognised.
func kindName(base string) string {
	b := strings.ToLower(base)
	t := strings.TrimRight(b, "0123456789.")
	t = strings.TrimRight(t, "-_")
	if t == "" {
		return b
	}
	return t
}

// isShell: shells whose `-c` payload is analysed as bash text. The payload
// never runs through the shell: the plan runs the payload's commands.
func isShell(name string) bool {
	switch name {
	case "sh", "bash", "dash", "zsh", "ksh", "mksh", "lksh", "pdksh", "ash",
		"yash", "posh", "hush", "rbash":
		return true
	}
	return false
}

// isOtherShell: shells and shell-like interpreters with a different grammar;
// their payloads cannot be analysed as bash.
func isOtherShell(name string) bool {
	switch name {
	case "fish", "csh", "tcsh", "rc", "es", "nu", "elvish", "xonsh", "pwsh",
		"powershell", "scsh", "oil", "osh", "ysh":
		return true
	}
	return false
}

// isDispatchWrapper: wrappers the analyser unwraps.
func isDispatchWrapper(name string) bool {
	switch name {
	case "env", "nice", "nohup", "timeout", "stdbuf", "flock", "time",
		"command", "exec", "busybox", "toybox":
		return true
	}
	return false
}

// isPrivilege: tools that run a command as another user.
func isPrivilege(name string) bool {
	switch name {
	case "sudo", "doas", "su", "pkexec", "runuser", "sg", "newgrp", "ksu", "calife", "sudoedit":
		return true
	}
	return false
}

// isBuiltin: shell builtins that change the shell's state or only make sense
// inside the shell. Run from a plan they would not do what the text says.
func isBuiltin(name string) bool {
	switch name {
	case "alias", "unalias", "bind", "builtin", "caller", "cd", "compgen",
		"complete", "compopt", "declare", "dirs", "disown", "enable", "exit",
		"export", "fc", "fg", "bg", "getopts", "hash", "history", "jobs", "local",
		"logout", "mapfile", "popd", "pushd", "read", "readarray", "readonly",
		"return", "set", "shift", "shopt", "suspend", "trap", "type", "typeset",
		"ulimit", "umask", "unset", "wait", "let":
		return true
	}
	return false
}

// unsafeKind says why an executable, by the real name it resolves to, may
// never satisfy an allowlist on its own: shells would read commands from
// somewhere, dispatch wrappers are judged by what they run, privilege
// tools change who runs it. "" when none applies. What any other
// allowlisted program runs, the kernel confinement decides (DESIGN.md
// §3.4), not a list here.
func unsafeKind(realBase string) string {
	n := kindName(realBase)
	switch {
	case isShell(n) || isOtherShell(n):
		return "shell"
	case isDispatchWrapper(n):
		return "dispatch wrapper"
	case isPrivilege(n):
		return "privilege tool"
	}
	return ""
}

// unwrap follows dispatch wrappers from args and records the resulting
// segment(s). written is the command as written, for the segment's Argv.
func (a *analyzer) unwrap(written []string, args []word, st state) {
	emit := func(program []word) {
		a.segs = append(a.segs, planSeg{
			argv: written, via: st.via, wrappers: st.wrappers, program: program, chdir: st.chdir,
		})
	}
	for {
		if len(args) == 0 {
			a.add(ReasonWrapper, "wrapper without a command")
			emit(nil)
			return
		}
		if st.depth > MaxWrapperDepth {
			a.add(ReasonWrapperDepth, strings.Join(st.via, " → "))
			emit(nil)
			return
		}
		name := commandName(args[0])
		switch {
		case name == "":
			emit(args) // dynamic executable, reported by the caller
			return

		case name == "env":
			kept, rest, chdir, ok := a.parseEnv(args)
			if !ok {
				emit(nil)
				return
			}
			if len(rest) == 0 {
				emit(args) // `env` alone prints the environment
				return
			}
			if chdir != nil {
				if st.chdir != nil && !chdir.tilde && !filepath.IsAbs(chdir.text) {
					// A relative -C is relative to the previous one.
					chdir = &word{text: filepath.Join(st.chdir.text, chdir.text), tilde: st.chdir.tilde}
				}
				st.chdir = chdir
			}
			st = st.nest("env", kept)
			args = rest

		case name == "command":
			i := 1
			for ; i < len(args) && strings.HasPrefix(args[i].text, "-") && !args[i].dynamic; i++ {
				t := args[i].text
				if t == "--" {
					i++
					break
				}
				if t == "-p" {
					continue
				}
				if strings.Trim(t[1:], "pvV") == "" && strings.ContainsAny(t, "vV") {
					a.add(ReasonBuiltin, "command "+t)
				} else {
					a.add(ReasonWrapper, "command option "+t)
				}
				emit(args)
				return
			}
			if i >= len(args) {
				a.add(ReasonBuiltin, "command without a program")
				emit(args)
				return
			}
			st = st.nest("command", nil)
			args = args[i:]

		case name == "exec":
			i := 1
			if i < len(args) && args[i].text == "--" {
				i++
			}
			if i < len(args) && strings.HasPrefix(args[i].text, "-") {
				a.add(ReasonWrapper, "exec option "+args[i].text)
				emit(args)
				return
			}
			if i >= len(args) {
				a.add(ReasonBuiltin, "exec without a command")
				emit(args)
				return
			}
			st = st.nest("exec", nil)
			args = args[i:]

		case name == "nice", name == "nohup", name == "timeout", name == "stdbuf", name == "time":
			n, ok := a.wrapperOptions(name, args)
			if !ok {
				emit(nil)
				return
			}
			if n >= len(args) {
				if name == "nice" || name == "time" {
					emit(args) // prints the niceness / usage; runs nothing else
				} else {
					a.add(ReasonWrapper, name+" without a command")
					emit(nil)
				}
				return
			}
			st = st.nest(name, args[:n])
			args = args[n:]

		case name == "flock":
			n, ok := a.wrapperOptions(name, args)
			if !ok {
				emit(nil)
				return
			}
			if n+1 >= len(args) {
				emit(args) // `flock FD`: locks a descriptor, runs nothing
				return
			}
			kept := args[:n+1] // options and the lock file
			rest := args[n+1:]
			if t := rest[0].text; t == "-c" || t == "--command" {
				if len(rest) != 2 {
					a.add(ReasonWrapper, "flock -c takes exactly one command string")
					emit(nil)
					return
				}
				a.payload(rest[1], st.nest("flock -c", kept), emit)
				return
			}
			st = st.nest("flock", kept)
			args = rest

		case name == "busybox" || name == "toybox":
			if len(args) < 2 || strings.HasPrefix(args[1].text, "-") || args[1].dynamic {
				emit(args) // --list, --install, …: busybox itself
				return
			}
			// busybox APPLET runs the applet; the plan runs the program of
			// that name found on PATH instead, which is what gets checked.
			st = st.nest(name, nil)
			args = args[1:]

		case isShell(name):
			a.shell(name, args, st, emit)
			return

		case isOtherShell(name):
			a.add(ReasonShellWrapper, name+" is not analysed")
			emit(args)
			return

		case isPrivilege(name):
			a.add(ReasonPrivilege, name)
			emit(args)
			return

		case name == "eval":
			a.add(ReasonEval, "eval")
			emit(args)
			return

		case name == "source" || name == ".":
			a.add(ReasonSource, name)
			emit(args)
			return

		case isBuiltin(name):
			a.add(ReasonBuiltin, name)
			emit(args)
			return

		default:
			emit(args)
			return
		}
	}
}

// shell handles `sh [options] -c PAYLOAD`. Without -c the shell reads
// commands from stdin or a script file, which the analyser cannot see.
func (a *analyzer) shell(name string, args []word, st state, emit func([]word)) {
	sawC := false
	i := 1
options:
	for ; i < len(args); i++ {
		w := args[i]
		t := w.text
		switch {
		case w.dynamic && sawC:
			break options // the command string; payload reports it
		case w.dynamic:
			a.add(ReasonShellWrapper, name+" with a dynamic option")
			emit(nil)
			return
		case t == "--" || t == "-":
			i++
			break options
		case t == "--login" || t == "--noprofile" || t == "--norc":
		case strings.HasPrefix(t, "--"):
			a.add(ReasonShellWrapper, name+" option "+t)
			emit(nil)
			return
		case len(t) > 1 && (t[0] == '-' || t[0] == '+'):
			// Single-letter options that do not change how the payload is
			// parsed. Options taking an argument (-o, -O) are refused.
			for _, c := range t[1:] {
				switch {
				case c == 'c' && t[0] == '-':
					sawC = true
				case strings.ContainsRune("lixeuvfpn", c):
				default:
					a.add(ReasonShellWrapper, name+" option "+t)
					emit(nil)
					return
				}
			}
		default:
			break options
		}
	}
	if !sawC {
		a.add(ReasonShellWrapper, name+" without -c reads commands from stdin or a script")
		emit(args)
		return
	}
	if i >= len(args) {
		a.add(ReasonShellWrapper, name+" -c without a command string")
		emit(nil)
		return
	}
	if i+1 < len(args) {
		// Extra words become $0, $1, … of the payload. A literal payload
		// cannot use them, and refusing keeps the plan equal to the text.
		a.add(ReasonShellWrapper, name+" -c with arguments after the command string")
	}
	a.payload(args[i], st.nest(name+" -c", nil), emit)
}

// payload analyses a command string run by a wrapper (sh -c, flock -c) as
// shell text of its own.
// emit records the wrapper itself as the segment when the payload cannot be
// analysed.
func (a *analyzer) payload(w word, st state, emit func([]word)) {
	if w.dynamic {
		a.add(ReasonDynamicArgument, "command string "+w.text)
		emit(nil)
		return
	}
	if st.depth > MaxWrapperDepth {
		a.add(ReasonWrapperDepth, strings.Join(st.via, " → "))
		emit(nil)
		return
	}
	before := len(a.segs)
	a.source(w.text, st)
	if len(st.wrappers) > 0 && len(a.segs)-before > 1 {
		// nice/timeout/… would apply to the whole pipeline, which a plan of
		// single argvs cannot express.
		a.add(ReasonWrapper, "wrapper around a pipeline")
	}
}

var (
	reInt      = regexp.MustCompile(`^[+-]?[0-9]+$`)
	reDuration = regexp.MustCompile(`^([0-9]+\.?[0-9]*|\.[0-9]+)[smhd]?$`)
	reBufMode  = regexp.MustCompile(`^(L|0|[0-9]+[KMGTPEZYkmgtpezy]?B?)$`)
	reSignal   = regexp.MustCompile(`^[A-Za-z0-9+-]+$`)
)

// wrapperOptions parses the options of nice, nohup, timeout, stdbuf, time and
// flock and returns the index of the first word after them (for timeout,
// after the duration; for flock, the lock file's index). Unknown options are
// refused: an option the analyser does not know may take a value and shift
// what it thinks the command is.
func (a *analyzer) wrapperOptions(name string, args []word) (int, bool) {
	refuse := func(t string) (int, bool) {
		a.add(ReasonWrapper, name+" option "+t)
		return 0, false
	}
	// Per wrapper: the options without a value (flags) and the ones with a
	// value (values), each with a validator for the value.
	type valued struct {
		long, short string
		valid       func(string) bool
	}
	var flags []string
	var values []valued
	anyValue := func(string) bool { return true }
	switch name {
	case "nice":
		values = []valued{{"--adjustment", "-n", reInt.MatchString}}
	case "nohup":
	case "timeout":
		flags = []string{"--preserve-status", "--foreground", "-v", "--verbose"}
		values = []valued{{"--kill-after", "-k", reDuration.MatchString}, {"--signal", "-s", reSignal.MatchString}}
	case "stdbuf":
		values = []valued{{"--input", "-i", reBufMode.MatchString}, {"--output", "-o", reBufMode.MatchString}, {"--error", "-e", reBufMode.MatchString}}
	case "time":
		flags = []string{"-p", "--portability", "-v", "--verbose", "-q", "--quiet"}
		values = []valued{{"--format", "-f", anyValue}}
	case "flock":
		flags = []string{"-s", "--shared", "-x", "-e", "--exclusive", "-u", "--unlock", "-n", "--nb", "--nonblock", "-o", "--close", "-F", "--no-fork", "--verbose"}
		values = []valued{{"--timeout", "-w", reDuration.MatchString}, {"--wait", "", reDuration.MatchString}, {"--conflict-exit-code", "-E", reInt.MatchString}}
	}
	i := 1
	nopts := 0
loop:
	for i < len(args) {
		w := args[i]
		t := w.text
		if w.dynamic {
			a.add(ReasonWrapper, name+" with a dynamic operand")
			return 0, false
		}
		switch {
		case t == "--":
			i++
			break loop
		case !strings.HasPrefix(t, "-") || t == "-":
			break loop
		case name == "nice" && reInt.MatchString(t[1:]):
			i++ // legacy `nice -10 cmd`
			nopts++
			continue
		case slices.Contains(flags, t):
			i++
			nopts++
			continue
		}
		matched := false
		for _, v := range values {
			var val string
			var have bool
			switch {
			case t == v.long || (v.short != "" && t == v.short):
				if i+1 >= len(args) || args[i+1].dynamic {
					return refuse(t)
				}
				val, have = args[i+1].text, true
				i++
			case strings.HasPrefix(t, v.long+"="):
				val, have = t[len(v.long)+1:], true
			case v.short != "" && strings.HasPrefix(t, v.short) && len(t) > len(v.short):
				val, have = t[len(v.short):], true
			}
			if have {
				if !v.valid(val) {
					return refuse(t)
				}
				matched = true
				break
			}
		}
		if !matched {
			return refuse(t)
		}
		i++
		nopts++
	}
	switch name {
	case "timeout":
		if i >= len(args) || args[i].dynamic || !reDuration.MatchString(args[i].text) {
			a.add(ReasonWrapper, "timeout without a valid duration")
			return 0, false
		}
		i++
	case "stdbuf":
		if nopts == 0 {
			a.add(ReasonWrapper, "stdbuf without a buffering option")
			return 0, false
		}
	case "flock":
		if i >= len(args) || args[i].dynamic {
			a.add(ReasonWrapper, "flock without a lock file")
			return 0, false
		}
	}
	return i, true
}

// parseEnv parses GNU env's options and assignments. It returns the wrapper
// to keep in front of the command (nil when env changes nothing and can be
// dropped), the command, and the directory of -C.
func (a *analyzer) parseEnv(args []word) (kept []word, rest []word, chdir *word, ok bool) {
	envWord := args[0]
	var opts []word
	queue := append([]word(nil), args[1:]...)
	splits := 0
	lit := func(s string) word { return word{text: s} }
loop:
	for len(queue) > 0 {
		w := queue[0]
		t := w.text
		if w.dynamic {
			a.add(ReasonWrapper, "env with a dynamic operand")
			return nil, nil, nil, false
		}
		// takeValue returns the value of an option that has one, attached
		// (rest of the word) or as the next word.
		takeValue := func(attached string, hasAttached bool) (word, bool) {
			if hasAttached {
				return lit(attached), true
			}
			if len(queue) < 2 || queue[1].dynamic {
				a.add(ReasonWrapper, "env "+t+" without a value")
				return word{}, false
			}
			v := queue[1]
			queue = queue[1:]
			return v, true
		}
		handle := func(opt byte, attached string, hasAttached bool) bool {
			switch opt {
			case 'i':
				opts = append(opts, lit("-i"))
			case 'v':
				opts = append(opts, lit("-v"))
			case 'u':
				v, ok := takeValue(attached, hasAttached)
				if !ok {
					return false
				}
				opts = append(opts, lit("-u"), v)
			case 'C':
				v, ok := takeValue(attached, hasAttached)
				if !ok {
					return false
				}
				opts = append(opts, lit("-C"), v)
				vv := v
				chdir = &vv
			case 'S':
				v, ok := takeValue(attached, hasAttached)
				if !ok {
					return false
				}
				splits++
				if splits > MaxWrapperDepth {
					a.add(ReasonWrapperDepth, "env -S")
					return false
				}
				words, ok := a.splitEnvString(v.text)
				if !ok {
					return false
				}
				// The split words take the place of the option, and env
				// parses them as options, assignments and command.
				queue = append(append([]word{{}}, words...), queue[1:]...)
			default:
				a.add(ReasonWrapper, "env option -"+string(opt))
				return false
			}
			return true
		}
		switch {
		case t == "--":
			queue = queue[1:]
			break loop
		case t == "-" || t == "--ignore-environment":
			opts = append(opts, lit("-i"))
		case t == "--debug":
			opts = append(opts, lit("-v"))
		case strings.HasPrefix(t, "--unset"), strings.HasPrefix(t, "--chdir"), strings.HasPrefix(t, "--split-string"):
			long, val, has := strings.Cut(t, "=")
			var opt byte
			switch long {
			case "--unset":
				opt = 'u'
			case "--chdir":
				opt = 'C'
			case "--split-string":
				opt = 'S'
			default:
				a.add(ReasonWrapper, "env option "+t)
				return nil, nil, nil, false
			}
			if !handle(opt, val, has) {
				return nil, nil, nil, false
			}
		case strings.HasPrefix(t, "--"):
			a.add(ReasonWrapper, "env option "+t)
			return nil, nil, nil, false
		case strings.HasPrefix(t, "-"):
			for j := 1; j < len(t); j++ {
				c := t[j]
				if c == 'u' || c == 'C' || c == 'S' {
					if !handle(c, t[j+1:], j+1 < len(t)) {
						return nil, nil, nil, false
					}
					break
				}
				if !handle(c, "", false) {
					return nil, nil, nil, false
				}
			}
		case strings.Contains(t, "="):
			name, _, _ := strings.Cut(t, "=")
			a.add(ReasonAssignment, "env "+assignmentDetail(name))
			// Keep parsing so the command is still known for display and
			// allow-always.
		default:
			break loop
		}
		queue = queue[1:]
	}
	if len(opts) > 0 {
		kept = append([]word{envWord}, opts...)
	}
	return kept, queue, chdir, true
}

// splitEnvString splits the string of env -S. env has its own escape and
// ${VAR} language; only strings where it and the shell grammar agree are
// accepted: no backslash, dollar, comment sign or control character, and a
// single simple command of plain or quoted words.
func (a *analyzer) splitEnvString(s string) ([]word, bool) {
	refuse := func(why string) ([]word, bool) {
		a.add(ReasonWrapper, "env -S "+why)
		return nil, false
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f || r == '\\' || r == '$' || r == '#' {
			return refuse("string with escapes, expansions or comments")
		}
	}
	if strings.TrimSpace(s) == "" {
		return nil, true
	}
	f, err := syntax.NewParser(syntax.Variant(syntax.LangBash)).Parse(strings.NewReader(s), "")
	if err != nil || len(f.Stmts) != 1 {
		return refuse("string that is not a single command")
	}
	st := f.Stmts[0]
	call, ok := st.Cmd.(*syntax.CallExpr)
	if !ok || st.Negated || st.Background || len(st.Redirs) > 0 || len(call.Assigns) > 0 {
		return refuse("string that is not a simple command")
	}
	var out []word
	for _, w := range call.Args {
		var b strings.Builder
		for _, p := range w.Parts {
			switch q := p.(type) {
			case *syntax.Lit:
				if strings.ContainsAny(q.Value, "*?[]{}~") {
					return refuse("string with glob or tilde characters")
				}
				b.WriteString(q.Value)
			case *syntax.SglQuoted:
				if q.Dollar {
					return refuse("string with $'…'")
				}
				b.WriteString(q.Value)
			case *syntax.DblQuoted:
				if q.Dollar {
					return refuse("string with $\"…\"")
				}
				for _, ip := range q.Parts {
					l, ok := ip.(*syntax.Lit)
					if !ok {
						return refuse("string with expansions")
					}
					b.WriteString(l.Value)
				}
			default:
				return refuse("string with expansions")
			}
		}
		out = append(out, word{text: b.String()})
	}
	return out, true
}
