package host

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/execmesh/execmesh/protocol"
)

// addFile is a patch that adds name with one line.
func addFile(name string) string {
	return "*** Begin Patch\n*** Add File: " + name + "\n+patched\n*** End Patch\n"
}

// TestApplyPatchWorkspaceRule: without AnyWorkdir a patch writes only
// under the agent's workspace (<Workspace>/<agentId>): its workdir is
// taken from there and may not leave it, and a host without a workspace
// root refuses; with AnyWorkdir any existing directory the host accepts
// is the root. A patch never leaves its root, security deny refuses, and
// nothing is written by a refused patch.
func TestApplyPatchWorkspaceRule(t *testing.T) {
	t.Parallel()
	ws := t.TempDir()
	outside := t.TempDir()
	for _, tc := range []struct {
		name      string
		workspace string
		req       protocol.ApplyPatchRequest
		wantFile  string // written on success, relative to ws unless absolute
		errType   protocol.ErrorType
		errText   string
		failed    bool // a failed result (workdir unavailable), not an error
	}{
		{name: "workspace", workspace: ws, req: protocol.ApplyPatchRequest{Args: protocol.ApplyPatchArgs{Input: addFile("a.txt")}}, wantFile: "main/a.txt"},
		{name: "another agent", workspace: ws, req: protocol.ApplyPatchRequest{AgentID: "ops", Args: protocol.ApplyPatchArgs{Input: addFile("a.txt")}}, wantFile: "ops/a.txt"},
		{name: "workdir outside the workspace", workspace: ws, req: protocol.ApplyPatchRequest{Args: protocol.ApplyPatchArgs{Input: addFile("b.txt"), Workdir: outside}}, errType: protocol.ErrSecurityViolation, errText: "workspaceOnly"},
		{name: "relative workdir climbing out", workspace: ws, req: protocol.ApplyPatchRequest{Args: protocol.ApplyPatchArgs{Input: addFile("b.txt"), Workdir: "../.."}}, errType: protocol.ErrSecurityViolation, errText: "workspaceOnly"},
		{name: "missing workdir in the workspace", workspace: ws, req: protocol.ApplyPatchRequest{Args: protocol.ApplyPatchArgs{Input: addFile("b.txt"), Workdir: "nope"}}, failed: true},
		{name: "no workspace root", workspace: "", req: protocol.ApplyPatchRequest{Args: protocol.ApplyPatchArgs{Input: addFile("b.txt")}}, errType: protocol.ErrSecurityViolation, errText: "has no workspace root"},
		{name: "bad agent id", workspace: ws, req: protocol.ApplyPatchRequest{AgentID: "../x", Args: protocol.ApplyPatchArgs{Input: addFile("b.txt")}}, errType: protocol.ErrInvalidRequest},
		{name: "any workdir", workspace: "", req: protocol.ApplyPatchRequest{AnyWorkdir: true, Args: protocol.ApplyPatchArgs{Input: addFile("c.txt"), Workdir: outside}}, wantFile: filepath.Join(outside, "c.txt")},
		{name: "any workdir missing", workspace: "", req: protocol.ApplyPatchRequest{AnyWorkdir: true, Args: protocol.ApplyPatchArgs{Input: addFile("c.txt"), Workdir: "/nonexistent/dir"}}, failed: true},
		{name: "patch leaves its root", workspace: ws, req: protocol.ApplyPatchRequest{Args: protocol.ApplyPatchArgs{Input: addFile("../escape.txt")}}, errType: protocol.ErrSecurityViolation},
		{name: "security deny", workspace: ws, req: protocol.ApplyPatchRequest{Security: "deny", Args: protocol.ApplyPatchArgs{Input: addFile("d.txt")}}, errType: protocol.ErrDenied, errText: "security=deny"},
		{name: "sandbox target without a sandbox", workspace: ws, req: protocol.ApplyPatchRequest{Target: protocol.TargetSandbox, Args: protocol.ApplyPatchArgs{Input: addFile("d.txt")}}, errType: protocol.ErrHostNotAllowed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLocal(t, KindGateway, nil)
			l.SetSettings(Settings{Workspace: tc.workspace})
			req := tc.req
			req.SessionKey = testKey
			if req.Target == "" {
				req.Target = protocol.TargetGateway
			}
			if req.Security == "" {
				req.Security = "full"
			}
			before := tree(t, ws, outside)
			res, err := l.ApplyPatch(t.Context(), req)
			switch {
			case tc.errType != "":
				if errType(err) != tc.errType || !strings.Contains(err.Error(), tc.errText) {
					t.Fatalf("%+v %v, want a %s error mentioning %q", res, err, tc.errType, tc.errText)
				}
			case tc.failed:
				if err != nil || res.Status() != protocol.StatusFailed {
					t.Fatalf("%+v %v, want a failed result", res, err)
				}
			default:
				if err != nil || res.Status() != protocol.StatusCompleted {
					t.Fatalf("%+v %v", res, err)
				}
				path := tc.wantFile
				if !filepath.IsAbs(path) {
					path = filepath.Join(ws, path)
				}
				if b, err := os.ReadFile(path); err != nil || string(b) != "patched\n" {
					t.Fatalf("%s: %q %v", path, b, err)
				}
				return
			}
			if after := tree(t, ws, outside); after != before {
				t.Errorf("a refused patch changed files:\n%s\nthen\n%s", before, after)
			}
		})
	}
}

// tree lists the regular files under dirs and their parents' siblings
// (where an escaping patch would write).
func tree(t *testing.T, dirs ...string) string {
	t.Helper()
	var b strings.Builder
	for _, d := range dirs {
		_ = filepath.Walk(filepath.Dir(d), func(p string, fi os.FileInfo, err error) error {
			if err == nil && fi.Mode().IsRegular() && strings.HasSuffix(p, ".txt") {
				b.WriteString(p + "\n")
			}
			return nil
		})
	}
	return b.String()
}
