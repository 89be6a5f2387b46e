package nodeagent

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/execmesh/execmesh/protocol"
)

// TestNodeAllowlistEnv: a node enforces its own tools.exec.allowlistEnv
// (Config.AllowlistEnv, the default when unset) on requests that reach it
// over NATS under security allowlist: a key outside it is a security
// violation naming it, a key of it lets the command run; and a bad
// pattern is refused by New, naming the field.
func TestNodeAllowlistEnv(t *testing.T) {
	if _, err := New(Config{StateDir: t.TempDir(), AllowlistEnv: []string{"TERM", "*"}}); err == nil || !strings.Contains(err.Error(), "AllowlistEnv[1]") {
		t.Fatalf("New with a lone *: %v, want an error naming AllowlistEnv[1]", err)
	}
	for _, tc := range []struct {
		name    string
		list    []string
		env     map[string]string
		refused string // "" means it runs
	}{
		{"default refuses FOO", nil, map[string]string{"FOO": "1"}, `env "FOO" may not be set`},
		{"default allows TERM", nil, map[string]string{"TERM": "dumb"}, ""},
		{"configured allows FOO", []string{"FOO"}, map[string]string{"FOO": "1"}, ""},
		{"configured refuses TERM", []string{"FOO"}, map[string]string{"TERM": "dumb"}, `env "TERM" may not be set`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.AllowlistEnv = tc.list })
			// head is a safe bin: it runs under allowlist with or without
			// the kernel's confinement.
			m, e := h.call(protocol.NodeEndpointExec, h.execRequest(map[string]any{"command": "head -n 1", "env": tc.env}, "allowlist", "off"), nil)
			if tc.refused != "" {
				if e == nil || e.Type != protocol.ErrSecurityViolation || !strings.Contains(e.Message, tc.refused) {
					t.Fatalf("exec: %v, want a security violation containing %q", e, tc.refused)
				}
				return
			}
			if e != nil {
				t.Fatalf("exec: %v", e)
			}
			var reply protocol.ExecReply
			if err := json.Unmarshal(m.Data, &reply); err != nil || reply.Result.Status() != protocol.StatusCompleted {
				t.Fatalf("exec: %v %+v, want it completed", err, reply.Result)
			}
		})
	}
}
