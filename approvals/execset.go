package approvals

import (
	"path/filepath"
	"slices"
	"strings"
)

// ExecSet is what an agent's allowlist and safe bins let a confined
// command execute (DESIGN.md §3.4), in the shape a kernel rule set takes:
// files bound by path, directory trees, or everything.
type ExecSet struct {
	// All is set by the bare pattern "*": anything may be executed.
	All bool
	// Files are real paths of executables that exist now.
	Files []string
	// Dirs are trees that hold what a wildcard pattern may match. A tree
	// is wider than its pattern (`/opt/*/bin/x` gives /opt); Match is the
	// exact rule inside it.
	Dirs []string

	patterns []pattern
}

// Match reports whether an executable's real path matches one of the
// patterns behind Dirs (the exact glob rule, case-insensitive).
func (s *ExecSet) Match(realPath string) bool {
	for _, p := range s.patterns {
		if p.match(realPath) {
			return true
		}
	}
	return false
}

// NewExecSet turns the allowlist (with ~ expanded from home) and the safe
// bins found in trusted directories into an ExecSet. A literal pattern
// becomes the file it names (if it is there); a wildcard pattern becomes
// the tree of its literal directory prefix, symbolic links resolved.
func NewExecSet(allowlist []Entry, home string, safeBins, trustedDirs []string) *ExecSet {
	s := &ExecSet{}
	for _, e := range allowlist {
		p, ok := compilePattern(e, home)
		if !ok {
			continue
		}
		if p.all {
			s.All = true
			continue
		}
		glob := strings.TrimSpace(e.Pattern)
		if strings.HasPrefix(glob, "~") {
			glob = strings.TrimSuffix(home, "/") + glob[1:]
		}
		i := strings.IndexAny(glob, "*?")
		if i < 0 {
			// Matched on the real path, as Evaluate does: a link named
			// like the pattern does not allow its target.
			if real, err := realExecutable(glob); err == nil && p.match(real) {
				s.Files = append(s.Files, real)
			}
			continue
		}
		dir := filepath.Dir(glob[:i] + "x")
		if real, err := filepath.EvalSymlinks(dir); err == nil {
			dir = real
		}
		if filepath.IsAbs(dir) {
			s.Dirs = append(s.Dirs, filepath.Clean(dir))
			s.patterns = append(s.patterns, p)
		}
	}
	if safeBins == nil {
		safeBins = DefaultSafeBins()
	}
	for _, name := range NormalizeSafeBins(safeBins) {
		if neverSafeBin(name) {
			continue
		}
		for _, d := range append(DefaultTrustedDirs(), trustedDirs...) {
			if !filepath.IsAbs(d) {
				continue
			}
			if real, err := realExecutable(filepath.Join(d, name)); err == nil && !slices.Contains(s.Files, real) {
				s.Files = append(s.Files, real)
			}
		}
	}
	return s
}
