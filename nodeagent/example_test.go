package nodeagent_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/hostbus"
	"github.com/execmesh/execmesh/nodeagent"
	"github.com/execmesh/execmesh/protocol"
)

// A node agent on an embedded NATS server runs a command a gateway sends
// to its exec endpoint.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dir, err := os.MkdirTemp("", "nodeagent-example-")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)

	srv, err := bus.StartServer(ctx, bus.ServerConfig{Listen: "127.0.0.1:-1", JetStream: true, StoreDir: filepath.Join(dir, "nats")})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Shutdown(context.Background()) //nolint:errcheck

	cfg := nodeagent.DefaultConfig()
	cfg.StateDir = filepath.Join(dir, "node") // holds the node's nkey
	cfg.Name = "build-1"
	cfg.Client = bus.ClientConfig{URLs: []string{srv.ClientURL()}}
	cfg.Cwd = dir
	agent, err := nodeagent.New(cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer agent.Close(context.Background()) //nolint:errcheck
	if err := agent.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	if err := agent.Ready(ctx); err != nil {
		fmt.Println(err)
		return
	}

	// What a gateway sends: the exec arguments plus routing and policy.
	nc, err := bus.Connect(ctx, bus.ClientConfig{URLs: []string{srv.ClientURL()}}, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer nc.Close()
	node := &hostbus.Remote{Conn: nc, Group: protocol.Subjects("").NodeGroup(agent.ID()), Label: "node build-1"}
	reply, err := node.Exec(ctx, protocol.ExecRequest{SessionKey: "agent:main:main", Target: protocol.TargetNode,
		Args: protocol.ExecArgs{Command: "echo hello from $0"}, Security: "full", Ask: "off"})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(reply.Result.Status(), strings.Contains(reply.Result.Text(), "hello from"))
	// Output: completed true
}
