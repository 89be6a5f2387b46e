package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
	"github.com/execmesh/execmesh/nodeagent"
	"github.com/execmesh/execmesh/protocol"
)

func TestNodeExecForegroundBackgroundAndProcess(t *testing.T) {
	env := startNodeGateway(t, nil, "", nil)
	a := env.pairAgent(testAgentConfig(t, env.srv, "alpha"))

	res := env.invoke("exec", map[string]any{"command": "echo hello-from-node; pwd", "host": "node"}, "")
	if res.Status() != protocol.StatusCompleted || !strings.Contains(res.Text(), "hello-from-node") {
		t.Fatalf("foreground: %s %v", res.Text(), res.Details)
	}

	res = env.invoke("exec", map[string]any{"command": "echo started; sleep 30", "host": "node", "background": true}, "")
	if res.Status() != protocol.StatusRunning {
		t.Fatalf("background: %s %v", res.Text(), res.Details)
	}
	id := res.SessionID()
	if !strings.Contains(res.Text(), "Command still running (session "+id) {
		t.Fatalf("running text: %s", res.Text())
	}

	poll := env.invoke("process", map[string]any{"action": "poll", "sessionId": id, "timeout": 2000}, "")
	if !strings.Contains(poll.Text(), "started") {
		t.Fatalf("poll: %s", poll.Text())
	}
	list := env.invoke("process", map[string]any{"action": "list"}, "")
	if !strings.Contains(list.Text(), id) {
		t.Fatalf("list: %s", list.Text())
	}
	// Another sessionKey sees nothing of it.
	other := env.invoke("process", map[string]any{"action": "poll", "sessionId": id}, "agent:main:other")
	if other.Status() != protocol.StatusFailed {
		t.Fatalf("other scope poll: %s", other.Text())
	}
	log := env.invoke("process", map[string]any{"action": "log", "sessionId": id}, "")
	if !strings.Contains(log.Text(), "started") {
		t.Fatalf("log: %s", log.Text())
	}
	kill := env.invoke("process", map[string]any{"action": "kill", "sessionId": id}, "")
	if kill.Status() == protocol.StatusFailed {
		t.Fatalf("kill: %s", kill.Text())
	}
	checkFor(t, 30*time.Second, func() error {
		p := env.invoke("process", map[string]any{"action": "poll", "sessionId": id}, "")
		if p.Status() == protocol.StatusRunning {
			return fmt.Errorf("still running: %s", p.Text())
		}
		return nil
	})
	rm := env.invoke("process", map[string]any{"action": "remove", "sessionId": id}, "")
	if rm.Status() == protocol.StatusFailed {
		t.Fatalf("remove: %s", rm.Text())
	}
	gone := env.invoke("process", map[string]any{"action": "poll", "sessionId": id}, "")
	if gone.Status() != protocol.StatusFailed {
		t.Fatalf("poll after remove: %s", gone.Text())
	}
	// The node view counts sessions and names its server.
	v := env.waitNode(a.ID(), "connected", protocol.NodePairingPaired)
	if v.Name != "alpha" || v.Server == "" || v.Platform == "" || v.LastSeen == 0 {
		t.Fatalf("node view: %+v", v)
	}
}

func TestNodeWorkdirAndEnvPolicy(t *testing.T) {
	env := startNodeGateway(t, nil, "", nil)
	env.pairAgent(testAgentConfig(t, env.srv, "alpha"))

	res := env.invoke("exec", map[string]any{"command": "pwd", "host": "node", "workdir": "/definitely/not/here"}, "")
	if res.Status() != protocol.StatusFailed || !strings.Contains(res.Text(), `workdir "/definitely/not/here" is unavailable or not a directory`) {
		t.Fatalf("bad workdir: %s %v", res.Text(), res.Details)
	}
	res = env.invoke("exec", map[string]any{"command": "pwd", "host": "node", "workdir": "/tmp"}, "")
	if !strings.Contains(res.Text(), "/tmp") {
		t.Fatalf("workdir: %s", res.Text())
	}
	// The gateway refuses a PATH for host=node, as for host=gateway.
	st, e := env.invokeErr("exec", map[string]any{"command": "true", "host": "node", "env": map[string]string{"PATH": "/x:/usr/bin"}}, "")
	if st != http.StatusBadRequest || !strings.Contains(e.Message, "Custom 'PATH' variable is forbidden") {
		t.Fatalf("PATH: %d %v", st, e)
	}
	res = env.invoke("exec", map[string]any{"command": "echo $GREETING", "host": "node", "env": map[string]string{"GREETING": "hi-there"}}, "")
	if !strings.Contains(res.Text(), "hi-there") {
		t.Fatalf("env: %s", res.Text())
	}
}

