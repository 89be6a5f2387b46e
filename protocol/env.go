package protocol

import (
	"cmp"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// This file ports OpenClaw's host exec environment policy
// (src/infra/host-env-security.ts, 2026.9.6): which variables a request may
// set for a command run on the gateway or on a node, and which variables of
// the daemon's own environment a command inherits. The behaviour, including
// JavaScript's notions of trimming, upper-casing and sorting, is pinned by
// testdata/conformance/host_env.json.

// Names the sanitiser treats specially.
const (
	openClawCLIEnvKey        = "OPENCLAW_CLI" // always "1" in a host command's environment
	gitAllowProtocolKey      = "GIT_ALLOW_PROTOCOL"
	gitProtocolFromUserKey   = "GIT_PROTOCOL_FROM_USER"
	pathEnvKey               = "PATH"
	cargoTargetPrefix        = "CARGO_TARGET_"
	securityViolationPrefix  = "Security Violation: "
	customPathForbiddenError = "Security Violation: Custom 'PATH' variable is forbidden during host execution"
)

// blockedOverridePattern is the source of OpenClaw's regular expression for
// cargo's per-target linker and runner variables, which run a program of
// the caller's choosing. isCargoTargetExecutableKey implements it.
const blockedOverridePattern = `^CARGO_TARGET_[A-Z0-9_]+_(?:LINKER|RUNNER)$`

// IsDangerousHostEnvVarName reports whether key names a variable that is
// dangerous everywhere: in the blocked-everywhere list (NODE_OPTIONS,
// BASH_ENV, GIT_EXEC_PATH, …) or starting with a blocked prefix (LD_, DYLD_,
// BASH_FUNC_). The key is trimmed and compared case-insensitively. It is
// OpenClaw's isDangerousHostEnvVarName.
func IsDangerousHostEnvVarName(key string) bool {
	upper, ok := normalizedUpper(key)
	return ok && isBlockedEverywhere(upper)
}

// IsDangerousHostEnvOverrideVarName reports whether key may not be set by a
// request although it is not dangerous everywhere: the override-only list
// (HOME, proxies, credentials, package-index settings, …), the override
// prefixes (GIT_CONFIG_, NPM_CONFIG_, CARGO_REGISTRIES_, TF_VAR_) and cargo's
// CARGO_TARGET_<triple>_LINKER/_RUNNER. It does not cover PATH or the
// blocked-everywhere keys; a request override is refused when either this
// or IsDangerousHostEnvVarName holds, or it is PATH. It is OpenClaw's
// isDangerousHostEnvOverrideVarName.
func IsDangerousHostEnvOverrideVarName(key string) bool {
	upper, ok := normalizedUpper(key)
	return ok && isBlockedOverrideOnly(upper)
}

// IsDangerousHostInheritedEnvVarName reports whether a variable of the
// daemon's own environment is kept from host commands: the blocked-everywhere
// keys and prefixes, and the override-only keys that are not safe to inherit
// (tokens, tool configuration), while HOME, proxies and the like stay. It is
// OpenClaw's isDangerousHostInheritedEnvVarName. SanitizeHostEnv keeps
// GIT_ALLOW_PROTOCOL and GIT_PROTOCOL_FROM_USER in a restricted form
// although this reports them.
func IsDangerousHostInheritedEnvVarName(key string) bool {
	upper, ok := normalizedUpper(key)
	return ok && isBlockedInherited(upper)
}

// InspectEnvOverrides checks the env of a host exec request without
// applying it. blocked lists the refused keys upper-cased (PATH included);
// invalid lists the keys that are not portable variable names
// (^[A-Za-z_][A-Za-z0-9_]*$, or with "(" and ")" for Windows names such as
// ProgramFiles(x86)), trimmed, or raw when trimming empties them. Both are
// de-duplicated and sorted like JavaScript sorts strings (UTF-16 code
// units), and nil when empty.
//
// PAGER and GIT_PAGER are allowed with the value "" or "cat" (turning the
// pager off is harmless); any other value is blocked. Besides OpenClaw's
// lists, execmesh's own additions are blocked
// (IsExecmeshBlockedOverrideVarName: LESS*, GIT_TRACE*, PERL*, PYTHON*, …).
func InspectEnvOverrides(env map[string]string) (blocked, invalid []string) {
	_, blocked, invalid = filterOverrides(env, true)
	return blocked, invalid
}

// ValidateHostEnvOverrides returns nil when every key of a host exec
// request's env may be applied, and otherwise an *Error of type
// ErrSecurityViolation with OpenClaw's exact text, for example
//
//	Security Violation: Custom 'PATH' variable is forbidden during host execution.
//	Security Violation: Environment variable 'LD_PRELOAD' is forbidden during host execution.
//	Security Violation: blocked override keys: EDITOR, HOME.
//	Security Violation: Custom 'PATH' variable is forbidden during host execution (blocked override keys: LD_PRELOAD, PATH).
//
// The exec tool calls it before anything runs on host=gateway and
// host=node; host=sandbox applies no blocklist. A request PATH is always an
// error here; a node agent that receives one anyway applies
// NodePathOverrideAllowed.
func ValidateHostEnvOverrides(env map[string]string) error {
	blocked, invalid := InspectEnvOverrides(env)
	if len(blocked) == 0 && len(invalid) == 0 {
		return nil
	}
	pathBlocked := slices.Contains(blocked, pathEnvKey)
	if len(blocked) == 1 && len(invalid) == 0 {
		if pathBlocked {
			return &Error{Type: ErrSecurityViolation, Message: customPathForbiddenError + "."}
		}
		return &Error{Type: ErrSecurityViolation, Message: securityViolationPrefix +
			"Environment variable '" + blocked[0] + "' is forbidden during host execution."}
	}
	var details []string
	if len(blocked) > 0 {
		details = append(details, "blocked override keys: "+strings.Join(blocked, ", "))
	}
	if len(invalid) > 0 {
		details = append(details, "invalid non-portable override keys: "+strings.Join(invalid, ", "))
	}
	suffix := strings.Join(details, "; ")
	if pathBlocked {
		return &Error{Type: ErrSecurityViolation, Message: customPathForbiddenError + " (" + suffix + ")."}
	}
	return &Error{Type: ErrSecurityViolation, Message: securityViolationPrefix + suffix + "."}
}

// SanitizeHostEnv builds the environment of a host command from base, the
// daemon's own environment, and overrides, the request's env. It never
// fails: rejected overrides are dropped and reported as InspectEnvOverrides
// reports them (PATH counts as blocked only when blockPathOverrides is
// true). Callers that must refuse such requests call
// ValidateHostEnvOverrides first.
//
// Inherited keys are trimmed (empty ones dropped) and keep their case.
// Those IsDangerousHostInheritedEnvVarName reports are dropped, except that
// GIT_ALLOW_PROTOCOL is cut down to its git, http, https and ssh entries and
// a permissive GIT_PROTOCOL_FROM_USER (true, yes, on or a non-zero integer)
// becomes "0", so an inherited git setting cannot enable the file or ext
// transports. Accepted overrides are applied next, under their trimmed key,
// and OPENCLAW_CLI=1 last. Where two keys trim to the same name, the one
// that needed no trimming wins.
func SanitizeHostEnv(base, overrides map[string]string, blockPathOverrides bool) (env map[string]string, rejectedBlocked, rejectedInvalid []string) {
	env = make(map[string]string, len(base)+len(overrides)+1)
	for _, e := range trimmedEntries(base) {
		upper := jsToUpper(e.key)
		switch {
		case upper == gitAllowProtocolKey:
			env[e.key] = sanitizeGitAllowProtocol(e.value)
		case upper == gitProtocolFromUserKey:
			if isPermissiveGitProtocolFromUser(e.value) {
				env[e.key] = "0"
			} else {
				env[e.key] = e.value
			}
		case isBlockedInherited(upper):
			// dropped
		default:
			env[e.key] = e.value
		}
	}
	accepted, rejectedBlocked, rejectedInvalid := filterOverrides(overrides, blockPathOverrides)
	for _, e := range accepted {
		env[e.key] = e.value
	}
	env[openClawCLIEnvKey] = "1"
	return env, rejectedBlocked, rejectedInvalid
}

// FilterShellWrapperEnvOverrides returns the part of a request env that a
// node passes to a shell-wrapper run (sh -c …, where the payload cannot be
// analysed for what it reads): TERM, LANG, LC_*, COLORTERM, NO_COLOR,
// FORCE_COLOR and OPENCLAW_SUBAGENT_EXEC, plus PAGER/GIT_PAGER set to "" when
// the request turns the pager off. Keys must be portable names; everything
// else is dropped silently. It returns nil when nothing remains. It is
// OpenClaw's sanitizeSystemRunEnvOverrides for shell wrappers.
func FilterShellWrapperEnvOverrides(overrides map[string]string) map[string]string {
	var out map[string]string
	for _, e := range trimmedEntries(overrides) {
		if !isPortableKey(e.key) {
			continue
		}
		upper := asciiUpper(e.key)
		value := e.value
		switch {
		case isNoPagerOverride(upper, value):
			value = ""
		case isShellWrapperAllowed(upper):
			// kept as given
		default:
			continue
		}
		if out == nil {
			out = make(map[string]string)
		}
		out[e.key] = value
	}
	return out
}

// EnvMap parses KEY=VALUE entries, as os.Environ returns them, into a map.
// Entries without "=" are skipped; a later entry for the same key wins. A
// leading "=" belongs to the key, as in Windows' per-drive "=C:=C:\dir".
func EnvMap(environ []string) map[string]string {
	m := make(map[string]string, len(environ))
	for _, kv := range environ {
		i := strings.IndexByte(kv, '=')
		if i == 0 {
			i = strings.IndexByte(kv[1:], '=') + 1
			if i == 0 {
				continue
			}
		}
		if i < 0 {
			continue
		}
		m[kv[:i]] = kv[i+1:]
	}
	return m
}

// EnvList formats env as KEY=VALUE entries sorted by key, the form
// exec.Cmd.Env and the session core take. The order is fixed so that the
// same environment always gives the same list.
func EnvList(env map[string]string) []string {
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	list := make([]string, len(keys))
	for i, k := range keys {
		list[i] = k + "=" + env[k]
	}
	return list
}

// envEntry is one environment variable under its trimmed key.
type envEntry struct {
	key, value string
}

// filterOverrides splits request overrides into the accepted entries (in
// application order) and the sorted blocked and invalid key lists. It is
// OpenClaw's sanitizeHostEnvOverridesWithDiagnostics, plus execmesh's own
// additions (env_execmesh.go).
func filterOverrides(overrides map[string]string, blockPath bool) (accepted []envEntry, blocked, invalid []string) {
	for _, raw := range sortedRawKeys(overrides) {
		value := overrides[raw]
		key := jsTrim(raw)
		if !isHostOverrideKey(key) {
			if key == "" {
				key = raw
			}
			invalid = append(invalid, key)
			continue
		}
		upper := asciiUpper(key) // a valid key is ASCII
		switch {
		case blockPath && upper == pathEnvKey:
			blocked = append(blocked, upper)
		case isNoPagerOverride(upper, value):
			accepted = append(accepted, envEntry{key: key, value: ""})
		case isBlockedEverywhere(upper) || isBlockedOverrideOnly(upper) || isExecmeshBlocked(upper):
			blocked = append(blocked, upper)
		default:
			accepted = append(accepted, envEntry{key: key, value: value})
		}
	}
	return accepted, sortUniqueJS(blocked), sortUniqueJS(invalid)
}

// trimmedEntries returns the entries of env under their trimmed keys,
// dropping keys that trim to nothing, in an order where assigning them one
// after the other lets an exact key win over a padded one (" FOO " loses to
// "FOO"). JavaScript would use the object's insertion order instead, which
// a Go map does not have.
func trimmedEntries(env map[string]string) []envEntry {
	type rawEntry struct {
		raw, key string
	}
	// Each key is trimmed once, not at every comparison of the sort.
	raws := make([]rawEntry, 0, len(env))
	for raw := range env {
		raws = append(raws, rawEntry{raw: raw, key: jsTrim(raw)})
	}
	slices.SortFunc(raws, func(a, b rawEntry) int { return compareRawKeys(a.raw, a.key == a.raw, b.raw, b.key == b.raw) })
	entries := make([]envEntry, 0, len(raws))
	for _, r := range raws {
		if r.key != "" {
			entries = append(entries, envEntry{key: r.key, value: env[r.raw]})
		}
	}
	return entries
}

// sortedRawKeys returns the keys of m with padded keys before exact ones,
// each group sorted, so processing is deterministic and exact keys win.
func sortedRawKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return compareRawKeys(a, jsTrim(a) == a, b, jsTrim(b) == b) })
	return keys
}

