package integration

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/protocol"
)

// TestNodeKilledAndRestarted kills a node agent with SIGKILL while a
// session runs: calls for its sessions fail fast with a retryable error;
// after a restart the session is reported lost, never silently dropped.
func TestNodeKilledAndRestarted(t *testing.T) {
	ns := startNodeServer(t, bus.ServerConfig{})
	gw := startItGateway(t, ns, "", bus.ClientConfig{})
	np := startPairedNode(t, ns, gw, "alpha")
	res := gw.invoke("exec", map[string]any{"command": "echo before-kill; sleep 30", "host": "node", "background": true})
	np.track(res)
	id := res.SessionID()

	np.kill()
	// Once its heartbeats stop the node is unreachable, and calls for its
	// sessions fail at once, retryably. (A request sent in the moment
	// before the server notices the dead connection would instead be
	// "outcome unknown" after its deadline: it may have been delivered.)
	gw.waitNode(np.id, "unreachable", "paired")
	start := time.Now()
	r := gw.invokeRaw("process", map[string]any{"action": "poll", "sessionId": id})
	if r.Status != http.StatusServiceUnavailable || r.Error == nil || !r.Error.Retryable || !strings.Contains(r.Error.Message, "unreachable") {
		t.Fatalf("poll: %d %s", r.Status, r.Raw)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("not fail-fast: %s", d)
	}
	r = gw.invokeRaw("exec", map[string]any{"command": "true", "host": "node"})
	if r.Status != http.StatusServiceUnavailable || r.Error == nil || !r.Error.Retryable {
		t.Fatalf("exec while the only node is down: %d %s", r.Status, r.Raw)
	}

	np.start()
	gw.waitNode(np.id, "connected", "paired")
	waitFor(t, 60*time.Second, func() error {
		p := gw.invoke("process", map[string]any{"action": "poll", "sessionId": id})
		if p.Status() != protocol.StatusFailed || p.Details.Lost.Value() != true || !strings.Contains(p.Text(), "was lost") {
			return fmt.Errorf("poll: %s %v", p.Text(), p.Details)
		}
		return nil
	})
	if l := gw.invoke("process", map[string]any{"action": "list"}); !hasAll(l.Text(), id, "lost") {
		t.Fatalf("list: %s", l.Text())
	}
	if r := gw.invoke("exec", map[string]any{"command": "echo back", "host": "node"}); !strings.Contains(r.Text(), "back") {
		t.Fatalf("exec after restart: %s", r.Text())
	}
	if r := gw.invoke("process", map[string]any{"action": "remove", "sessionId": id}); !strings.Contains(r.Text(), "Removed session "+id) {
		t.Fatalf("remove lost: %s", r.Text())
	}
}

// TestNodeNATSRestart cuts every NATS connection by restarting the
// embedded server on the same port while a background command runs and
// ends: the command finishes, calls meanwhile fail fast, and the exit
// event arrives once.
func TestNodeNATSRestart(t *testing.T) {
	ns := startNodeServer(t, bus.ServerConfig{})
	gw := startItGateway(t, ns, "", bus.ClientConfig{})
	np := startPairedNode(t, ns, gw, "alpha")
	res := gw.invoke("exec", map[string]any{"command": "sleep 1; echo survived-the-outage", "host": "node", "background": true})
	np.track(res)
	id := res.SessionID()

	ns.stop()
	start := time.Now()
	r := gw.invokeRaw("process", map[string]any{"action": "poll", "sessionId": id})
	if r.Status != http.StatusServiceUnavailable || r.Error == nil || !r.Error.Retryable {
		t.Fatalf("poll during the outage: %d %s", r.Status, r.Raw)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("not fail-fast during the outage: %s", d)
	}
	time.Sleep(2 * time.Second) // the command ends while NATS is down
	ns.start()
	gw.g.SetEmbeddedServer(ns.srv)
	gw.waitNode(np.id, "connected", "paired")
	evs := gw.waitExitEvents(60*time.Second, time.Second)
	want := "Exec completed (" + id + ", code 0) :: survived-the-outage"
	if len(evs) != 1 || evs[0].Text != want {
		t.Fatalf("exit events %+v, want one %q", evs, want)
	}
	if p := gw.invoke("process", map[string]any{"action": "poll", "sessionId": id}); p.Status() != protocol.StatusCompleted || !strings.Contains(p.Text(), "survived-the-outage") {
		t.Fatalf("poll after the outage: %s", p.Text())
	}
}