func TestNodeSelection(t *testing.T) {
	env := startNodeGateway(t, nil, "", nil)

	// No node at all.
	st, e := env.invokeErr("exec", map[string]any{"command": "true", "host": "node"}, "")
	if st != 400 || e.Message != "exec host=node requires a paired node (none available). This requires a companion app or node host." {
		t.Fatalf("none: %d %v", st, e)
	}

	a := env.pairAgent(testAgentConfig(t, env.srv, "alpha"))
	res := env.invoke("exec", map[string]any{"command": "echo only", "host": "node"}, "")
	if !strings.Contains(res.Text(), "only") {
		t.Fatalf("only node: %s", res.Text())
	}
	b := env.pairAgent(testAgentConfig(t, env.srv, "beta"))

	st, e = env.invokeErr("exec", map[string]any{"command": "true", "host": "node"}, "")
	if st != 400 || e.Message != "exec host=node requires a node id when multiple nodes are available (set tools.exec.node or exec.node)." {
		t.Fatalf("multiple: %d %v", st, e)
	}
	for _, target := range []string{a.ID(), "alpha", "ALPHA"} {
		res := env.invoke("exec", map[string]any{"command": "echo on-$0", "host": "node", "node": target}, "")
		if res.Status() != protocol.StatusCompleted {
			t.Fatalf("node=%s: %s", target, res.Text())
		}
	}
	// Routed to the node asked for: each node answers with its own state dir in HOME.
	for _, ag := range []*nodeagent.Agent{a, b} {
		res := env.invoke("exec", map[string]any{"command": "echo $HOME", "host": "node", "node": ag.Name()}, "")
		if !strings.Contains(res.Text(), "/") {
			t.Fatalf("node %s: %s", ag.Name(), res.Text())
		}
	}
	st, e = env.invokeErr("exec", map[string]any{"command": "true", "host": "node", "node": "gamma"}, "")
	if st != 400 || !strings.Contains(e.Message, `exec node "gamma" is unknown`) {
		t.Fatalf("unknown: %d %v", st, e)
	}

	// Bound by tools.exec.node: a different request is refused.
	env.g.cfgMu.Lock()
	env.g.cfg.Tools.Exec.Node = "alpha"
	env.g.cfgMu.Unlock()
	st, e = env.invokeErr("exec", map[string]any{"command": "true", "host": "node", "node": "beta"}, "")
	if st != 400 || e.Message != "exec node not allowed (bound to alpha)" {
		t.Fatalf("bound: %d %v", st, e)
	}
	// The same node by id is the bound node.
	res = env.invoke("exec", map[string]any{"command": "echo bound", "host": "node", "node": a.ID()}, "")
	if !strings.Contains(res.Text(), "bound") {
		t.Fatalf("bound by id: %s", res.Text())
	}
	res = env.invoke("exec", map[string]any{"command": "echo default-bound", "host": "node"}, "")
	if !strings.Contains(res.Text(), "default-bound") {
		t.Fatalf("bound default: %s", res.Text())
	}
}

