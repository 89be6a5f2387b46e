package main

import (
	"strings"
	"testing"
)

// TestNodeAllowlistEnvVariable: a bad EXECMESH_NODE_ALLOWLIST_ENV entry
// stops `execmesh node` before it connects, naming the variable and the
// entry.
func TestNodeAllowlistEnvVariable(t *testing.T) {
	r := runCLI(t, map[string]string{"EXECMESH_NODE_ALLOWLIST_ENV": "TERM, LC_*, A-B"}, "", "node", "--state-dir", t.TempDir())
	if r.code == 0 || !strings.Contains(r.stderr, `EXECMESH_NODE_ALLOWLIST_ENV: "A-B" is not a variable name`) {
		t.Fatalf("exit %d, stderr %q; want a refusal naming the variable and A-B", r.code, r.stderr)
	}
}
