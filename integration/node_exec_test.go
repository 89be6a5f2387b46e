package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/config"

	"github.com/nats-io/nats.go/micro"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/protocol"
)

// TestNodeExecAndEveryProcessAction runs commands on a node agent process
// through the gateway: foreground, yielded, failed, timed out, and a PTY
// program driven with send-keys, paste and submit, then every other
// process action.
func TestNodeExecAndEveryProcessAction(t *testing.T) {
	ns := startNodeServer(t, bus.ServerConfig{})
	gw := startItGateway(t, ns, "", bus.ClientConfig{})
	np := startPairedNode(t, ns, gw, "alpha")

	res := gw.invoke("exec", map[string]any{"command": "echo fg-$((1+1)); echo $HOME", "host": "node"})
	if res.Status() != protocol.StatusCompleted || !hasAll(res.Text(), "fg-2", np.stateDir) {
		t.Fatalf("foreground: %s %v", res.Text(), res.Details)
	}
	res = gw.invoke("exec", map[string]any{"command": "exit 7", "host": "node"})
	if res.Status() != protocol.StatusCompleted || !strings.Contains(res.Text(), "(Command exited with code 7)") {
		t.Fatalf("exit 7: %s %v", res.Text(), res.Details)
	}
	res = gw.invoke("exec", map[string]any{"command": "sleep 10", "host": "node", "timeout": 1})
	if res.Status() != protocol.StatusFailed || !strings.Contains(res.Text(), "timed out after 1 second") {
		t.Fatalf("timeout: %s %v", res.Text(), res.Details)
	}
	res = gw.invoke("exec", map[string]any{"command": "sleep 0.5; echo yielded-done", "host": "node", "yieldMs": 50})
	if res.Status() != protocol.StatusRunning {
		t.Fatalf("yield: %s", res.Text())
	}
	if done, seen := gw.pollUntilDone(res.SessionID(), 60*time.Second); done.Status() != protocol.StatusCompleted || !strings.Contains(seen, "yielded-done") {
		t.Fatalf("yielded poll: %s", seen)
	}

	// A PTY program answered with send-keys, paste and submit.
	res = gw.invoke("exec", map[string]any{"host": "node", "pty": true, "background": true,
		"command": `printf 'name? '; read n; echo "hi $n"; printf 'again? '; read m; echo "bye $m"; sleep 30`})
	np.track(res)
	pty := res.SessionID()
	waitFor(t, 60*time.Second, func() error {
		p := gw.invoke("process", map[string]any{"action": "log", "sessionId": pty})
		if !strings.Contains(p.Text(), "name?") {
			return fmt.Errorf("log %q", p.Text())
		}
		return nil
	})
	if r := gw.invoke("process", map[string]any{"action": "send-keys", "sessionId": pty, "literal": "alice", "keys": []string{"Enter"}}); r.Status() == protocol.StatusFailed {
		t.Fatalf("send-keys: %s", r.Text())
	}
	waitFor(t, 60*time.Second, func() error {
		if p := gw.invoke("process", map[string]any{"action": "log", "sessionId": pty}); !hasAll(p.Text(), "hi alice", "again?") {
			return fmt.Errorf("log %q", p.Text())
		}
		return nil
	})
	if r := gw.invoke("process", map[string]any{"action": "paste", "sessionId": pty, "text": "bob", "bracketed": false}); !strings.Contains(r.Text(), "Pasted 3 chars") {
		t.Fatalf("paste: %s", r.Text())
	}
	if r := gw.invoke("process", map[string]any{"action": "submit", "sessionId": pty}); !strings.Contains(r.Text(), "Submitted session "+pty) {
		t.Fatalf("submit: %s", r.Text())
	}
	waitFor(t, 60*time.Second, func() error {
		if p := gw.invoke("process", map[string]any{"action": "log", "sessionId": pty}); !strings.Contains(p.Text(), "bye bob") {
			return fmt.Errorf("log %q", p.Text())
		}
		return nil
	})
	if r := gw.invoke("process", map[string]any{"action": "log", "sessionId": pty, "offset": 0, "limit": 1}); r.Status() == protocol.StatusFailed {
		t.Fatalf("log window: %s", r.Text())
	}
	if l := gw.invoke("process", map[string]any{"action": "list"}); !strings.Contains(l.Text(), pty) {
		t.Fatalf("list: %s", l.Text())
	}
	if r := gw.invoke("process", map[string]any{"action": "kill", "sessionId": pty}); r.Status() == protocol.StatusFailed {
		t.Fatalf("kill: %s", r.Text())
	}
	if p, _ := gw.pollUntilDone(pty, 60*time.Second); !strings.Contains(p.Text(), "Process stopped by request") {
		t.Fatalf("poll after kill: %s", p.Text())
	}

	// write + eof (stdin is only writable in a PTY: pipe sessions get
	// stdin at EOF), then clear the finished session.
	res = gw.invoke("exec", map[string]any{"command": "cat", "host": "node", "background": true, "pty": true})
	np.track(res)
	cat := res.SessionID()
	if r := gw.invoke("process", map[string]any{"action": "write", "sessionId": cat, "data": "line-one\n", "eof": true}); !strings.Contains(r.Text(), "Wrote 9 bytes") {
		t.Fatalf("write: %s", r.Text())
	}
	if p, seen := gw.pollUntilDone(cat, 60*time.Second); p.Status() != protocol.StatusCompleted || !strings.Contains(seen, "line-one") {
		t.Fatalf("cat poll: %s", seen)
	}
	if r := gw.invoke("process", map[string]any{"action": "clear", "sessionId": cat}); !strings.Contains(r.Text(), "Cleared session "+cat) {
		t.Fatalf("clear: %s", r.Text())
	}
	if r := gw.invoke("process", map[string]any{"action": "poll", "sessionId": cat}); r.Status() != protocol.StatusFailed {
		t.Fatalf("poll after clear: %s", r.Text())
	}

	// remove a running session: gone from list, its process ended.
	res = gw.invoke("exec", map[string]any{"command": "sleep 30", "host": "node", "background": true})
	np.track(res)
	sl := res.SessionID()
	if r := gw.invoke("process", map[string]any{"action": "remove", "sessionId": sl}); !strings.Contains(r.Text(), "Removed session "+sl) {
		t.Fatalf("remove: %s", r.Text())
	}
	if l := gw.invoke("process", map[string]any{"action": "list"}); strings.Contains(l.Text(), sl) {
		t.Fatalf("list after remove: %s", l.Text())
	}

	// Unknown session, and another sessionKey's view.
	if r := gw.invoke("process", map[string]any{"action": "poll", "sessionId": "no-such-session"}); r.Status() != protocol.StatusFailed || !strings.Contains(r.Text(), "no-such-session") {
		t.Fatalf("unknown session: %s", r.Text())
	}
	if r := gw.invokeAs("agent:other:main", "process", map[string]any{"action": "log", "sessionId": pty}); r.Result == nil || r.Result.Status() != protocol.StatusFailed {
		t.Fatalf("other scope: %s", r.Raw)
	}
}

