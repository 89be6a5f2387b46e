package protocol

import (
	"path/filepath"
	"slices"
	"strings"
)

// PathPrependIgnoredOnNodeWarning is put at the top of the result text when
// tools.exec.pathPrepend is configured and the command runs on a node: the
// gateway's idea of PATH says nothing about another machine.
const PathPrependIgnoredOnNodeWarning = "Warning: tools.exec.pathPrepend is ignored for host=node. Configure PATH on the node host/service instead."

const pathListSeparator = string(filepath.ListSeparator)

// NodePathOverrideAllowed reports whether a node agent accepts requested as
// the PATH of a command when its own PATH is own. Only prepending is
// allowed: requested must be own itself, or absolute directories followed
// by the separator and own, so a request can add tools in front but never
// drop the node's directories. Empty and relative entries ("", ".", "bin")
// are refused: they would resolve commands against the working directory,
// which the request also chooses. When own is empty only an empty requested
// PATH is accepted.
//
// The gateway refuses a request env.PATH for host=node outright
// (ValidateHostEnvOverrides); this is the node's own check for requests that
// reach it by any route (DESIGN.md §7).
func NodePathOverrideAllowed(requested, own string) bool {
	if requested == own {
		return true
	}
	if own == "" {
		return false
	}
	prefix, ok := strings.CutSuffix(requested, pathListSeparator+own)
	if !ok || prefix == "" {
		return false
	}
	for dir := range strings.SplitSeq(prefix, pathListSeparator) {
		if !filepath.IsAbs(dir) {
			return false
		}
	}
	return true
}

// MergePathPrepend puts the tools.exec.pathPrepend entries in front of path
// (OpenClaw's mergePathPrepend). The entries are trimmed, empty ones
// dropped; then the entries of path are appended, trimmed and without
// empties, and every directory is kept at its first occurrence. With no
// usable prepend entries path is returned unchanged.
//
//	MergePathPrepend([]string{"/custom/bin", "/opt/oss/bin"}, "/usr/bin") == "/custom/bin:/opt/oss/bin:/usr/bin"
func MergePathPrepend(prepend []string, path string) string {
	entries := normalizePathList(prepend)
	if len(entries) == 0 {
		return path
	}
	entries = append(entries, strings.Split(path, pathListSeparator)...)
	return strings.Join(normalizePathList(entries), pathListSeparator)
}

// ApplyPathPrepend merges prepend into the PATH of env in place, with
// MergePathPrepend. The variable is PATH, or else a key that upper-cases to
// PATH (Windows' "Path"; the first in sorted order if there are several),
// or else a new PATH. A merge that comes out empty leaves env unchanged.
func ApplyPathPrepend(env map[string]string, prepend []string) {
	key := pathKey(env)
	if merged := MergePathPrepend(prepend, env[key]); merged != "" {
		env[key] = merged
	}
}

// pathKey returns the key under which env holds PATH.
func pathKey(env map[string]string) string {
	if _, ok := env[pathEnvKey]; ok {
		return pathEnvKey
	}
	var candidates []string
	for k := range env {
		if jsToUpper(k) == pathEnvKey {
			candidates = append(candidates, k)
		}
	}
	if len(candidates) == 0 {
		return pathEnvKey
	}
	return slices.Min(candidates)
}

// normalizePathList trims the entries, drops empty ones and keeps the first
// of each duplicate, in order.
func normalizePathList(entries []string) []string {
	out := make([]string, 0, len(entries))
	seen := make(map[string]struct{}, len(entries))
	for _, e := range entries {
		e = jsTrim(e)
		if e == "" {
			continue
		}
		if _, dup := seen[e]; dup {
			continue
		}
		seen[e] = struct{}{}
		out = append(out, e)
	}
	return out
}
