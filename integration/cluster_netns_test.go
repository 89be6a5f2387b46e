package integration

import (
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/protocol"
)

// TestClusterNetns runs the deploy/ walkthrough on six machines made of
// network namespaces — three NATS servers (deploy/nats/cluster), the
// gateway (deploy/gateway.cluster.json) and two node agents (the
// execmesh-node unit's env file) — and then breaks things one at a time.
// The subtests share the cluster and leave it healthy; each uses its own
// sessionKey, so exit events of one never count for another.
//
// The test reaches the gateway's HTTP API from inside the gateway's
// namespace (clDialIn): no address is added outside the namespaces.
func TestClusterNetns(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-host cluster")
	}
	start := time.Now()
	c := newClCluster(t)
	t.Logf("cluster up in %s (subnet %s.0/24)", time.Since(start).Round(time.Millisecond), c.net.subnet)

	t.Run("Smoke", func(t *testing.T) { clSmoke(t, c) })
}

// clSmoke: a foreground and a background command on each node through
// the gateway; the command really runs on that machine (it sees the
// machine's address); the background session's exit event arrives once.
func clSmoke(t *testing.T, c *clCluster) {
	c.use(t)
	const key = "agent:smoke:main"
	want := map[string]string{}
	for _, name := range clNodeNames {
		n := c.node(name)
		res := c.mustCall(key, "exec", map[string]any{"command": "ip -o -4 addr show dev eth0; echo ran-on-" + name, "host": "node", "node": name})
		if res.Status() != protocol.StatusCompleted || !strings.Contains(res.Text(), n.host.ip+"/24") || !strings.Contains(res.Text(), "ran-on-"+name) {
			t.Fatalf("exec on %s: %s %q", name, res.Status(), res.Text())
		}
		bg := c.mustCall(key, "exec", map[string]any{"command": "sleep 0.3; echo bg-done-" + name, "host": "node", "node": n.ident.NodeID, "background": true})
		if bg.Status() != protocol.StatusRunning || bg.SessionID() == "" {
			t.Fatalf("background exec on %s: %s %q", name, bg.Status(), bg.Text())
		}
		want[bg.SessionID()] = "bg-done-" + name
	}
	c.collectExitEvents(key, want, 30*time.Second, time.Second)
	list := c.listSessions(key)
	for id, text := range want {
		d, ok := list[id]
		if !ok {
			t.Fatalf("session %s not listed: %v", id, list)
		}
		if d["status"] != protocol.StatusCompleted {
			t.Fatalf("session %s: %v", id, d)
		}
		p := c.mustCall(key, "process", map[string]any{"action": "log", "sessionId": id})
		if !strings.Contains(p.Text(), text) {
			t.Fatalf("log of %s: %q", id, p.Text())
		}
	}
}
