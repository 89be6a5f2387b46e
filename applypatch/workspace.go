package applypatch

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// The workspace rule (tools.exec.applyPatch.workspaceOnly, default on):
// apply_patch writes only under the agent's workspace,
// <workspace root>/<agentId>, on the gateway host and on nodes alike (each
// host with its own root), whatever workdir the caller names. Together
// with the .git rule of Apply, a patch can plant neither hooks nor config
// in a repository an allowlisted git later runs in outside the workspace.

// ErrOutsideWorkspace is the error of a workdir outside the agent's
// workspace.
var ErrOutsideWorkspace = errors.New("workdir is outside the agent's workspace")

// DefaultAgentID is the agent of a call that names none.
const DefaultAgentID = "main"

// AgentWorkspace returns <root>/<agentID>, creating the root and the agent's
// directory (mode 0700) when missing. The agent id must be a plain name
// ([A-Za-z0-9._-], not starting with "." or "-", at most 128 bytes); ""
// is DefaultAgentID. A symlink in the agent's place is refused.
func AgentWorkspace(root, agentID string) (string, error) {
	if agentID == "" {
		agentID = DefaultAgentID
	}
	if len(agentID) > 128 || agentID[0] == '.' || agentID[0] == '-' ||
		strings.IndexFunc(agentID, func(c rune) bool {
			return !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.')
		}) >= 0 {
		return "", fmt.Errorf("apply patch: agent id %q cannot name a workspace", agentID)
	}
	if !filepath.IsAbs(root) {
		return "", fmt.Errorf("apply patch: workspace root %q is not absolute", root)
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return "", fmt.Errorf("apply patch: workspace root: %w", err)
	}
	dir := filepath.Join(root, agentID)
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("apply patch: workspace of agent %s: %w", agentID, err)
	}
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("apply patch: workspace of agent %s is not a directory", agentID)
	}
	return dir, nil
}

// WorkdirIn resolves a requested workdir inside the workspace ws: empty is
// ws, a relative path is taken from ws, an absolute one must lie inside it,
// also once symbolic links are resolved. An outside workdir is an error
// matching ErrOutsideWorkspace; one that is not an existing directory
// matches fs.ErrNotExist.
func WorkdirIn(ws, workdir string) (string, error) {
	dir := ws
	if w := strings.TrimSpace(workdir); w != "" {
		if filepath.IsAbs(w) {
			dir = filepath.Clean(w)
		} else {
			dir = filepath.Join(ws, w)
		}
	}
	realWS, err := filepath.EvalSymlinks(ws)
	if err != nil {
		return "", fmt.Errorf("apply patch: workspace %s: %w", ws, err)
	}
	if !within(ws, dir) && !within(realWS, dir) {
		return "", fmt.Errorf("%w: %s is not inside %s", ErrOutsideWorkspace, workdir, ws)
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "", fmt.Errorf("apply patch: workdir %s: %w", workdir, fs.ErrNotExist)
	}
	if !within(realWS, real) {
		return "", fmt.Errorf("%w: %s leads to %s, outside %s", ErrOutsideWorkspace, workdir, real, ws)
	}
	if fi, err := os.Stat(real); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("apply patch: workdir %s: %w", workdir, fs.ErrNotExist)
	}
	return real, nil
}

func within(root, p string) bool {
	rel, err := filepath.Rel(root, p)
	return err == nil && !escapes(rel)
}
