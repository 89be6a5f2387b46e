package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/execmesh/execmesh/access"
	"github.com/execmesh/execmesh/protocol"
)

// TestClusterHA is high availability on the machines of the cluster suite: gateway
// A (deploy/gateway.cluster.json) and gateway B (deploy/ha/gateway.ha.json,
// its own identity appended to auth.conf as deploy/README.md says) on the
// three-server cluster, two nodes. Any gateway answers any call; losing A
// (kill -9, under load) or one NATS server loses no session, approval or
// event; A restarted on an empty state dir rejoins.
func TestClusterHA(t *testing.T) {
	c := newClCluster(t)
	b := c.addGateway(t, "gateway-b", 8421)
	a := &haGW{c: c, name: "A", url: c.gwURL, state: c.gwState}
	clCheckFor(t, "ha", 30*time.Second, 200*time.Millisecond, func() error {
		for _, g := range []*haGW{a, b} {
			if n := g.gateways(t); n != 2 {
				return fmt.Errorf("%s lists %d gateways", g.name, n)
			}
		}
		return nil
	})
	node := clNodeNames[0]

	t.Run("SessionThroughEither", func(t *testing.T) {
		r := a.mustCall(t, "agent:ha:s", "exec", map[string]any{"command": "echo via-a; sleep 60", "host": "node", "node": node, "background": true})
		id := r.SessionID()
		clCheckFor(t, "ha", 15*time.Second, 200*time.Millisecond, func() error {
			if p := b.mustCall(t, "agent:ha:s", "process", map[string]any{"action": "poll", "sessionId": id}); !strings.Contains(p.Text(), "via-a") {
				return fmt.Errorf("poll via B: %s", p.Text())
			}
			return nil
		})
		if l := b.mustCall(t, "agent:ha:s", "process", map[string]any{"action": "log", "sessionId": id}); !strings.Contains(l.Text(), "via-a") {
			t.Fatalf("log via B: %s", l.Text())
		}
		if k := b.mustCall(t, "agent:ha:s", "process", map[string]any{"action": "kill", "sessionId": id}); k.Status() == protocol.StatusFailed {
			t.Fatalf("kill via B: %s", k.Text())
		}
		clCheckFor(t, "ha", 15*time.Second, 200*time.Millisecond, func() error {
			if p := a.mustCall(t, "agent:ha:s", "process", map[string]any{"action": "poll", "sessionId": id}); p.Status() == protocol.StatusRunning {
				return fmt.Errorf("still running (poll via A)")
			}
			return nil
		})
	})

	t.Run("ApprovalThroughEither", func(t *testing.T) {
		const key = "agent:ha:approve"
		if st, raw := a.do(t, "PUT", "/v1/sessions/"+key+"/exec", map[string]any{"security": "allowlist", "ask": "on-miss"}, false); st != 200 {
			t.Fatalf("session defaults via A: %d %s", st, raw)
		}
		marker := filepath.Join(t.TempDir(), "approved")
		var r protocol.Result
		clCheckFor(t, "ha", 10*time.Second, 200*time.Millisecond, func() error { // the defaults reach B's view
			// The workdir is where an approved command may write.
			r = a.mustCall(t, key, "exec", map[string]any{"command": "touch " + marker + "; echo approved-run", "host": "node", "node": node, "workdir": filepath.Dir(marker)})
			if r.Status() != protocol.StatusApprovalPending {
				return fmt.Errorf("want approval-pending: %s", r.Text())
			}
			return nil
		})
		id := r.Details.ApprovalID.Value()
		if st, raw := b.do(t, "POST", "/v1/approvals/"+id, map[string]any{"decision": "allow-once"}, true); st != 200 {
			t.Fatalf("decide via B: %d %s", st, raw)
		}
		clCheckFor(t, "ha", 30*time.Second, 200*time.Millisecond, func() error {
			if _, err := os.Stat(marker); err != nil {
				return fmt.Errorf("the approved command did not run")
			}
			return nil
		})
		var evs []protocol.SystemEvent
		clCheckFor(t, "ha", 30*time.Second, 200*time.Millisecond, func() error {
			evs = append(evs, b.events(t, key, 500*time.Millisecond)...)
			for _, ev := range evs {
				if ev.Kind == protocol.EventExecFinished && strings.Contains(ev.Text, "approved-run") {
					return nil
				}
			}
			return fmt.Errorf("no Exec finished: %+v", evs)
		})
	})

	t.Run("EventsOnceAlternating", func(t *testing.T) {
		const key = "agent:ha:events"
		want := map[string]bool{}
		for i := range 10 {
			g := []*haGW{a, b}[i%2]
			r := g.mustCall(t, key, "exec", map[string]any{"command": fmt.Sprintf("sleep 0.%d; echo ev-%d", i%5, i), "host": "node", "node": clNodeNames[i%2], "background": true})
			want[r.SessionID()] = true
		}
		got := map[string]int{}
		deadline := time.Now().Add(60 * time.Second)
		for i := 0; time.Now().Before(deadline); i++ {
			for _, ev := range []*haGW{a, b}[i%2].events(t, key, time.Second) {
				if ev.Kind == protocol.EventExecExit {
					got[strings.TrimPrefix(ev.ContextKey, "exec:")]++
				}
			}
			if len(got) == len(want) && i > 4 {
				break
			}
		}
		for id := range want {
			if got[id] != 1 {
				t.Errorf("session %s: %d exit events, want 1 (got %v)", id, got[id], got)
			}
		}
	})

	t.Run("GatewayKilledUnderLoad", func(t *testing.T) {
		const key = "agent:ha:load"
		// Node sessions that outlive A.
		bg := map[string]bool{}
		for i := range 4 {
			r := a.mustCall(t, key, "exec", map[string]any{"command": fmt.Sprintf("sleep 4; echo bg-%d", i), "host": "node", "node": clNodeNames[i%2], "background": true})
			bg[r.SessionID()] = true
		}
		runs := filepath.Join(t.TempDir(), "runs")
		var mu sync.Mutex
		var failures []string
		retried := 0
		var wg sync.WaitGroup
		stop := make(chan struct{})
		killed := make(chan struct{})
		for w := range 50 {
			wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					idem := fmt.Sprintf("w%d-%d", w, i)
					args := map[string]any{"command": "echo " + idem + " >> " + runs + "; echo out-" + idem, "host": "node", "node": clNodeNames[(w+i)%2]}
					first := []*haGW{a, b}[w%2]
					res, n, err := first.callOnce(key, args, idem, b)
					mu.Lock()
					retried += n
					if err != nil || !strings.Contains(res.Text(), "out-"+idem) {
						failures = append(failures, fmt.Sprintf("%s: %v %q", idem, err, res.Text()))
					}
					mu.Unlock()
				}
			})
		}
		time.Sleep(2 * time.Second)
		c.gw.kill(t)
		close(killed)
		time.Sleep(5 * time.Second)
		close(stop)
		wg.Wait()
		if len(failures) > 0 {
			t.Fatalf("%d calls failed after retries; first: %v", len(failures), failures[:min(5, len(failures))])
		}
		data, _ := os.ReadFile(runs)
		seen := map[string]int{}
		for l := range strings.SplitSeq(strings.TrimSpace(string(data)), "\n") {
			seen[l]++
		}
		for k, n := range seen {
			if n != 1 {
				t.Errorf("%s ran %d times", k, n)
			}
		}
		t.Logf("%d starts, %d retried against B after A died", len(seen), retried)
		// The node sessions started through A end and are told once, through B.
		got := map[string]int{}
		deadline := time.Now().Add(60 * time.Second)
		for time.Now().Before(deadline) && len(got) < len(bg) {
			for _, ev := range b.events(t, key, time.Second) {
				if ev.Kind == protocol.EventExecExit {
					got[strings.TrimPrefix(ev.ContextKey, "exec:")]++
				}
			}
		}
		for _, ev := range b.events(t, key, 2*time.Second) {
			if ev.Kind == protocol.EventExecExit {
				got[strings.TrimPrefix(ev.ContextKey, "exec:")]++
			}
		}
		for id := range bg {
			if got[id] != 1 {
				t.Errorf("node session %s started through A: %d exit events through B, want 1", id, got[id])
			}
		}
	})

	t.Run("ServerKilled", func(t *testing.T) {
		c.servers[1].kill(t)
		defer func() {
			c.servers[1].start(t)
			c.waitServersHealthy(60 * time.Second)
		}()
		clCheckFor(t, "ha", 30*time.Second, 200*time.Millisecond, func() error {
			r := b.call("agent:ha:srv", "exec", map[string]any{"command": "echo still-serving", "host": "node", "node": node}, "")
			if r.Status != 200 || !strings.Contains(string(r.Raw), "still-serving") {
				return fmt.Errorf("exec via B with a server down: %d %s", r.Status, r.Raw)
			}
			return nil
		})
	})

	t.Run("RestartOnEmptyStateDir", func(t *testing.T) {
		// A node session started through B while A is down: A, back
		// with nothing on disk, reaches it from the shared state.
		kept := b.mustCall(t, "agent:ha:back", "exec", map[string]any{"command": "echo kept-through-b; sleep 60", "host": "node", "node": node, "background": true}).SessionID()
		entries, _ := os.ReadDir(c.gwState)
		for _, e := range entries {
			_ = os.RemoveAll(filepath.Join(c.gwState, e.Name()))
		}
		c.startGateway()
		a.state = c.gwState
		clCheckFor(t, "ha", 30*time.Second, 200*time.Millisecond, func() error {
			if n := b.gateways(t); n != 2 {
				return fmt.Errorf("B lists %d gateways", n)
			}
			return nil
		})
		if r := a.mustCall(t, "agent:ha:back", "exec", map[string]any{"command": "echo back", "host": "node", "node": node}); !strings.Contains(r.Text(), "back") {
			t.Fatalf("A after the restart: %s", r.Text())
		}
		if p := a.mustCall(t, "agent:ha:back", "process", map[string]any{"action": "poll", "sessionId": kept}); p.Status() != protocol.StatusRunning || !strings.Contains(p.Text(), "kept-through-b") {
			t.Fatalf("A after the restart, B's node session: %s %s", p.Status(), p.Text())
		}
		if k := a.mustCall(t, "agent:ha:back", "process", map[string]any{"action": "kill", "sessionId": kept}); k.Status() == protocol.StatusFailed {
			t.Fatalf("kill via A after the restart: %s", k.Text())
		}
	})
}