// TestNodeRoutingAndPairingGate runs two node agent processes: an unpaired
// node receives nothing; then routing by id and by name, and the three
// selection errors of spec §19.1.
func TestNodeRoutingAndPairingGate(t *testing.T) {
	ns := startNodeServer(t, bus.ServerConfig{})
	gw := startItGateway(t, ns, "", bus.ClientConfig{}, func(c *config.Config) {
		c.Agents.List = []config.Agent{{ID: "bound", Tools: config.AgentTools{Exec: config.AgentExec{Node: "beta"}}}}
	})
	st, e := gw.invokeErr("exec", map[string]any{"command": "true", "host": "node"})
	if st != 400 || e.Message != "exec host=node requires a paired node (none available). This requires a companion app or node host." {
		t.Fatalf("no node: %d %v", st, e)
	}
	a := newNodeProc(t, "alpha", "--nats-url", ns.url())
	b := newNodeProc(t, "beta", "--nats-url", ns.url())
	a.start()
	b.start()
	gw.waitNode(a.id, "connected", "pending")
	gw.waitNode(b.id, "connected", "pending")

	// Pending nodes get no work: the gateway refuses, and the nodes' exec
	// endpoints never see a request.
	st, e = gw.invokeErr("exec", map[string]any{"command": "touch should-not-run", "host": "node"})
	if st != 400 || !strings.Contains(e.Message, "none available") {
		t.Fatalf("pending, default: %d %v", st, e)
	}
	st, e = gw.invokeErr("exec", map[string]any{"command": "touch should-not-run", "host": "node", "node": "alpha"})
	if st != 400 || !strings.Contains(e.Message, "not paired") {
		t.Fatalf("pending, named: %d %v", st, e)
	}
	for _, np := range []*nodeProc{a, b} {
		if n := execRequests(t, gw, np.id); n != 0 {
			t.Fatalf("unpaired node %s received %d exec requests", np.name, n)
		}
	}

	gw.approve(a.id)
	res := gw.invoke("exec", map[string]any{"command": "echo $HOME", "host": "node"})
	if !strings.Contains(res.Text(), a.stateDir) {
		t.Fatalf("only node: %s", res.Text())
	}
	gw.approve(b.id)
	st, e = gw.invokeErr("exec", map[string]any{"command": "true", "host": "node"})
	if st != 400 || e.Message != "exec host=node requires a node id when multiple nodes are available (set tools.exec.node or exec.node)." {
		t.Fatalf("multiple: %d %v", st, e)
	}
	for target, np := range map[string]*nodeProc{a.id: a, "alpha": a, b.id: b, "beta": b} {
		res := gw.invoke("exec", map[string]any{"command": "echo $HOME", "host": "node", "node": target})
		if !strings.Contains(res.Text(), np.stateDir) {
			t.Fatalf("node=%s ran on the wrong node: %s", target, res.Text())
		}
	}
	st, e = gw.invokeErr("exec", map[string]any{"command": "true", "host": "node", "node": "gamma"})
	if st != 400 || !strings.Contains(e.Message, `"gamma" is unknown`) {
		t.Fatalf("unknown node: %d %v", st, e)
	}
	// Agent "bound" is bound to beta: a different node is refused, no
	// node means beta.
	r := gw.invokeAs("agent:bound:main", "exec", map[string]any{"command": "true", "host": "node", "node": "alpha"})
	if r.Status != 400 || r.Error == nil || r.Error.Message != "exec node not allowed (bound to beta)" {
		t.Fatalf("bound mismatch: %d %s", r.Status, r.Raw)
	}
	r = gw.invokeAs("agent:bound:main", "exec", map[string]any{"command": "echo $HOME", "host": "node"})
	if r.Result == nil || !strings.Contains(r.Result.Text(), b.stateDir) {
		t.Fatalf("bound default: %d %s", r.Status, r.Raw)
	}
	if n := execRequests(t, gw, a.id); n == 0 {
		t.Fatal("stats do not count exec requests")
	}
}

