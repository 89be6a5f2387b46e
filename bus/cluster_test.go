package bus_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
	"github.com/execmesh/execmesh/protocol"
)

// TestClusterJetStream forms a 3-server cluster with authenticated routes
// and creates the execmesh assets with 3 replicas.
func TestClusterJetStream(t *testing.T) {
	if testing.Short() {
		t.Skip("3-server cluster")
	}
	// JetStream clustering wants configured routes on every server, so
	// the route ports are picked up front; each server lists all three
	// (itself included, which NATS ignores).
	var routes []string
	for range 3 {
		routes = append(routes, bustest.Listen(bustest.FreePort(t)))
	}
	cluster := func(i int) bustest.Option {
		return bustest.WithConfig(func(c *bus.ServerConfig) {
			c.ServerName = fmt.Sprintf("s%d", i+1)
			c.Cluster = &bus.ClusterConfig{Name: "mesh", Listen: routes[i], Routes: routes, Username: "route", Password: "route-secret"}
			c.Users = []bus.User{{Name: "gateway", Password: "gw-secret"}}
		})
	}
	s1 := bustest.StartServer(t, cluster(0))
	s2 := bustest.StartServer(t, cluster(1))
	s3 := bustest.StartServer(t, cluster(2))
	bustest.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		for _, s := range []*bus.Server{s1, s2, s3} {
			if n := s.NATSServer().NumRoutes(); n < 2 {
				return fmt.Errorf("%s has %d routes", s.NATSServer().Name(), n)
			}
		}
		return nil
	})

	nc := bustest.Connect(t, s3, bus.ClientConfig{URLs: []string{s3.ClientURL(), s1.ClientURL()}, User: "gateway", Password: "gw-secret"})
	js := bustest.JetStream(t, nc)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	if err := bus.EnsureStreams(ctx, js, bus.DefaultPrefix, 3); err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, bus.StreamNamesFor(bus.DefaultPrefix).Exit)
	if err != nil {
		t.Fatal(err)
	}
	if r := st.CachedInfo().Config.Replicas; r != 3 {
		t.Fatalf("exit stream replicas %d", r)
	}
	ev := protocol.ExitEvent{SessionID: "s", NodeID: "n1"}
	if _, err := bus.PublishExitEvent(ctx, js, bus.DefaultPrefix, ev); err != nil {
		t.Fatal(err)
	}

	// A clustered server reloads users too (cluster options unchanged).
	node := newIdentity(t)
	if err := s1.AddNKeyUser(nodeUser(t, node)); err != nil {
		t.Fatalf("reload on a cluster member: %v", err)
	}
	nodeClient(t, s1, node)
}
