package nodes

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
	"github.com/execmesh/execmesh/protocol"
)

// TestExitFeedWaitsForPairings: exit events that waited in the stream
// while no gateway ran are handed to OnExit by the next registry, not
// dropped as events of an unpaired node because the registry bucket was
// not read yet. Many other nodes in the bucket make its
// first read take a while.
func TestExitFeedWaitsForPairings(t *testing.T) {
	srv := bustest.StartServer(t)
	nc := bustest.Connect(t, srv, bus.ClientConfig{})
	js := bustest.JetStream(t, nc)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	const prefix = protocol.DefaultSubjectPrefix
	var kcfg jetstream.KeyValueConfig
	for _, c := range bus.KeyValueConfigs(prefix, 1) {
		if c.Bucket == bus.StreamNamesFor(prefix).Nodes {
			kcfg = c
		}
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, kcfg)
	if err != nil {
		t.Fatal(err)
	}
	put := func() string {
		id, err := bus.NewIdentity()
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(record{ID: id.NodeID, PublicKey: id.PublicKey, Pairing: protocol.NodePairingPaired, DecidedAt: 1})
		if _, err := kv.Put(ctx, id.NodeID, b); err != nil {
			t.Fatal(err)
		}
		return id.NodeID
	}
	for range 1500 {
		put()
	}
	node := put()
	if _, err := js.CreateOrUpdateStream(ctx, bus.ExitStreamConfig(prefix, 1)); err != nil {
		t.Fatal(err)
	}
	const n = 5
	for i := range n {
		ev := protocol.ExitEvent{NodeID: node, SessionID: fmt.Sprintf("s-%d", i), SessionKey: "agent:a:main", StartedAt: int64(i + 1), Notify: true, Text: "done"}
		if _, err := bus.PublishExitEvent(ctx, js, prefix, ev); err != nil {
			t.Fatal(err)
		}
	}

	var mu sync.Mutex
	got := map[string]int{}
	r, err := Start(Options{Conn: nc, JS: js, Prefix: prefix, OnExit: func(_ context.Context, _ Node, ev protocol.ExitEvent) error {
		mu.Lock()
		got[ev.SessionID]++
		mu.Unlock()
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(context.Background())
	bustest.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(got) < n {
			return fmt.Errorf("OnExit got %d of %d waiting events: %v", len(got), n, got)
		}
		return nil
	})
	cons, err := js.Consumer(ctx, bus.StreamNamesFor(prefix).Exit, exitConsumerName(prefix))
	if err != nil {
		t.Fatal(err)
	}
	bustest.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		ci, err := cons.Info(ctx)
		if err != nil {
			return err
		}
		if ci.AckFloor.Stream != n || ci.NumAckPending != 0 {
			return fmt.Errorf("ack floor %d, pending %d", ci.AckFloor.Stream, ci.NumAckPending)
		}
		return nil
	})
}
