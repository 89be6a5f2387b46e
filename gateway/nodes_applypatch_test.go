package gateway

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/execmesh/execmesh/config"

	"github.com/execmesh/execmesh/approvals"
	"github.com/execmesh/execmesh/protocol"
)

// TestNodeApplyPatch: the same patch the gateway applies locally, applied
// on a node through POST /tools/invoke with host=node; an escaping patch
// is refused and leaves the tree untouched; the node's own security deny
// refuses; an unusable workdir is the failed-workdir result. (With
// tools.exec.applyPatch.workspaceOnly false: any workdir on the node;
// TestNodeApplyPatchWorkspaceOnly has the default.)
func TestNodeApplyPatch(t *testing.T) {
	env := startNodeGateway(t, nil, "", func(c *config.Config, _ *Options) {
		c.Tools.Exec.ApplyPatch.Enabled = true
		c.Tools.Exec.ApplyPatch.WorkspaceOnly = false
	})
	cfg := testAgentConfig(t, env.srv, "patcher")
	env.pairAgent(cfg)
	if err := os.Mkdir(filepath.Join(cfg.Cwd, "proj"), 0o755); err != nil {
		t.Fatal(err)
	}
	patch := "*** Begin Patch\n*** Add File: hello.txt\n+hello\n*** End Patch\n"
	res := env.invoke("apply_patch", map[string]any{"input": patch, "workdir": "proj", "host": "node"}, "")
	if !strings.Contains(res.Text(), "A hello.txt") {
		t.Fatalf("apply: %s %v", res.Text(), res.Details)
	}
	if b, err := os.ReadFile(filepath.Join(cfg.Cwd, "proj", "hello.txt")); err != nil || string(b) != "hello\n" {
		t.Fatalf("file on the node: %q %v", b, err)
	}
	// Absolute workdir.
	abs := t.TempDir()
	res = env.invoke("apply_patch", map[string]any{"input": patch, "workdir": abs, "host": "node"}, "")
	if _, err := os.Stat(filepath.Join(abs, "hello.txt")); err != nil {
		t.Fatalf("absolute workdir: %s: %v", res.Text(), err)
	}

	before := snapshotTree(t, cfg.Cwd)
	escape := "*** Begin Patch\n*** Add File: ok.txt\n+fine\n*** Add File: ../escaped.txt\n+x\n*** End Patch\n"
	r := env.invokeRaw("apply_patch", map[string]any{"input": escape, "workdir": "proj", "host": "node"}, "")
	if r.Status != 400 || r.Error == nil || r.Error.Type != protocol.ErrSecurityViolation {
		t.Fatalf("escape: %d %s", r.Status, r.Raw)
	}
	if after := snapshotTree(t, cfg.Cwd); after != before {
		t.Fatalf("tree changed by a refused patch:\nbefore %s\nafter  %s", before, after)
	}

	res = env.invoke("apply_patch", map[string]any{"input": patch, "workdir": "missing-dir", "host": "node"}, "")
	if res.Status() != protocol.StatusFailed || !strings.Contains(res.Text(), "missing-dir") {
		t.Fatalf("bad workdir: %s %v", res.Text(), res.Details)
	}

	// The node's own file says deny: refused, nothing written.
	f := approvals.NewFile()
	f.Defaults = &approvals.Settings{Security: approvals.SecurityDeny}
	if _, err := approvals.Save(approvals.Path(cfg.StateDir), f, ""); err != nil {
		t.Fatal(err)
	}
	other := "*** Begin Patch\n*** Add File: denied.txt\n+no\n*** End Patch\n"
	r = env.invokeRaw("apply_patch", map[string]any{"input": other, "workdir": "proj", "host": "node"}, "")
	if r.Status != 400 || r.Error == nil || r.Error.Type != protocol.ErrDenied {
		t.Fatalf("node deny: %d %s", r.Status, r.Raw)
	}
	if _, err := os.Stat(filepath.Join(cfg.Cwd, "proj", "denied.txt")); err == nil {
		t.Fatal("denied patch written")
	}
}

// TestNodeApplyPatchWorkspaceOnly: by default a node confines patches to
// the agent's workspace below its own workspace root (the gateway does not
// send anyWorkdir); a workdir outside it, or a .git path, is a security
// violation and nothing is written.
func TestNodeApplyPatchWorkspaceOnly(t *testing.T) {
	env := startNodeGateway(t, nil, "", func(c *config.Config, _ *Options) {
		c.Tools.Exec.ApplyPatch.Enabled = true
	})
	cfg := testAgentConfig(t, env.srv, "patcher")
	cfg.Workspace = filepath.Join(t.TempDir(), "ws")
	env.pairAgent(cfg)
	patch := "*** Begin Patch\n*** Add File: hello.txt\n+hello\n*** End Patch\n"
	res := env.invoke("apply_patch", map[string]any{"input": patch, "host": "node"}, "")
	if !strings.Contains(res.Text(), "A hello.txt") {
		t.Fatalf("apply: %s %v", res.Text(), res.Details)
	}
	if b, err := os.ReadFile(filepath.Join(cfg.Workspace, "main", "hello.txt")); err != nil || string(b) != "hello\n" {
		t.Fatalf("file in the node's workspace: %q %v", b, err)
	}
	before := snapshotTree(t, cfg.Cwd)
	for _, args := range []map[string]any{
		{"input": patch, "workdir": cfg.Cwd, "host": "node"},
		{"input": "*** Begin Patch\n*** Add File: r/.git/config\n+[core]\n+\tfsmonitor = id\n*** End Patch\n", "host": "node"},
	} {
		r := env.invokeRaw("apply_patch", args, "")
		if r.Status != 400 || r.Error == nil || r.Error.Type != protocol.ErrSecurityViolation {
			t.Fatalf("%v: %d %s", args, r.Status, r.Raw)
		}
	}
	if after := snapshotTree(t, cfg.Cwd); after != before {
		t.Fatal("a refused patch wrote on the node")
	}
	if _, err := os.Stat(filepath.Join(cfg.Workspace, "main", "r")); err == nil {
		t.Fatal(".git patch written")
	}
}

// snapshotTree lists every path and file content below root.
func snapshotTree(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		b.WriteString(p)
		if !fi.IsDir() {
			c, _ := os.ReadFile(p)
			b.WriteString("=" + string(c))
		}
		b.WriteString("\n")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}
