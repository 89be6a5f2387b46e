package integration

import (
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fltFastCall is one call that must, during a fault, fail fast with a
// retryable 503 (or succeed).
type fltFastCall struct {
	name string
	tool string
	args map[string]any
}

// fltFailsFast makes each call and fails the test unless it answered
// within limit, either 200 or a retryable 503. It returns how many were
// 503s.
func fltFailsFast(t *testing.T, d *fltDaemon, key string, limit time.Duration, calls []fltFastCall) int {
	t.Helper()
	n := 0
	for _, c := range calls {
		r := d.call(key, c.tool, c.args)
		t.Logf("%s: %d in %s: %.200s", c.name, r.Status, r.Took.Round(time.Millisecond), r.Raw)
		switch {
		case r.Took > limit:
			t.Errorf("%s took %s (limit %s): %d %.300s", c.name, r.Took.Round(time.Millisecond), limit, r.Status, r.Raw)
		case r.Status == http.StatusServiceUnavailable && r.Error != nil && r.Error.Retryable:
			n++
		case r.Status == 200:
		default:
			t.Errorf("%s: want 200 or a retryable 503: %d %.300s", c.name, r.Status, r.Raw)
		}
	}
	return n
}

// fltNodeCalls are the calls to a node's session id (and the node) that
// a fault must not hang.
func fltNodeCalls(id string) []fltFastCall {
	return []fltFastCall{
		{"exec on the node", "exec", map[string]any{"command": "echo hi", "host": "node"}},
		{"poll", "process", map[string]any{"action": "poll", "sessionId": id}},
		{"log", "process", map[string]any{"action": "log", "sessionId": id}},
		{"list", "process", map[string]any{"action": "list"}},
		{"background on the node", "exec", map[string]any{"command": "sleep 1", "host": "node", "background": true}},
	}
}

// fltWorksAgain waits until every call of calls answers 200.
func fltWorksAgain(t *testing.T, d *fltDaemon, key string, total time.Duration, calls []fltFastCall) time.Duration {
	t.Helper()
	start := time.Now()
	for _, c := range calls {
		for {
			r := d.call(key, c.tool, c.args)
			if r.Status == 200 {
				break
			}
			if time.Since(start) > total {
				t.Fatalf("%s after the fault ended: %d %.300s", c.name, r.Status, r.Raw)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	return time.Since(start)
}

// TestFaultHungNATSServer (issue 17 item 6): the NATS server is frozen
// (SIGSTOP) for 15 s, longer than the node's presence TTL would catch
// alone. Node calls and process list fail within a few seconds with a
// retryable 503 — the gateway's pings of the server go unanswered — and
// work again soon after SIGCONT.
func TestFaultHungNATSServer(t *testing.T) {
	e := newFltExternal(t, 5*time.Second, nil, "alpha")
	gw := e.gw
	const key = "agent:f6:main"
	id := gw.background(key, "node", "echo f6; sleep 600")
	calls := fltNodeCalls(id)
	fltWorksAgain(t, gw, key, 10*time.Second, calls)

	// A poll that waits on the node when the server freezes.
	inflight := make(chan fltResp, 1)
	go func() {
		inflight <- gw.call(key, "process", map[string]any{"action": "poll", "sessionId": id, "timeout": 25000})
	}()
	time.Sleep(500 * time.Millisecond)
	e.nats.proc.signal(syscall.SIGSTOP)
	stopped := time.Now()
	defer e.nats.proc.signal(syscall.SIGCONT)
	r := <-inflight
	t.Logf("poll under way: %d %s after the freeze: %.200s", r.Status, time.Since(stopped).Round(time.Millisecond), r.Raw)
	if d := time.Since(stopped); d > 5*time.Second || r.Status != http.StatusServiceUnavailable || r.Error == nil || !r.Error.Retryable {
		t.Errorf("a poll under way when the server froze: %d %s after the freeze, want a retryable 503 within 5s: %.300s", r.Status, d, r.Raw)
	}
	n := fltFailsFast(t, gw, key, 5*time.Second, calls)
	if n == 0 {
		t.Errorf("no call failed while the NATS server was frozen")
	}
	st, body := gw.healthz()
	t.Logf("healthz while frozen: %d %s", st, body)
	if st == 200 {
		t.Errorf("/healthz answers 200 while the NATS server is frozen: %s", body)
	}
	if d := time.Since(stopped); d > 14*time.Second {
		t.Logf("the calls took %s in all", d)
	}
	time.Sleep(max(0, 15*time.Second-time.Since(stopped)))
	e.nats.proc.signal(syscall.SIGCONT)
	took := fltWorksAgain(t, gw, key, 20*time.Second, calls)
	t.Logf("every call worked again %s after SIGCONT", took.Round(time.Millisecond))
	if took > 10*time.Second {
		t.Errorf("calls worked again only %s after SIGCONT", took)
	}
	if !strings.Contains(gw.proc.runLog(), "the NATS server stopped answering") {
		t.Errorf("the gateway's log does not say the NATS server stopped answering")
	}
}