// compareRawKeys orders padded keys before exact ones (exact: the key
// equals its trimmed form), then bytewise.
func compareRawKeys(a string, exactA bool, b string, exactB bool) int {
	if exactA != exactB {
		if exactA {
			return 1
		}
		return -1
	}
	return strings.Compare(a, b)
}

// normalizedUpper trims key and upper-cases it as JavaScript would; ok is
// false when nothing is left.
func normalizedUpper(key string) (upper string, ok bool) {
	key = jsTrim(key)
	if key == "" {
		return "", false
	}
	return jsToUpper(key), true
}

func isBlockedEverywhere(upper string) bool {
	return inTable(blockedEverywhereKeys, upper) || hasAnyPrefix(upper, blockedPrefixes)
}

func isBlockedOverrideOnly(upper string) bool {
	return inTable(blockedOverrideOnlyKeys, upper) ||
		isCargoTargetExecutableKey(upper) ||
		hasAnyPrefix(upper, blockedOverridePrefixes)
}

// isBlockedInherited is the derived blockedInheritedKeys set (everywhere,
// plus override-only minus allowed-inherited) with the blocked prefixes.
func isBlockedInherited(upper string) bool {
	if isBlockedEverywhere(upper) {
		return true
	}
	return inTable(blockedOverrideOnlyKeys, upper) && !inTable(allowedInheritedOverrideOnlyKeys, upper)
}

