package main

import (
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