// execRequests asks a node's micro STATS how many exec requests it saw.
func execRequests(t *testing.T, gw *itGateway, id string) int {
	t.Helper()
	subject, err := micro.ControlSubject(micro.StatsVerb, bus.NodeServiceName, "")
	if err != nil {
		t.Fatal(err)
	}
	inbox := gw.nc.NewRespInbox()
	sub, err := gw.nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe() //nolint:errcheck
	if err := gw.nc.PublishRequest(subject, inbox, nil); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := sub.NextMsg(2 * time.Second)
		if err != nil {
			t.Fatalf("no STATS from node %s: %v", id, err)
		}
		var st micro.Stats
		if json.Unmarshal(m.Data, &st) != nil || st.Metadata["nodeId"] != id {
			continue
		}
		for _, ep := range st.Endpoints {
			if ep.Name == "exec" {
				return ep.NumRequests
			}
		}
		return 0
	}
}

// TestNodeBadInput sends malformed messages straight to a node's subjects:
// each is answered with an error, and nothing changes on the node.
func TestNodeBadInput(t *testing.T) {
	ns := startNodeServer(t, bus.ServerConfig{})
	gw := startItGateway(t, ns, "", bus.ClientConfig{})
	np := startPairedNode(t, ns, gw, "alpha")
	res := gw.invoke("exec", map[string]any{"command": "sleep 30", "host": "node", "background": true})
	np.track(res)

	subj := protocol.Subjects("execmesh")
	list := func() string {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		m, err := bus.RequestChunked(ctx, gw.nc, subj.Node(np.id, "list"), []byte(`{"all":true}`), nil)
		if err != nil {
			t.Fatal(err)
		}
		var lr struct {
			Sessions []struct {
				SessionKey string           `json:"sessionKey"`
				Details    protocol.Details `json:"details"`
			} `json:"sessions"`
		}
		if err := json.Unmarshal(m.Data, &lr); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, s := range lr.Sessions {
			ids = append(ids, s.SessionKey+"/"+fmt.Sprint(s.Details.SessionID.Value())+"/"+fmt.Sprint(s.Details.Status.Value()))
		}
		return strings.Join(ids, ",")
	}
	before := list()
	for _, c := range []struct{ endpoint, body, want string }{
		{"exec", `this is not json`, "JSON object"},
		{"exec", `{"sessionKey":"agent:main:main","args":{"command":42}}`, `"args.command" must be a string`},
		{"exec", `{"sessionKey":["x"],"args":{"command":"true"}}`, `"sessionKey" must be a string`},
		{"process", `{"sessionKey":"agent:main:main","args":{"action":"kill","sessionId":7}}`, `"args.sessionId" must be a string`},
		{"process", `{"sessionKey":"agent:main:main","args":{"action":"poll"},"x":1}`, `unknown field`},
		{"list", `{"sessionKey":{}}`, `must be a string`},
		{"which", `nope`, "JSON object"},
	} {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		m, err := bus.RequestChunked(ctx, gw.nc, subj.Node(np.id, c.endpoint), []byte(c.body), nil)
		cancel()
		if err != nil {
			t.Fatalf("%s %s: %v", c.endpoint, c.body, err)
		}
		se, ok := bus.ReplyError(m).(*bus.ServiceError)
		if !ok || se.Code != "400" || !strings.Contains(se.Description, c.want) {
			t.Fatalf("%s %s: %v, want 400 with %q", c.endpoint, c.body, bus.ReplyError(m), c.want)
		}
	}
	if after := list(); after != before {
		t.Fatalf("sessions changed: %s → %s", before, after)
	}
	// Unknown session, straight and through the gateway.
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	m, err := bus.RequestChunked(ctx, gw.nc, subj.Node(np.id, "process"), []byte(`{"sessionKey":"agent:main:main","args":{"action":"poll","sessionId":"ghost-session"}}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	var r protocol.ProcessReply
	if err := json.Unmarshal(m.Data, &r); err != nil || r.Result.Status() != protocol.StatusFailed || !strings.Contains(r.Result.Text(), "ghost-session") || !r.Gone {
		t.Fatalf("unknown session: %s %v", m.Data, err)
	}
	if r := gw.invoke("process", map[string]any{"action": "kill", "sessionId": "ghost-session"}); r.Status() != protocol.StatusFailed {
		t.Fatalf("unknown via gateway: %s", r.Text())
	}
	// Still serving.
	if r := gw.invoke("exec", map[string]any{"command": "echo still-fine", "host": "node"}); !strings.Contains(r.Text(), "still-fine") {
		t.Fatalf("after bad input: %s", r.Text())
	}
	// The HTTP API's own checks.
	if r := gw.do("POST", "/v1/nodes/nonexistent/approve", nil); r.Status != http.StatusNotFound {
		t.Fatalf("approve unknown: %d", r.Status)
	}
	if r := gw.do("POST", "/v1/nodes/invite", map[string]any{"ttlMs": "soon"}); r.Status != http.StatusBadRequest {
		t.Fatalf("bad invite: %d %s", r.Status, r.Raw)
	}
}
