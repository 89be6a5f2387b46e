package applypatch

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

func TestWorkspaceRule(t *testing.T) {
	root := filepath.Join(t.TempDir(), "ws")
	ws, err := AgentWorkspace(root, "")
	if err != nil || ws != filepath.Join(root, DefaultAgentID) {
		t.Fatalf("AgentWorkspace = %q, %v", ws, err)
	}
	if fi, err := os.Stat(ws); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("workspace mode: %v %v", fi, err)
	}
	for _, bad := range []string{"..", ".hidden", "-x", "a/b", "a b"} {
		if _, err := AgentWorkspace(root, bad); err == nil {
			t.Errorf("agent id %q accepted", bad)
		}
	}
	outside := t.TempDir()
	writeFiles(t, ws, map[string]string{"proj/f": ""})
	symlink(t, outside, filepath.Join(ws, "out"))
	for workdir, want := range map[string]error{
		"":                           nil,
		"proj":                       nil,
		filepath.Join(ws, "proj"):    nil,
		"missing":                    fs.ErrNotExist,
		"proj/f":                     fs.ErrNotExist,
		"../":                        ErrOutsideWorkspace,
		outside:                      ErrOutsideWorkspace,
		"out":                        ErrOutsideWorkspace, // a link leading out
		filepath.Join(ws, "..", "x"): ErrOutsideWorkspace,
	} {
		dir, err := WorkdirIn(ws, workdir)
		if want == nil && err != nil || want != nil && !errors.Is(err, want) {
			t.Errorf("WorkdirIn(%q) = %q, %v; want %v", workdir, dir, err, want)
		}
	}
}
