package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
	"github.com/execmesh/execmesh/nodeagent"
	"github.com/execmesh/execmesh/protocol"
)

// TestDiscoveryTrustsOnlyTheNodesOwnSubject: a client holding node beta's
// credentials — confined by NATS permissions as a paired node is — answers
// $SRV.PING naming node alpha (running, with a session) and node gamma
// (paired, stopped) with another name, platform and instance, and tries to
// serve their ping and list endpoints, which is what would make a
// restarted gateway's liveness probe trust it. The servers refuse those
// subscriptions: alpha keeps its name, platform, instance and running
// session (no restart is inferred); gamma stays unreachable.
func TestDiscoveryTrustsOnlyTheNodesOwnSubject(t *testing.T) {
	srv := bustest.StartServer(t, bustest.WithUsers(bus.User{Name: "gateway", Password: "gw-secret"}))
	asGateway := func(cc *bus.ClientConfig) { cc.User, cc.Password = "gateway", "gw-secret" }
	stateDir := t.TempDir()
	env := startNodeGateway(t, srv, stateDir, nil, asGateway)
	agent := func(name string) (nodeagent.Config, bus.Identity) {
		cfg := testAgentConfig(t, srv, name)
		id, err := bus.LoadOrCreateNodeIdentity(cfg.StateDir)
		if err != nil {
			t.Fatal(err)
		}
		u, err := bus.NodeUser(bus.DefaultPrefix, id.PublicKey)
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.AddNKeyUser(u); err != nil {
			t.Fatal(err)
		}
		return cfg, id
	}
	alphaCfg, _ := agent("alpha")
	betaCfg, betaID := agent("beta")
	gammaCfg, _ := agent("gamma")
	alpha := env.pairAgent(alphaCfg)
	env.pairAgent(betaCfg)
	gamma := env.pairAgent(gammaCfg)
	res := env.invoke("exec", map[string]any{"command": "sleep 30", "host": "node", "node": "alpha", "background": true}, "")
	if res.Status() != protocol.StatusRunning {
		t.Fatalf("exec on alpha: %s %q", res.Status(), res.Text())
	}
	session := res.SessionID()
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	if err := gamma.Close(ctx); err != nil {
		t.Fatalf("stop gamma: %v", err)
	}
	env.close()

	// The forger: beta's key, beta's permissions.
	var mu sync.Mutex
	var violations []string
	rogue := bustest.Connect(t, srv, bus.ClientConfig{Name: "rogue beta", NKeySeed: betaID.Seed, InboxPrefix: bus.InboxPrefix(betaID.NodeID),
		ErrorHandler: func(_ *nats.Conn, _ *nats.Subscription, err error) {
			mu.Lock()
			violations = append(violations, err.Error())
			mu.Unlock()
		}})
	var answered atomic.Int32
	for _, victim := range []string{alpha.ID(), gamma.ID()} {
		ping, _ := json.Marshal(micro.Ping{ServiceIdentity: micro.ServiceIdentity{Name: bus.NodeServiceName, ID: "forged-" + victim, Version: "0.0.0-dev",
			Metadata: map[string]string{"nodeId": victim, "name": "evil", "platform": "evil/evil", "instance": "forged"}}, Type: micro.PingResponseType})
		for _, s := range []string{"$SRV.PING", "$SRV.PING." + bus.NodeServiceName} {
			if _, err := rogue.Subscribe(s, func(m *nats.Msg) {
				if m.Respond(ping) == nil {
					answered.Add(1)
				}
			}); err != nil {
				t.Fatal(err)
			}
		}
		// What would make the probe trust the forger: serving the
		// victim's ping endpoint. The servers refuse it.
		probe := protocol.Subjects(bus.DefaultPrefix).Node(victim, protocol.NodeEndpointPing)
		if _, err := rogue.Subscribe(probe, func(m *nats.Msg) {
			b, _ := json.Marshal(protocol.PingReply{Instance: "forged"})
			_ = m.Respond(b)
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := rogue.Flush(); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 10*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		for _, victim := range []string{alpha.ID(), gamma.ID()} {
			found := false
			for _, v := range violations {
				found = found || strings.Contains(v, "Subscription to \""+protocol.Subjects(bus.DefaultPrefix).Node(victim, protocol.NodeEndpointPing)+"\"")
			}
			if !found {
				return fmt.Errorf("serving %s's list endpoint with beta's credentials not refused: %q", victim, violations)
			}
		}
		return nil
	})

	env2 := startNodeGateway(t, srv, stateDir, nil, asGateway)
	if v := env2.waitNode(alpha.ID(), "connected", protocol.NodePairingPaired); v.Name != "alpha" {
		t.Fatalf("alpha: %+v", v)
	}
	// Anyone asking $SRV.PING gets the forged answers; the gateway never
	// trusts them.
	if _, err := env2.nc.Request("$SRV.PING", nil, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	// The first answer ends the request; the forger's may come after.
	checkFor(t, 5*time.Second, func() error {
		if answered.Load() == 0 {
			return fmt.Errorf("the forger got no $SRV.PING: the test proves nothing")
		}
		return nil
	})
	reg := env2.g.NodeRegistry()
	a, _ := reg.Get(alpha.ID())
	g, _ := reg.Get(gamma.ID())
	if a.Name != "alpha" || strings.Contains(a.Platform, "evil") || a.Instance != alpha.Instance() {
		t.Fatalf("alpha after forged answers: name %q platform %q instance %q (its own: %q)", a.Name, a.Platform, a.Instance, alpha.Instance())
	}
	if g.Live || g.Instance == "forged" || strings.Contains(g.Platform, "evil") {
		t.Fatalf("stopped gamma after forged answers: %+v", g)
	}
	if v := env2.waitNode(alpha.ID(), "connected", protocol.NodePairingPaired); v.Name != "alpha" {
		t.Fatalf("alpha: %+v", v)
	}
	for _, v := range env2.g.Nodes() {
		if v.ID == gamma.ID() && v.Status != "unreachable" {
			t.Fatalf("stopped gamma listed %+v after forged discovery answers", v)
		}
	}
	if p := env2.invoke("process", map[string]any{"action": "poll", "sessionId": session}, ""); p.Status() != protocol.StatusRunning {
		t.Fatalf("alpha's session after forged discovery answers: %s %q %v", p.Status(), p.Text(), p.Details)
	}
}
