package gateway

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/internal/hostid"
	"github.com/execmesh/execmesh/nodeagent"
)

// TestNodeDecideByName: approve and reject take a node's name where the
// id is not known, as exec's node parameter does (issue 13 item 7); an
// unknown name is a 404 that says so, an ambiguous one a 400 listing the
// ids.
func TestNodeDecideByName(t *testing.T) {
	env := startNodeGateway(t, nil, "", nil)
	a := startAgent(t, testAgentConfig(t, env.srv, "build-1"))
	env.waitNode(a.ID(), "connected", "")
	r := env.do("POST", "/v1/nodes/build-1/approve", nil, nil)
	var ans struct{ Node NodeView }
	if r.Status != 200 || json.Unmarshal(r.Raw, &ans) != nil || ans.Node.ID != a.ID() || ans.Node.Pairing != "paired" {
		t.Fatalf("approve by name: %d %s", r.Status, r.Raw)
	}
	checkFor(t, 30*time.Second, func() error {
		if a.Pairing() != nodeagent.PairingPaired {
			return errors.New("agent not paired yet")
		}
		return nil
	})
	if r := env.do("POST", "/v1/nodes/BUILD-1/reject", nil, nil); r.Status != 200 || !strings.Contains(string(r.Raw), `"pairing":"rejected"`) {
		t.Fatalf("reject by name (case-insensitive): %d %s", r.Status, r.Raw)
	}
	if r := env.do("POST", "/v1/nodes/build-9/reject", nil, nil); r.Status != 404 || !strings.Contains(string(r.Raw), `unknown node \"build-9\": no node with that id or name`) {
		t.Fatalf("unknown name: %d %s", r.Status, r.Raw)
	}
	b := startAgent(t, testAgentConfig(t, env.srv, "twin"))
	c := startAgent(t, testAgentConfig(t, env.srv, "twin"))
	env.waitNode(b.ID(), "connected", "")
	env.waitNode(c.ID(), "connected", "")
	if r := env.do("POST", "/v1/nodes/twin/approve", nil, nil); r.Status != 400 || !strings.Contains(string(r.Raw), "ambiguous") {
		t.Fatalf("ambiguous name: %d %s", r.Status, r.Raw)
	}
}

// TestHealthReportsHostID: /healthz carries the gateway's host id (the
// same as this process's: one machine, one mount namespace), without a
// token; a client compares it with its own to send its working directory.
func TestHealthReportsHostID(t *testing.T) {
	mine, err := hostid.ID()
	if err != nil {
		t.Skipf("no host id here: %v", err)
	}
	tg := startGateway(t, func(c *Config, _ *Options) { c.Gateway.Auth.Token = "tok" })
	r := tg.do("GET", "/healthz", nil, map[string][]string{"Authorization": {"Bearer wrong"}})
	var h struct {
		OK     bool   `json:"ok"`
		HostID string `json:"hostId"`
	}
	if r.Status != 200 || json.Unmarshal(r.Raw, &h) != nil || !h.OK || h.HostID != mine {
		t.Fatalf("/healthz: %d %s, want hostId %s", r.Status, r.Raw, mine)
	}
}

// TestBlockersIsAList: no blockers is [], not null (issue 13 item 9).
func TestBlockersIsAList(t *testing.T) {
	tg := startGateway(t, nil)
	if r := tg.do("GET", "/v1/admin/blockers", nil, nil); r.Status != 200 || strings.TrimSpace(string(r.Raw)) != `{"blockers":[]}` {
		t.Fatalf("blockers: %d %s", r.Status, r.Raw)
	}
}

