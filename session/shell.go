package session

import (
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// ResolveShell picks the shell commands run in, as OpenClaw does on POSIX
// systems (spec §8): $SHELL (shellEnv) unless it is empty or ends in
// "false" or "nologin"; when it is fish, bash found on pathEnv, else sh,
// else fish itself; without a usable $SHELL, sh on pathEnv, else bash,
// else the bare name "sh".
func ResolveShell(shellEnv, pathEnv string) string {
	shell := jsTrim(shellEnv)
	if base := filepath.Base(shell); base == "false" || base == "nologin" {
		shell = ""
	}
	if shell != "" && filepath.Base(shell) == "fish" {
		if p := findExecutable("bash", pathEnv); p != "" {
			return p
		}
		if p := findExecutable("sh", pathEnv); p != "" {
			return p
		}
	}
	if shell != "" {
		return shell
	}
	if p := findExecutable("sh", pathEnv); p != "" {
		return p
	}
	if p := findExecutable("bash", pathEnv); p != "" {
		return p
	}
	return "sh"
}

// shellArgs are the arguments before the command text: profiles and rc
// files are skipped so that commands behave the same in every account.
func shellArgs(shell string) []string {
	switch filepath.Base(shell) {
	case "bash":
		return []string{"--noprofile", "--norc", "-c"}
	case "zsh":
		return []string{"-f", "-c"}
	case "fish":
		return []string{"--no-config", "-c"}
	}
	return []string{"-c"}
}

// findExecutable returns the first <dir>/<name> on pathEnv that the
// process may execute, or "".
func findExecutable(name, pathEnv string) string {
	for _, dir := range strings.Split(pathEnv, ":") {
		if dir == "" {
			continue
		}
		p := filepath.Join(dir, name)
		if unix.Access(p, unix.X_OK) == nil {
			return p
		}
	}
	return ""
}

// execCommand returns the command text to hand to shell with "exec "
// before it when the shell would only fork once more to run it: a single
// simple command of plain words whose program is a file the shell would
// find and could run. The shell then becomes the program instead of
// waiting for it, as bash does by itself for `bash -c 'cmd'`; dash, the
// usual sh, does not, and a background `sleep 600` was two processes to
// start, hold, signal and reap instead of one. The program, its
// arguments, descriptors, environment, process group and cgroup are the
// same; what changes is that a program killed by a signal is reported as
// killed by that signal (as under bash), where dash reported exit code
// 128+n. Anything else is left as it is: words with quotes, expansions,
// globs, redirections, operators or assignments, builtins and reserved
// words, and programs the shell would not find or could not run (its
// error text would name "exec").
//
// env is the command's environment (its PATH finds the program) and cwd
// its working directory.
func execCommand(shell, command string, env []string, cwd string) string {
	if !execShell(filepath.Base(shell)) {
		return command
	}
	name, ok := plainWords(command)
	if !ok || shellWord(name) {
		return command
	}
	var path string // a regular file
	if strings.Contains(name, "/") {
		if path = name; !filepath.IsAbs(path) {
			path = filepath.Join(cwd, path)
		}
		if !regularFile(path) {
			return command
		}
	} else if path = lookShellPath(name, envValue(env, "PATH")); path == "" {
		return command
	}
	if unix.Access(path, unix.X_OK) != nil {
		return command
	}
	return "exec " + command
}

// regularFile reports whether path names a regular file (following
// symbolic links, as exec does).
func regularFile(path string) bool {
	var st unix.Stat_t
	return path != "" && unix.Stat(path, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG
}

// execShell reports whether shell (a base name) is one whose `exec` runs
// a program in place of the shell, as POSIX says.
func execShell(base string) bool {
	switch base {
	case "sh", "dash", "bash", "ash", "ksh", "ksh93", "mksh", "zsh", "yash", "posh":
		return true
	}
	return false
}

// shellWord reports whether w is a builtin or a reserved word of one of
// the shells execShell accepts: a command named so runs in the shell (or
// means something else to it), even where a program of that name exists.
func shellWord(w string) bool {
	switch w {
	case ".", ":", "alias", "autoload", "bg", "bind", "bindkey", "break", "builtin", "bye",
		"caller", "case", "cd", "chdir", "command", "compgen", "complete", "compopt",
		"continue", "coproc", "declare", "dirs", "disable", "disown", "do", "done", "echo",
		"elif", "else", "emulate", "enable", "end", "esac", "eval", "exec", "exit", "export",
		"false", "fc", "fg", "fi", "float", "for", "foreach", "function", "functions",
		"getln", "getopts", "hash", "help", "history", "if", "in", "integer", "jobs", "kill",
		"let", "limit", "local", "log", "logout", "mapfile", "newgrp", "noglob", "nocorrect",
		"popd", "print", "printf", "pushd", "pushln", "pwd", "r", "read", "readarray",
		"readonly", "rehash", "repeat", "return", "sched", "select", "set", "setopt",
		"shift", "shopt", "source", "stat", "suspend", "test", "then", "time", "times",
		"trap", "true", "type", "typeset", "ulimit", "umask", "unalias", "unfunction",
		"unhash", "unlimit", "unset", "unsetopt", "until", "vared", "wait", "whence",
		"where", "which", "while", "zcompile", "zformat", "zle", "zmodload", "zparseopts",
		"zprof", "zpty", "zstyle":
		return true
	}
	return false
}

// plainWords reports whether command is one simple command of plain words
// (letters, digits and _-./,:+=@% separated by blanks, no assignment in
// front) and returns its first word.
func plainWords(command string) (string, bool) {
	first := ""
	for i, w := range strings.FieldsFunc(command, func(r rune) bool { return r == ' ' || r == '\t' }) {
		for j := 0; j < len(w); j++ {
			c := w[j]
			switch {
			case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
			case strings.IndexByte("_-./,:+=@%", c) >= 0:
			default:
				return "", false
			}
		}
		if i == 0 {
			first = w
		}
	}
	if first == "" || strings.Contains(first, "=") {
		return "", false
	}
	return first, true
}

// lookShellPath returns the file a POSIX shell runs for name: the first
// regular file called name in a directory of pathEnv (it need not be
// executable: the shell then fails to run it, and so must we not run
// another). It returns "" when none is found first in an absolute
// directory (an empty or relative entry names the shell's working
// directory, which is left to the shell).
func lookShellPath(name, pathEnv string) string {
	for _, dir := range strings.Split(pathEnv, ":") {
		if !filepath.IsAbs(dir) {
			return ""
		}
		if p := filepath.Join(dir, name); regularFile(p) {
			return p
		}
	}
	return ""
}

// envValue returns the value of key in env, the last one set winning (as
// for exec).
func envValue(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == key {
			return v
		}
	}
	return ""
}