func isShellWrapperAllowed(upper string) bool {
	return inTable(shellWrapperAllowedOverrideKeys, upper) || hasAnyPrefix(upper, shellWrapperAllowedOverridePrefixes)
}

// isNoPagerOverride reports a request that only turns a pager off.
func isNoPagerOverride(upper, value string) bool {
	return (upper == "PAGER" || upper == "GIT_PAGER") && (value == "" || value == "cat")
}

// isCargoTargetExecutableKey matches blockedOverridePattern:
// CARGO_TARGET_, at least one of [A-Z0-9_], then _LINKER or _RUNNER.
func isCargoTargetExecutableKey(upper string) bool {
	rest, ok := strings.CutPrefix(upper, cargoTargetPrefix)
	if !ok {
		return false
	}
	var mid string
	if m, ok := strings.CutSuffix(rest, "_LINKER"); ok {
		mid = m
	} else if m, ok := strings.CutSuffix(rest, "_RUNNER"); ok {
		mid = m
	} else {
		return false
	}
	if mid == "" {
		return false
	}
	for i := 0; i < len(mid); i++ {
		c := mid[i]
		if !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// sanitizeGitAllowProtocol keeps only the protocols git allows by default;
// an inherited list must not enable file:// or ext:: transports.
func sanitizeGitAllowProtocol(value string) string {
	value = jsTrim(value)
	if value == "" {
		return ""
	}
	var kept []string
	for p := range strings.SplitSeq(value, ":") {
		switch p {
		case "git", "http", "https", "ssh":
			kept = append(kept, p)
		}
	}
	return strings.Join(kept, ":")
}

// isPermissiveGitProtocolFromUser reports a GIT_PROTOCOL_FROM_USER value
// that git reads as true: true, yes, on, or an integer other than zero.
func isPermissiveGitProtocolFromUser(value string) bool {
	v := strings.ToLower(jsTrim(value))
	switch v {
	case "true", "yes", "on":
		return true
	}
	digits := strings.TrimLeft(v, "+-")
	if len(v)-len(digits) > 1 || digits == "" {
		return false
	}
	nonZero := false
	for i := 0; i < len(digits); i++ {
		c := digits[i]
		if c < '0' || c > '9' {
			return false
		}
		nonZero = nonZero || c != '0'
	}
	return nonZero
}

// isHostOverrideKey reports whether a trimmed key is a portable variable
// name, or one with parentheses as Windows has (ProgramFiles(x86)).
func isHostOverrideKey(key string) bool {
	if key == "" {
		return false
	}
	if c := key[0]; !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c == '_') {
		return false
	}
	for i := 1; i < len(key); i++ {
		if c := key[i]; !(isPortableKeyByte(c) || c == '(' || c == ')') {
			return false
		}
	}
	return true
}

// isPortableKey reports whether key matches ^[A-Za-z_][A-Za-z0-9_]*$.
func isPortableKey(key string) bool {
	if key == "" {
		return false
	}
	if c := key[0]; !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c == '_') {
		return false
	}
	for i := 1; i < len(key); i++ {
		if !isPortableKeyByte(key[i]) {
			return false
		}
	}
	return true
}

