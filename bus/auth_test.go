package bus_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
	"github.com/execmesh/execmesh/protocol"
)

const prefix = bus.DefaultPrefix

// errSink collects a connection's asynchronous errors.
type errSink struct {
	mu   sync.Mutex
	errs []error
}

func (s *errSink) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	s.mu.Lock()
	s.errs = append(s.errs, err)
	s.mu.Unlock()
}

func (s *errSink) violations(substr string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, err := range s.errs {
		if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), substr) {
			n++
		}
	}
	return n
}

func (s *errSink) all() []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]error(nil), s.errs...)
}

// nodeClient connects a node with its identity, inbox prefix and an error
// sink.
func nodeClient(t *testing.T, s *bus.Server, id bus.Identity) (*nats.Conn, *errSink) {
	t.Helper()
	sink := &errSink{}
	nc := bustest.Connect(t, s, bus.ClientConfig{
		Name:         "node-" + id.NodeID,
		NKeySeed:     id.Seed,
		InboxPrefix:  bus.InboxPrefix(id.NodeID),
		ErrorHandler: sink.handler,
	})
	return nc, sink
}

func newIdentity(t *testing.T) bus.Identity {
	t.Helper()
	id, err := bus.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func nodeUser(t *testing.T, id bus.Identity) bus.NKeyUser {
	t.Helper()
	u, err := bus.NodeUser(prefix, id.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TestNodePermissions: a node uses its own subjects (micro service,
// presence, chunked replies, exit events through JetStream) and is refused
// on another node's subjects, which never see its messages.
func TestNodePermissions(t *testing.T) {
	a, b := newIdentity(t), newIdentity(t)
	gwUser := bus.User{Name: "gateway", Password: "gw-secret"}
	s := bustest.StartServer(t, bustest.WithMaxPayload(64<<10),
		bustest.WithUsers(gwUser), bustest.WithNKeys(nodeUser(t, a), nodeUser(t, b)))
	gw := bustest.Connect(t, s, bus.ClientConfig{Name: "gateway", User: gwUser.Name, Password: gwUser.Password})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := bus.EnsureStreams(ctx, bustest.JetStream(t, gw), prefix, 1); err != nil {
		t.Fatal(err)
	}

	ncA, sinkA := nodeClient(t, s, a)
	ncB, sinkB := nodeClient(t, s, b)

	// Node A runs its micro service; a chunked reply (several messages to
	// one reply subject) passes allow_responses.
	payload := bytes.Repeat([]byte("x"), 200<<10)
	var wg sync.WaitGroup
	defer wg.Wait()
	svc, err := micro.AddService(ncA, micro.Config{Name: bus.NodeServiceName, Version: "0.0.0-dev"})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Stop()
	if err := svc.AddGroup(prefix+".node."+a.NodeID).AddEndpoint("log", micro.HandlerFunc(func(req micro.Request) {
		reply := req.Reply()
		wg.Go(func() {
			if err := bus.RespondChunked(ncA, reply, payload, nil); err != nil {
				t.Error(err)
			}
		})
	})); err != nil {
		t.Fatal(err)
	}
	if err := ncA.Flush(); err != nil { // the server has A's subscriptions
		t.Fatal(err)
	}
	m, err := bus.RequestChunked(ctx, gw, prefix+".node."+a.NodeID+".log", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(m.Data, payload) {
		t.Fatalf("chunked reply through allow_responses: %d bytes, want %d", len(m.Data), len(payload))
	}
	// Discovery reaches the node's service.
	pingSubj, _ := micro.ControlSubject(micro.PingVerb, bus.NodeServiceName, "")
	if _, err := gw.RequestWithContext(ctx, pingSubj, nil); err != nil {
		t.Fatalf("micro ping: %v", err)
	}

	// Own presence: delivered.
	presence, err := gw.SubscribeSync(prefix + ".presence.>")
	if err != nil {
		t.Fatal(err)
	}
	gw.Flush()
	if err := ncA.Publish(prefix+".presence."+a.NodeID, []byte("alive")); err != nil {
		t.Fatal(err)
	}
	if m, err := presence.NextMsgWithContext(ctx); err != nil || m.Subject != prefix+".presence."+a.NodeID {
		t.Fatalf("own presence: %v %v", m, err)
	}

	// Own stream output: delivered.
	streams, err := gw.SubscribeSync(prefix + ".nstream.>")
	if err != nil {
		t.Fatal(err)
	}
	gw.Flush()
	ownStream := prefix + ".nstream." + a.NodeID + ".s1"
	if err := ncA.Publish(ownStream, []byte("out")); err != nil {
		t.Fatal(err)
	}
	if m, err := streams.NextMsgWithContext(ctx); err != nil || m.Subject != ownStream {
		t.Fatalf("own stream output: %v %v", m, err)
	}

	// Own exit event through JetStream (publish + ack on A's inbox).
	code := 0
	ev := protocol.ExitEvent{SessionID: "nimble-coral", NodeID: a.NodeID, Status: "completed", ExitCode: &code, StartedAt: 1}
	if _, err := bus.PublishExitEvent(ctx, bustest.JetStream(t, ncA), prefix, ev); err != nil {
		t.Fatalf("own exit event: %v", err)
	}

	// B listens on its own endpoint subject.
	bSubj := prefix + ".node." + b.NodeID + ".exec"
	bInbox, err := ncB.SubscribeSync(prefix + ".node." + b.NodeID + ".>")
	if err != nil {
		t.Fatal(err)
	}
	ncB.Flush()

	// A impersonates B: every attempt is a permissions violation.
	ncA.Publish(bSubj, []byte("rm -rf"))
	ncA.Publish(prefix+".presence."+b.NodeID, []byte("fake"))
	ncA.Publish(prefix+".gw.invoke", []byte("{}"))
	ncA.Publish(prefix+".nstream."+b.NodeID+".s1", []byte("forged output"))
	nodesKV := "$KV." + bus.StreamNamesFor(prefix).Nodes + "." + a.NodeID
	ncA.Publish(nodesKV, []byte(`{"pairing":"paired"}`)) // its own registry record
	if _, err := ncA.SubscribeSync(prefix + ".node." + b.NodeID + ".>"); err != nil {
		t.Fatal(err)
	}
	if _, err := ncA.SubscribeSync("_INBOX.>"); err != nil {
		t.Fatal(err)
	}
	ncA.Flush()
	bustest.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		for _, want := range []string{
			`Publish to "` + bSubj,
			`Publish to "` + prefix + ".presence." + b.NodeID,
			`Publish to "` + prefix + ".gw.invoke",
			`Publish to "` + prefix + ".nstream." + b.NodeID,
			`Publish to "` + nodesKV,
			`Subscription to "` + prefix + ".node." + b.NodeID,
			`Subscription to "_INBOX.>"`,
		} {
			if sinkA.violations(want) == 0 {
				return fmt.Errorf("no violation for %s; errors: %v", want, sinkA.all())
			}
		}
		return nil
	})

	// B never saw A's message; a message from the gateway still arrives
	// after it, so it was not merely late.
	gw.Publish(bSubj, []byte("from gateway"))
	got, err := bInbox.NextMsgWithContext(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Data) != "from gateway" {
		t.Fatalf("node B received %q from node A", got.Data)
	}
	if m, err := presence.NextMsg(100 * time.Millisecond); err == nil {
		t.Fatalf("forged presence delivered: %s %q", m.Subject, m.Data)
	}
	if m, err := streams.NextMsg(10 * time.Millisecond); err == nil {
		t.Fatalf("forged stream output delivered: %s %q", m.Subject, m.Data)
	}
	if errs := sinkB.all(); len(errs) != 0 {
		t.Fatalf("node B errors: %v", errs)
	}
	// A's own traffic still works after the violations.
	if err := ncA.Publish(prefix+".presence."+a.NodeID, []byte("still")); err != nil {
		t.Fatal(err)
	}
	if m, err := presence.NextMsgWithContext(ctx); err != nil || string(m.Data) != "still" {
		t.Fatalf("own presence after violations: %v %v", m, err)
	}
}

// TestReloadUsers admits a node by configuration reload, refuses unknown
// keys, and disconnects a removed node.
func TestReloadUsers(t *testing.T) {
	gwUser := bus.User{Name: "gateway", Password: "gw-secret"}
	s := bustest.StartServer(t, bustest.WithUsers(gwUser))
	gw := bustest.Connect(t, s, bus.ClientConfig{InProcess: s, User: gwUser.Name, Password: gwUser.Password})
	node := newIdentity(t)
	stranger := newIdentity(t)

	connect := func(id bus.Identity, d time.Duration) (*nats.Conn, error) {
		ctx, cancel := context.WithTimeout(t.Context(), d)
		defer cancel()
		return bus.Connect(ctx, bus.ClientConfig{URLs: []string{s.ClientURL()}, NKeySeed: id.Seed, InboxPrefix: bus.InboxPrefix(id.NodeID)}, nil)
	}
	if _, err := connect(node, 500*time.Millisecond); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("unknown node connected or wrong error: %v", err)
	}

	if err := s.AddNKeyUser(nodeUser(t, node)); err != nil {
		t.Fatal(err)
	}
	nc, err := connect(node, 10*time.Second)
	if err != nil {
		t.Fatalf("admitted node: %v", err)
	}
	defer nc.Close()
	if _, err := connect(stranger, 500*time.Millisecond); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("stranger: %v", err)
	}
	// The gateway's in-process connection survived the reloads.
	roundTrip(t, gw, gw)
	if _, nk := s.Users(); len(nk) != 1 || nk[0].PublicKey != node.PublicKey {
		t.Fatalf("Users() nkeys = %v", nk)
	}
	// Adding again replaces, it does not duplicate.
	if err := s.AddNKeyUser(nodeUser(t, node)); err != nil {
		t.Fatal(err)
	}

	if err := s.RemoveNKeyUser(node.PublicKey); err != nil {
		t.Fatal(err)
	}
	bustest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if nc.IsConnected() {
			return errors.New("removed node still connected")
		}
		return nil
	})
	if err := s.RemoveNKeyUser(node.PublicKey); err != nil {
		t.Fatalf("removing twice: %v", err)
	}

	// Authentication cannot be switched off live.
	if err := s.ReloadUsers(nil, nil); !errors.Is(err, bus.ErrAuthModeChange) {
		t.Fatalf("ReloadUsers(nil, nil) = %v, want ErrAuthModeChange", err)
	}
	roundTrip(t, gw, gw)
}

