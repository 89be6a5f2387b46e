package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestNodeOpenClawFlags: the OpenClaw flags are checked before anything
// connects, naming the flag.
func TestNodeOpenClawFlags(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"token without a gateway", nil, []string{"--openclaw-token", "t"}, "--openclaw-token needs --openclaw-gateway"},
		{"token from the environment without a gateway", map[string]string{"EXECMESH_OPENCLAW_TOKEN": "t"}, nil, "--openclaw-token needs --openclaw-gateway"},
		{"approvals set without a gateway", nil, []string{"--openclaw-approvals-set"}, "--openclaw-approvals-set needs --openclaw-gateway"},
		{"not a WebSocket URL", nil, []string{"--openclaw-gateway", "http://127.0.0.1:18789"}, "--openclaw-gateway: openclawnode: gateway URL"},
		{"gateway from the environment", map[string]string{"EXECMESH_OPENCLAW_GATEWAY": "127.0.0.1:18789"}, nil, "want ws://HOST:PORT"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"node", "--state-dir", t.TempDir()}, tt.args...)
			r := runCLI(t, tt.env, "", args...)
			if r.code == 0 || !strings.Contains(r.stderr, tt.want) {
				t.Fatalf("exit %d, stderr %q; want %q", r.code, r.stderr, tt.want)
			}
		})
	}
}

// TestNodeSecrets: a node hides from its confined commands its own state
// dir and credentials, and the default state dirs of a gateway on the
// same machine (the environment's and ~/.execmesh), whether or not they
// exist when the node starts: a gateway started later is hidden too.
func TestNodeSecrets(t *testing.T) {
	home := t.TempDir()
	gwDir := filepath.Join(home, ".execmesh")
	other := t.TempDir()
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	tests := []struct {
		name string
		env  map[string]string
		want []string
	}{
		{"~/.execmesh, not made yet", map[string]string{"HOME": home}, []string{gwDir}},
		{"and $EXECMESH_STATE_DIR", map[string]string{"HOME": home, envStateDir: other}, []string{other, gwDir}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := nodeSecrets("/state", "/creds", "", env(tt.env))
			want := append([]string{"/state", "/creds", ""}, tt.want...)
			if !slices.Equal(got, want) {
				t.Errorf("nodeSecrets = %q, want %q", got, want)
			}
		})
	}
	if _, err := os.Stat(gwDir); err == nil {
		t.Fatal("the test made ~/.execmesh")
	}
}
