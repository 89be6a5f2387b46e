package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/bus/bustest"
	"github.com/execmesh/execmesh/config"
	"github.com/execmesh/execmesh/index"
	"github.com/execmesh/execmesh/protocol"
)

// High availability inside one process: two gateways (their own state dirs, so
// their own identities) on one NATS server share the control plane.

// startPair starts gateways A and B on one fresh server.
func startPair(t *testing.T, mutate func(*config.Config, *Options)) (a, b *nodeEnv) {
	t.Helper()
	srv := bustest.StartServer(t)
	a = startNodeGateway(t, srv, "", mutate)
	b = startNodeGateway(t, srv, "", mutate)
	if a.g.ID() == b.g.ID() {
		t.Fatal("two gateways with one id")
	}
	checkFor(t, 15*time.Second, func() error {
		if n := len(a.g.peers.List()); n != 2 {
			return fmt.Errorf("A sees %d gateways", n)
		}
		if n := len(b.g.peers.List()); n != 2 {
			return fmt.Errorf("B sees %d gateways", n)
		}
		return nil
	})
	return a, b
}

func TestGatewaysList(t *testing.T) {
	a, b := startPair(t, nil)
	r := a.do("GET", "/v1/gateways", nil, nil)
	var ans struct {
		Gateways []struct {
			ID   string `json:"id"`
			Self bool   `json:"self"`
		} `json:"gateways"`
	}
	if r.Status != 200 || json.Unmarshal(r.Raw, &ans) != nil || len(ans.Gateways) != 2 {
		t.Fatalf("gateways: %d %s", r.Status, r.Raw)
	}
	for _, g := range ans.Gateways {
		if g.Self != (g.ID == a.g.ID()) || (g.ID != a.g.ID() && g.ID != b.g.ID()) {
			t.Fatalf("gateways: %s", r.Raw)
		}
	}
	// B stops: A sees it go at once (B deletes its key).
	b.close()
	checkFor(t, 10*time.Second, func() error {
		if a.g.peers.Alive(b.g.ID()) || len(a.g.peers.List()) != 1 {
			return fmt.Errorf("B still listed: %+v", a.g.peers.List())
		}
		return nil
	})
}

// TestSessionThroughAnyGateway: a host=gateway session started through A
// is polled, logged, listed and killed through B; when A is gone, B
// answers that it is lost, and its agent hears of its end once (A's exit
// notice, stored as A stopped and ended it, keeps B's lost report out).
func TestSessionThroughAnyGateway(t *testing.T) {
	a, b := startPair(t, nil)
	res := a.invoke("exec", map[string]any{"command": "echo from-a; sleep 30", "background": true}, "")
	id := res.SessionID()
	if res.Status() != protocol.StatusRunning {
		t.Fatalf("start: %s", res.Text())
	}
	checkFor(t, 10*time.Second, func() error {
		if p := b.invoke("process", map[string]any{"action": "poll", "sessionId": id}, ""); !strings.Contains(p.Text(), "from-a") {
			return fmt.Errorf("poll through B: %s", p.Text())
		}
		return nil
	})
	if l := b.invoke("process", map[string]any{"action": "log", "sessionId": id}, ""); !strings.Contains(l.Text(), "from-a") {
		t.Fatalf("log through B: %s", l.Text())
	}
	if l := b.invoke("process", map[string]any{"action": "list"}, ""); !strings.Contains(l.Text(), id) {
		t.Fatalf("list through B: %s", l.Text())
	}
	// Another sessionKey sees nothing of it through B either.
	if p := b.invoke("process", map[string]any{"action": "poll", "sessionId": id}, "agent:other:main"); p.Status() != protocol.StatusFailed {
		t.Fatalf("other scope through B: %s", p.Text())
	}
	if k := b.invoke("process", map[string]any{"action": "kill", "sessionId": id}, ""); k.Status() == protocol.StatusFailed {
		t.Fatalf("kill through B: %s", k.Text())
	}
	checkFor(t, 15*time.Second, func() error {
		if p := b.invoke("process", map[string]any{"action": "poll", "sessionId": id}, ""); p.Status() == protocol.StatusRunning {
			return fmt.Errorf("still running")
		}
		return nil
	})

	// A second session; then A goes away with its host.
	res = a.invoke("exec", map[string]any{"command": "sleep 60", "background": true}, "")
	id2 := res.SessionID()
	b.events(DefaultSessionKey, 100*time.Millisecond) // drop the kill's notices
	a.close()
	checkFor(t, 20*time.Second, func() error {
		p := b.invoke("process", map[string]any{"action": "poll", "sessionId": id2}, "")
		if p.Details.Lost.Value() != true || !strings.Contains(p.Text(), "gateway "+a.g.ID()) {
			return fmt.Errorf("poll after A left: %s %v", p.Text(), p.Details)
		}
		return nil
	})
	var ends []protocol.SystemEvent
	collect := func(wait time.Duration) {
		for _, ev := range b.events(DefaultSessionKey, wait) {
			if ev.Kind == protocol.EventExecLost || ev.Kind == protocol.EventExecExit {
				ends = append(ends, ev)
			}
		}
	}
	checkFor(t, 15*time.Second, func() error {
		collect(500 * time.Millisecond)
		if len(ends) == 0 {
			return fmt.Errorf("no exec.lost or exec.exit")
		}
		return nil
	})
	collect(time.Second)
	if len(ends) != 1 || ends[0].ContextKey != "exec:"+id2 {
		t.Fatalf("end events %+v, want one for %s", ends, id2)
	}
}