// haGW is one gateway of TestClusterHA, reached from the gateway machine.
type haGW struct {
	c     *clCluster
	name  string
	url   string
	state string // its state dir (the generated operator token)
	opTok string // the operator token, when configured
	proc  *clProc
}

// addGateway starts a second gateway on the gateway machine, listening on
// port: its identity made by `execmesh nodes credentials` and appended to
// auth.conf (the servers reloaded), its configuration
// deploy/ha/gateway.ha.json with the first gateway's operator token.
func (c *clCluster) addGateway(t *testing.T, name string, port int) *haGW {
	t.Helper()
	ident := clCredentials(t, filepath.Join(c.dir, name), true)
	auth := filepath.Join(c.dir, "auth.conf")
	entry := filepath.Join(c.dir, name+"-user.conf")
	if err := os.WriteFile(entry, []byte(ident.Entry), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("sed", "-i", clNodeEntrySed+entry, auth).CombinedOutput(); err != nil {
		t.Fatalf("sed: %v %s", err, out)
	}
	for _, s := range c.servers {
		_ = s.cmd.Process.Signal(syscall.SIGHUP) // nats-server reloads its config
	}
	opTok, err := access.ReadOperatorTokenFile(c.gwState)
	if err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(c.dir, name+"-state")
	if err := os.MkdirAll(state, 0o700); err != nil {
		t.Fatal(err)
	}
	conf := clRender(t, "ha/gateway.ha.json", filepath.Join(c.dir, name+".json"), 0o600,
		"REPLACE_WITH_GATEWAY_TOKEN", c.token,
		"REPLACE_WITH_OPERATOR_TOKEN", opTok,
		"/etc/execmesh/gateway.nkey", ident.SeedFile,
		"/etc/execmesh/tls/ca.pem", c.ca,
		"/var/lib/execmesh", state,
		"0.0.0.0:8420", fmt.Sprintf("0.0.0.0:%d", port))
	h := c.net.hosts["gw"]
	p := newClProc(t, h, name, state, []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + state, "SHELL=/bin/sh", "LANG=C"},
		c.emBin, "gateway", "--config", conf, "--state-dir", state)
	g := &haGW{c: c, name: name, url: fmt.Sprintf("http://%s:%d", h.ip, port), state: state, opTok: opTok, proc: p}
	clCheckFor(t, "ha", 60*time.Second, 200*time.Millisecond, func() error {
		if !p.running() {
			p.start(t)
		}
		st, raw := g.do(t, "GET", "/healthz", nil, false)
		if st != 200 {
			return fmt.Errorf("%s /healthz: %d %s", name, st, raw)
		}
		return nil
	})
	return g
}

