package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/nats-io/nkeys"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/nodeagent"
	"github.com/execmesh/execmesh/protocol"
)

// TestClusterNetns runs the deploy/ walkthrough on machines made of
// network namespaces — three NATS servers (deploy/nats/cluster), the
// gateway (deploy/gateway.cluster.json), two node agents (the
// execmesh-node unit's env file) and a spare host for servers with broken
// certificates — and then breaks things one at a time: a server killed, a
// link cut, the gateway and a node agent killed, impersonation attempts,
// bad credentials and certificates, a server missing, load. The subtests
// share the cluster and leave it healthy; each uses its own sessionKey, so
// exit events of one never count for another. Without root and iproute2
// it skips, loudly.
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
	t.Run("NATSServerKilled", func(t *testing.T) { clServerKill(t, c) })
	t.Run("NodeLinkCut", func(t *testing.T) { clLinkCut(t, c) })
	t.Run("NodeCutFromOneServer", func(t *testing.T) { clOneServerCut(t, c) })
	t.Run("GatewayKilled", func(t *testing.T) { clGatewayKill(t, c) })
	t.Run("GatewayKilledWithQueuedEvent", func(t *testing.T) { clGatewayKillQueued(t, c) })
	t.Run("NodeAgentKilled", func(t *testing.T) { clNodeKill(t, c) })
	t.Run("Impersonation", func(t *testing.T) { clImpersonation(t, c) })
	t.Run("ForgedExitEvent", func(t *testing.T) { clForgedExitEvent(t, c) })
	t.Run("DiscoveryForgery", func(t *testing.T) { clDiscoveryForgery(t, c) })
	t.Run("ServerMissing", func(t *testing.T) { clServerMissing(t, c) })
	t.Run("BadCredentials", func(t *testing.T) { clBadCredentials(t, c) })
	t.Run("BadTLS", func(t *testing.T) { clBadTLS(t, c) })
	t.Run("Load", func(t *testing.T) { clLoad(t, c) })
	t.Run("ThousandSessions", func(t *testing.T) { clManySessions(t, c) })
	t.Run("NodeStopWithManySessions", func(t *testing.T) { clNodeStopBound(t, c) })
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
		if d.Status.Value() != protocol.StatusCompleted {
			t.Fatalf("session %s: %v", id, d)
		}
		p := c.mustCall(key, "process", map[string]any{"action": "log", "sessionId": id})
		if !strings.Contains(p.Text(), text) {
			t.Fatalf("log of %s: %q", id, p.Text())
		}
	}
}

// clServerKill kills (SIGKILL) the NATS server that leads the exit-event
// stream while 20 background commands run across the two nodes, then
// restarts it. Nothing is lost: every command's exit event arrives
// exactly once, every session stays listable, and every line of output
// is in its log.
func clServerKill(t *testing.T, c *clCluster) {
	c.use(t)
	const key = "agent:natskill:main"
	const lines = 8
	want := map[string]string{}
	ids := map[string]int{}
	for i := range 20 {
		name := clNodeNames[i%2]
		cmd := fmt.Sprintf("for j in $(seq 1 %d); do echo cl-%d-line-$j; sleep 0.4; done; echo cl-%d-done", lines, i, i)
		bg := c.mustCall(key, "exec", map[string]any{"command": cmd, "host": "node", "node": name, "background": true})
		if bg.Status() != protocol.StatusRunning {
			t.Fatalf("start %d: %s %q", i, bg.Status(), bg.Text())
		}
		want[bg.SessionID()] = fmt.Sprintf("cl-%d-done", i)
		ids[bg.SessionID()] = i
	}

	victim := c.streamLeader(bus.StreamNamesFor(bus.DefaultPrefix).Exit)
	t.Logf("killing %s (leader of the exit stream) with 20 commands running", c.servers[victim].name)
	c.servers[victim].kill(t)

	// The cluster keeps serving: calls fail over to the other servers.
	clCheckFor(t, "list with a server down", 30*time.Second, 200*time.Millisecond, func() error {
		r := c.call(key, "process", map[string]any{"action": "list"})
		if r.Status != 200 {
			return fmt.Errorf("list: %d %s", r.Status, r.Raw)
		}
		n := 0
		for _, d := range c.listSessions(key) {
			if _, ok := want[d.SessionID.Value()]; ok {
				n++
			}
		}
		if n != len(want) {
			return fmt.Errorf("%d of %d sessions listed", n, len(want))
		}
		return nil
	})
	c.collectExitEvents(key, want, 60*time.Second, 2*time.Second)

	c.servers[victim].start(t)
	c.waitServersHealthy(60 * time.Second)
	c.waitStreamsCurrent(60 * time.Second)

	list := c.listSessions(key)
	for id, i := range ids {
		d, ok := list[id]
		if !ok || d.Status.Value() != protocol.StatusCompleted {
			t.Fatalf("session %s after the server came back: %v", id, d)
		}
		log := c.mustCall(key, "process", map[string]any{"action": "log", "sessionId": id, "limit": 100}).Text()
		for j := 1; j <= lines; j++ {
			if !strings.Contains(log, fmt.Sprintf("cl-%d-line-%d\n", i, j)) {
				t.Fatalf("session %s (%d): line %d missing from the log: %q", id, i, j, log)
			}
		}
		if !strings.Contains(log, fmt.Sprintf("cl-%d-done", i)) {
			t.Fatalf("session %s: last line missing: %q", id, log)
		}
	}
	for _, name := range clNodeNames {
		c.waitNode(c.node(name).ident.NodeID, "connected", "paired", 30*time.Second)
	}
}

