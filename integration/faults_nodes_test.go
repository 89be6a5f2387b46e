package integration

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/protocol"
)

// fltExternal is an external nats-server, an `execmesh gateway` on it
// and node agents, paired.
type fltExternal struct {
	nats  *fltNATS
	gwKey fltKey
	gw    *fltDaemon
	nodes []*fltNode
}

// newFltExternal starts the server, the gateway and one node agent per
// name (heartbeat hb), and pairs them. env is the gateway's extra
// environment.
func newFltExternal(t *testing.T, hb time.Duration, env []string, names ...string) *fltExternal {
	t.Helper()
	e := &fltExternal{}
	e.gwKey = newFltKey(t, t.TempDir(), "gateway")
	addr := freeAddr(t)
	var nodes []*fltNode
	users := []string{e.gwKey.PublicKey}
	for _, name := range names {
		n := newFltNode(t, name, "nats://"+addr, hb, nil)
		nodes = append(nodes, n)
		users = append(users, n.publicKey)
	}
	e.nats = startFltNATS(t, "", addr, users...)
	e.gw = newFltDaemon(t, "gateway", fltDaemonOpts{NATSURL: e.nats.url(), NKeySeedFile: e.gwKey.SeedFile, Env: env})
	for _, n := range nodes {
		n.proc.start()
		e.gw.pair(n.id)
	}
	e.nodes = nodes
	return e
}