func TestReloadUsersOnOpenServerRefused(t *testing.T) {
	s := bustest.StartServer(t)
	id := newIdentity(t)
	// A node that always presents its key still gets onto an open server.
	nodeClient(t, s, id)
	if err := s.AddNKeyUser(nodeUser(t, id)); !errors.Is(err, bus.ErrAuthModeChange) {
		t.Fatalf("AddNKeyUser on an open server = %v, want ErrAuthModeChange", err)
	}
}

// TestJoinFlow walks the join-by-code exchange: a one-time user may only
// ask to pair; the gateway admits the node's key and drops the user.
func TestJoinFlow(t *testing.T) {
	gwUser := bus.User{Name: "gateway", Password: "gw-secret"}
	s := bustest.StartServer(t, bustest.WithUsers(gwUser))
	gw := bustest.Connect(t, s, bus.ClientConfig{InProcess: s, User: gwUser.Name, Password: gwUser.Password})

	joinName := "join-4f2a9c"
	perms, err := bus.JoinPermissions(prefix, joinName)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.AddUser(bus.User{Name: joinName, Password: "one-time", Permissions: perms}); err != nil {
		t.Fatal(err)
	}
	sub, err := gw.Subscribe(prefix+".pair.request", func(m *nats.Msg) {
		pub := string(m.Data)
		u, err := bus.NodeUser(prefix, pub)
		if err == nil {
			err = s.AddNKeyUser(u)
		}
		if err != nil {
			m.Respond([]byte("error: " + err.Error()))
			return
		}
		m.Respond([]byte("ok"))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	gw.Flush()

	id := newIdentity(t)
	sink := &errSink{}
	joiner := bustest.Connect(t, s, bus.ClientConfig{User: joinName, Password: "one-time", InboxPrefix: bus.InboxPrefix(joinName), ErrorHandler: sink.handler})
	m, err := bus.RequestChunked(t.Context(), joiner, prefix+".pair.request", []byte(id.PublicKey), nil)
	if err != nil || string(m.Data) != "ok" {
		t.Fatalf("pair request: %v %q", err, m.Data)
	}
	joiner.Publish(prefix+".node.x.exec", nil)
	joiner.Flush()
	bustest.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if sink.violations(prefix+".node.x.exec") == 0 {
			return fmt.Errorf("joiner not confined: %v", sink.all())
		}
		return nil
	})
	if err := s.RemoveUser(joinName); err != nil {
		t.Fatal(err)
	}
	nodeClient(t, s, id) // the node's own key now works
}