// TestNodeGatewayRestart restarts the gateway while a node session runs:
// the new gateway lists the session (rebuilt from the node) and delivers
// its exit event once.
func TestNodeGatewayRestart(t *testing.T) {
	ns := startNodeServer(t, bus.ServerConfig{})
	gw := startItGateway(t, ns, "", bus.ClientConfig{})
	np := startPairedNode(t, ns, gw, "alpha")
	res := gw.invoke("exec", map[string]any{"command": "sleep 2; echo after-gateway-restart", "host": "node", "background": true})
	np.track(res)
	id := res.SessionID()
	gw.close()

	gw2 := startItGateway(t, ns, gw.stateDir, bus.ClientConfig{})
	if l := gw2.invoke("process", map[string]any{"action": "list"}); !hasAll(l.Text(), id, "running") {
		t.Fatalf("list after gateway restart: %s", l.Text())
	}
	evs := gw2.waitExitEvents(60*time.Second, time.Second)
	if len(evs) != 1 || !strings.Contains(evs[0].Text, "after-gateway-restart") || evs[0].ContextKey != "exec:"+id {
		t.Fatalf("exit events: %+v", evs)
	}
	gw2.waitNode(np.id, "connected", "paired")
}

// TestNodeLargeOutput runs a command that writes 50 MB through a node
// session: nothing blocks or drops the stream (the command exits 0 and the
// last line arrives), and the caps hold (at most 200000 retained chars).
func TestNodeLargeOutput(t *testing.T) {
	ns := startNodeServer(t, bus.ServerConfig{})
	gw := startItGateway(t, ns, "", bus.ClientConfig{})
	np := startPairedNode(t, ns, gw, "alpha")
	start := time.Now()
	res := gw.invoke("exec", map[string]any{"host": "node", "background": true,
		"command": "yes 0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ | head -c 52428800; echo; echo END-OF-OUTPUT"})
	np.track(res)
	id := res.SessionID()
	var polled int
	var done protocol.Result
	waitFor(t, 3*time.Minute, func() error {
		done = gw.invoke("process", map[string]any{"action": "poll", "sessionId": id, "timeout": 2000})
		if n := len(done.Text()); n > polled {
			polled = n
		}
		if done.Status() == protocol.StatusRunning {
			return fmt.Errorf("still running")
		}
		return nil
	})
	if done.Status() != protocol.StatusCompleted || fmt.Sprint(done.Details.ExitCode.Value()) != "0" {
		t.Fatalf("final poll: %v", done.Details)
	}
	if polled > 2*30000+1000 {
		t.Fatalf("a poll returned %d chars, above the pending caps", polled)
	}
	log := gw.invoke("process", map[string]any{"action": "log", "sessionId": id, "limit": 100000})
	total := log.Details.TotalChars.Value()
	if total <= 0 || total > 200000 || len(log.Text()) > 200000+2000 || !strings.Contains(log.Text(), "END-OF-OUTPUT") {
		t.Fatalf("log: totalChars %v, %d chars of text, marker %v", log.Details.TotalChars.Value(), len(log.Text()), strings.Contains(log.Text(), "END-OF-OUTPUT"))
	}
	t.Logf("50 MB through a node session in %s", time.Since(start).Round(time.Millisecond))
}

