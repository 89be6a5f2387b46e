package protocol

import (
	"fmt"
	"strings"
)

// DefaultAllowlistEnv returns the default of tools.exec.allowlistEnv, a
// fresh slice each call: the request env keys a command under security
// allowlist may set (DESIGN.md §3.4). They change how a program presents
// its output (terminal, locale, time zone, colour, width) and name no
// program, file or library: a request cannot use them to make an
// allowlisted tool run something else. A pattern ending in "*" matches
// every key that starts with what comes before it (LC_*).
func DefaultAllowlistEnv() []string {
	return []string{"TERM", "LANG", "LANGUAGE", "LC_*", "TZ", "NO_COLOR", "FORCE_COLOR", "CLICOLOR", "CI", "COLUMNS", "LINES"}
}

// ValidateAllowlistEnvPattern checks one tools.exec.allowlistEnv entry: a
// portable variable name (a letter or '_', then letters, digits or '_'),
// optionally ending in "*" to match every key with that prefix. A lone
// "*" is refused: it would let a request set anything, which is what
// security full is for.
func ValidateAllowlistEnvPattern(p string) error {
	name, wild := strings.CutSuffix(p, "*")
	if name == "" {
		if wild {
			return fmt.Errorf("%q would allow every key (name a prefix, such as LC_*)", p)
		}
		return fmt.Errorf("empty pattern")
	}
	for i := range len(name) {
		c := name[i]
		if c == '_' || 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || i > 0 && '0' <= c && c <= '9' {
			continue
		}
		return fmt.Errorf("%q is not a variable name, or a name prefix followed by *", p)
	}
	return nil
}

// AllowlistEnvAllows reports whether key matches one of patterns
// (tools.exec.allowlistEnv entries): exactly, case included, as the
// environment itself distinguishes case, or by prefix for a pattern that
// ends in "*".
func AllowlistEnvAllows(patterns []string, key string) bool {
	for _, p := range patterns {
		if prefix, ok := strings.CutSuffix(p, "*"); ok {
			if prefix != "" && strings.HasPrefix(key, prefix) {
				return true
			}
		} else if key == p {
			return true
		}
	}
	return false
}