// TestReloadThroughLoad: with Options.Load, Reload applies what it builds
// (the host's layering: a file created after the start, the environment,
// the flags); a configuration that drops the token of a gateway listening
// beyond loopback is refused and the old one stays.
func TestReloadThroughLoad(t *testing.T) {
	next := DefaultConfig()
	var loadErr error
	tg := startGateway(t, func(c *Config, o *Options) {
		c.Gateway.Listen = "0.0.0.0:0"
		c.Gateway.Auth.Token = "tok"
		o.Load = func() (Config, error) { return next, loadErr }
	})
	next.StateDir = tg.g.Config().StateDir
	next.Gateway.Auth.Token = "tok"
	next.Tools.Deny = []string{"exec"}
	if err := tg.g.Reload(); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	if got := tg.g.Config(); len(got.Tools.Deny) != 1 || got.Gateway.Listen != "0.0.0.0:0" {
		t.Fatalf("after reload: deny %v listen %s", got.Tools.Deny, got.Gateway.Listen)
	}
	next.Gateway.Auth.Token = ""
	next.Tools.Deny = nil
	if err := tg.g.Reload(); err == nil || !strings.Contains(err.Error(), "gateway.auth.token") {
		t.Fatalf("reload without the token: %v", err)
	}
	if got := tg.g.Config(); got.Gateway.Auth.Token != "tok" || len(got.Tools.Deny) != 1 {
		t.Fatalf("a refused reload changed the configuration: %+v", got.Gateway)
	}
	loadErr = errors.New("tools.exec.host: invalid value")
	if err := tg.g.Reload(); err == nil || !strings.Contains(err.Error(), "tools.exec.host") {
		t.Fatalf("failing Load: %v", err)
	}
}

// TestExecPolicyDefaults: the security and ask in force when nothing sets
// them, as DESIGN.md §3.4 says; the agent's values over the global ones.
func TestExecPolicyDefaults(t *testing.T) {
	tests := []struct {
		name     string
		mutate   func(*Config)
		sec, ask string
		agent    string
	}{
		{"defaults", nil, "allowlist", "on-miss", "main"},
		{"sandbox host", func(c *Config) { c.Tools.Exec.Host = "sandbox" }, "deny", "on-miss", "main"},
		{"auto with a sandbox", func(c *Config) { c.Sandbox.Mode = "bwrap" }, "deny", "on-miss", "main"},
		{"global values", func(c *Config) { c.Tools.Exec.Security, c.Tools.Exec.Ask = "full", "off" }, "full", "off", "main"},
		{"the agent's", func(c *Config) {
			c.Tools.Exec.Security = "full"
			c.Agents.List = []AgentConfig{{ID: "ops", Tools: AgentToolsConfig{Exec: AgentExecConfig{Security: "deny", Ask: "always"}}}}
		}, "deny", "always", "ops"},
	}
	for _, tt := range tests {
		cfg := DefaultConfig()
		if tt.mutate != nil {
			tt.mutate(&cfg)
		}
		if sec, ask := cfg.ExecPolicy(tt.agent); sec != tt.sec || ask != tt.ask {
			t.Errorf("%s: %s %s, want %s %s", tt.name, sec, ask, tt.sec, tt.ask)
		}
	}
}

// TestEnvVarNamesTheKey: every EXECMESH_* override names its key.
func TestEnvVarNamesTheKey(t *testing.T) {
	for key, want := range map[string]string{
		"tools.exec.security":    "EXECMESH_EXEC_SECURITY",
		"stateDir":               "EXECMESH_STATE_DIR",
		"gateway.auth.token":     "EXECMESH_GATEWAY_TOKEN",
		"tools.exec.pathPrepend": "",
	} {
		if got := EnvVar(key); got != want {
			t.Errorf("EnvVar(%q) = %q, want %q", key, got, want)
		}
	}
	// Each variable sets the key its tag names.
	for key := range map[string]bool{"tools.exec.security": true, "nats.listen": true, "sandbox.mode": true} {
		v := EnvVar(key)
		val := map[string]string{"tools.exec.security": "full", "nats.listen": "127.0.0.1:5999", "sandbox.mode": "off"}[key]
		cfg, err := LoadConfig("", map[string]string{v: val})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{"tools.exec.security": cfg.Tools.Exec.Security, "nats.listen": cfg.NATS.Listen, "sandbox.mode": cfg.Sandbox.Mode}[key]
		if got != val {
			t.Errorf("%s=%s set %s to %q", v, val, key, got)
		}
	}
}