func TestNodePermissionsRejectsBadIDs(t *testing.T) {
	for _, id := range []string{"", "*", ">", "a.b", "a b"} {
		if _, err := bus.NodePermissions(prefix, id); err == nil {
			t.Errorf("NodePermissions accepted node id %q", id)
		}
	}
	for _, p := range []string{"", "a.b", "a..b", "a.*", "a.>", "$SYS"} {
		if _, err := bus.NodePermissions(p, "abc"); err == nil {
			t.Errorf("NodePermissions accepted prefix %q", p)
		}
	}
	if _, err := bus.NodeUser(prefix, "SUAAA"); err == nil {
		t.Error("NodeUser accepted a non-key")
	}
}

func TestNodeIdentityPersisted(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	id1, err := bus.LoadOrCreateNodeIdentity(dir)
	if err != nil {
		t.Fatal(err)
	}
	id2, err := bus.LoadOrCreateNodeIdentity(dir)
	if err != nil {
		t.Fatal(err)
	}
	if id1.PublicKey != id2.PublicKey || !bytes.Equal(id1.Seed, id2.Seed) || id1.NodeID != id2.NodeID {
		t.Fatal("identity changed between loads")
	}
	if len(id1.NodeID) != 16 || strings.ToLower(id1.PublicKey[1:17]) != id1.NodeID {
		t.Fatalf("node id %q from key %s", id1.NodeID, id1.PublicKey)
	}
	fi, err := os.Stat(filepath.Join(dir, bus.NodeKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", fi.Mode().Perm())
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("state dir holds %d entries; temp files left?", len(entries))
	}
	// The seed never shows up in logs.
	var buf bytes.Buffer
	slogger(slogTextHandler(&buf)).Info("identity", "id", id1)
	if strings.Contains(buf.String(), string(id1.Seed)) || !strings.Contains(buf.String(), id1.NodeID) {
		t.Fatalf("log line %q", buf.String())
	}
}

func TestNodeIdentityConcurrentCreate(t *testing.T) {
	dir := t.TempDir()
	const n = 8
	ids := make([]bus.Identity, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			id, err := bus.LoadOrCreateNodeIdentity(dir)
			if err != nil {
				t.Error(err)
			}
			ids[i] = id
		})
	}
	wg.Wait()
	for _, id := range ids[1:] {
		if id.PublicKey != ids[0].PublicKey {
			t.Fatal("racing creators ended with different identities")
		}
	}
}

func TestNodeIdentityCorruptFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, bus.NodeKeyFile), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := bus.LoadOrCreateNodeIdentity(dir); err == nil {
		t.Fatal("loaded a corrupt key file")
	}
	// And it was not overwritten.
	data, _ := os.ReadFile(filepath.Join(dir, bus.NodeKeyFile))
	if string(data) != "garbage" {
		t.Fatal("corrupt key file was replaced")
	}
}

// TestNodeIdentitySeedFile: the persisted key file works as a NATS nkey
// seed file.
func TestNodeIdentitySeedFile(t *testing.T) {
	dir := t.TempDir()
	id, err := bus.LoadOrCreateNodeIdentity(dir)
	if err != nil {
		t.Fatal(err)
	}
	s := bustest.StartServer(t, bustest.WithNKeys(nodeUser(t, id)))
	nc := bustest.Connect(t, s, bus.ClientConfig{NKeySeedFile: filepath.Join(dir, bus.NodeKeyFile), InboxPrefix: bus.InboxPrefix(id.NodeID)})
	if err := nc.Publish(prefix+".presence."+id.NodeID, nil); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// TestOperatorPermissions: the operator's identity watches everything and
// reads JetStream, calls the tool API, and cannot send to a node, speak
// for a node or the gateway, or write JetStream.
func TestOperatorPermissions(t *testing.T) {
	gwID, op, node := newIdentity(t), newIdentity(t), newIdentity(t)
	opPerms, err := bus.OperatorPermissions(prefix)
	if err != nil {
		t.Fatal(err)
	}
	s := bustest.StartServer(t, bustest.WithNKeys(bus.NKeyUser{PublicKey: gwID.PublicKey},
		bus.NKeyUser{PublicKey: op.PublicKey, Permissions: opPerms}, nodeUser(t, node)))
	gw := bustest.Connect(t, s, bus.ClientConfig{Name: "gateway", NKeySeed: gwID.Seed})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := bus.EnsureStreams(ctx, bustest.JetStream(t, gw), prefix, 1); err != nil {
		t.Fatal(err)
	}
	sink := &errSink{}
	opc := bustest.Connect(t, s, bus.ClientConfig{Name: "operator", NKeySeed: op.Seed, ErrorHandler: sink.handler})
	ncN, _ := nodeClient(t, s, node)

	// Watching: a node's heartbeat and the gateway's requests to it.
	watch, err := opc.SubscribeSync(prefix + ".>")
	if err != nil {
		t.Fatal(err)
	}
	invoke, err := gw.Subscribe(prefix+".gw.invoke", func(m *nats.Msg) { _ = m.Respond([]byte(`{"ok":true}`)) })
	if err != nil {
		t.Fatal(err)
	}
	defer invoke.Unsubscribe()
	nodeSubj := prefix + ".node." + node.NodeID + ".exec"
	toNode, err := ncN.SubscribeSync(prefix + ".node." + node.NodeID + ".>")
	if err != nil {
		t.Fatal(err)
	}
	for _, nc := range []*nats.Conn{opc, gw, ncN} {
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if err := ncN.Publish(prefix+".presence."+node.NodeID, []byte("alive")); err != nil {
		t.Fatal(err)
	}
	if m, err := watch.NextMsgWithContext(ctx); err != nil || m.Subject != prefix+".presence."+node.NodeID {
		t.Fatalf("the operator watching presence: %v %v", m, err)
	}
	// The tool API answers (the gateway checks the token).
	if m, err := opc.RequestWithContext(ctx, prefix+".gw.invoke", []byte("{}")); err != nil || string(m.Data) != `{"ok":true}` {
		t.Fatalf("gw.invoke: %v %v", m, err)
	}
	// JetStream reads.
	js := bustest.JetStream(t, opc)
	if _, err := js.Stream(ctx, bus.StreamNamesFor(prefix).Exit); err != nil {
		t.Fatalf("stream info: %v", err)
	}
	// Nothing in anyone else's name.
	opc.Publish(nodeSubj, []byte(`{"approval":{"id":"forged","decision":"allow-once"}}`))
	opc.Publish(prefix+".presence."+node.NodeID, []byte("fake"))
	opc.Publish(prefix+".events.exit."+node.NodeID, []byte("{}"))
	opc.Publish(prefix+".gw.events.x", []byte("{}"))
	opc.Publish("$KV."+bus.StreamNamesFor(prefix).Nodes+".x", []byte("{}"))
	opc.Publish("$JS.API.STREAM.DELETE."+bus.StreamNamesFor(prefix).Exit, nil)
	opc.Flush()
	bustest.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		for _, want := range []string{nodeSubj, prefix + ".presence.", prefix + ".events.exit.", prefix + ".gw.events.", "$KV.", "$JS.API.STREAM.DELETE."} {
			if sink.violations(`Publish to "`+want) == 0 {
				return fmt.Errorf("no violation for %s; errors: %v", want, sink.all())
			}
		}
		return nil
	})
	// The gateway's message reaches the node after the operator's was
	// dropped, so that one was not merely late.
	gw.Publish(nodeSubj, []byte("from gateway"))
	if m, err := toNode.NextMsgWithContext(ctx); err != nil || string(m.Data) != "from gateway" {
		t.Fatalf("the node received %v %v", m, err)
	}
	if _, err := js.Stream(ctx, bus.StreamNamesFor(prefix).Exit); err != nil {
		t.Fatalf("the exit stream after the operator's delete: %v", err)
	}
}

// TestGatewayIdentityPersisted: the gateway's nkey lives in
// <state-dir>/gateway.nkey (0600) and is the same on the next start.
func TestGatewayIdentityPersisted(t *testing.T) {
	dir := t.TempDir()
	id1, err := bus.LoadOrCreateGatewayIdentity(dir)
	if err != nil {
		t.Fatal(err)
	}
	id2, err := bus.LoadOrCreateGatewayIdentity(dir)
	if err != nil || id2.PublicKey != id1.PublicKey {
		t.Fatalf("second load: %v %v", id2.PublicKey, err)
	}
	st, err := os.Stat(filepath.Join(dir, bus.GatewayKeyFile))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("gateway.nkey: %v %v", st, err)
	}
	if _, err := os.Stat(filepath.Join(dir, bus.NodeKeyFile)); err == nil {
		t.Fatal("the gateway's identity is the node's file")
	}
}