func isPortableKeyByte(c byte) bool {
	return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_'
}

func inTable(table []string, s string) bool {
	_, found := slices.BinarySearch(table, s)
	return found
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// jsTrim trims what JavaScript's String.prototype.trim trims. Go's
// unicode.IsSpace differs: it includes U+0085 and excludes U+FEFF.
func jsTrim(s string) string {
	return strings.TrimFunc(s, isJSSpace)
}

func isJSSpace(r rune) bool {
	switch r {
	case '\t', '\n', '\v', '\f', '\r', ' ', 0xA0, 0x1680, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000, 0xFEFF:
		return true
	}
	return r >= 0x2000 && r <= 0x200A
}

func asciiUpper(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'a' && c <= 'z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if b[j] >= 'a' && b[j] <= 'z' {
					b[j] -= 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}

// jsToUpper upper-cases like JavaScript's toUpperCase where it matters for
// matching ASCII names: Go's per-rune mapping leaves ß and the Latin
// ligatures alone, JavaScript expands them (ß → SS, ﬁ → FI), so an
// inherited "Cﬂags" is CFLAGS to OpenClaw. Other differences only produce
// non-ASCII text, which matches no policy entry either way.
func jsToUpper(s string) string {
	ascii := true
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			ascii = false
			break
		}
	}
	if ascii {
		return asciiUpper(s)
	}
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		switch r {
		case 'ß':
			b.WriteString("SS")
		case 'ﬀ':
			b.WriteString("FF")
		case 'ﬁ':
			b.WriteString("FI")
		case 'ﬂ':
			b.WriteString("FL")
		case 'ﬃ':
			b.WriteString("FFI")
		case 'ﬄ':
			b.WriteString("FFL")
		case 'ﬅ', 'ﬆ':
			b.WriteString("ST")
		default:
			b.WriteRune(unicode.ToUpper(r))
		}
	}
	return b.String()
}

