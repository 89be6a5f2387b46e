package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/execmesh/execmesh/config"

	"github.com/nats-io/nats.go"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
	"github.com/execmesh/execmesh/host"
	"github.com/execmesh/execmesh/nodeagent"
	"github.com/execmesh/execmesh/protocol"
)

// testHeartbeat is the node heartbeat interval in these tests (see
// testNodeEnv for the presence TTL).
const testHeartbeat = 100 * time.Millisecond

// testNodeEnv is the environment the test gateways read: a presence TTL
// of 3 s, so that heartbeats every 0.1 s may be late on a loaded machine
// without the node looking lost.
func testNodeEnv(key string) string {
	if key == "EXECMESH_NODE_PRESENCE_TTL_MS" {
		return "3000"
	}
	return ""
}

// testNodeEnvWith is testNodeEnv with more settings.
func testNodeEnvWith(more map[string]string) func(string) string {
	return func(key string) string {
		if v, ok := more[key]; ok {
			return v
		}
		return testNodeEnv(key)
	}
}

// nodeEnv is a gateway served over HTTP with its NATS API and node backend
// attached to a real embedded server.
type nodeEnv struct {
	*testGateway
	srv      *bus.Server
	nc       *nats.Conn
	stateDir string
	closeFn  func()
}

// startNodeGateway starts a gateway on srv (a fresh embedded server when
// nil) with the node backend attached before the HTTP handler is built, as
// the daemon wiring does. stateDir "" means a fresh one.
func startNodeGateway(t *testing.T, srv *bus.Server, stateDir string, mutate func(*config.Config, *Options), client ...func(*bus.ClientConfig)) *nodeEnv {
	t.Helper()
	if srv == nil {
		srv = bustest.StartServer(t)
	}
	if stateDir == "" {
		stateDir = t.TempDir()
	}
	cfg := config.Default()
	cfg.StateDir = stateDir
	cfg.Tools.Exec.Security = "full"
	cfg.Tools.Exec.Ask = "off"
	cfg.Tools.Exec.KillGraceMs = 1000
	cwd := t.TempDir()
	opts := Options{
		Cwd:            cwd,
		Environ:        []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + cwd, "SHELL=/bin/sh", "LANG=C"},
		Getenv:         testNodeEnv,
		LoginShellPath: func() string { return "" },
		Confine:        host.ConfineConfig{Helper: "/proc/self/exe"},
	}
	if mutate != nil {
		mutate(&cfg, &opts)
	}
	cc := bus.ClientConfig{Name: "gateway"}
	for _, f := range client {
		f(&cc)
	}
	nc := bustest.Connect(t, srv, cc)
	opts.Conn, opts.Server = nc, srv
	g, err := New(t.Context(), cfg, opts)
	if err != nil {
		t.Fatalf("gateway.New: %v", err)
	}
	hs := httptest.NewServer(g.Handler())
	env := &nodeEnv{
		testGateway: &testGateway{t: t, g: g, srv: hs, token: cfg.Gateway.Auth.Token, cwd: cwd},
		srv:         srv, nc: nc, stateDir: stateDir,
	}
	var closed bool
	env.closeFn = func() {
		if closed {
			return
		}
		closed = true
		hs.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := g.Close(ctx); err != nil {
			t.Errorf("gateway.Close: %v", err)
		}
	}
	t.Cleanup(env.close)
	return env
}

// close stops the gateway (idempotent); the NATS server stays.
func (e *nodeEnv) close() { e.closeFn() }

// testAgentConfig is a node agent configuration for tests: short
// heartbeats, a fixed environment, a fresh state dir.
func testAgentConfig(t *testing.T, srv *bus.Server, name string) nodeagent.Config {
	t.Helper()
	cfg := nodeagent.DefaultConfig()
	cfg.Confine = host.ConfineConfig{Helper: "/proc/self/exe"}
	cfg.StateDir = t.TempDir()
	cfg.Name = name
	cfg.Client = bus.ClientConfig{URLs: []string{srv.ClientURL()}}
	cfg.HeartbeatInterval = testHeartbeat
	home := t.TempDir()
	cfg.Cwd = home
	cfg.Environ = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + home, "SHELL=/bin/sh", "LANG=C"}
	cfg.Session.Shell = "/bin/sh"
	cfg.Session.KillGrace = time.Second
	return cfg
}

// startAgent starts an in-process node agent; it is closed at cleanup.
func startAgent(t *testing.T, cfg nodeagent.Config) *nodeagent.Agent {
	t.Helper()
	a, err := nodeagent.New(cfg)
	if err != nil {
		t.Fatalf("nodeagent.New: %v", err)
	}
	if err := a.Start(t.Context()); err != nil {
		t.Fatalf("agent.Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := a.Close(ctx); err != nil {
			t.Errorf("agent.Close: %v", err)
		}
	})
	return a
}

// waitNode waits until the gateway lists node id with the given status
// (and pairing, when not empty).
func (e *nodeEnv) waitNode(id, status, pairing string) NodeView {
	e.t.Helper()
	var got NodeView
	checkFor(e.t, 30*time.Second, func() error {
		for _, n := range e.g.Nodes() {
			if n.ID == id {
				got = n
				if n.Status == status && (pairing == "" || n.Pairing == pairing) {
					return nil
				}
				return fmt.Errorf("node %s: status %s pairing %s", id, n.Status, n.Pairing)
			}
		}
		return fmt.Errorf("node %s not listed", id)
	})
	return got
}

// pairAgent starts an agent, waits for the gateway to see it, approves it
// and waits until the agent knows.
func (e *nodeEnv) pairAgent(cfg nodeagent.Config) *nodeagent.Agent {
	e.t.Helper()
	a := startAgent(e.t, cfg)
	e.waitNode(a.ID(), "connected", "")
	r := e.do("POST", "/v1/nodes/"+a.ID()+"/approve", nil, nil)
	if r.Status != 200 {
		e.t.Fatalf("approve: %d %s", r.Status, r.Raw)
	}
	checkFor(e.t, 30*time.Second, func() error {
		if a.Pairing() != nodeagent.PairingPaired {
			return fmt.Errorf("agent pairing %q", a.Pairing())
		}
		return nil
	})
	return a
}

// invokeErr calls a tool and fails the test unless the answer is an error.
func (tg *testGateway) invokeErr(tool string, args any, sessionKey string) (int, *protocol.Error) {
	tg.t.Helper()
	r := tg.invokeRaw(tool, args, sessionKey)
	if r.Error == nil {
		tg.t.Fatalf("%s %v: want an error, got %d %s", tool, args, r.Status, r.Raw)
	}
	return r.Status, r.Error
}

// events takes the queued events of sessionKey, waiting up to wait.
func (tg *testGateway) events(sessionKey string, wait time.Duration) []protocol.SystemEvent {
	tg.t.Helper()
	r := tg.do("GET", fmt.Sprintf("/v1/events?sessionKey=%s&waitMs=%d", sessionKey, wait.Milliseconds()), nil, nil)
	var out struct {
		Events []protocol.SystemEvent `json:"events"`
	}
	if err := json.Unmarshal(r.Raw, &out); err != nil {
		tg.t.Fatalf("events: %v: %s", err, r.Raw)
	}
	return out.Events
}
