package approvals

import (
	"path/filepath"
	"regexp"
	"strings"
)

// pattern is a compiled allowlist entry.
type pattern struct {
	entry Entry
	all   bool             // the bare "*" pattern
	res   []*regexp.Regexp // the pattern, and its canonical form when it differs
}

// compilePattern turns an allowlist entry into matchers. It reports false for
// entries that can never match: empty patterns, basename-only patterns (no
// "/", "\" or "~": `rg` is ignored, as in OpenClaw), "~" patterns without an
// absolute home, "~user" patterns, and entries with an argPattern (execmesh
// does not implement argument binding, so such entries fail closed instead
// of matching more than they were meant to).
func compilePattern(e Entry, home string) (pattern, bool) {
	p := strings.TrimSpace(e.Pattern)
	if p == "" || strings.TrimSpace(e.ArgPattern) != "" {
		return pattern{}, false
	}
	if p == "*" {
		return pattern{entry: e, all: true}, true
	}
	if !strings.ContainsAny(p, `/\~`) {
		return pattern{}, false
	}
	if strings.HasPrefix(p, "~") {
		if (p != "~" && !strings.HasPrefix(p, "~/")) || !filepath.IsAbs(home) {
			return pattern{}, false
		}
		p = strings.TrimSuffix(home, "/") + p[1:]
	}
	out := pattern{entry: e, res: []*regexp.Regexp{globRegexp(p)}}
	if c := canonicalPattern(p); c != "" {
		out.res = append(out.res, globRegexp(c))
	}
	return out, true
}

func (p pattern) match(realPath string) bool {
	if p.all {
		return true
	}
	for _, re := range p.res {
		if re.MatchString(realPath) {
			return true
		}
	}
	return false
}

// globRegexp compiles an allowlist glob: `**` matches any run of characters
// including "/", `*` any run without "/", `?` exactly one character other
// than "/"; everything else is literal. The match is anchored and
// case-insensitive (OpenClaw lower-cases both sides).
func globRegexp(glob string) *regexp.Regexp {
	var b strings.Builder
	b.WriteString(`(?is)^`)
	for i := 0; i < len(glob); {
		switch {
		case strings.HasPrefix(glob[i:], "**"):
			b.WriteString(`.*`)
			i += 2
			for i < len(glob) && glob[i] == '*' {
				i++
			}
		case glob[i] == '*':
			b.WriteString(`[^/]*`)
			i++
		case glob[i] == '?':
			b.WriteString(`[^/]`)
			i++
		default:
			j := i
			for j < len(glob) && glob[j] != '*' && glob[j] != '?' {
				j++
			}
			b.WriteString(regexp.QuoteMeta(glob[i:j]))
			i = j
		}
	}
	b.WriteString(`$`)
	// QuoteMeta output and the fixed fragments always compile.
	return regexp.MustCompile(b.String())
}

// canonicalPattern resolves symbolic links in the directory part of a
// pattern that precedes its first wildcard, so that `/bin/*` also covers
// `/usr/bin/ls` on systems where /bin links to /usr/bin. Only directories
// are resolved: the last component is never followed, so an allowlisted
// name that is itself a symlink does not extend the allowlist to its target.
// It returns "" when nothing changes.
func canonicalPattern(p string) string {
	lit := p
	if i := strings.IndexAny(p, "*?"); i >= 0 {
		lit = p[:i]
	}
	j := strings.LastIndexByte(lit, '/')
	if j <= 0 {
		return ""
	}
	dir := p[:j]
	real, err := filepath.EvalSymlinks(dir)
	if err != nil || real == dir {
		return ""
	}
	return real + p[j:]
}

// MatchPattern reports whether the allowlist pattern matches an executable's
// real path, with `~` expanded from home. It applies the rules of
// Evaluate: basename-only patterns never match and `*` matches everything.
func MatchPattern(pat, realPath, home string) bool {
	p, ok := compilePattern(Entry{Pattern: pat}, home)
	return ok && p.match(realPath)
}