// do sends a request; operator requests carry the operator token.
func (g *haGW) do(t *testing.T, method, path string, body any, operator bool) (int, []byte) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, g.url+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Authorization", "Bearer "+g.c.token)
	if operator {
		tok := g.opTok
		if tok == "" {
			if tok, err = access.ReadOperatorTokenFile(g.state); err != nil {
				t.Fatal(err)
			}
		}
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	res, err := g.c.http.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	return res.StatusCode, raw
}

// call invokes a tool, with an Idempotency-Key when idem is set.
func (g *haGW) call(sessionKey, tool string, args map[string]any, idem string) clResp {
	b, _ := json.Marshal(map[string]any{"tool": tool, "args": args, "sessionKey": sessionKey})
	req, _ := http.NewRequest("POST", g.url+"/tools/invoke", bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+g.c.token)
	if idem != "" {
		req.Header.Set("Idempotency-Key", idem)
	}
	res, err := g.c.http.Do(req)
	if err != nil {
		return clResp{Raw: []byte(err.Error())}
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	r := clResp{Status: res.StatusCode, Raw: raw}
	if len(raw) > 0 && raw[0] == '{' {
		_ = json.Unmarshal(raw, &r)
	}
	return r
}

// mustCall makes one call as an agent does: a retryable answer (a 503
// while a clustered stream elects its leader after a server restart,
// say) is sent again for up to 30 s; any other failure ends the test.
func (g *haGW) mustCall(t *testing.T, sessionKey, tool string, args map[string]any) protocol.Result {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := g.call(sessionKey, tool, args, "")
		if r.Status == 200 && r.Result != nil {
			return *r.Result
		}
		if r.Error == nil || !r.Error.Retryable || time.Now().After(deadline) {
			t.Fatalf("%s via %s: %d %s", tool, g.name, r.Status, r.Raw)
		}
		t.Logf("%s via %s: retryable %d %s; sent again", tool, g.name, r.Status, r.Raw)
		time.Sleep(200 * time.Millisecond)
	}
}

