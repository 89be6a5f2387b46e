package nodeagent

import (
	"maps"
	"os"
	"path/filepath"
	"strings"

	"github.com/execmesh/execmesh/protocol"
)

// commandEnv builds the environment of a command from the node's own
// sanitised environment and the request's overrides (DESIGN.md §7):
// overrides are checked with protocol.ValidateHostEnvOverrides, except
// that a PATH is accepted when it only prepends absolute directories to
// the node's own PATH (protocol.NodePathOverrideAllowed). A refused
// request is an *protocol.Error with OpenClaw's Security Violation text.
func (a *Agent) commandEnv(requested map[string]string) ([]string, error) {
	overrides := maps.Clone(requested)
	pathValue, hasPath := "", false
	for k, v := range requested {
		if !strings.EqualFold(strings.TrimSpace(k), "PATH") {
			continue
		}
		// Only the exact key PATH may prepend; "Path" or " PATH" would
		// become a second variable that some programs read instead.
		if k != "PATH" || !protocol.NodePathOverrideAllowed(v, a.ownPath) {
			if err := protocol.ValidateHostEnvOverrides(requested); err != nil {
				return nil, err
			}
			return nil, protocol.Errorf(protocol.ErrSecurityViolation, "Security Violation: Custom 'PATH' variable is forbidden during host execution.")
		}
		pathValue, hasPath = v, true
		delete(overrides, k)
	}
	if err := protocol.ValidateHostEnvOverrides(overrides); err != nil {
		return nil, err
	}
	env, _, _ := protocol.SanitizeHostEnv(a.baseEnv, overrides, true)
	if hasPath {
		env["PATH"] = pathValue
	}
	return protocol.EnvList(env), nil
}

// resolveWorkdir resolves a requested workdir on this host: empty means
// the node's default; a relative path is taken from the default; the
// result must be an existing directory. ok is false when it is not.
func (a *Agent) resolveWorkdir(requested string) (dir string, ok bool) {
	if requested == "" {
		return a.cfg.Cwd, true
	}
	dir = strings.TrimSpace(requested)
	if dir == "" {
		return requested, false
	}
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(a.cfg.Cwd, dir)
	}
	st, err := os.Stat(dir)
	if err != nil || !st.IsDir() {
		return requested, false
	}
	return dir, true
}

// which finds bins on the node's own PATH, as OpenClaw's system.which:
// names with a path separator are skipped, and so are binaries not found.
func (a *Agent) which(bins []string) map[string]string {
	out := make(map[string]string, len(bins))
	for _, name := range bins {
		if name == "" || strings.ContainsRune(name, '/') || strings.ContainsRune(name, filepath.Separator) {
			continue
		}
		for dir := range strings.SplitSeq(a.ownPath, string(filepath.ListSeparator)) {
			if dir == "" || !filepath.IsAbs(dir) {
				continue
			}
			p := filepath.Join(dir, name)
			if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
				out[name] = p
				break
			}
		}
	}
	return out
}