// TestNodeManyAgents connects 20 node agents at once; all are listed
// connected, and each runs a command routed to it by id.
func TestNodeManyAgents(t *testing.T) {
	const n = 20
	ns := startNodeServer(t, bus.ServerConfig{})
	gw := startItGateway(t, ns, "", bus.ClientConfig{})
	procs := make([]*nodeProc, n)
	for i := range procs {
		procs[i] = newNodeProc(t, fmt.Sprintf("node-%02d", i), "--nats-url", ns.url())
		procs[i].start()
	}
	for _, np := range procs {
		gw.waitNode(np.id, "connected", "")
		gw.approve(np.id)
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for _, np := range procs {
		wg.Go(func() {
			r := gw.invokeRaw("exec", map[string]any{"command": "echo $HOME", "host": "node", "node": np.id})
			if r.Result == nil || !strings.Contains(r.Result.Text(), np.stateDir) {
				errs <- fmt.Errorf("node %s: %d %s", np.name, r.Status, r.Raw)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	connected := 0
	for _, v := range gw.nodes() {
		if v.Status == "connected" && v.Paired {
			connected++
		}
	}
	if connected != n {
		t.Fatalf("%d nodes connected and paired, want %d", connected, n)
	}
}

// TestNodeHungMidRequest stops a node agent (SIGSTOP: its NATS connection
// stays open, so the server still routes to it) while it holds a poll
// that waits for output, and while it holds an exec start. Each call ends
// once the node's heartbeats stop (presence TTL 3 s here), as a retryable
// 503 whose outcome is unknown, instead of waiting for its deadline (35 s
// for the poll). After SIGCONT the node answers again.
func TestNodeHungMidRequest(t *testing.T) {
	ns := startNodeServer(t, bus.ServerConfig{})
	gw := startItGateway(t, ns, "", bus.ClientConfig{})
	np := startPairedNode(t, ns, gw, "hung")
	res := gw.invoke("exec", map[string]any{"command": "echo hung-start; sleep 30", "host": "node", "background": true})
	np.track(res)
	id := res.SessionID()
	if p := gw.invoke("process", map[string]any{"action": "poll", "sessionId": id, "timeout": 5000}); !strings.Contains(p.Text(), "hung-start") {
		t.Fatalf("first poll: %s", p.Text())
	}
	resume := func() { _ = np.cmd.Process.Signal(syscall.SIGCONT) }
	t.Cleanup(resume)

	for _, tc := range []struct {
		name string
		args map[string]any
		tool string
		want string
	}{
		{"poll waiting for output", map[string]any{"action": "poll", "sessionId": id, "timeout": 20000}, "process", "the action may or may not have been applied"},
		{"exec start", map[string]any{"command": "sleep 8; echo late", "host": "node", "yieldMs": 20000}, "exec", "may or may not have started"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			type answer struct {
				r    *itResponse
				took time.Duration
			}
			done := make(chan answer, 1)
			go func() {
				start := time.Now()
				r := gw.invokeRaw(tc.tool, tc.args)
				done <- answer{r, time.Since(start)}
			}()
			time.Sleep(500 * time.Millisecond) // the request is with the node
			if err := np.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			var a answer
			select {
			case a = <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("the call still waits 30 s after its node stopped")
			}
			if a.r.Status != http.StatusServiceUnavailable || a.r.Error == nil || !a.r.Error.Retryable ||
				!strings.Contains(a.r.Error.Message, "stopped sending heartbeats") || !strings.Contains(a.r.Error.Message, tc.want) {
				t.Fatalf("%s on a stopped node: %d %s", tc.tool, a.r.Status, a.r.Raw)
			}
			// The presence TTL (3 s) plus the watch interval, with room for a
			// loaded machine; far from the request's own deadline.
			if a.took > 12*time.Second {
				t.Fatalf("%s on a stopped node took %s", tc.tool, a.took)
			}
			resume()
			gw.waitNode(np.id, "connected", "paired")
			if p := gw.invoke("process", map[string]any{"action": "poll", "sessionId": id}); p.Status() != protocol.StatusRunning {
				t.Fatalf("poll after SIGCONT: %s %q", p.Status(), p.Text())
			}
		})
	}
}
