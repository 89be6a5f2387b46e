package ui

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/execmesh/execmesh/config"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
	"github.com/execmesh/execmesh/gateway"
	"github.com/execmesh/execmesh/nodeagent"
	"github.com/execmesh/execmesh/protocol"
)

// testHeartbeat is the node agents' heartbeat interval in these tests;
// the gateway's presence TTL (testGatewayEnv) leaves room for late beats
// on a loaded machine.
const testHeartbeat = 200 * time.Millisecond

// testGatewayEnv is the environment the test gateways read.
func testGatewayEnv(key string) string {
	if key == "EXECMESH_NODE_PRESENCE_TTL_MS" {
		return "5000"
	}
	return ""
}

// startNodeGateway starts an embedded NATS server and a gateway with a
// token that runs commands without approvals, serving its NATS API and
// node backend there, as the daemon does; everything is closed at the end
// of the test. The gateway's HTTP handler is built by the caller, after
// this returns (the node routes exist from now on).
func startNodeGateway(t *testing.T, token string) (*gateway.Gateway, *bus.Server) {
	t.Helper()
	srv := bustest.StartServer(t)
	dir := t.TempDir()
	cfg := config.Default()
	cfg.StateDir = dir
	cfg.Gateway.Auth.Token = token
	cfg.Tools.Exec.Security = "full"
	cfg.Tools.Exec.Ask = "off"
	cfg.Tools.Exec.KillGraceMs = 1000
	nc := bustest.Connect(t, srv, bus.ClientConfig{Name: "gateway"})
	g, err := gateway.New(t.Context(), cfg, gateway.Options{
		Conn:           nc,
		Server:         srv,
		Cwd:            dir,
		Environ:        []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + dir, "SHELL=/bin/sh", "LANG=C"},
		Getenv:         testGatewayEnv,
		LoginShellPath: func() string { return "" },
	})
	if err != nil {
		t.Fatalf("gateway.New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := g.Close(ctx); err != nil {
			t.Errorf("gateway.Close: %v", err)
		}
	})
	return g, srv
}

// startPairedAgent starts a node agent on srv, approves its pairing on g
// and waits until both sides know. It is closed at the end of the test,
// before the gateway.
func startPairedAgent(t *testing.T, g *gateway.Gateway, srv *bus.Server, name string) *nodeagent.Agent {
	t.Helper()
	cfg := nodeagent.DefaultConfig()
	cfg.StateDir = t.TempDir()
	cfg.Name = name
	cfg.Client = bus.ClientConfig{URLs: []string{srv.ClientURL()}}
	cfg.HeartbeatInterval = testHeartbeat
	home := t.TempDir()
	cfg.Cwd = home
	cfg.Environ = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + home, "SHELL=/bin/sh", "LANG=C"}
	cfg.Session.Shell = "/bin/sh"
	cfg.Session.KillGrace = time.Second
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
	waitFor(t, 30*time.Second, func() error {
		for _, n := range g.Nodes() {
			if n.ID == a.ID() && n.Status == "connected" {
				return nil
			}
		}
		return fmt.Errorf("node %s not connected", a.ID())
	})
	if err := g.ApproveNode(a.ID()); err != nil {
		t.Fatalf("ApproveNode: %v", err)
	}
	waitFor(t, 30*time.Second, func() error {
		if a.Pairing() != nodeagent.PairingPaired {
			return fmt.Errorf("agent pairing %q", a.Pairing())
		}
		return nil
	})
	return a
}

// waitFor retries f until it returns nil or the time is up.
func waitFor(t *testing.T, total time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(total)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met after %v: %v", total, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// invokeOK runs a tool call on g and fails the test on a refusal.
func invokeOK(t *testing.T, g *gateway.Gateway, tool, args string) protocol.Result {
	t.Helper()
	res, err := g.Invoke(t.Context(), gateway.InvokeRequest{Tool: tool, Args: []byte(args)})
	if err != nil {
		t.Fatalf("%s %s: %v", tool, args, err)
	}
	return res
}
