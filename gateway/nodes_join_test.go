package gateway

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/config"

	"github.com/nats-io/nats.go"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
	"github.com/execmesh/execmesh/nodeagent"
	"github.com/execmesh/execmesh/nodes"
	"github.com/execmesh/execmesh/protocol"
)

// secureEnv is a gateway on an embedded server that authenticates every
// client, as one listening beyond loopback does. The server listens on
// loopback, so join codes carry its URL through EXECMESH_NODE_JOIN_URLS
// (as for a server reached through a forward).
func secureEnv(t *testing.T) *nodeEnv {
	t.Helper()
	gw := bus.User{Name: "execmesh-gateway", Password: "gateway-secret"}
	srv := bustest.StartServer(t, bustest.WithUsers(gw))
	return startNodeGateway(t, srv, "", func(_ *config.Config, o *Options) {
		o.JoinURLs = func() []string { return []string{srv.ClientURL()} }
	}, func(cc *bus.ClientConfig) {
		cc.User, cc.Password = gw.Name, gw.Password
	})
}

// TestNodeInviteRefusedOnLoopback: with the embedded server on loopback
// only (the default), an invite is refused with what to do instead of a
// code whose nats://127.0.0.1 URLs no other machine reaches; the HTTP API
// refuses, so every client does.
func TestNodeInviteRefusedOnLoopback(t *testing.T) {
	env := startNodeGateway(t, nil, "", nil)
	r := env.do("POST", "/v1/nodes/invite", []byte(`{"name":"build-1"}`), nil)
	if r.Status != 409 || !strings.Contains(string(r.Raw), "loopback only") || !strings.Contains(string(r.Raw), "--nats-listen") {
		t.Fatalf("invite on loopback: %d %s", r.Status, r.Raw)
	}
	// A node on this machine reaches the loopback address: asked for as
	// such, the code is issued and names it.
	r = env.do("POST", "/v1/nodes/invite", []byte(`{"name":"side","local":true}`), nil)
	var inv nodes.Invite
	if r.Status != 200 || json.Unmarshal(r.Raw, &inv) != nil || inv.Code == "" {
		t.Fatalf("local invite on loopback: %d %s", r.Status, r.Raw)
	}
	jc, err := nodeagent.DecodeJoinCode(inv.Code)
	if err != nil || len(jc.URLs) != 1 || jc.URLs[0] != env.srv.ClientURL() {
		t.Fatalf("local code %+v %v, want the server's URL %s", jc, err, env.srv.ClientURL())
	}
}

func (e *nodeEnv) invite(name string, ttl time.Duration) nodes.Invite {
	e.t.Helper()
	body, _ := json.Marshal(map[string]any{"name": name, "ttlMs": ttl.Milliseconds()})
	r := e.do("POST", "/v1/nodes/invite", body, nil)
	if r.Status != 200 {
		e.t.Fatalf("invite: %d %s", r.Status, r.Raw)
	}
	var out nodes.Invite
	if err := json.Unmarshal(r.Raw, &out); err != nil {
		e.t.Fatal(err)
	}
	return out
}

