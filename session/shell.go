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