// clLinkCut takes node-b off the network for longer than the presence
// TTL (three heartbeats) and brings it back. Meanwhile the gateway lists
// it unreachable, calls for it and its sessions fail at once with a
// retryable error, its sessions stay listed, node-a keeps working. After
// the link returns: the node is connected again, a session that ended
// during the cut and one still running are both intact, and every exit
// event arrives once.
func clLinkCut(t *testing.T, c *clCluster) {
	c.use(t)
	const key = "agent:linkcut:main"
	a, b := c.node("node-a"), c.node("node-b")
	start := func(node *clNode, cmd string) string {
		r := c.mustCall(key, "exec", map[string]any{"command": cmd, "host": "node", "node": node.name, "background": true, "yieldMs": 10})
		if r.Status() != protocol.StatusRunning {
			t.Fatalf("start on %s: %s %q", node.name, r.Status(), r.Text())
		}
		return r.SessionID()
	}
	aID := start(a, "echo a-start; sleep 2; echo a-done")
	bShort := start(b, "echo b-short-start; sleep 1.5; echo b-short-done") // ends during the cut
	bLong := start(b, "echo b-long-start; sleep 12; echo b-long-done")     // outlives the cut
	clCheckFor(t, "first output of node-b's sessions", 10*time.Second, 100*time.Millisecond, func() error {
		for _, id := range []string{bShort, bLong} {
			log := c.mustCall(key, "process", map[string]any{"action": "log", "sessionId": id}).Text()
			if !strings.Contains(log, "-start") {
				return fmt.Errorf("%s: %q", id, log)
			}
		}
		return nil
	})

	cutAt := time.Now()
	b.host.cut()
	restored := false
	defer func() {
		if !restored {
			b.host.restore()
		}
	}()
	ttl := 3 * clHeartbeat
	c.waitNode(b.ident.NodeID, "unreachable", "paired", ttl+10*time.Second)
	t.Logf("node-b unreachable %s after the cut (presence TTL %s)", time.Since(cutAt).Round(time.Millisecond), ttl)

	failFast := func(what string, r clResp, took time.Duration) {
		t.Helper()
		if r.Status != 503 || r.Error == nil || !r.Error.Retryable || !strings.Contains(r.Error.Message, "unreachable") {
			t.Fatalf("%s while node-b is cut off: %d %s", what, r.Status, r.Raw)
		}
		if took > time.Second {
			t.Fatalf("%s while node-b is cut off took %s: not fail-fast", what, took)
		}
	}
	t0 := time.Now()
	r := c.call(key, "process", map[string]any{"action": "poll", "sessionId": bLong, "timeout": 2000})
	failFast("poll", r, time.Since(t0))
	t0 = time.Now()
	r = c.call(key, "exec", map[string]any{"command": "echo never", "host": "node", "node": b.name})
	failFast("exec", r, time.Since(t0))
	list := c.listSessions(key)
	for _, id := range []string{aID, bShort, bLong} {
		if _, ok := list[id]; !ok {
			t.Fatalf("session %s not listed while node-b is cut off: %v", id, list)
		}
	}
	if res := c.mustCall(key, "exec", map[string]any{"command": "echo a-still-works", "host": "node", "node": a.name}); !strings.Contains(res.Text(), "a-still-works") {
		t.Fatalf("node-a during node-b's outage: %q", res.Text())
	}

	// The outage lasts long enough for node-b's short command to end
	// while it is cut off (its exit event must wait for the link). This
	// is the length of the fault, not a wait for a condition.
	time.Sleep(time.Until(cutAt.Add(2 * ttl)))
	b.host.restore()
	restored = true
	c.waitNode(b.ident.NodeID, "connected", "paired", 60*time.Second)
	t.Logf("node-b connected again %s after the cut", time.Since(cutAt).Round(time.Millisecond))

	p := c.mustCall(key, "process", map[string]any{"action": "log", "sessionId": bLong})
	if !strings.Contains(p.Text(), "b-long-start") {
		t.Fatalf("node-b's running session after the outage: %q", p.Text())
	}
	c.collectExitEvents(key, map[string]string{aID: "a-done", bShort: "b-short-done", bLong: "b-long-done"}, 30*time.Second, 2*time.Second)
	for id, want := range map[string]string{bShort: "b-short-start\nb-short-done", bLong: "b-long-start\nb-long-done"} {
		if log := c.mustCall(key, "process", map[string]any{"action": "log", "sessionId": id}).Text(); !strings.Contains(log, want) {
			t.Fatalf("log of %s after the outage: %q", id, log)
		}
	}
}