func TestNodePairingGate(t *testing.T) {
	env := startNodeGateway(t, nil, "", nil)
	a := startAgent(t, testAgentConfig(t, env.srv, "pending-one"))
	v := env.waitNode(a.ID(), "connected", protocol.NodePairingPending)
	if v.Paired {
		t.Fatalf("new node paired: %+v", v)
	}
	checkFor(t, 30*time.Second, func() error {
		if a.Pairing() != nodeagent.PairingPending {
			return fmt.Errorf("agent pairing %q", a.Pairing())
		}
		return nil
	})
	// An unpaired node gets no work, even when named.
	st, e := env.invokeErr("exec", map[string]any{"command": "true", "host": "node"}, "")
	if st != 400 || !strings.Contains(e.Message, "none available") {
		t.Fatalf("unpaired, default: %d %v", st, e)
	}
	st, e = env.invokeErr("exec", map[string]any{"command": "true", "host": "node", "node": "pending-one"}, "")
	if st != 400 || !strings.Contains(e.Message, "is not paired yet") {
		t.Fatalf("unpaired, named: %d %v", st, e)
	}
	// The node itself refuses work while pending, whoever sends it.
	ten := 10.0
	body, _ := json.Marshal(protocol.ExecRequest{SessionKey: "agent:main:main", Target: protocol.TargetNode, Args: protocol.ExecArgs{Command: "echo sneaky", Timeout: &ten}, Security: "full", Ask: "off"})
	m, err := bus.RequestChunked(t.Context(), env.nc, protocol.Subjects("execmesh").Node(a.ID(), "exec"), body, nil)
	if err != nil {
		t.Fatal(err)
	}
	if bus.ReplyError(m) == nil || !strings.Contains(bus.ReplyError(m).Error(), "not paired") {
		t.Fatalf("node gate: %v %s", bus.ReplyError(m), m.Data)
	}
	if r := env.do("POST", "/v1/nodes/nope/approve", nil, nil); r.Status != 404 {
		t.Fatalf("approve unknown: %d", r.Status)
	}
	if r := env.do("POST", "/v1/nodes/"+a.ID()+"/approve", nil, nil); r.Status != 200 {
		t.Fatalf("approve: %d %s", r.Status, r.Raw)
	}
	res := env.invoke("exec", map[string]any{"command": "echo now-paired", "host": "node"}, "")
	if !strings.Contains(res.Text(), "now-paired") {
		t.Fatalf("after approve: %s", res.Text())
	}
	if n, ok := env.g.NodeRegistry().Get(a.ID()); !ok || n.Pairing != protocol.NodePairingPaired || n.PublicKey != a.PublicKey() {
		t.Fatalf("registry: %+v", n)
	}
	if r := env.do("POST", "/v1/nodes/"+a.ID()+"/reject", nil, nil); r.Status != 200 {
		t.Fatalf("reject: %d %s", r.Status, r.Raw)
	}
	st, e = env.invokeErr("exec", map[string]any{"command": "true", "host": "node"}, "")
	if st != 400 || !strings.Contains(e.Message, "none available") {
		t.Fatalf("rejected: %d %v", st, e)
	}
	checkFor(t, 30*time.Second, func() error {
		if a.Pairing() != nodeagent.PairingRejected {
			return fmt.Errorf("agent pairing %q", a.Pairing())
		}
		return nil
	})
	// Told so, the rejected node stops (its Run returns ErrRejected).
	select {
	case <-a.Rejected():
	case <-time.After(10 * time.Second):
		t.Fatal("a rejected node keeps running")
	}
}

func TestNodeApproveBeforeSeenAndPersisted(t *testing.T) {
	srv := bustest.StartServer(t)
	stateDir := t.TempDir()
	cfg := testAgentConfig(t, srv, "local")
	id, err := bus.LoadOrCreateNodeIdentity(cfg.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	env := startNodeGateway(t, srv, stateDir, nil)
	// `execmesh up` approves its own node before it ever beats.
	if err := env.g.ApproveNode(id.NodeID); err != nil {
		t.Fatal(err)
	}
	a := startAgent(t, cfg)
	env.waitNode(a.ID(), "connected", protocol.NodePairingPaired)
	res := env.invoke("exec", map[string]any{"command": "echo auto-approved", "host": "node"}, "")
	if !strings.Contains(res.Text(), "auto-approved") {
		t.Fatalf("exec: %s", res.Text())
	}
	env.close()
	// A restarted gateway keeps the decision.
	env2 := startNodeGateway(t, srv, stateDir, nil)
	env2.waitNode(a.ID(), "connected", protocol.NodePairingPaired)
	if err := env2.g.ApproveNode("bad id!"); err == nil {
		t.Fatal("ApproveNode accepted an invalid id")
	}
}

func TestNodeIdempotentStart(t *testing.T) {
	env := startNodeGateway(t, nil, "", nil)
	a := env.pairAgent(testAgentConfig(t, env.srv, "alpha"))
	thirty := 30.0
	req := protocol.ExecRequest{SessionKey: "agent:main:main", Target: protocol.TargetNode,
		Args: protocol.ExecArgs{Command: "echo once >> runs.txt; sleep 5", Background: true, Timeout: &thirty}, Security: "full", Ask: "off"}
	body, _ := json.Marshal(req)
	hdr := nats.Header{}
	hdr.Set(protocol.NodeHeaderIdempotencyKey, "1d0a3a84-7b0b-4e37-9a5c-5a1ad6bfc6a3")
	subject := protocol.Subjects("execmesh").Node(a.ID(), "exec")
	var ids []string
	for range 3 {
		m, err := bus.RequestChunked(t.Context(), env.nc, subject, body, hdr)
		if err != nil {
			t.Fatal(err)
		}
		if e := bus.ReplyError(m); e != nil {
			t.Fatal(e)
		}
		var reply protocol.ExecReply
		if err := json.Unmarshal(m.Data, &reply); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, reply.Result.SessionID())
	}
	if ids[0] == "" || ids[0] != ids[1] || ids[1] != ids[2] {
		t.Fatalf("retries started new sessions: %v", ids)
	}
	// A key reused by another sessionKey is refused.
	req.SessionKey = "agent:main:other"
	body2, _ := json.Marshal(req)
	m, err := bus.RequestChunked(t.Context(), env.nc, subject, body2, hdr)
	if err != nil {
		t.Fatal(err)
	}
	if e := bus.ReplyError(m); e == nil || !strings.Contains(e.Error(), "another sessionKey") {
		t.Fatalf("reused key: %v", e)
	}
}