// sortUniqueJS de-duplicates and sorts like JavaScript's default sort, by
// UTF-16 code units, so reported key lists match OpenClaw's byte for byte.
// It returns nil for an empty list.
func sortUniqueJS(list []string) []string {
	if len(list) == 0 {
		return nil
	}
	slices.SortFunc(list, compareUTF16)
	return slices.Compact(list)
}

// compareUTF16 orders strings by their UTF-16 code units. It differs from
// byte order only between a supplementary character and one in
// U+E000..U+FFFF.
func compareUTF16(a, b string) int {
	for a != "" && b != "" {
		ra, na := utf8.DecodeRuneInString(a)
		rb, nb := utf8.DecodeRuneInString(b)
		if ra != rb {
			if c := cmp.Compare(firstUTF16Unit(ra), firstUTF16Unit(rb)); c != 0 {
				return c
			}
			return cmp.Compare(ra, rb)
		}
		if na != nb || a[:na] != b[:nb] { // invalid UTF-8 decoding to the same rune
			return strings.Compare(a[:na], b[:nb])
		}
		a, b = a[na:], b[nb:]
	}
	return cmp.Compare(len(a), len(b))
}

func firstUTF16Unit(r rune) rune {
	if r >= 0x10000 && r <= unicode.MaxRune {
		return 0xD800 + (r-0x10000)>>10
	}
	return r
}