// clOneServerCut: node-b's packets to the NATS server it is connected
// to vanish for 30 s, and only those: the link to the other two servers
// stays up. That server keeps node-b's old connection open all along (it
// hears no reset) while node-b, its pings unanswered, connects to another
// server of the cluster, so the cluster holds two connections of node-b
// with the same subscriptions. Calls must reach node-b through the new
// one during the cut, and within 5 s of the heal at the latest; each
// answers within the presence TTL meanwhile.
func clOneServerCut(t *testing.T, c *clCluster) {
	c.use(t)
	const key = "agent:oneserver:main"
	b := c.node("node-b")
	id := c.mustCall(key, "exec", map[string]any{"command": "echo os-start; sleep 600", "host": "node", "node": b.name, "background": true}).SessionID()
	srv := c.nodeServer(t, b)
	ip := c.net.hosts[fmt.Sprintf("nats-%d", srv+1)].ip
	route := func(op string) {
		t.Helper()
		if err := clIP("-n", b.host.ns, "route", op, "blackhole", ip+"/32"); err != nil {
			t.Fatalf("route %s blackhole %s: %v", op, ip, err)
		}
	}
	route("add")
	cutAt := time.Now()
	restored := false
	defer func() {
		if !restored {
			route("del")
		}
	}()
	works := func() error {
		t0 := time.Now()
		r := c.call(key, "exec", map[string]any{"command": "echo one-server", "host": "node", "node": b.name})
		p := c.call(key, "process", map[string]any{"action": "poll", "sessionId": id})
		if took := time.Since(t0); took > 2*3*clHeartbeat+5*time.Second {
			t.Errorf("exec and poll on node-b took %s while it is cut off from nats-%d", took.Round(time.Millisecond), srv+1)
		}
		if r.Status != 200 || p.Status != 200 {
			return fmt.Errorf("exec %d %.200s; poll %d %.200s", r.Status, r.Raw, p.Status, p.Raw)
		}
		return nil
	}
	back := time.Duration(-1)
	for time.Since(cutAt) < 30*time.Second {
		if err := works(); err == nil && back < 0 {
			back = time.Since(cutAt)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if back < 0 {
		t.Errorf("node-b was not reachable through another server during the 30 s cut from nats-%d", srv+1)
	} else {
		t.Logf("node-b reachable through another server %s after its cut from nats-%d", back.Round(time.Millisecond), srv+1)
	}
	stale := c.serverHolds(srv, b)
	route("del")
	restored = true
	healed := time.Now()
	clCheckFor(t, "exec and poll on node-b after the heal", 5*time.Second, 100*time.Millisecond, works)
	t.Logf("exec and poll on node-b worked %s after the heal (nats-%d still held its old connection at the heal: %v)",
		time.Since(healed).Round(time.Millisecond), srv+1, stale)
}

// clGatewayKill kills the gateway with SIGKILL while six node sessions
// run; three of them end while it is down. The restarted gateway (same
// state dir) lists all six again and delivers every exit event once:
// those that waited in JetStream and those that come later.
func clGatewayKill(t *testing.T, c *clCluster) {
	c.use(t)
	const key = "agent:gwkill:main"
	js, err := jetstream.New(c.gatewayConn())
	if err != nil {
		t.Fatal(err)
	}
	exitStream := bus.StreamNamesFor(bus.DefaultPrefix).Exit
	before := c.streamMsgs(js, exitStream)
	want := map[string]string{}
	for i := range 6 {
		d := "1"
		if i >= 3 {
			d = "6" // still running when the gateway is back
		}
		cmd := fmt.Sprintf("echo gk-%d-start; sleep %s; echo gk-%d-done", i, d, i)
		r := c.mustCall(key, "exec", map[string]any{"command": cmd, "host": "node", "node": clNodeNames[i%2], "background": true})
		want[r.SessionID()] = fmt.Sprintf("gk-%d-done", i)
	}
	c.gw.kill(t)
	clCheckFor(t, "3 exits stored in JetStream while the gateway is down", 30*time.Second, 100*time.Millisecond, func() error {
		if n := c.streamMsgs(js, exitStream); n < before+3 {
			return fmt.Errorf("%d new exit events", n-before)
		}
		return nil
	})
	c.startGateway()
	for _, name := range clNodeNames {
		c.waitNode(c.node(name).ident.NodeID, "connected", "paired", 30*time.Second)
	}
	list := c.listSessions(key)
	for id := range want {
		if _, ok := list[id]; !ok {
			t.Fatalf("session %s not listed by the restarted gateway: %v", id, list)
		}
	}
	c.collectExitEvents(key, want, 30*time.Second, 2*time.Second)
	for id, w := range want {
		if log := c.mustCall(key, "process", map[string]any{"action": "log", "sessionId": id}).Text(); !strings.Contains(log, w) {
			t.Fatalf("log of %s: %q", id, log)
		}
	}
}

// clGatewayKillQueued: an exit event the gateway already took from
// JetStream (and acknowledged) but no client has read yet when the
// gateway is SIGKILLed must still be delivered by the restarted gateway.
func clGatewayKillQueued(t *testing.T, c *clCluster) {
	c.use(t)
	const key = "agent:gwkillqueued:main"
	js, err := jetstream.New(c.gatewayConn())
	if err != nil {
		t.Fatal(err)
	}
	exitStream := bus.StreamNamesFor(bus.DefaultPrefix).Exit
	before := c.streamMsgs(js, exitStream)
	r := c.mustCall(key, "exec", map[string]any{"command": "sleep 0.2; echo queued-done", "host": "node", "node": "node-a", "background": true})
	id := r.SessionID()
	clCheckFor(t, "exit event stored and acknowledged by the gateway", 30*time.Second, 100*time.Millisecond, func() error {
		n := c.streamMsgs(js, exitStream)
		if n < before+1 {
			return fmt.Errorf("not stored yet")
		}
		cons, err := js.Consumer(clCtx(t, 5*time.Second), exitStream, bus.DefaultPrefix+"_gateway")
		if err != nil {
			return err
		}
		ci := cons.CachedInfo()
		if ci.NumAckPending != 0 || ci.AckFloor.Stream < c.streamLastSeq(js, exitStream) {
			return fmt.Errorf("consumer ack floor %d, pending %d", ci.AckFloor.Stream, ci.NumAckPending)
		}
		return nil
	})
	c.gw.kill(t)
	c.startGateway()
	var got []protocol.SystemEvent
	deadline := time.Now().Add(6 * time.Second)
	for len(got) == 0 && time.Now().Before(deadline) {
		got = append(got, c.events(key, time.Second)...)
	}
	if len(got) == 0 {
		t.Fatalf("exit event of %s lost: the gateway had taken it from JetStream (and acknowledged it) but no client had read it "+
			"when the gateway was SIGKILLed; its queue must survive (<state-dir>/events.json)", id)
	}
	if len(got) != 1 || !strings.Contains(got[0].Text, "queued-done") {
		t.Fatalf("events after the restart: %+v", got)
	}
}

// clNodeKill kills node-a's agent with SIGKILL while three of its
// sessions run. Until it is back, calls for them fail at once with a
// retryable error and they stay listed; the restarted agent (a new
// instance, same key) does not have them, and the gateway reports them
// lost — in poll and in list — rather than dropping them. node-b is
// unaffected throughout.
func clNodeKill(t *testing.T, c *clCluster) {
	c.use(t)
	const key = "agent:nodekill:main"
	a := c.node("node-a")
	var ids []string
	for i := range 3 {
		r := c.mustCall(key, "exec", map[string]any{"command": fmt.Sprintf("echo nk-%d-start; sleep 60", i), "host": "node", "node": a.name, "background": true})
		ids = append(ids, r.SessionID())
	}
	bID := c.mustCall(key, "exec", map[string]any{"command": "sleep 1; echo nk-b-done", "host": "node", "node": "node-b", "background": true}).SessionID()

	a.proc.kill(t)
	// Fail-fast needs the cluster to know the node is gone: a request that
	// beats the interest removal across a route is forwarded to the dead
	// node's server and dropped there, and waits for its deadline (NATS
	// sends "no responders" only from the server that saw no interest).
	// That takes milliseconds, more on a loaded machine.
	c.waitNoInterest(protocol.Subjects(bus.DefaultPrefix).Node(a.ident.NodeID, protocol.NodeEndpointProcess), 10*time.Second)
	clCheckFor(t, "fail-fast poll of a session of the killed node", 10*time.Second, 100*time.Millisecond, func() error {
		t0 := time.Now()
		r := c.call(key, "process", map[string]any{"action": "poll", "sessionId": ids[0], "timeout": 2000})
		if took := time.Since(t0); took > time.Second {
			t.Fatalf("poll of a dead node's session took %s: not fail-fast", took)
		}
		if r.Status != 503 || r.Error == nil || !r.Error.Retryable {
			return fmt.Errorf("poll: %d %s", r.Status, r.Raw)
		}
		return nil
	})
	c.waitNode(a.ident.NodeID, "unreachable", "paired", 10*time.Second)
	list := c.listSessions(key)
	for _, id := range ids {
		if _, ok := list[id]; !ok {
			t.Fatalf("session %s of the killed node not listed: %v", id, list)
		}
	}
	c.collectExitEvents(key, map[string]string{bID: "nk-b-done"}, 20*time.Second, 0)

	a.proc.start(t)
	c.waitNode(a.ident.NodeID, "connected", "paired", 30*time.Second)
	clCheckFor(t, "sessions of the killed node reported lost", 20*time.Second, 200*time.Millisecond, func() error {
		for _, id := range ids {
			p := c.mustCall(key, "process", map[string]any{"action": "poll", "sessionId": id})
			if p.Status() != protocol.StatusFailed || p.Details.Lost.Value() != true || !strings.Contains(p.Text(), "lost") {
				return fmt.Errorf("poll %s: %s %q %v", id, p.Status(), p.Text(), p.Details)
			}
		}
		return nil
	})
	list = c.listSessions(key)
	for _, id := range ids {
		if d, ok := list[id]; !ok || d.Status.Value() != "lost" {
			t.Fatalf("list after the node's restart: %s is %v", id, d)
		}
	}
	if r := c.mustCall(key, "exec", map[string]any{"command": "echo a-is-back", "host": "node", "node": a.name}); !strings.Contains(r.Text(), "a-is-back") {
		t.Fatalf("exec on the restarted node: %q", r.Text())
	}
	for _, id := range ids {
		if r := c.mustCall(key, "process", map[string]any{"action": "remove", "sessionId": id}); !strings.Contains(r.Text(), id) {
			t.Fatalf("remove lost session %s: %q", id, r.Text())
		}
	}
	// The killed agent's commands were orphaned in node-a's machine
	// (nothing adopts them); end them so they do not load later tests.
	c.killOrphans(a.host, "sleep 60")
}

// clImpersonation: node-b's credentials cannot act as node-a. The
// servers refuse a connection that claims node-a's public key without its
// seed, and every subscription or publication of node-b on node-a's
// subjects, the tool API or other inboxes. What node-b may legitimately
// publish (its own heartbeat subject, the shared pairing subject) with
// node-a's id in the body is ignored by the gateway: node-a keeps its
// name, its sessions and its liveness.
func clImpersonation(t *testing.T, c *clCluster) {
	c.use(t)
	const key = "agent:impersonation:main"
	a, b := c.node("node-a"), c.node("node-b")
	aSession := c.mustCall(key, "exec", map[string]any{"command": "echo imp-start; sleep 3; echo imp-done", "host": "node", "node": a.name, "background": true}).SessionID()

	// 1. node-a's public key with node-b's seed: the nonce signature fails.
	bSeed, err := os.ReadFile(b.ident.SeedFile)
	if err != nil {
		t.Fatal(err)
	}
	bKP, err := nkeys.FromSeed(bytes.TrimSpace(bSeed))
	if err != nil {
		t.Fatal(err)
	}
	_, err = nats.Connect(fmt.Sprintf("tls://%s:4222", c.net.hosts["nats-1"].ip),
		nats.Nkey(a.ident.PublicKey, bKP.Sign), nats.RootCAs(c.ca), nats.NoReconnect(), nats.Timeout(5*time.Second),
		nats.SetCustomDialer(clNSDialer{ns: b.host.ns}))
	if err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
		t.Fatalf("connect claiming node-a's key with node-b's seed: %v", err)
	}

	// 2. node-b's own credentials on node-a's subjects.
	var mu sync.Mutex
	var violations []string
	nc := c.natsConn(b.host, bus.ClientConfig{Name: "rogue node-b", NKeySeedFile: b.ident.SeedFile, InboxPrefix: bus.InboxPrefix(b.ident.NodeID),
		ErrorHandler: func(_ *nats.Conn, _ *nats.Subscription, err error) {
			mu.Lock()
			violations = append(violations, err.Error())
			mu.Unlock()
		}})
	subj := protocol.Subjects(bus.DefaultPrefix)
	subs := []string{subj.NodeAll(a.ident.NodeID), subj.Node(a.ident.NodeID, protocol.NodeEndpointExec), subj.Invoke, subj.Presence, "_INBOX.>", bus.InboxPrefix(a.ident.NodeID) + ".>"}
	for _, s := range subs {
		if _, err := nc.SubscribeSync(s); err != nil {
			t.Fatal(err)
		}
	}
	pubs := []string{subj.PresenceOf(a.ident.NodeID), subj.ExitEventsOf(a.ident.NodeID), subj.Node(a.ident.NodeID, protocol.NodeEndpointProcess), subj.Invoke, "$KV." + bus.StreamNamesFor(bus.DefaultPrefix).Nodes + "." + a.ident.NodeID}
	for _, p := range pubs {
		if err := nc.Publish(p, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	// 3. What node-b may publish, claiming node-a in the body.
	now := time.Now().UnixMilli()
	forged := func(v any) []byte { b, _ := json.Marshal(v); return b }
	if err := nc.Publish(subj.PresenceOf(b.ident.NodeID), forged(nodeagent.Heartbeat{NodeID: a.ident.NodeID, PublicKey: a.ident.PublicKey, Name: "evil",
		Instance: "forged", IntervalMs: 60000, TS: now})); err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Request(subj.PairRequest, forged(nodeagent.PairRequest{Type: nodeagent.PairAnnounce, NodeID: a.ident.NodeID, PublicKey: a.ident.PublicKey,
		Name: "evil", Instance: "forged"}), 5*time.Second); err != nil {
		t.Fatalf("pairing request: %v", err)
	}
	_ = nc.Flush()
	clCheckFor(t, "permission violations", 10*time.Second, 100*time.Millisecond, func() error {
		mu.Lock()
		got := strings.Join(violations, "\n")
		mu.Unlock()
		for _, s := range subs {
			if !strings.Contains(got, "Subscription to \""+s+"\"") {
				return fmt.Errorf("subscribing to %s not refused; violations:\n%s", s, got)
			}
		}
		for _, p := range pubs {
			if !strings.Contains(got, "Publish to \""+p+"\"") {
				return fmt.Errorf("publishing to %s not refused; violations:\n%s", p, got)
			}
		}
		return nil
	})
	c.checkNodeAIntact(key, aSession, a)
	c.collectExitEvents(key, map[string]string{aSession: "imp-done"}, 30*time.Second, time.Second)
}

// clForgedExitEvent: node-b publishes, on its own exit-event subject (as
// its permissions allow), an exit event for node-a's session under
// another agent's sessionKey. The gateway must not deliver it: an exit
// event counts only for a session the sending node runs.
func clForgedExitEvent(t *testing.T, c *clCluster) {
	c.use(t)
	const key = "agent:forgedexit:main"
	a, b := c.node("node-a"), c.node("node-b")
	aSession := c.mustCall(key, "exec", map[string]any{"command": "sleep 3; echo real-done", "host": "node", "node": a.name, "background": true}).SessionID()
	nc := c.natsConn(b.host, bus.ClientConfig{Name: "rogue node-b", NKeySeedFile: b.ident.SeedFile, InboxPrefix: bus.InboxPrefix(b.ident.NodeID)})
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bus.PublishExitEvent(clCtx(t, 10*time.Second), js, bus.DefaultPrefix, protocol.ExitEvent{NodeID: b.ident.NodeID, SessionID: aSession,
		SessionKey: key, StartedAt: time.Now().UnixMilli(), Notify: true, Text: "Exec completed (" + aSession + ", code 0) :: forged by node-b"}); err != nil {
		t.Fatalf("node-b's own exit subject: %v", err)
	}
	if evs := c.events(key, 1500*time.Millisecond); len(evs) != 0 {
		t.Fatalf("gateway delivered a forged exit event: besides naming the same paired node in subject and body "+
			"(gateway/nodes_events.go onExitMsg), an exit event must be for a session that node runs under that sessionKey, "+
			"or any paired node can inject 'Exec completed' notifications into any agent's events, naming another node's session: %+v", evs)
	}
	c.collectExitEvents(key, map[string]string{aSession: "real-done"}, 30*time.Second, time.Second)
}

// clDiscoveryForgery: node-b answers micro discovery
// ($SRV.PING.execmesh-node, which node permissions must let a node
// answer, for `nats micro ls`) with node-a's id, another name and
// platform, and a new instance, while the gateway restarts. The gateway
// learns nodes from the registry bucket and from each node's own
// presence subject and endpoints, which NATS lets that node alone use;
// discovery answers name nothing to it. node-a's running session stays
// reachable and running, its name and platform stay, the gateway logs
// no restart of node-a, and the session's exit event arrives once.
func clDiscoveryForgery(t *testing.T, c *clCluster) {
	c.use(t)
	const key = "agent:discovery:main"
	a, b := c.node("node-a"), c.node("node-b")
	// The session runs until the test lets it end, however long the
	// gateway restart takes on a busy machine.
	gate := filepath.Join(t.TempDir(), "discovery-done")
	release := func() { _ = os.WriteFile(gate, nil, 0o644) }
	defer release()
	aSession := c.mustCall(key, "exec", map[string]any{"command": "echo disc-start; while [ ! -e " + gate + " ]; do sleep 0.1; done; echo disc-done",
		"host": "node", "node": a.name, "background": true}).SessionID()
	nc := c.natsConn(b.host, bus.ClientConfig{Name: "rogue node-b", NKeySeedFile: b.ident.SeedFile, InboxPrefix: bus.InboxPrefix(b.ident.NodeID)})
	ping := micro.Ping{ServiceIdentity: micro.ServiceIdentity{Name: bus.NodeServiceName, ID: "forged", Version: "0.0.0-dev",
		Metadata: map[string]string{"nodeId": a.ident.NodeID, "name": "evil", "platform": "evil/evil", "instance": "forged"}}, Type: micro.PingResponseType}
	body, _ := json.Marshal(ping)
	var answered atomic.Int32
	for _, s := range []string{"$SRV.PING", "$SRV.PING." + bus.NodeServiceName} {
		if _, err := nc.Subscribe(s, func(m *nats.Msg) {
			if m.Respond(body) == nil {
				answered.Add(1)
			}
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := c.gw.stop(); err != nil {
		t.Fatalf("gateway stop: %v", err)
	}
	c.startGateway()
	// What an operator's `nats micro ls` would ask: the forger answers.
	if _, err := c.gatewayConn().Request("$SRV.PING."+bus.NodeServiceName, nil, 2*time.Second); err != nil {
		t.Logf("discovery request: %v", err)
	}
	c.checkNodeAIntact(key, aSession, a)
	nodes, err := c.nodesView()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.ID == a.ident.NodeID && strings.Contains(n.Platform, "evil") {
			t.Fatalf("the forged discovery answer set node-a's platform: %+v", n)
		}
	}
	for l := range strings.SplitSeq(c.gw.lastRunLog(), "\n") {
		if strings.Contains(l, "node restarted") && strings.Contains(l, a.ident.NodeID) {
			t.Fatalf("the forged discovery answer made the gateway take node-a for restarted: %s", l)
		}
	}
	release()
	c.collectExitEvents(key, map[string]string{aSession: "disc-done"}, 30*time.Second, time.Second)
	t.Logf("%d forged discovery answers sent by node-b's credentials; ignored", answered.Load())
}

// checkNodeAIntact fails unless nodeAIntactErr finds nothing wrong.
func (c *clCluster) checkNodeAIntact(key, session string, a *clNode) {
	c.t.Helper()
	if err := c.nodeAIntactErr(key, session, a); err != nil {
		c.t.Fatal(err)
	}
}

// nodeAIntactErr checks that node a is listed with its own name,
// connected and paired, and that its session is still running.
func (c *clCluster) nodeAIntactErr(key, session string, a *clNode) error {
	c.t.Helper()
	c.waitNode(a.ident.NodeID, "connected", "paired", 30*time.Second)
	nodes, err := c.nodesView()
	if err != nil {
		return err
	}
	for _, n := range nodes {
		if n.ID == a.ident.NodeID && n.Name != a.name {
			return fmt.Errorf("node-a renamed to %q", n.Name)
		}
	}
	p := c.mustCall(key, "process", map[string]any{"action": "poll", "sessionId": session})
	if p.Status() != protocol.StatusRunning {
		return fmt.Errorf("node-a's session %s: %s %q %v", session, p.Status(), p.Text(), p.Details)
	}
	return nil
}

// clLoadDuration is how long the load test runs: EXECMESH_CLUSTER_LOAD_SECONDS,
// default 60 s (the whole integration package then takes
// about 3½ minutes on 2 cores, well inside CI's 20-minute timeout; set a
// lower value for a quick local run).
func clLoadDuration(t *testing.T) time.Duration {
	if v := os.Getenv("EXECMESH_CLUSTER_LOAD_SECONDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("EXECMESH_CLUSTER_LOAD_SECONDS=%q: want a positive number of seconds", v)
		}
		return time.Duration(n) * time.Second
	}
	return 60 * time.Second
}

// clLoad: 100 concurrent callers do exec round trips (a foreground echo,
// alternating between the two nodes) for clLoadDuration. Every call must
// come back completed with exactly its own output. A retryable error (a
// node starved of CPU missed its heartbeats: "nothing was started") is
// retried, as the API asks, and counted; the round trip's latency
// includes the retries. p50/p99 are logged.
func clLoad(t *testing.T, c *clCluster) {
	c.use(t)
	const key = "agent:load:main"
	const callers = 100
	dur := clLoadDuration(t)
	type callerResult struct {
		lat     []time.Duration
		retries int
		failed  int
		errs    []string
	}
	results := make([]callerResult, callers)
	deadline := time.Now().Add(dur)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			res := &results[i]
			for n := 0; time.Now().Before(deadline); n++ {
				node := clNodeNames[(i+n)%2]
				want := fmt.Sprintf("load-%d-%d-%s", i, n, node)
				t0 := time.Now()
				r, retries := c.callRetry(key, "exec", map[string]any{"command": "echo " + want, "host": "node", "node": node})
				res.lat = append(res.lat, time.Since(t0))
				res.retries += retries
				if r.Status != 200 || r.Result == nil || r.Result.Status() != protocol.StatusCompleted || strings.TrimSpace(r.Result.Text()) != want {
					res.failed++
					if len(res.errs) < 3 {
						res.errs = append(res.errs, fmt.Sprintf("want %q: %d %.400s", want, r.Status, r.Raw))
					}
				}
			}
		})
	}
	wg.Wait()
	var all []time.Duration
	var errs []string
	failed, retries := 0, 0
	for _, r := range results {
		all = append(all, r.lat...)
		failed += r.failed
		retries += r.retries
		errs = append(errs, r.errs...)
	}
	slices.Sort(all)
	if len(all) == 0 {
		t.Fatal("no calls made")
	}
	pct := func(p float64) time.Duration { return all[min(len(all)-1, int(p*float64(len(all))))] }
	t.Logf("load: %d callers for %s (EXECMESH_CLUSTER_LOAD_SECONDS, default 60), %d exec round trips on 2 nodes, %.1f/s, p50 %s, p99 %s, max %s, %d retried retryable errors",
		callers, dur, len(all), float64(len(all))/dur.Seconds(), pct(0.50).Round(time.Millisecond), pct(0.99).Round(time.Millisecond), all[len(all)-1].Round(time.Millisecond), retries)
	if failed > 0 {
		t.Fatalf("%d of %d round trips did not return their own output; first: %q", failed, len(all), errs[:min(len(errs), 5)])
	}
	// A starved node used to answer "(no output)" here: the output an
	// exited echo had written was cut at the drain wait (fixed in the
	// session core: see session/wait.go drainOutput).
}

// clManySessions: 1000 background sessions spread over the two nodes
// are all listed and polled as running, then killed: none is left
// running, no process is left on the machines, and killed sessions send no
// exit notification (DESIGN §7).
func clManySessions(t *testing.T, c *clCluster) {
	c.use(t)
	const key = "agent:many:main"
	const total = 1000
	defer func() {
		if t.Failed() { // do not leave 1000 sleeps to the next subtests
			for _, name := range clNodeNames {
				c.killOrphans(c.node(name).host, "sleep 600")
			}
		}
	}()
	ids := make([]string, total)
	var retries atomic.Int64
	t0 := time.Now()
	c.parallel(t, 16, total, func(i int) error {
		r, n := c.callRetry(key, "exec", map[string]any{"command": "sleep 600", "host": "node", "node": clNodeNames[i%2], "background": true})
		retries.Add(int64(n))
		if r.Status != 200 || r.Result == nil || r.Result.Status() != protocol.StatusRunning {
			return fmt.Errorf("start %d: %d %.300s", i, r.Status, r.Raw)
		}
		ids[i] = r.Result.SessionID()
		return nil
	})
	t.Logf("%d background sessions started in %s", total, time.Since(t0).Round(time.Millisecond))
	t0 = time.Now()
	list := c.listSessions(key)
	t.Logf("list of %d sessions took %s", len(list), time.Since(t0).Round(time.Millisecond))
	for _, id := range ids {
		if d, ok := list[id]; !ok || d.Status.Value() != protocol.StatusRunning {
			t.Fatalf("session %s: listed %v as %v", id, ok, d)
		}
	}
	t0 = time.Now()
	c.parallel(t, 32, total, func(i int) error {
		r, n := c.callRetry(key, "process", map[string]any{"action": "poll", "sessionId": ids[i]})
		retries.Add(int64(n))
		if r.Status != 200 || r.Result == nil || r.Result.Status() != protocol.StatusRunning {
			return fmt.Errorf("poll %s: %d %.300s", ids[i], r.Status, r.Raw)
		}
		return nil
	})
	t.Logf("%d polls took %s", total, time.Since(t0).Round(time.Millisecond))
	t0 = time.Now()
	c.parallel(t, 16, total, func(i int) error {
		r, n := c.callRetry(key, "process", map[string]any{"action": "kill", "sessionId": ids[i]})
		retries.Add(int64(n))
		if r.Status != 200 || r.Result == nil || r.Result.Status() == protocol.StatusFailed {
			return fmt.Errorf("kill %s: %d %.300s", ids[i], r.Status, r.Raw)
		}
		return nil
	})
	t.Logf("%d kills took %s (%d retryable errors retried overall)", total, time.Since(t0).Round(time.Millisecond), retries.Load())
	t0 = time.Now()
	var procsGone time.Duration
	stillRunning := func() error {
		if procsGone == 0 && c.countProcs(c.node("node-a").host, "sleep 600")+c.countProcs(c.node("node-b").host, "sleep 600") == 0 {
			procsGone = time.Since(t0)
		}
		running := 0
		l := c.listSessions(key)
		for _, id := range ids {
			if d, ok := l[id]; ok && d.Status.Value() == protocol.StatusRunning {
				running++
			}
		}
		if running > 0 {
			return fmt.Errorf("%d sessions still running", running)
		}
		return nil
	}
	// A kill is SIGTERM to a sleep: a minute is ample for 1000, even on
	// a busy machine.
	clCheckFor(t, "no session left running after the kills", time.Minute, 500*time.Millisecond, stillRunning)
	ended := time.Since(t0)
	t.Logf("after the kills: every session ended %s later (their processes were gone after %s)", ended.Round(time.Millisecond), procsGone.Round(time.Millisecond))
	for _, name := range clNodeNames {
		clCheckFor(t, "no sleep 600 left on "+name, 30*time.Second, 200*time.Millisecond, func() error {
			if n := c.countProcs(c.node(name).host, "sleep 600"); n > 0 {
				return fmt.Errorf("%d processes", n)
			}
			return nil
		})
	}
	for _, ev := range c.events(key, 500*time.Millisecond) {
		if ev.Kind == protocol.EventExecExit {
			t.Fatalf("a killed session sent an exit notification: %+v", ev)
		}
	}
}

// clNodeStopBound: SIGTERM to a node agent holding 200 running sessions
// (what systemctl stop sends) ends it within its own 30 s bound
// (nodeCloseTimeout, below the unit's TimeoutStopSec) with every session's
// process gone. The restarted agent reports them lost, not running.
func clNodeStopBound(t *testing.T, c *clCluster) {
	c.use(t)
	const key = "agent:nodestop:main"
	const total = 200
	b := c.node("node-b")
	ids := make([]string, total)
	c.parallel(t, 16, total, func(i int) error {
		r, _ := c.callRetry(key, "exec", map[string]any{"command": "sleep 601", "host": "node", "node": b.name, "background": true})
		if r.Status != 200 || r.Result == nil || r.Result.Status() != protocol.StatusRunning {
			return fmt.Errorf("start %d: %d %.300s", i, r.Status, r.Raw)
		}
		ids[i] = r.Result.SessionID()
		return nil
	})
	t0 := time.Now()
	err := b.proc.stop() // SIGKILL after 40 s, as systemd after TimeoutStopSec
	took := time.Since(t0)
	t.Logf("node agent with %d sessions stopped by SIGTERM in %s (exit: %v)", total, took.Round(time.Millisecond), err)
	left := c.countProcs(b.host, "sleep 601")
	if err != nil || took > 30*time.Second {
		c.killOrphans(b.host, "sleep 601") // what KillMode=control-group does after TimeoutStopSec
		b.proc.start(t)
		t.Fatalf("the node agent did not end its %d sessions within its own 30 s bound (%v after %s, %d session processes left); "+
			"the unit's TimeoutStopSec (45 s) assumes it does", total, err, took.Round(time.Second), left)
	}
	if left > 0 {
		t.Fatalf("%d session processes outlived the node agent's clean shutdown", left)
	}
	b.proc.start(t)
	c.waitNode(b.ident.NodeID, "connected", "paired", 30*time.Second)
	clCheckFor(t, "sessions of the stopped node reported lost or ended", 30*time.Second, 500*time.Millisecond, func() error {
		l := c.listSessions(key)
		for _, id := range ids {
			if d, ok := l[id]; ok && d.Status.Value() == protocol.StatusRunning {
				return fmt.Errorf("session %s still listed running: %v", id, d)
			}
		}
		return nil
	})
}