func TestNodeExitEventOnce(t *testing.T) {
	env := startNodeGateway(t, nil, "", nil)
	a := env.pairAgent(testAgentConfig(t, env.srv, "alpha"))
	res := env.invoke("exec", map[string]any{"command": "sleep 0.3; echo finished-output; exit 3", "host": "node", "background": true}, "")
	id := res.SessionID()
	var evs []protocol.SystemEvent
	checkFor(t, 30*time.Second, func() error {
		evs = append(evs, env.events(DefaultSessionKey, 200*time.Millisecond)...)
		if len(evs) == 0 {
			return fmt.Errorf("no event yet")
		}
		return nil
	})
	want := "Exec completed (" + id + ", code 3) :: finished-output"
	if len(evs) != 1 || evs[0].Text != want || evs[0].Kind != protocol.EventExecExit || evs[0].ContextKey != "exec:"+id {
		t.Fatalf("events: %+v, want one %q", evs, want)
	}
	// A copy published again, even under another message id (so the
	// stream stores it twice), is not queued again.
	js := bustest.JetStream(t, env.nc)
	stream, err := js.Stream(t.Context(), bus.StreamNamesFor("execmesh").Exit)
	if err != nil {
		t.Fatal(err)
	}
	last, err := stream.GetLastMsgForSubject(t.Context(), "execmesh.events.exit."+a.ID())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(t.Context(), last.Subject, last.Data, jetstream.WithMsgID("another-id")); err != nil {
		t.Fatal(err)
	}
	if more := env.events(DefaultSessionKey, 700*time.Millisecond); len(more) != 0 {
		t.Fatalf("extra events: %+v", more)
	}
}

func TestNodeTerminalPollAcknowledgesExit(t *testing.T) {
	env := startNodeGateway(t, nil, "", nil)
	env.pairAgent(testAgentConfig(t, env.srv, "alpha"))
	res := env.invoke("exec", map[string]any{"command": "echo polled; exit 1", "host": "node", "background": true}, "")
	id := res.SessionID()
	checkFor(t, 30*time.Second, func() error {
		p := env.invoke("process", map[string]any{"action": "poll", "sessionId": id}, "")
		if p.Status() == protocol.StatusRunning {
			return fmt.Errorf("running")
		}
		return nil
	})
	if evs := env.events(DefaultSessionKey, time.Second); len(evs) != 0 {
		t.Fatalf("exit event after a terminal poll: %+v", evs)
	}
}

