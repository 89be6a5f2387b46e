package nodes

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
	"github.com/execmesh/execmesh/protocol"
)

// Timings of these tests: a presence TTL short enough to watch nodes come
// and go, heartbeats well within it.
const (
	testTTL       = 400 * time.Millisecond
	testBeatEvery = 50 * time.Millisecond
)

// gatewayUser is the gateway's identity on servers that authenticate.
var gatewayUser = bus.User{Name: "execmesh-gateway", Password: "gateway-secret"}

// startRegistry starts a Registry on srv over a connection of its own (a
// gateway), with the test presence TTL, and waits until it read the
// registry bucket. mutate may change the options first.
func startRegistry(t *testing.T, srv *bus.Server, mutate func(*Options)) *Registry {
	t.Helper()
	cc := bus.ClientConfig{Name: "gateway"}
	if users, _ := srv.Users(); len(users) > 0 {
		cc.User, cc.Password = gatewayUser.Name, gatewayUser.Password
	}
	nc := bustest.Connect(t, srv, cc)
	opts := Options{Conn: nc, JS: bustest.JetStream(t, nc), PresenceTTL: testTTL}
	if mutate != nil {
		mutate(&opts)
	}
	r, err := Start(opts)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := r.Close(ctx); err != nil {
			t.Errorf("Registry.Close: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := r.Ready(ctx); err != nil {
		t.Fatalf("Ready: %v", err)
	}
	return r
}

// testNode speaks a node agent's side of the control plane over a real
// NATS connection, under the test's control: heartbeats when told, and
// answers to liveness probes (optionally late, or none). It records the
// pairing notices it gets.
type testNode struct {
	t        *testing.T
	id       bus.Identity
	name     string
	instance string
	nc       *nats.Conn
	subj     protocol.SubjectSet

	mute       atomic.Bool  // answer no probe
	probeDelay atomic.Int64 // answer probes this late (ns)
	probes     atomic.Int32 // probes answered

	pingSub *nats.Subscription

	mu      sync.Mutex
	notices []string // pairing statuses received
	stop    func()
}

func newTestNode(t *testing.T, srv *bus.Server, name string) *testNode {
	t.Helper()
	id, err := bus.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	n := &testNode{t: t, id: id, name: name, instance: "run-1", subj: protocol.Subjects(protocol.DefaultSubjectPrefix)}
	cc := bus.ClientConfig{Name: "node-" + name}
	if users, _ := srv.Users(); len(users) > 0 {
		// What the node says is what is tested here, not its
		// credentials.
		cc.User, cc.Password = gatewayUser.Name, gatewayUser.Password
	}
	n.nc = bustest.Connect(t, srv, cc)
	n.pingSub, err = n.nc.Subscribe(n.subj.Node(id.NodeID, protocol.NodeEndpointPing), func(m *nats.Msg) {
		if n.mute.Load() {
			return
		}
		go func() {
			time.Sleep(time.Duration(n.probeDelay.Load()))
			b, _ := json.Marshal(protocol.PingReply{Instance: n.instance})
			if bus.RespondChunked(n.nc, m.Reply, b, nil) == nil {
				n.probes.Add(1)
			}
		}()
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = n.nc.Subscribe(n.subj.Node(id.NodeID, protocol.NodeEndpointPairing), func(m *nats.Msg) {
		var notice protocol.NodePairingNotice
		_ = json.Unmarshal(m.Data, &notice)
		n.mu.Lock()
		n.notices = append(n.notices, notice.Status)
		n.mu.Unlock()
		_ = bus.RespondChunked(n.nc, m.Reply, []byte("{}"), nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.stopBeating)
	return n
}

// deafen stops serving probes: a probe finds nobody listening at once.
func (n *testNode) deafen() {
	if err := n.pingSub.Unsubscribe(); err != nil {
		n.t.Fatal(err)
	}
	_ = n.nc.Flush()
}

// beat publishes one heartbeat.
func (n *testNode) beat() {
	now := time.Now()
	hb := protocol.NodeHeartbeat{
		NodeID: n.id.NodeID, PublicKey: n.id.PublicKey, Name: n.name, Platform: "linux", Version: "test",
		Instance: n.instance, StartedAt: now.Add(-time.Minute).UnixMilli(), IntervalMs: testBeatEvery.Milliseconds(), TS: now.UnixMilli(),
	}
	b, _ := json.Marshal(hb)
	if err := n.nc.Publish(n.subj.PresenceOf(n.id.NodeID), b); err != nil {
		n.t.Errorf("heartbeat: %v", err)
	}
	_ = n.nc.Flush()
}

// startBeating sends a heartbeat every testBeatEvery until stopBeating.
func (n *testNode) startBeating() {
	n.stopBeating()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	// Its stop is set before the first beat: a test that stops it as
	// soon as the node is heard must find it.
	n.mu.Lock()
	n.stop = func() { cancel(); <-done }
	n.mu.Unlock()
	go func() {
		defer close(done)
		t := time.NewTicker(testBeatEvery)
		defer t.Stop()
		for {
			n.beat()
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}

func (n *testNode) stopBeating() {
	n.mu.Lock()
	stop := n.stop
	n.stop = nil
	n.mu.Unlock()
	if stop != nil {
		stop()
	}
}

func (n *testNode) lastNotice() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.notices) == 0 {
		return ""
	}
	return n.notices[len(n.notices)-1]
}

// checkFor retries f every 10 ms until it returns nil, failing the test
// with its last error after total.
func checkFor(t *testing.T, total time.Duration, f func() error) {
	t.Helper()
	bustest.CheckFor(t, total, 10*time.Millisecond, f)
}

// waitLive waits until r reports node id live (want true) or not.
func waitLive(t *testing.T, r *Registry, id string, want bool, within time.Duration) {
	t.Helper()
	checkFor(t, within, func() error {
		n, ok := r.Get(id)
		if !ok {
			return fmt.Errorf("node %s unknown", id)
		}
		if n.Live != want {
			return fmt.Errorf("node %s live=%v, want %v", id, n.Live, want)
		}
		return nil
	})
}

// registryKV opens the registry bucket the registries share.
func registryKV(t *testing.T, r *Registry) jetstream.KeyValue {
	t.Helper()
	kv, err := r.opts.JS.KeyValue(t.Context(), r.names.Nodes)
	if err != nil {
		t.Fatal(err)
	}
	return kv
}
