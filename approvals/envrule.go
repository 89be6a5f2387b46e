package approvals

import (
	"strconv"
	"strings"
)

// allowlistEnv are the fixed variables of AllowlistEnv.
var allowlistEnv = map[string]string{
	// Pagers never get a shell: git, man, systemd and most tools page
	// through $PAGER or their own variable, and a less started any other
	// way runs in its secure mode (no !, |, v, s, :e, log files, lesskey,
	// LESSOPEN).
	"PAGER":               "cat",
	"GIT_PAGER":           "cat",
	"MANPAGER":            "cat",
	"SYSTEMD_PAGER":       "cat",
	"SYSTEMD_PAGERSECURE": "1",
	"LESSSECURE":          "1",
	// No editor: ":" is git's "leave the message as it is", and a program
	// that runs $EDITOR runs the shell's no-op.
	"GIT_EDITOR":          ":",
	"GIT_SEQUENCE_EDITOR": ":",
	"EDITOR":              ":",
	"VISUAL":              ":",
}

// allowlistGitConfig is configuration every git under allowlist gets in
// git's command-line scope (GIT_CONFIG_COUNT, git 2.31 and later), which
// wins over any repository's: planted hooks and fsmonitor never run.
var allowlistGitConfig = [][2]string{
	{"core.hooksPath", "/dev/null"},
	{"core.fsmonitor", "false"},
}

// AllowlistEnv returns the variables a host sets, over the command's own
// environment env, for every command it runs under security allowlist
// (allowlisted plans, approved commands and askFallback runs alike):
// PAGER, GIT_PAGER, MANPAGER and SYSTEMD_PAGER are cat, LESSSECURE=1,
// GIT_EDITOR, GIT_SEQUENCE_EDITOR, EDITOR and VISUAL are ":", and git gets
// core.hooksPath=/dev/null and core.fsmonitor=false through
// GIT_CONFIG_COUNT/GIT_CONFIG_KEY_n/GIT_CONFIG_VALUE_n, appended after any
// such entries env already has. A pager's shell escape reached through
// `process write` in a PTY session, and hooks planted in a repository,
// are closed this way whatever the command's arguments. The map is new on
// every call.
func AllowlistEnv(env map[string]string) map[string]string {
	out := make(map[string]string, len(allowlistEnv)+1+2*len(allowlistGitConfig))
	for k, v := range allowlistEnv {
		out[k] = v
	}
	n := 0
	if c, err := strconv.Atoi(strings.TrimSpace(env["GIT_CONFIG_COUNT"])); err == nil && c > 0 && c < 1000 {
		n = c
	}
	for _, kv := range allowlistGitConfig {
		i := strconv.Itoa(n)
		out["GIT_CONFIG_KEY_"+i] = kv[0]
		out["GIT_CONFIG_VALUE_"+i] = kv[1]
		n++
	}
	out["GIT_CONFIG_COUNT"] = strconv.Itoa(n)
	return out
}
