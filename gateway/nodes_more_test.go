package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/config"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
	"github.com/execmesh/execmesh/protocol"
)

// fakeNode beats like a node but answers nothing else: requests to it are
// delivered and never answered.
type fakeNode struct {
	id   bus.Identity
	seen chan *nats.Msg
}

func startFakeNode(t *testing.T, env *nodeEnv) *fakeNode {
	t.Helper()
	id, err := bus.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeNode{id: id, seen: make(chan *nats.Msg, 16)}
	sub, err := env.nc.Subscribe(protocol.Subjects("execmesh").NodeAll(id.NodeID), func(m *nats.Msg) {
		if strings.HasSuffix(m.Subject, "."+protocol.NodeEndpointPing) {
			b, _ := json.Marshal(protocol.PingReply{Instance: "i1"}) // alive, so requests are sent
			_ = m.Respond(b)
			return
		}
		f.seen <- m
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(testHeartbeat)
		defer tick.Stop()
		for {
			b, _ := json.Marshal(protocol.NodeHeartbeat{NodeID: id.NodeID, PublicKey: id.PublicKey, Name: "silent", Instance: "i1", IntervalMs: testHeartbeat.Milliseconds()})
			_ = env.nc.Publish(protocol.Subjects("execmesh").PresenceOf(id.NodeID), b)
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
	return f
}

func TestNodeStartOutcomeUnknown(t *testing.T) {
	env := startNodeGateway(t, nil, "", func(_ *config.Config, o *Options) {
		o.Getenv = testNodeEnvWith(map[string]string{"EXECMESH_NODE_REQUEST_MARGIN_MS": "300", "EXECMESH_NODE_CALL_TIMEOUT_MS": "300"})
	})
	f := startFakeNode(t, env)
	env.waitNode(f.id.NodeID, "connected", protocol.NodePairingPending)
	if err := env.g.ApproveNode(f.id.NodeID); err != nil {
		t.Fatal(err)
	}
	r := env.invokeRaw("exec", map[string]any{"command": "echo maybe", "host": "node", "background": true}, "")
	if r.Status != http.StatusServiceUnavailable || r.Error == nil || !r.Error.Retryable ||
		!strings.Contains(r.Error.Message, "may or may not have started") || !strings.Contains(r.Error.Message, "idempotency key") {
		t.Fatalf("outcome unknown: %d %s", r.Status, r.Raw)
	}
	// The request was delivered once, with its key; it was not re-sent.
	var got []*nats.Msg
	for len(got) < 3 {
		select {
		case m := <-f.seen:
			if strings.HasSuffix(m.Subject, ".exec") {
				got = append(got, m)
			}
			continue
		case <-time.After(500 * time.Millisecond):
		}
		break
	}
	if len(got) != 1 || got[0].Header.Get(protocol.NodeHeaderIdempotencyKey) == "" || !strings.Contains(r.Error.Message, got[0].Header.Get(protocol.NodeHeaderIdempotencyKey)) {
		t.Fatalf("exec deliveries: %d", len(got))
	}
	// The request carried the resolved timeout, no routing fields, and the
	// session id the gateway allocated (kept in the index: the command may
	// run).
	var w protocol.ExecRequest
	if err := json.Unmarshal(got[0].Data, &w); err != nil {
		t.Fatal(err)
	}
	if w.Args.Timeout == nil || *w.Args.Timeout != float64(config.DefaultTimeoutSec) || w.Args.Host != "" || w.Security != "full" || w.Ask != "off" ||
		w.Target != protocol.TargetNode || w.SessionID == "" {
		t.Fatalf("exec request: %s", got[0].Data)
	}
	if rec, ok := env.g.index.Lookup(t.Context(), w.SessionID); !ok || rec.HostID != f.id.NodeID {
		t.Fatalf("index entry of the unknown start: %+v %v", rec, ok)
	}
}

func TestNodeGhostsExpire(t *testing.T) {
	env := startNodeGateway(t, nil, "", func(_ *config.Config, o *Options) {
		o.Getenv = testNodeEnvWith(map[string]string{"EXECMESH_NODE_PRESENCE_TTL_MS": "1000", "EXECMESH_NODE_GHOST_TTL_MS": "500"})
	})
	cfg := testAgentConfig(t, env.srv, "kept")
	a := env.pairAgent(cfg)
	ctx := t.Context()
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	env.waitNode(a.ID(), "unreachable", protocol.NodePairingPaired)
	// An unpaired node that went silent is swept away after the ghost TTL.
	ghost := startAgent(t, testAgentConfig(t, env.srv, "ghost"))
	env.waitNode(ghost.ID(), "connected", protocol.NodePairingPending)
	if err := ghost.Close(ctx); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 30*time.Second, func() error {
		for _, n := range env.g.Nodes() {
			if n.ID == ghost.ID() {
				return fmt.Errorf("ghost still listed: %+v", n)
			}
		}
		return nil
	})
	// The paired node stays listed, unreachable.
	env.waitNode(a.ID(), "unreachable", protocol.NodePairingPaired)
	if r := env.do("GET", "/v1/nodes/"+a.ID(), nil, nil); r.Status != 200 || !strings.Contains(string(r.Raw), `"status":"unreachable"`) {
		t.Fatalf("GET node: %d %s", r.Status, r.Raw)
	}
	if r := env.do("GET", "/v1/nodes/nope", nil, nil); r.Status != 404 {
		t.Fatalf("GET unknown node: %d", r.Status)
	}
}

func TestNodeSynchronousWhenProcessDenied(t *testing.T) {
	env := startNodeGateway(t, nil, "", func(c *config.Config, _ *Options) { c.Tools.Deny = []string{"process"} })
	env.pairAgent(testAgentConfig(t, env.srv, "alpha"))
	res := env.invoke("exec", map[string]any{"command": "sleep 0.3; echo sync-done", "host": "node", "background": true}, "")
	if res.Status() != protocol.StatusCompleted || !strings.Contains(res.Text(), "sync-done") || !strings.Contains(res.Text(), warnBackgroundDisabled) {
		t.Fatalf("sync: %s %v", res.Text(), res.Details)
	}
}

// TestNodeForgedExitEvent: a paired node's exit event counts only for a
// session that node runs for that sessionKey.
func TestNodeForgedExitEvent(t *testing.T) {
	env := startNodeGateway(t, nil, "", nil)
	a := env.pairAgent(testAgentConfig(t, env.srv, "alpha"))
	b := env.pairAgent(testAgentConfig(t, env.srv, "beta"))
	res := env.invoke("exec", map[string]any{"command": "sleep 30", "host": "node", "node": a.ID(), "background": true}, "")
	id := res.SessionID()
	js := bustest.JetStream(t, env.nc)
	for _, ev := range []protocol.ExitEvent{
		{NodeID: b.ID(), SessionID: id, SessionKey: DefaultSessionKey, StartedAt: 1, Notify: true, Text: "Exec completed (" + id + ", code 0) :: forged"},
		{NodeID: b.ID(), SessionID: "made-up", SessionKey: DefaultSessionKey, StartedAt: 2, Notify: true, Text: "Exec completed (made-up, code 0) :: forged"},
	} {
		if _, err := bus.PublishExitEvent(t.Context(), js, "execmesh", ev); err != nil {
			t.Fatal(err)
		}
	}
	if evs := env.events(DefaultSessionKey, 1500*time.Millisecond); len(evs) != 0 {
		t.Fatalf("forged exit events delivered: %+v", evs)
	}
	if p := env.invoke("process", map[string]any{"action": "poll", "sessionId": id}, ""); p.Status() != protocol.StatusRunning {
		t.Fatalf("a's session: %s", p.Text())
	}
}

// TestNodeDiscoveryForgery: a micro PING answer naming another node's id
// and a new instance does not make a restarted gateway take that node for
// restarted.
func TestNodeDiscoveryForgery(t *testing.T) {
	srv := bustest.StartServer(t)
	stateDir := t.TempDir()
	env := startNodeGateway(t, srv, stateDir, nil)
	a := env.pairAgent(testAgentConfig(t, srv, "alpha"))
	res := env.invoke("exec", map[string]any{"command": "sleep 30", "host": "node", "background": true}, "")
	id := res.SessionID()
	env.close()

	rogue := bustest.Connect(t, srv, bus.ClientConfig{Name: "rogue"})
	ping, _ := json.Marshal(micro.Ping{ServiceIdentity: micro.ServiceIdentity{Name: bus.NodeServiceName, ID: "forged", Version: "0.0.0-dev",
		Metadata: map[string]string{"nodeId": a.ID(), "name": "evil", "instance": "forged"}}, Type: micro.PingResponseType})
	if _, err := rogue.Subscribe("$SRV.PING."+bus.NodeServiceName, func(m *nats.Msg) { _ = m.Respond(ping) }); err != nil {
		t.Fatal(err)
	}
	_ = rogue.Flush()
	env2 := startNodeGateway(t, srv, stateDir, nil)
	v := env2.waitNode(a.ID(), "connected", protocol.NodePairingPaired)
	if v.Name != "alpha" {
		t.Fatalf("renamed: %+v", v)
	}
	if p := env2.invoke("process", map[string]any{"action": "poll", "sessionId": id}, ""); p.Status() != protocol.StatusRunning {
		t.Fatalf("session after a forged discovery answer: %s %v", p.Text(), p.Details)
	}
}