// exitStreamMsgs returns the messages in the exit stream.
func (e *fltExternal) exitStreamMsgs(t *testing.T) uint64 {
	t.Helper()
	nc, err := e.nats.connect(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(clCtx(t, 5*time.Second), bus.StreamNamesFor(bus.DefaultPrefix).Exit)
	if err != nil {
		return 0
	}
	return st.CachedInfo().State.Msgs
}

// TestFaultNodeRestartedWhileGatewayDown: five node
// sessions finish while the gateway is down (SIGKILL), and two more are
// still running when the node agent is restarted (SIGTERM), before the
// gateway comes back. The restarted gateway must deliver every finished
// session's exit event exactly once, though the node that sent them is a
// new run now, and tell the agent of each of the two ended sessions once
// (an exit or a lost event), never nothing.
func TestFaultNodeRestartedWhileGatewayDown(t *testing.T) {
	e := newFltExternal(t, 500*time.Millisecond, nil, "alpha")
	gw, node := e.gw, e.nodes[0]
	const key = "agent:f2:main"
	var finished, ended []string
	for i := range 5 {
		finished = append(finished, gw.background(key, "node", fmt.Sprintf("sleep 1; echo f2-done-%d", i)))
	}
	for i := range 2 {
		ended = append(ended, gw.background(key, "node", fmt.Sprintf("echo f2-long-%d; sleep 600", i)))
	}
	before := e.exitStreamMsgs(t)
	gw.proc.kill()
	clCheckFor(t, "5 exit events stored while the gateway is down", 30*time.Second, 100*time.Millisecond, func() error {
		if n := e.exitStreamMsgs(t) - before; n < 5 {
			return fmt.Errorf("%d stored", n)
		}
		return nil
	})
	if err := node.proc.stop(); err != nil {
		t.Fatal(err)
	}
	node.proc.start()
	gw.start()
	gw.waitNode(node.id, "connected", 30*time.Second)

	c := gw.tally(key, append(append([]string{}, finished...), ended...), 30*time.Second, 2*time.Second,
		protocol.EventExecExit, protocol.EventExecLost)
	c.exact(t, "5 sessions finished while the gateway was down, 2 ended by the node's restart")
	for _, id := range finished {
		for _, ev := range c.ByID[id] {
			if ev.Kind != protocol.EventExecExit || !strings.Contains(ev.Text, "f2-done-") {
				t.Errorf("session %s finished while the gateway was down: %s %q", id, ev.Kind, ev.Text)
			}
		}
	}
	for _, id := range ended {
		for _, ev := range c.ByID[id] {
			t.Logf("session %s ended by the node's restart: %s %q", id, ev.Kind, ev.Text)
		}
	}
	if log := gw.proc.runLog(); strings.Contains(log, "dropped") {
		t.Errorf("the gateway dropped exit events:\n%s", grepLines(log, "dropped"))
	}
}

// TestFaultDeadNodeErrorText: after a node agent is
// killed (SIGKILL), the calls that find it gone are retryable 503s that
// come at once and say when its last heartbeat came and what happened
// then — not "never since the gateway started" (heartbeats had been
// seen), not an unanswered probe (nobody listened), not that its session
// keeps running (nobody knows).
func TestFaultDeadNodeErrorText(t *testing.T) {
	e := newFltExternal(t, time.Second, nil, "alpha")
	gw, node := e.gw, e.nodes[0]
	const key = "agent:f10:main"
	id := gw.background(key, "node", "sleep 600")
	time.Sleep(1500 * time.Millisecond) // heartbeats seen
	node.proc.kill()
	var texts []string
	for i := range 3 {
		for _, c := range []struct {
			tool string
			args map[string]any
		}{
			{"exec", map[string]any{"command": "echo hi", "host": "node"}},
			{"process", map[string]any{"action": "poll", "sessionId": id}},
		} {
			r := gw.call(key, c.tool, c.args)
			if r.Status != http.StatusServiceUnavailable || r.Error == nil || !r.Error.Retryable {
				t.Fatalf("call %d %s to a killed node: %d %s", i, c.tool, r.Status, r.Raw)
			}
			if r.Took > 5*time.Second {
				t.Errorf("call %d %s to a killed node took %s", i, c.tool, r.Took)
			}
			texts = append(texts, r.Error.Message)
			for _, wrong := range []string{"never", "probe", "keeps running"} {
				// Heartbeats had been seen; no probe went unanswered
				// (nobody listened); nothing says the session still runs.
				if strings.Contains(r.Error.Message, wrong) {
					t.Errorf("call %d %s to a killed node: %q says %q", i, c.tool, r.Error.Message, wrong)
				}
			}
		}
		time.Sleep(time.Second)
	}
	t.Logf("texts: %q", texts)
	// Once the node is known to be gone, the texts say when it was last
	// heard of and what happened then.
	for _, msg := range texts[1:] {
		if !strings.Contains(msg, "last heartbeat") || !strings.Contains(msg, "ago; then it ") ||
			!strings.Contains(msg, "no longer connected to NATS") && !strings.Contains(msg, "stopped sending heartbeats") {
			t.Errorf("a call to a node known to be gone: %q: want when its last heartbeat came and what happened then", msg)
		}
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestFaultJetStreamStoreLost: the NATS server is
// killed (SIGKILL), its JetStream store wiped and the server started
// again, empty, while node sessions run. Neither the gateway nor the node
// agent is restarted: they create the streams, buckets and consumers
// again, the node stays paired and usable, the exit events of the
// sessions that ended after the loss arrive exactly once, and so do
// those of sessions started afterwards. The loss is logged.
func TestFaultJetStreamStoreLost(t *testing.T) {
	e := newFltExternal(t, 500*time.Millisecond, nil, "alpha")
	gw, node := e.gw, e.nodes[0]
	const key = "agent:f4:main"
	first := gw.startMany(key, "node", "echo f4-first-%d", 2)
	gw.tally(key, first, 20*time.Second, 0, protocol.EventExecExit).exact(t, "before the loss")

	across := gw.startMany(key, "node", "sleep 6; echo f4-across-%d", 3)
	gwLocal := gw.startMany(key, "gateway", "sleep 6; echo f4-gw-%d", 2)
	e.nats.proc.kill()
	if err := os.RemoveAll(e.nats.store); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	e.nats.start()
	lostAt := time.Now()
	// /healthz while the store is being re-created.
	seen := map[string]bool{}
	var seenMu sync.Mutex
	stopWatch := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			select {
			case <-stopWatch:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if st, body := gw.healthz(); st != 200 {
				seenMu.Lock()
				seen[body] = true
				seenMu.Unlock()
			}
		}
	}()

	c := gw.tally(key, append(append([]string{}, across...), gwLocal...), 30*time.Second, 2*time.Second, protocol.EventExecExit, protocol.EventExecLost)
	c.exact(t, "sessions that ended after the store was lost")
	took := time.Since(lostAt)
	t.Logf("after the loss: %s in %s", c, took.Round(time.Millisecond))
	// The sessions end about 5 s after the server is back; their events
	// wait no longer than it takes to notice the store is empty.
	if took > 15*time.Second {
		t.Errorf("the exit events of the sessions that ended after the loss took %s (want ≤ 15 s)", took.Round(time.Millisecond))
	}
	close(stopWatch)
	<-watched
	storeSeen := false
	for body := range seen {
		t.Logf("/healthz after the server came back: %s", body)
		if strings.Contains(body, "exit feed") || strings.Contains(body, "session index") || strings.Contains(body, "event store") {
			storeSeen = true
		}
	}
	// The loss is noticed: /healthz fails naming the store while it is
	// lost, but the gateway creates a lost bucket or consumer again at
	// its first use after the loss, so that window can be shorter than
	// the watch's interval; the log names it either way.
	log := gw.proc.runLog()
	if !strings.Contains(log, "lost; creating it again") {
		t.Errorf("the gateway did not log the loss of the store")
	}
	if !storeSeen && !strings.Contains(log, "created anew") {
		t.Errorf("/healthz never said the store was lost, and the gateway did not log creating it anew")
	}
	gw.waitNode(node.id, "connected", 20*time.Second)
	for _, n := range gw.nodes() {
		if n["id"] == node.id && n["pairing"] != "paired" {
			t.Errorf("node %s after the store was lost: pairing %v", node.id, n["pairing"])
		}
	}
	after := gw.startMany(key, "node", "echo f4-after-%d", 3)
	gw.tally(key, after, 30*time.Second, 2*time.Second, protocol.EventExecExit).exact(t, "sessions started after the store came back")
	if st, body := gw.healthz(); st != 200 {
		t.Errorf("/healthz after the store came back: %d %s", st, body)
	}
	for _, p := range []*fltProc{gw.proc, node.proc} {
		if !p.running() {
			t.Errorf("%s exited: %v", p.name, p.err)
		}
		if b, _ := os.ReadFile(p.log); strings.Count(string(b), "=== start") > 1 {
			t.Errorf("%s was restarted", p.name)
		}
	}
}
