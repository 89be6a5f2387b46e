package gateway

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/execmesh/execmesh/approvals"
	"github.com/execmesh/execmesh/config"
	"github.com/execmesh/execmesh/protocol"
)

// TestAllowlistEnvOverHTTP: under security allowlist a request env key
// outside tools.exec.allowlistEnv is a 400 security violation naming the
// key, and the command (allowlisted, so that it would run) leaves no
// marker; keys of the list let a command run (a safe bin, which runs with
// or without the kernel's confinement); a configured list replaces the
// default.
func TestAllowlistEnvOverHTTP(t *testing.T) {
	for _, tc := range []struct {
		name    string
		list    []string // nil: the default
		env     map[string]string
		errText string // "" means it runs
	}{
		{"default list refuses FOO", nil, map[string]string{"FOO": "1"},
			`Security Violation: env "FOO" may not be set by a request under security allowlist (allowed: tools.exec.allowlistEnv: TERM, LANG,`},
		{"default list allows TERM and LC_ALL", nil, map[string]string{"TERM": "dumb", "LC_ALL": "C"}, ""},
		{"configured list allows FOO", []string{"FOO"}, map[string]string{"FOO": "1"}, ""},
		{"configured list refuses TERM", []string{"FOO"}, map[string]string{"TERM": "dumb"}, `env "TERM" may not be set`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tg := startGateway(t, func(c *config.Config, _ *Options) {
				c.Tools.Exec.Security, c.Tools.Exec.Ask = "allowlist", "off"
				if tc.list != nil {
					c.Tools.Exec.AllowlistEnv = tc.list
				}
				if _, err := approvals.Update(approvals.Path(c.StateDir), func(f *approvals.File) error {
					f.Agents["*"] = &approvals.Agent{Allowlist: []approvals.Entry{{Pattern: "/usr/bin/touch"}}}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
			})
			if tc.errText == "" {
				r := tg.invokeRaw("exec", map[string]any{"command": "head -n 1", "env": tc.env, "host": "gateway"}, "")
				if r.Status != 200 || r.Result == nil || r.Result.Status() != protocol.StatusCompleted {
					t.Fatalf("got %d %s; want the command to run", r.Status, r.Raw)
				}
				return
			}
			marker := filepath.Join(tg.cwd, "ran")
			r := tg.invokeRaw("exec", map[string]any{"command": "touch " + marker, "env": tc.env, "host": "gateway"}, "")
			_, statErr := os.Stat(marker)
			if r.Status != 400 || r.Error == nil || r.Error.Type != protocol.ErrSecurityViolation || !strings.Contains(r.Error.Message, tc.errText) {
				t.Fatalf("got %d %s, want 400 security_violation containing %q", r.Status, r.Raw, tc.errText)
			}
			if !errors.Is(statErr, os.ErrNotExist) {
				t.Fatalf("a refused command ran (marker: %v)", statErr)
			}
		})
	}
}
