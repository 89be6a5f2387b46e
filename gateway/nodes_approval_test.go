package gateway

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/config"

	"github.com/execmesh/execmesh/approvals"
	"github.com/execmesh/execmesh/nodeagent"
	"github.com/execmesh/execmesh/protocol"
)

// startNodeApproval starts a gateway (security full, ask off: only the
// node's own file asks) and a paired node whose exec-approvals.json is
// file.
func startNodeApproval(t *testing.T, file string, mutate func(*config.Config)) (*nodeEnv, nodeagent.Config, *nodeagent.Agent) {
	t.Helper()
	env := startNodeGateway(t, nil, "", func(c *config.Config, _ *Options) {
		c.Tools.Exec.ApprovalRunningNoticeMs = 0
		if mutate != nil {
			mutate(c)
		}
	})
	cfg := testAgentConfig(t, env.srv, "approver")
	if err := os.WriteFile(approvals.Path(cfg.StateDir), []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	a := env.pairAgent(cfg)
	return env, cfg, a
}

const nodeAskFile = `{"version":1,"defaults":{"security":"allowlist","ask":"on-miss","askFallback":"deny"},"agents":{}}`

// pendingOnNode runs command on the node and checks the approval-pending
// answer; it returns the approval id.
func pendingOnNode(t *testing.T, env *nodeEnv, nodeID, command string) string {
	t.Helper()
	res := env.invoke("exec", map[string]any{"command": command, "host": "node"}, "")
	if res.Status() != protocol.StatusApprovalPending {
		t.Fatalf("want approval-pending: %s %v", res.Text(), res.Details)
	}
	id := res.Details.ApprovalID.Value()
	if id == "" || res.Details.Host.Value() != "node" || res.Details.NodeID.Value() != nodeID {
		t.Fatalf("details: %v", res.Details)
	}
	for _, line := range []string{"Host: node", "Node: " + nodeID, command} {
		if !strings.Contains(res.Text(), line) {
			t.Fatalf("text lacks %q:\n%s", line, res.Text())
		}
	}
	r := env.do("GET", "/v1/approvals", nil, nil)
	var list struct {
		Approvals []PendingApproval `json:"approvals"`
	}
	if err := json.Unmarshal(r.Raw, &list); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range list.Approvals {
		if p.ID == id {
			found = true
			if p.NodeID != nodeID || p.Host != "node" || p.Command != command {
				t.Fatalf("listed: %+v", p)
			}
		}
	}
	if !found {
		t.Fatalf("approval %s not listed: %s", id, r.Raw)
	}
	return id
}

func decide(t *testing.T, env *nodeEnv, id, decision string) {
	t.Helper()
	r := env.do("POST", "/v1/approvals/"+id, []byte(`{"decision":"`+decision+`"}`), nil)
	if r.Status != 200 {
		t.Fatalf("decide %s: %d %s", decision, r.Status, r.Raw)
	}
}

// collectEvents gathers the events of the default sessionKey for d.
func collectEvents(env *nodeEnv, d time.Duration, until func([]protocol.SystemEvent) bool) []protocol.SystemEvent {
	var out []protocol.SystemEvent
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		out = append(out, env.events(DefaultSessionKey, 500*time.Millisecond)...)
		if until != nil && until(out) {
			break
		}
	}
	return out
}

func countKind(evs []protocol.SystemEvent, kind string) (int, protocol.SystemEvent) {
	n, last := 0, protocol.SystemEvent{}
	for _, ev := range evs {
		if ev.Kind == kind {
			n++
			last = ev
		}
	}
	return n, last
}

// TestNodeApprovalApproveRuns: pending → allow-once over HTTP → runs on
// the node → one Exec finished event with the node, the approval id, the
// session and the output; no exit notification besides.
func TestNodeApprovalApproveRuns(t *testing.T) {
	env, cfg, a := startNodeApproval(t, nodeAskFile, func(c *config.Config) { c.Tools.Exec.ApprovalRunningNoticeMs = 300 })
	marker := filepath.Join(cfg.Cwd, "ran-once")
	command := "sh -c 'sleep 1; touch " + marker + "; echo node-output-1'"
	id := pendingOnNode(t, env, a.ID(), command)
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("ran before approval")
	}
	decide(t, env, id, DecisionAllowOnce)
	evs := collectEvents(env, 30*time.Second, func(evs []protocol.SystemEvent) bool {
		n, _ := countKind(evs, protocol.EventExecFinished)
		return n > 0
	})
	// Anything more would arrive within a moment.
	evs = append(evs, collectEvents(env, time.Second, nil)...)
	n, fin := countKind(evs, protocol.EventExecFinished)
	if n != 1 {
		t.Fatalf("want one Exec finished, got %d: %+v", n, evs)
	}
	prefix := fmt.Sprintf("Exec finished (node=%s id=%s, session=", a.ID(), id)
	if !strings.HasPrefix(fin.Text, prefix) || !strings.Contains(fin.Text, ", code 0)\nnode-output-1") {
		t.Fatalf("finished text: %q", fin.Text)
	}
	if nr, run := countKind(evs, protocol.EventExecRunning); nr != 1 || run.Text != fmt.Sprintf("Exec running (node=%s id=%s, >1s): %s", a.ID(), id, command) {
		t.Fatalf("running events %d: %q", nr, run.Text)
	}
	if ne, _ := countKind(evs, protocol.EventExecExit); ne != 0 {
		t.Fatalf("exit notification besides Exec finished: %+v", evs)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("marker: %v", err)
	}
}

