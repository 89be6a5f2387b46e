package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/execmesh/execmesh/config"

	"github.com/execmesh/execmesh/access"
)

// TestOperatorTokenSent: client commands send the operator token (from
// the state dir, or EXECMESH_OPERATOR_TOKEN) to operator endpoints only,
// and the tool token everywhere else, against a real gateway.
func TestOperatorTokenSent(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	env := startGateway(t, func(c *config.Config) {
		c.StateDir = state
		c.Gateway.Auth.Token = "tool-tok"
		c.Tools.Exec.Security, c.Tools.Exec.Ask = "", "" // approvals
	})
	env["EXECMESH_GATEWAY_TOKEN"] = "tool-tok"
	pending := func() string { return pendingApproval(t, env) }
	id := pending()
	// Without the operator token: the tool token, refused.
	r := runCLI(t, env, "", "approvals", "resolve", id, "deny")
	if r.code == 0 || !strings.Contains(r.stderr, "needs the operator token") {
		t.Fatalf("resolve with the tool token: %d %s %s", r.code, r.stdout, r.stderr)
	}
	// From the gateway's state dir.
	withState := map[string]string{envStateDir: state}
	for k, v := range env {
		withState[k] = v
	}
	if r := runCLI(t, withState, "", "approvals", "resolve", id, "deny"); r.code != 0 {
		t.Fatalf("resolve as the operator (state dir): %d %s %s", r.code, r.stdout, r.stderr)
	}
	// From EXECMESH_OPERATOR_TOKEN.
	tok, err := os.ReadFile(filepath.Join(state, access.OperatorTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	env["EXECMESH_OPERATOR_TOKEN"] = strings.TrimSpace(string(tok))
	if r := runCLI(t, env, "", "approvals", "resolve", pending(), "deny"); r.code != 0 {
		t.Fatalf("resolve as the operator (environment): %d %s %s", r.code, r.stdout, r.stderr)
	}
	for _, c := range []struct {
		method, path string
		want         bool
	}{
		{"POST", "/v1/approvals/ab12", true},
		{"POST", "/v1/nodes/invite", true},
		{"POST", "/v1/nodes/n1/approve", true},
		{"GET", "/v1/nodes/n1/approvals", true},
		{"PUT", "/v1/nodes/n1/approvals", true},
		{"PUT", "/v1/config/exec-node", true},
		{"POST", "/v1/admin/reload", true},
		{"GET", "/v1/admin/blockers", false},
		{"GET", "/v1/approvals", false},
		{"GET", "/v1/nodes", false},
		{"POST", "/tools/invoke", false},
		{"PUT", "/v1/sessions/agent:main:main/exec", false},
	} {
		if got := isOperatorRequest(c.method, c.path); got != c.want {
			t.Errorf("%s %s: operator %v, want %v", c.method, c.path, got, c.want)
		}
	}
}

// pendingApproval makes an exec call that waits for approval, with the
// environment's tool token, and returns its approval id.
func pendingApproval(t *testing.T, env map[string]string) string {
	t.Helper()
	r := runCLIRetrying(t, env, "", "call", `{"tool":"exec","args":{"command":"echo needs-approval"}}`)
	var ans struct {
		Result struct {
			Details struct {
				ApprovalID string `json:"approvalId"`
			} `json:"details"`
		} `json:"result"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &ans) != nil || ans.Result.Details.ApprovalID == "" {
		t.Fatalf("call with the tool token: %d %s %s", r.code, r.stdout, r.stderr)
	}
	return ans.Result.Details.ApprovalID
}