// TestIdempotentExecAcrossGateways: an exec start retried with the same
// Idempotency-Key through the other gateway gets the first answer and
// runs once; another key runs again; a key under another sessionKey is
// another start.
func TestIdempotentExecAcrossGateways(t *testing.T) {
	a, b := startPair(t, nil)
	dir := t.TempDir()
	marker := filepath.Join(dir, "runs")
	body, _ := json.Marshal(map[string]any{"tool": "exec", "args": map[string]any{"command": "echo run >> " + marker + "; echo started-once"}})
	call := func(env *nodeEnv, key, sessionKey string) *response {
		b := body
		if sessionKey != "" {
			b, _ = json.Marshal(map[string]any{"tool": "exec", "sessionKey": sessionKey, "args": map[string]any{"command": "echo run >> " + marker + "; echo started-once"}})
		}
		return env.do("POST", "/tools/invoke", b, http.Header{IdempotencyHeader: {key}})
	}
	r1 := call(a, "k-1", "")
	r2 := call(b, "k-1", "")
	if r1.Status != 200 || r2.Status != 200 || r1.Result.Text() != r2.Result.Text() || !strings.Contains(r1.Result.Text(), "started-once") {
		t.Fatalf("answers: %d %s / %d %s", r1.Status, r1.Raw, r2.Status, r2.Raw)
	}
	runs := func() int {
		b, _ := os.ReadFile(marker)
		return strings.Count(string(b), "run\n")
	}
	if n := runs(); n != 1 {
		t.Fatalf("ran %d times with one key", n)
	}
	call(b, "k-2", "")
	call(a, "k-1", "agent:other:main")
	if n := runs(); n != 3 {
		t.Fatalf("ran %d times, want 3 (k-1, k-2, k-1 of another sessionKey)", n)
	}
	// A key is not a way around validation: a bad request still fails,
	// and leaves the key free.
	if r := a.do("POST", "/tools/invoke", []byte(`{"tool":"exec","args":{"command":""}}`), http.Header{IdempotencyHeader: {"k-3"}}); r.Status != 400 && (r.Result == nil || r.Result.Status() != protocol.StatusFailed) {
		t.Fatalf("bad request with a key: %d %s", r.Status, r.Raw)
	}
	if r := a.do("POST", "/tools/invoke", body, http.Header{IdempotencyHeader: {strings.Repeat("k", 300)}}); r.Status != 400 {
		t.Fatalf("overlong key: %d %s", r.Status, r.Raw)
	}
}

// TestExecDefaultsShared: per-sessionKey exec defaults set through A apply
// to calls through B.
func TestExecDefaultsShared(t *testing.T) {
	a, b := startPair(t, nil)
	if r := a.do("PUT", "/v1/sessions/"+DefaultSessionKey+"/exec", []byte(`{"security":"deny"}`), nil); r.Status != 200 {
		t.Fatalf("put defaults: %d %s", r.Status, r.Raw)
	}
	checkFor(t, 10*time.Second, func() error {
		r := b.invokeRaw("exec", map[string]any{"command": "true"}, "")
		if r.Error == nil || r.Error.Type != protocol.ErrDenied {
			return fmt.Errorf("exec through B: %d %s", r.Status, r.Raw)
		}
		return nil
	})
	if r := b.do("GET", "/v1/sessions/"+DefaultSessionKey+"/exec", nil, nil); !strings.Contains(string(r.Raw), `"deny"`) {
		t.Fatalf("defaults read through B: %s", r.Raw)
	}
}