func TestNodeUnreachableFailsFast(t *testing.T) {
	env := startNodeGateway(t, nil, "", nil)
	cfg := testAgentConfig(t, env.srv, "alpha")
	a, err := nodeagent.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	env.waitNode(a.ID(), "connected", "")
	if r := env.do("POST", "/v1/nodes/"+a.ID()+"/approve", nil, nil); r.Status != 200 {
		t.Fatal(r.Status)
	}
	res := env.invoke("exec", map[string]any{"command": "sleep 30", "host": "node", "background": true}, "")
	id := res.SessionID()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	r := env.invokeRaw("process", map[string]any{"action": "poll", "sessionId": id}, "")
	if r.Status != http.StatusServiceUnavailable || r.Error == nil || !r.Error.Retryable || r.Error.Type != protocol.ErrUnavailable || !strings.Contains(r.Error.Message, "unreachable") {
		t.Fatalf("poll of an unreachable node: %d %s", r.Status, r.Raw)
	}
	// Far below the 15 s a dispatched request would wait (the bound is
	// loose for loaded test machines).
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %s, want fail-fast", d)
	}
	env.waitNode(a.ID(), "unreachable", protocol.NodePairingPaired)
	r = env.invokeRaw("exec", map[string]any{"command": "true", "host": "node"}, "")
	if r.Status != http.StatusServiceUnavailable || r.Error == nil || !r.Error.Retryable {
		t.Fatalf("exec on the only, unreachable node: %d %s", r.Status, r.Raw)
	}
}

func TestNodeRestartLosesSessions(t *testing.T) {
	env := startNodeGateway(t, nil, "", nil)
	cfg := testAgentConfig(t, env.srv, "alpha")
	a1, err := nodeagent.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := a1.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	env.waitNode(a1.ID(), "connected", "")
	env.do("POST", "/v1/nodes/"+a1.ID()+"/approve", nil, nil)
	res := env.invoke("exec", map[string]any{"command": "sleep 30", "host": "node", "background": true}, "")
	id := res.SessionID()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := a1.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// Same identity (state dir), new run.
	a2 := startAgent(t, cfg)
	checkFor(t, 30*time.Second, func() error {
		n, ok := env.g.NodeRegistry().Get(a2.ID())
		if !ok || !n.Live || n.Instance != a2.Instance() {
			return fmt.Errorf("new run not seen yet")
		}
		return nil
	})
	checkFor(t, 30*time.Second, func() error {
		p := env.invoke("process", map[string]any{"action": "poll", "sessionId": id}, "")
		if p.Details.Lost.Value() != true || !strings.Contains(p.Text(), "was lost: node alpha ("+a2.ID()+") restarted") {
			return fmt.Errorf("poll: %s %v", p.Text(), p.Details)
		}
		return nil
	})
	list := env.invoke("process", map[string]any{"action": "list"}, "")
	if !strings.Contains(list.Text(), id) || !strings.Contains(list.Text(), "lost") {
		t.Fatalf("list: %s", list.Text())
	}
	rm := env.invoke("process", map[string]any{"action": "remove", "sessionId": id}, "")
	if !strings.Contains(rm.Text(), "Removed session "+id) {
		t.Fatalf("remove: %s", rm.Text())
	}
	list = env.invoke("process", map[string]any{"action": "list"}, "")
	if strings.Contains(list.Text(), id) {
		t.Fatalf("list after remove: %s", list.Text())
	}
}

func TestNodeGatewayRestartResync(t *testing.T) {
	srv := bustest.StartServer(t)
	stateDir := t.TempDir()
	env := startNodeGateway(t, srv, stateDir, nil)
	env.pairAgent(testAgentConfig(t, srv, "alpha"))
	res := env.invoke("exec", map[string]any{"command": "sleep 1.5; echo survived-restart", "host": "node", "background": true}, "")
	id := res.SessionID()
	env.close()

	env2 := startNodeGateway(t, srv, stateDir, nil)
	list := env2.invoke("process", map[string]any{"action": "list"}, "")
	if !strings.Contains(list.Text(), id) {
		t.Fatalf("list after gateway restart: %s", list.Text())
	}
	var evs []protocol.SystemEvent
	checkFor(t, 30*time.Second, func() error {
		evs = append(evs, env2.events(DefaultSessionKey, 200*time.Millisecond)...)
		if len(evs) == 0 {
			return fmt.Errorf("no exit event")
		}
		return nil
	})
	if more := env2.events(DefaultSessionKey, 500*time.Millisecond); len(more) != 0 || len(evs) != 1 || !strings.Contains(evs[0].Text, "survived-restart") {
		t.Fatalf("events: %+v + %+v", evs, more)
	}
	p := env2.invoke("process", map[string]any{"action": "poll", "sessionId": id}, "")
	if p.Status() != protocol.StatusCompleted {
		t.Fatalf("poll after restart: %s", p.Text())
	}
}