func TestNodeJoinByCode(t *testing.T) {
	env := secureEnv(t)
	inv := env.invite("builder", time.Minute)
	if inv.Command != "execmesh node --join "+inv.Code || inv.ExpiresAtMs <= time.Now().UnixMilli() {
		t.Fatalf("invite: %+v", inv)
	}
	raw, _ := base64.RawURLEncoding.DecodeString(inv.Code)
	var code protocol.JoinCode
	if err := json.Unmarshal(raw, &code); err != nil || code.User == "" || len(code.URLs) != 1 || code.URLs[0] != env.srv.ClientURL() {
		t.Fatalf("code: %+v %v", code, err)
	}

	// An anonymous client, or a wrong password, is refused by the server.
	if nc, err := nats.Connect(env.srv.ClientURL()); err == nil {
		nc.Close()
		t.Fatal("anonymous client admitted")
	}

	cfg := testAgentConfig(t, env.srv, "")
	cfg.Name = ""
	cfg.Client = bus.ClientConfig{}
	cfg.Join = inv.Code
	a := startAgent(t, cfg)
	if a.Name() != "builder" || a.Pairing() != nodeagent.PairingPaired {
		t.Fatalf("joined node: name %q pairing %q", a.Name(), a.Pairing())
	}
	v := env.waitNode(a.ID(), "connected", protocol.NodePairingPaired)
	if !v.Joined || v.PublicKey != a.PublicKey() {
		t.Fatalf("view: %+v", v)
	}
	res := env.invoke("exec", map[string]any{"command": "echo joined-node-runs", "host": "node"}, "")
	if !strings.Contains(res.Text(), "joined-node-runs") {
		t.Fatalf("exec: %s", res.Text())
	}
	_, nk := env.srv.Users()
	if len(nk) != 1 || nk[0].PublicKey != a.PublicKey() {
		t.Fatalf("nkey users: %+v", nk)
	}

	// The same code again: refused, with a clear error, whether the
	// one-time user is still there or already gone.
	cfg2 := testAgentConfig(t, env.srv, "intruder")
	cfg2.Client = bus.ClientConfig{}
	cfg2.Join = inv.Code
	b, err := nodeagent.New(cfg2)
	if err != nil {
		t.Fatal(err)
	}
	err = b.Start(t.Context())
	_ = b.Close(t.Context())
	if !errors.Is(err, nodeagent.ErrJoinRefused) || !(strings.Contains(err.Error(), "already used") || strings.Contains(err.Error(), "refused the join code")) {
		t.Fatalf("second use: %v", err)
	}

	// The joined node's credentials are confined to its own subjects:
	// publishing on another node's subjects is refused by NATS.
	violations := make(chan error, 4)
	nodeConn := bustest.Connect(t, env.srv, bus.ClientConfig{
		NKeySeed: mustSeed(t, cfg.StateDir), InboxPrefix: bus.InboxPrefix(a.ID()),
		ErrorHandler: func(_ *nats.Conn, _ *nats.Subscription, err error) { violations <- err },
	})
	other := "bbbbbbbbbbbbbbbb"
	_ = nodeConn.Publish(protocol.Subjects("execmesh").Node(other, "exec"), []byte(`{}`))
	_ = nodeConn.Publish(protocol.Subjects("execmesh").PresenceOf(other), []byte(`{}`))
	_ = nodeConn.Publish("execmesh.gw.invoke", []byte(`{}`))
	_ = nodeConn.Flush()
	for range 3 {
		select {
		case err := <-violations:
			if !errors.Is(err, nats.ErrPermissionViolation) {
				t.Fatalf("want a permissions violation, got %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no permissions violation reported")
		}
	}

	// Rejecting the node removes its NATS identity.
	if r := env.do("POST", "/v1/nodes/"+a.ID()+"/reject", nil, nil); r.Status != 200 {
		t.Fatalf("reject: %d", r.Status)
	}
	if _, nk := env.srv.Users(); len(nk) != 0 {
		t.Fatalf("nkey users after reject: %+v", nk)
	}
	// Whether it hears the rejection or only finds its key refused, the
	// node says so once and stops.
	select {
	case <-a.Rejected():
	case <-time.After(30 * time.Second):
		t.Fatal("a rejected node keeps retrying")
	}
}

func TestNodeJoinCodeExpiresAndInvalid(t *testing.T) {
	env := secureEnv(t)
	inv := env.invite("", time.Second)
	time.Sleep(1200 * time.Millisecond) // the code's lifetime is the subject
	cfg := testAgentConfig(t, env.srv, "late")
	cfg.Client = bus.ClientConfig{}
	cfg.Join = inv.Code
	cfg.JoinTimeout = 5 * time.Second
	a, err := nodeagent.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = a.Start(t.Context())
	_ = a.Close(t.Context())
	if !errors.Is(err, nodeagent.ErrJoinRefused) {
		t.Fatalf("expired code: %v", err)
	}
	// The expired code's one-time user is removed from the server.
	checkFor(t, 30*time.Second, func() error {
		if users, _ := env.srv.Users(); len(users) != 1 {
			return errors.New("one-time user still there")
		}
		return nil
	})
	for _, body := range []string{`{"ttlMs":-1}`, `{"name":5}`, `{"nmae":"x"}`} {
		if r := env.do("POST", "/v1/nodes/invite", []byte(body), nil); r.Status != 400 {
			t.Fatalf("invite %s: %d %s", body, r.Status, r.Raw)
		}
	}
}

func mustSeed(t *testing.T, stateDir string) []byte {
	t.Helper()
	id, err := bus.LoadOrCreateNodeIdentity(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	return id.Seed
}

// TestNodeAdmitLocalNode is what `execmesh up` does for its own node on a
// server that authenticates clients: admit the node's key, paired, before
// the node connects.
func TestNodeAdmitLocalNode(t *testing.T) {
	env := secureEnv(t)
	cfg := testAgentConfig(t, env.srv, "local")
	id, err := bus.LoadOrCreateNodeIdentity(cfg.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	if err := env.g.AdmitNode(id.PublicKey, "local"); err != nil {
		t.Fatal(err)
	}
	if err := env.g.AdmitNode("not-a-key", ""); err == nil {
		t.Fatal("AdmitNode accepted a bad key")
	}
	a := startAgent(t, cfg)
	env.waitNode(a.ID(), "connected", protocol.NodePairingPaired)
	if res := env.invoke("exec", map[string]any{"command": "echo local-node", "host": "node"}, ""); !strings.Contains(res.Text(), "local-node") {
		t.Fatalf("exec: %s", res.Text())
	}
	if n, ok := env.g.NodeRegistry().Get(id.NodeID); !ok || !n.Joined || n.PublicKey != id.PublicKey || n.Pairing != protocol.NodePairingPaired {
		t.Fatalf("registry: %+v", n)
	}
}