// TestApprovalThroughAnyGateway: an approval asked through A is decided
// through B and runs; with A gone, a node approval asked through A is
// decided through B, which takes it over and runs it on the node.
func TestApprovalThroughAnyGateway(t *testing.T) {
	srv := bustest.StartServer(t)
	mutate := func(c *config.Config, _ *Options) {
		c.Tools.Exec.Security, c.Tools.Exec.Ask = "allowlist", "on-miss"
		c.Tools.Exec.ApprovalRunningNoticeMs = 0
	}
	a := startNodeGateway(t, srv, "", mutate)
	b := startNodeGateway(t, srv, "", mutate)
	agent := a.pairAgent(testAgentConfig(t, srv, "approver"))
	checkFor(t, 15*time.Second, func() error {
		if n, ok := b.g.NodeRegistry().Get(agent.ID()); !ok || !n.Live {
			return fmt.Errorf("B does not see the node live")
		}
		return nil
	})
	dir := t.TempDir()
	run := func(env *nodeEnv, host, name string) string {
		// The workdir is where an approved command may write.
		res := env.invoke("exec", map[string]any{"command": "touch " + filepath.Join(dir, name) + "; echo approved-" + name, "host": host, "workdir": dir}, "")
		if res.Status() != protocol.StatusApprovalPending {
			t.Fatalf("want approval-pending: %s", res.Text())
		}
		return res.Details.ApprovalID.Value()
	}
	finished := func(env *nodeEnv, name string) {
		t.Helper()
		checkFor(t, 30*time.Second, func() error {
			if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
				return fmt.Errorf("%s did not run", name)
			}
			return nil
		})
	}
	id := run(a, "gateway", "gw-1")
	if r := b.do("POST", "/v1/approvals/"+id, []byte(`{"decision":"allow-once"}`), nil); r.Status != 200 {
		t.Fatalf("decide through B: %d %s", r.Status, r.Raw)
	}
	if r := a.do("POST", "/v1/approvals/"+id, []byte(`{"decision":"deny"}`), nil); r.Status != 409 {
		t.Fatalf("second decision through A: %d %s", r.Status, r.Raw)
	}
	finished(a, "gw-1")

	id = run(a, "node", "node-1")
	a.close()
	checkFor(t, 15*time.Second, func() error {
		if r := b.do("POST", "/v1/approvals/"+id, []byte(`{"decision":"allow-once"}`), nil); r.Status != 200 {
			return fmt.Errorf("decide through B after A left: %d %s", r.Status, r.Raw)
		}
		return nil
	})
	finished(b, "node-1")
	var evs []protocol.SystemEvent
	checkFor(t, 30*time.Second, func() error {
		evs = append(evs, b.events(DefaultSessionKey, 300*time.Millisecond)...)
		for _, ev := range evs {
			if ev.Kind == protocol.EventExecFinished && strings.Contains(ev.Text, "approved-node-1") {
				return nil
			}
		}
		return fmt.Errorf("no Exec finished for the node run: %+v", evs)
	})
	// A gateway-host approval whose gateway is gone is denied, not run
	// elsewhere.
	c := startNodeGateway(t, srv, "", mutate)
	id = run(c, "gateway", "gw-2")
	c.close()
	checkFor(t, 15*time.Second, func() error {
		r := b.do("POST", "/v1/approvals/"+id, []byte(`{"decision":"allow-once"}`), nil)
		if r.Status != 200 {
			return fmt.Errorf("decide: %d %s", r.Status, r.Raw)
		}
		return nil
	})
	checkFor(t, 15*time.Second, func() error {
		r := b.do("GET", "/v1/approvals/"+id, nil, nil)
		if !strings.Contains(string(r.Raw), "gateway-gone") {
			return fmt.Errorf("state: %s", r.Raw)
		}
		return nil
	})
	if _, err := os.Stat(filepath.Join(dir, "gw-2")); err == nil {
		t.Fatal("a gateway-host approval ran without its gateway")
	}
}

