package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/execmesh/execmesh/config"
)

// TestStateDirFromInvocationHome: with neither --state-dir nor
// EXECMESH_STATE_DIR, every command takes ~/.execmesh from the HOME of its
// own invocation, never the process's: a client does not send an operator
// token it found in the process's home (a `make run` before `make test`
// leaves one in the real ~/.execmesh), and a daemon's state dir is the
// invocation's. Not parallel: it sets the process's HOME.
func TestStateDirFromInvocationHome(t *testing.T) {
	procHome := t.TempDir()
	procState := filepath.Join(procHome, config.StateDirName)
	if err := os.MkdirAll(procState, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(procState, "operator.token"), []byte(strings.Repeat("p", 64)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("HOME", procHome)

	// A client: the operator call goes out with the tool token and is
	// refused as such, not with the process home's operator token.
	env := startGateway(t, func(c *config.Config) {
		c.Gateway.Auth.Token = "tool-tok"
		c.Tools.Exec.Security, c.Tools.Exec.Ask = "", "" // approvals
	})
	env["EXECMESH_GATEWAY_TOKEN"] = "tool-tok"
	r := runCLI(t, env, "", "approvals", "resolve", pendingApproval(t, env), "deny")
	if r.code == 0 || !strings.Contains(r.stderr, "needs the operator token") {
		t.Fatalf("resolve without an operator token of its own: %d %s %s", r.code, r.stdout, r.stderr)
	}

	// A daemon: its state dir is the invocation's ~/.execmesh.
	invHome := t.TempDir()
	c := &cli{env: map[string]string{"HOME": invHome}}
	cfg, _, err := c.loadServerConfig(&serverFlags{})
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(invHome, config.StateDirName); cfg.StateDir != want {
		t.Fatalf("daemon state dir %q, want %q (not the process's %q)", cfg.StateDir, want, procState)
	}
	if want := filepath.Join(invHome, config.StateDirName, "workspace"); cfg.Sandbox.Workspace != want {
		t.Fatalf("sandbox workspace %q, want %q", cfg.Sandbox.Workspace, want)
	}
}
