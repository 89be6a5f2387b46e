package integration

import (
	"net/http"
	"os/exec"
	"strings"
	"sync"
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

// TestFaultHungNATSServer: the NATS server is frozen
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
	// The poll below must find no output to answer with at once: wait for
	// the session's output, then take it (a poll answers pending output
	// without waiting, and the poll among the calls above may have come
	// before the output did).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if strings.Contains(gw.mustCall(key, "process", map[string]any{"action": "log", "sessionId": id}).Text(), "f6") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no output f6 from %s within 10s", id)
		}
	}
	gw.mustCall(key, "process", map[string]any{"action": "poll", "sessionId": id})

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

// fltNetFault is a gateway and a NATS server on one machine (network
// namespace) and a node agent on another, joined by the switch of
// cluster_netns_harness_test.go, whose link the test cuts.
type fltNetFault struct {
	net      *clNet
	srv, box *clHost
	nats     *fltNATS
	gw       *fltDaemon
	node     *fltNode
}

func newFltNetFault(t *testing.T, hb time.Duration) *fltNetFault {
	t.Helper()
	fltRoot(t, "network namespaces")
	if _, err := exec.LookPath("tc"); err != nil {
		clNetnsSkip(t, "the tc command (iproute2) is not installed")
	}
	f := &fltNetFault{}
	f.net = newClNet(t, "srv", "box")
	f.srv, f.box = f.net.hosts["srv"], f.net.hosts["box"]
	natsAddr := f.srv.ip + ":4222"
	gwKey := newFltKey(t, t.TempDir(), "gateway")
	f.node = newFltNode(t, "alpha", "nats://"+natsAddr, hb, []string{"ip", "netns", "exec", f.box.ns})
	f.nats = startFltNATS(t, f.srv.ns, natsAddr, gwKey.PublicKey, f.node.publicKey)
	f.gw = newFltDaemon(t, "gateway", fltDaemonOpts{NATSURL: f.nats.url(), NKeySeedFile: gwKey.SeedFile,
		Listen: f.srv.ip + ":8420", Prefix: []string{"ip", "netns", "exec", f.srv.ns}, HTTP: f.srv.httpClient(4)})
	f.node.proc.start()
	f.gw.pair(f.node.id)
	return f
}

// tcBlackhole drops every packet the switch sends to h (the server→node
// direction only): a pfifo queue of length 0 on its switch port, which
// every kernel with iproute2's tc has (netem need not be loaded).
func tcBlackhole(t *testing.T, h *clHost, on bool) {
	t.Helper()
	args := []string{"netns", "exec", h.net.sw, "tc", "qdisc", "add", "dev", h.port, "root", "pfifo", "limit", "0"}
	if !on {
		args = []string{"netns", "exec", h.net.sw, "tc", "qdisc", "del", "dev", h.port, "root"}
	}
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %v: %v: %s", args, err, out)
	}
}

// fltCallsDuring makes node calls one after another for total, each of
// which must answer 200 or a retryable 503 within limit, and returns how
// many of each, and when the first 200 after from came.
func fltCallsDuring(t *testing.T, d *fltDaemon, key, id string, total, limit time.Duration) (ok, unavailable int, firstOK time.Duration) {
	t.Helper()
	start := time.Now()
	firstOK = -1
	calls := fltNodeCalls(id)
	for i := 0; time.Since(start) < total; i++ {
		c := calls[i%len(calls)]
		if c.name == "background on the node" {
			continue // would pile up sessions; exec covers starts
		}
		r := d.call(key, c.tool, c.args)
		switch {
		case r.Took > limit:
			t.Errorf("%s at +%s took %s (limit %s): %d %.300s", c.name, time.Since(start).Round(time.Millisecond), r.Took.Round(time.Millisecond), limit, r.Status, r.Raw)
		case r.Status == 200:
			ok++
			if firstOK < 0 && c.name != "list" {
				firstOK = time.Since(start)
			}
		case r.Status == http.StatusServiceUnavailable && r.Error != nil && r.Error.Retryable:
			unavailable++
		default:
			t.Errorf("%s: want 200 or a retryable 503: %d %.300s", c.name, r.Status, r.Raw)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return ok, unavailable, firstOK
}

// TestFaultPartitionReachableAfterHeal: the node's machine is cut off
// (both directions), or only the server→node direction is dropped, for
// 30 s and for 90 s, longer than the presence TTL (15 s with the default
// 5 s heartbeat), each case on a network of its own, in parallel. During
// the fault every call to the node answers within the TTL (200 or a
// retryable 503); within 5 s of the heal an exec on the node and a poll
// of its session work, although the NATS server may still hold the
// node's old connection (a blackholed TCP connection stays open on the
// server side for minutes, and the server's retransmissions to the node
// have backed off to tens of seconds). The four cases run at once (they
// mostly wait), not two at a time as -parallel would have them.
func TestFaultPartitionReachableAfterHeal(t *testing.T) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, tc := range []struct {
		name     string
		oneWay   bool
		duration time.Duration
	}{
		{"both ways for 30s", false, 30 * time.Second},
		{"server to node for 30s", true, 30 * time.Second},
		{"both ways for 90s", false, 90 * time.Second},
		{"server to node for 90s", true, 90 * time.Second},
	} {
		wg.Go(func() {
			t.Run(tc.name, func(t *testing.T) {
				const hb, ttl = 5 * time.Second, 15 * time.Second
				f := newFltNetFault(t, hb)
				gw := f.gw
				const key = "agent:heal:main"
				id := gw.background(key, "node", "echo heal; sleep 600")
				fltWorksAgain(t, gw, key, 10*time.Second, fltNodeCalls(id))
				on, off := f.box.cut, f.box.restore
				if tc.oneWay {
					on, off = func() { tcBlackhole(t, f.box, true) }, func() { tcBlackhole(t, f.box, false) }
				}
				on()
				ok, un, _ := fltCallsDuring(t, gw, key, id, tc.duration, ttl)
				off()
				t.Logf("during the fault %d calls answered, %d retryable 503s", ok, un)
				healed := time.Now()
				calls := []fltFastCall{
					{"exec on the node", "exec", map[string]any{"command": "echo hi", "host": "node"}},
					{"poll", "process", map[string]any{"action": "poll", "sessionId": id}},
				}
				fltWorksAgain(t, gw, key, 30*time.Second, calls)
				took := time.Since(healed)
				t.Logf("exec and poll on the node worked %s after the heal", took.Round(time.Millisecond))
				if took > 5*time.Second {
					t.Errorf("the node was reachable again only %s after the heal, want within 5s", took.Round(time.Millisecond))
				}
			})
		})
	}
}