// TestIdempotentStartTakenOver: a keyed start whose gateway died before
// it named a session (its record says "started" without a session id,
// from a gateway that is not alive) is started by the gateway the retry
// reaches, once; the dead gateway, were it only cut off, can then no
// longer name a session for that key (its compare-and-set loses).
func TestIdempotentStartTakenOver(t *testing.T) {
	a, _ := startPair(t, nil)
	marker := filepath.Join(t.TempDir(), "runs")
	body, _ := json.Marshal(map[string]any{"tool": "exec", "args": map[string]any{"command": "echo run >> " + marker + "; echo taken-over"}})
	kv, err := a.g.idemBucket(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// What the dead gateway left: the key as execOnce names it.
	sum := sha256.Sum256([]byte(DefaultSessionKey + "\x00" + "k-dead"))
	k := hex.EncodeToString(sum[:20])
	left, _ := json.Marshal(idemRecord{State: "started", Gateway: "deadgatewayid"})
	rev, err := kv.Create(t.Context(), k, left)
	if err != nil {
		t.Fatal(err)
	}
	r := a.do("POST", "/tools/invoke", body, http.Header{IdempotencyHeader: {"k-dead"}})
	if r.Status != 200 || !strings.Contains(r.Result.Text(), "taken-over") {
		t.Fatalf("retry of a dead gateway's start: %d %s", r.Status, r.Raw)
	}
	again := a.do("POST", "/tools/invoke", body, http.Header{IdempotencyHeader: {"k-dead"}})
	if again.Status != 200 || again.Result.Text() != r.Result.Text() {
		t.Fatalf("second retry: %d %s", again.Status, again.Raw)
	}
	if b, _ := os.ReadFile(marker); strings.Count(string(b), "run\n") != 1 {
		t.Fatalf("ran %d times", strings.Count(string(b), "run\n"))
	}
	// The cut-off first gateway comes back and tries to name its session.
	st := &idemStarter{kv: kv, key: k, gateway: "deadgatewayid", rev: rev}
	if err := startedSession(context.WithValue(t.Context(), idemCtxKey{}, st), "some-id"); err == nil {
		t.Fatal("the replaced gateway could still claim the start")
	}
}

// TestIdempotentNodeStartTakenOver: a keyed host=node start whose gateway
// died after it named the session goes to the node again, under the same
// session id and node-level key: if the node had it, its first answer
// comes back and nothing runs again; if not, it runs now, once.
func TestIdempotentNodeStartTakenOver(t *testing.T) {
	a, b := startPair(t, nil)
	agent := a.pairAgent(testAgentConfig(t, a.srv, "n1"))
	b.waitNode(agent.ID(), "connected", "paired")
	kv, err := a.g.idemBucket(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	invoke := func(env *nodeEnv, key, marker string) *response {
		body, _ := json.Marshal(map[string]any{"tool": "exec", "args": map[string]any{
			"command": "echo run >> " + filepath.Join(dir, marker) + "; echo started; sleep 30", "host": "node", "background": true}})
		return env.do("POST", "/tools/invoke", body, http.Header{IdempotencyHeader: {key}})
	}
	runs := func(marker string) int {
		b, _ := os.ReadFile(filepath.Join(dir, marker))
		return strings.Count(string(b), "run\n")
	}
	// What a gateway that died after naming id leaves behind.
	leave := func(key, id string) {
		sum := sha256.Sum256([]byte(DefaultSessionKey + "\x00" + key))
		k := hex.EncodeToString(sum[:20])
		left, _ := json.Marshal(idemRecord{State: "started", Gateway: "deadgatewayid", SessionID: id})
		if _, err := kv.Put(t.Context(), k, left); err != nil {
			t.Fatal(err)
		}
	}

	// The node had the start: A ran it, then "died" before it kept the
	// answer.
	first := invoke(a, "k-reached", "reached")
	id := first.Result.SessionID()
	if first.Status != 200 || id == "" {
		t.Fatalf("first start: %d %s", first.Status, first.Raw)
	}
	leave("k-reached", id)
	again := invoke(b, "k-reached", "reached")
	if again.Status != 200 || again.Result.SessionID() != id {
		t.Fatalf("retry through B: %d %s, want session %s", again.Status, again.Raw, id)
	}
	// The node had not: the start runs now, under the named id.
	rec := index.Record{SessionKey: DefaultSessionKey, Host: index.HostNode, HostID: agent.ID(), State: index.StateRunning, StartedAt: time.Now().UnixMilli()}
	named, err := a.g.index.Allocate(t.Context(), rec)
	if err != nil {
		t.Fatal(err)
	}
	leave("k-unreached", named)
	late := invoke(b, "k-unreached", "unreached")
	if late.Status != 200 || late.Result.SessionID() != named {
		t.Fatalf("retry of a start that never reached the node: %d %s, want session %s", late.Status, late.Raw, named)
	}
	checkFor(t, 10*time.Second, func() error {
		if n, m := runs("reached"), runs("unreached"); n != 1 || m != 1 {
			return fmt.Errorf("runs: reached %d, unreached %d; want 1 and 1", n, m)
		}
		return nil
	})
	time.Sleep(300 * time.Millisecond)
	if n, m := runs("reached"), runs("unreached"); n != 1 || m != 1 {
		t.Fatalf("runs: reached %d, unreached %d; want 1 and 1", n, m)
	}
}
