package gateway

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/config"

	"github.com/execmesh/execmesh/internal/hostid"
	"github.com/execmesh/execmesh/nodeagent"
)

// TestNodeDecideByName: approve and reject take a node's name where the
// id is not known, as exec's node parameter does; an
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
	tg := startGateway(t, func(c *config.Config, _ *Options) { c.Gateway.Auth.Token = "tok" })
	r := tg.do("GET", "/healthz", nil, map[string][]string{"Authorization": {"Bearer wrong"}})
	var h struct {
		OK     bool   `json:"ok"`
		HostID string `json:"hostId"`
	}
	if r.Status != 200 || json.Unmarshal(r.Raw, &h) != nil || !h.OK || h.HostID != mine {
		t.Fatalf("/healthz: %d %s, want hostId %s", r.Status, r.Raw, mine)
	}
}

// TestBlockersIsAList: no blockers is [], not null.
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
	next := config.Default()
	var loadErr error
	tg := startGateway(t, func(c *config.Config, o *Options) {
		c.Gateway.Listen = "0.0.0.0:0"
		c.Gateway.Auth.Token = "tok"
		o.Load = func() (config.Config, error) { return next, loadErr }
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