// callOnce starts an exec with an Idempotency-Key as a client of an HA
// deployment does: on a connection error or a retryable answer it sends
// the same call (same key) to the other gateway, for up to 60 s. It
// returns the answer and the number of resends.
func (g *haGW) callOnce(sessionKey string, args map[string]any, idem string, other *haGW) (protocol.Result, int, error) {
	deadline := time.Now().Add(60 * time.Second)
	target := g
	for n := 0; ; n++ {
		r := target.call(sessionKey, "exec", args, idem)
		if r.Status == 200 && r.Result != nil {
			return *r.Result, n, nil
		}
		if r.Status != 0 && (r.Error == nil || !r.Error.Retryable) {
			return protocol.Result{}, n, fmt.Errorf("%d %s", r.Status, r.Raw)
		}
		if time.Now().After(deadline) {
			return protocol.Result{}, n, fmt.Errorf("no answer: %d %s", r.Status, r.Raw)
		}
		target = other
		time.Sleep(100 * time.Millisecond)
	}
}

// events is one long poll.
func (g *haGW) events(t *testing.T, sessionKey string, wait time.Duration) []protocol.SystemEvent {
	st, raw := g.do(t, "GET", fmt.Sprintf("/v1/events?sessionKey=%s&waitMs=%d", sessionKey, wait.Milliseconds()), nil, false)
	if st == http.StatusServiceUnavailable || st == 0 {
		time.Sleep(200 * time.Millisecond)
		return nil
	}
	var out struct {
		Events []protocol.SystemEvent `json:"events"`
	}
	if st != 200 || json.Unmarshal(raw, &out) != nil {
		t.Fatalf("events via %s: %d %s", g.name, st, raw)
	}
	return out.Events
}

// gateways is the number of gateways GET /v1/gateways lists.
func (g *haGW) gateways(t *testing.T) int {
	st, raw := g.do(t, "GET", "/v1/gateways", nil, false)
	var out struct {
		Gateways []json.RawMessage `json:"gateways"`
	}
	if st != 200 || json.Unmarshal(raw, &out) != nil {
		return -1
	}
	return len(out.Gateways)
}
