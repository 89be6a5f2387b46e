package bus_test

import (
	"bytes"
	"context"
	"fmt"
	"os"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/execmesh/execmesh/bus"
)

// Example starts an embedded server, connects in-process, creates the
// JetStream assets and moves a 3 MB reply through the 1 MB max_payload.
func Example() {
	ctx := context.Background()
	stateDir, err := os.MkdirTemp("", "execmesh-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(stateDir)

	cfg := bus.DefaultServerConfig(stateDir)
	cfg.Listen = "127.0.0.1:-1" // a random port; the default is 127.0.0.1:4222
	s, err := bus.StartServer(ctx, cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Shutdown(ctx)

	nc, err := bus.Connect(ctx, bus.ClientConfig{InProcess: s, Name: "example"}, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer nc.Close()

	js, err := jetstream.New(nc)
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := bus.EnsureStreams(ctx, js, bus.DefaultPrefix, 1); err != nil {
		fmt.Println(err)
		return
	}

	output := bytes.Repeat([]byte("log line\n"), 350_000) // 3.15 MB
	sub, err := nc.Subscribe("execmesh.node.demo.log", func(m *nats.Msg) {
		if err := bus.RespondChunked(nc, m.Reply, output, nil); err != nil {
			fmt.Println(err)
		}
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sub.Unsubscribe()

	reply, err := bus.RequestChunked(ctx, nc, "execmesh.node.demo.log", nil, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(len(reply.Data), bytes.Equal(reply.Data, output))
	// Output: 3150000 true
}

// ExampleNodeUser admits a node on the embedded server: the gateway
// derives the node id and permissions from the key the node presents.
func ExampleNodeUser() {
	id, err := bus.NewIdentity() // a node keeps its own in LoadOrCreateNodeIdentity
	if err != nil {
		fmt.Println(err)
		return
	}
	u, err := bus.NodeUser(bus.DefaultPrefix, id.PublicKey)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(u.PublicKey == id.PublicKey)
	fmt.Println(u.Permissions.Subscribe.Allow[0] == "execmesh.node."+id.NodeID+".>")
	// A running server would now take it with s.AddNKeyUser(u), and the
	// node would connect with ClientConfig{NKeySeed: id.Seed,
	// InboxPrefix: bus.InboxPrefix(id.NodeID)}.
	// Output:
	// true
	// true
}