// TestNodeApprovalDeny: deny → Exec denied (user-denied) and nothing ran.
func TestNodeApprovalDeny(t *testing.T) {
	env, cfg, a := startNodeApproval(t, nodeAskFile, nil)
	marker := filepath.Join(cfg.Cwd, "denied-marker")
	command := "touch " + marker
	id := pendingOnNode(t, env, a.ID(), command)
	decide(t, env, id, DecisionDeny)
	ev := env.waitEvent(protocol.EventExecDenied)
	if want := fmt.Sprintf("Exec denied (node=%s id=%s, user-denied): %s", a.ID(), id, command); ev.Text != want {
		t.Fatalf("denied text %q, want %q", ev.Text, want)
	}
	time.Sleep(300 * time.Millisecond)
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("a denied command ran")
	}
	if r := env.do("POST", "/v1/approvals/"+id, []byte(`{"decision":"allow-once"}`), nil); r.Status != 409 {
		t.Fatalf("second decision: %d %s", r.Status, r.Raw)
	}
}

// TestNodeApprovalTimeout: nobody answers; the node's askFallback deny
// decides: approval-timeout, nothing ran. With security full, ask always
// and askFallback full the command runs after the timeout.
func TestNodeApprovalTimeout(t *testing.T) {
	env, cfg, a := startNodeApproval(t, nodeAskFile, func(c *config.Config) { c.Tools.Exec.ApprovalTimeoutMs = 300 })
	marker := filepath.Join(cfg.Cwd, "timeout-marker")
	command := "touch " + marker
	id := pendingOnNode(t, env, a.ID(), command)
	ev := env.waitEvent(protocol.EventExecDenied)
	if want := fmt.Sprintf("Exec denied (node=%s id=%s, approval-timeout): %s", a.ID(), id, command); ev.Text != want {
		t.Fatalf("denied text %q, want %q", ev.Text, want)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("ran after a timeout with askFallback deny")
	}

	// ask always on the node, askFallback full: the timeout runs it.
	full := `{"version":1,"defaults":{"security":"full","ask":"always","askFallback":"full"},"agents":{}}`
	if err := os.WriteFile(approvals.Path(cfg.StateDir), []byte(full), 0o600); err != nil {
		t.Fatal(err)
	}
	id = pendingOnNode(t, env, a.ID(), command)
	fin := env.waitEvent(protocol.EventExecFinished)
	if !strings.HasPrefix(fin.Text, fmt.Sprintf("Exec finished (node=%s id=%s, session=", a.ID(), id)) || !strings.Contains(fin.Text, "code 0)") {
		t.Fatalf("finished: %q", fin.Text)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("askFallback full did not run: %v", err)
	}
}

// TestNodeApprovalAllowAlways: allow-always persists the resolved binary
// in the node's own file (not the gateway's); the next run needs no
// approval.
func TestNodeApprovalAllowAlways(t *testing.T) {
	env, cfg, a := startNodeApproval(t, nodeAskFile, nil)
	marker := filepath.Join(cfg.Cwd, "always-1")
	id := pendingOnNode(t, env, a.ID(), "touch "+marker)
	decide(t, env, id, DecisionAllowAlways)
	fin := env.waitEvent(protocol.EventExecFinished)
	if !strings.Contains(fin.Text, "code 0)") {
		t.Fatalf("finished: %q", fin.Text)
	}
	f, _, err := approvals.Load(approvals.Path(cfg.StateDir))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(f)
	touch, _ := filepath.EvalSymlinks("/usr/bin/touch")
	if touch == "" {
		touch, _ = filepath.EvalSymlinks("/bin/touch")
	}
	if !strings.Contains(string(b), touch) || strings.Contains(string(b), `"/bin/sh"`) {
		t.Fatalf("node file after allow-always (want %s): %s", touch, b)
	}
	if _, err := os.Stat(approvals.Path(env.stateDir)); err == nil {
		gf, _ := os.ReadFile(approvals.Path(env.stateDir))
		if strings.Contains(string(gf), touch) {
			t.Fatalf("allow-always went to the gateway's file: %s", gf)
		}
	}
	second := filepath.Join(cfg.Cwd, "always-2")
	res := env.invoke("exec", map[string]any{"command": "touch " + second, "host": "node"}, "")
	if res.Status() != protocol.StatusCompleted {
		t.Fatalf("second run: %s %v", res.Text(), res.Details)
	}
	if _, err := os.Stat(second); err != nil {
		t.Fatal(err)
	}
}
