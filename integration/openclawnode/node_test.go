package openclawnode

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/internal/openclawtest"
	"github.com/execmesh/execmesh/internal/testutil"
)

// Prompts of the scripted agent turns; each names what the model does.
const (
	promptHostExec   = "run-hostname-on-the-node"
	promptBackground = "background-session-on-the-node"
	promptDenied     = "allowlist-miss-on-the-node"
	promptRestarted  = "exec-after-a-restart-on-the-device-token"
)

// nodeRun is an execmesh node process serving the gateway.
type nodeRun struct {
	cmd      *exec.Cmd
	out      *testutil.SyncBuffer
	stateDir string
	deviceID string
	done     chan struct{}
}

// TestOpenClawAgentOnExecmeshNode runs the agent turns against one
// OpenClaw gateway (it takes 10 to 30 s to start on two cores; each turn
// a few seconds) and one node: first on both an execmesh gateway (NATS)
// and OpenClaw, one session core, then, after a restart, on OpenClaw
// alone.
func TestOpenClawAgentOnExecmeshNode(t *testing.T) {
	in := openclawtest.Require(t)
	bin := buildExecmesh(t)
	sleepToken := testutil.SleepToken()

	var mu sync.Mutex
	sessionID := ""
	model := openclawtest.NewModel(t, func(r openclawtest.Request) openclawtest.Reply {
		prompt := r.LastUser()
		step := r.Step()
		switch {
		case strings.Contains(prompt, promptHostExec) && step == 0:
			return openclawtest.Reply{ToolCalls: []openclawtest.ToolCall{{Name: "exec",
				Args: map[string]any{"command": "echo host=$(hostname); cat /proc/self/cgroup", "host": "node"}}}}
		case strings.Contains(prompt, promptBackground) && step == 0:
			return openclawtest.Reply{ToolCalls: []openclawtest.ToolCall{{Name: "execmesh_exec",
				Args: map[string]any{"command": "echo begun; sleep " + sleepToken, "background": true}}}}
		case strings.Contains(prompt, promptBackground) && step == 1:
			id := sessionIn(r)
			mu.Lock()
			sessionID = id
			mu.Unlock()
			return openclawtest.Reply{ToolCalls: []openclawtest.ToolCall{{Name: "execmesh_process",
				Args: map[string]any{"action": "poll", "sessionId": id, "timeout": 1000}}}}
		case strings.Contains(prompt, promptBackground) && step == 2:
			mu.Lock()
			id := sessionID
			mu.Unlock()
			return openclawtest.Reply{ToolCalls: []openclawtest.ToolCall{{Name: "execmesh_process",
				Args: map[string]any{"action": "kill", "sessionId": id}}}}
		case strings.Contains(prompt, promptRestarted) && step == 0:
			return openclawtest.Reply{ToolCalls: []openclawtest.ToolCall{{Name: "exec",
				Args: map[string]any{"command": "echo restarted-$((40+2))", "host": "node"}}}}
		case strings.Contains(prompt, promptDenied) && step == 0:
			return openclawtest.Reply{ToolCalls: []openclawtest.ToolCall{{Name: "exec",
				Args: map[string]any{"command": "id", "host": "node"}}}}
		}
		return openclawtest.Reply{Text: "done"}
	})
	gw := openclawtest.StartGateway(t, in, openclawtest.GatewayOptions{Model: model, Config: map[string]any{
		"tools": map[string]any{
			// The gateway leaves the decision to the node: its own policy
			// is full/off, so every run reaches the node's.
			"exec":       map[string]any{"host": "node", "security": "full", "ask": "off"},
			"toolSearch": false,
		},
	}})

	// The execmesh side: NATS and a gateway in the test process.
	natsURL, emGW := startExecmeshGateway(t)
	state := t.TempDir()
	id, err := bus.LoadOrCreateNodeIdentity(state)
	if err != nil {
		t.Fatal(err)
	}
	node := startNode(t, bin, gw, state, "--nats-url", natsURL, "--heartbeat", "200ms")
	parent := t // the node outlives each subtest
	if strings.Contains(node.out.String(), "without NATS") {
		t.Fatalf("the node ignored --nats-url:\n%s", node.out.String())
	}
	// A node on both waits for its execmesh pairing before it runs
	// anything (docs/openclaw-node.md).
	emGW.waitNode(t, id.NodeID)
	if r := emGW.do(t, "POST", "/v1/nodes/"+id.NodeID+"/approve", nil); r.status != 200 {
		t.Fatalf("approve on the execmesh gateway: %d %s", r.status, r.raw)
	}
	approveNode(t, gw, node)

	// (c) exec host=node runs on the execmesh node.
	t.Run("exec host=node", func(t *testing.T) {
		runTurn(t, gw, "agent:main:c", promptHostExec)
		res := toolResults(t, model, promptHostExec)
		t.Logf("the agent saw:\n%s", res)
		hostname, _ := os.Hostname()
		if !strings.Contains(res, "host="+hostname) {
			t.Fatalf("the agent's exec host=node did not run on the node (want host=%s):\n%s\nnode log:\n%s", hostname, res, node.out.String())
		}
		// Where the node contains sessions in cgroups, the command ran
		// in one of the node's.
		if strings.Contains(node.out.String(), "mode=cgroup") && !regexp.MustCompile(`/execmesh-[0-9]+-[0-9a-f]+/`).MatchString(res) {
			t.Errorf("the command did not run in the node's session cgroup:\n%s", res)
		}
		if !strings.Contains(res, "Node: "+node.deviceID) {
			t.Errorf("OpenClaw does not name the execmesh node as the host:\n%s", res)
		}
	})

	// (d) the plugin tools: a background session, polled, then killed.
	t.Run("plugin tools", func(t *testing.T) {
		runTurn(t, gw, "agent:main:d", promptBackground)
		req, ok := lastOfTurn(model, promptBackground)
		if !ok || req.Step() < 3 {
			t.Fatalf("the turn did not reach the kill: %s", transcript(model, promptBackground))
		}
		results := req.ToolResults()
		t.Logf("the agent saw:\n%s", req.Transcript())
		if len(results) < 3 {
			t.Fatalf("tool results: %s", req.Transcript())
		}
		if !strings.Contains(results[0].Text, "Command still running") {
			t.Errorf("execmesh_exec did not background the command: %s", results[0].Text)
		}
		if !strings.Contains(results[1].Text, "begun") {
			t.Errorf("execmesh_process poll did not show the output: %s", results[1].Text)
		}
		if !strings.Contains(results[2].Text, "Termination requested") {
			t.Errorf("execmesh_process kill: %s", results[2].Text)
		}
		deadline := time.Now().Add(15 * time.Second)
		for len(testutil.ProcsWith(sleepToken)) > 0 {
			if time.Now().After(deadline) {
				t.Fatal("the killed session's process still runs")
			}
			time.Sleep(50 * time.Millisecond)
		}
	})

	// The same node serves the execmesh gateway's callers, whose
	// sessionKeys do not reach the sessions OpenClaw's agent started.
	t.Run("execmesh gateway too", func(t *testing.T) {
		hostname, _ := os.Hostname()
		r := emGW.do(t, "POST", "/tools/invoke", map[string]any{"tool": "exec", "sessionKey": "agent:main:d",
			"args": map[string]any{"command": "echo via-nats=$(hostname)", "host": "node", "node": id.NodeID}})
		if r.status != 200 || r.result == nil || !strings.Contains(r.result.Text(), "via-nats="+hostname) {
			t.Fatalf("exec through the execmesh gateway: %d %s", r.status, r.raw)
		}
		own := testutil.SleepToken()
		r = emGW.do(t, "POST", "/tools/invoke", map[string]any{"tool": "exec", "sessionKey": "agent:main:d",
			"args": map[string]any{"command": "sleep " + own, "background": true, "host": "node", "node": id.NodeID}})
		if r.status != 200 || r.result == nil || r.result.SessionID() == "" {
			t.Fatalf("background exec through the execmesh gateway: %d %s", r.status, r.raw)
		}
		defer emGW.do(t, "POST", "/tools/invoke", map[string]any{"tool": "process", "sessionKey": "agent:main:d",
			"args": map[string]any{"action": "kill", "sessionId": r.result.SessionID()}})
		r = emGW.do(t, "POST", "/tools/invoke", map[string]any{"tool": "process", "sessionKey": "agent:main:d", "args": map[string]any{"action": "list"}})
		if r.status != 200 || !strings.Contains(string(r.raw), own) || strings.Contains(string(r.raw), sleepToken) {
			t.Errorf("the execmesh caller's list (agent:main:d) is not its own: %d %s", r.status, r.raw)
		}
	})

	// The node keeps the device token of hello-ok: started again without
	// the gateway token, and now without NATS, it connects with it and
	// serves the agent.
	t.Run("restart on the device token, OpenClaw only", func(t *testing.T) {
		node.stop(t)
		node = startNode(parent, bin, gw, node.stateDir, "--openclaw-token", "")
		if !strings.Contains(node.out.String(), "without NATS") {
			t.Errorf("the node did not start without NATS:\n%s", node.out.String())
		}
		runTurn(t, gw, "agent:main:r", promptRestarted)
		res := toolResults(t, model, promptRestarted)
		if !strings.Contains(res, "restarted-42") {
			t.Fatalf("exec after a restart without the gateway token:\n%s\nnode log:\n%s", res, node.out.String())
		}
	})

	// (e) an allowlist miss on the node comes back as SYSTEM_RUN_DENIED.
	t.Run("allowlist miss", func(t *testing.T) {
		// The node's approvals file, set from OpenClaw as an operator
		// would: `openclaw approvals set --node` reads it
		// (system.execApprovals.get, for the base hash), then replaces it
		// (system.execApprovals.set).
		approvals := filepath.Join(t.TempDir(), "approvals.json")
		if err := os.WriteFile(approvals, []byte(`{"version":1,"agents":{"main":{"security":"allowlist","ask":"off","allowlist":[]}}}`), 0o600); err != nil {
			t.Fatal(err)
		}
		openclaw(t, gw, "approvals", "set", "--node", node.deviceID, "--file", approvals)
		if got, err := os.ReadFile(filepath.Join(node.stateDir, "exec-approvals.json")); err != nil || !strings.Contains(string(got), `"allowlist"`) {
			t.Fatalf("the node's approvals file after openclaw approvals set: %s, %v", got, err)
		}
		runTurn(t, gw, "agent:main:e", promptDenied)
		res := toolResults(t, model, promptDenied)
		t.Logf("the agent saw:\n%s", res)
		if !strings.Contains(res, "SYSTEM_RUN_DENIED") || !strings.Contains(res, "denied before execution") {
			t.Fatalf("the node's denial did not reach the agent as SYSTEM_RUN_DENIED:\n%s\nnode log:\n%s", res, node.out.String())
		}
		if strings.Contains(res, "uid=") {
			t.Errorf("the denied command ran:\n%s", res)
		}
	})
}

// sessionIn returns the session id named by the turn's first tool result.
func sessionIn(r openclawtest.Request) string {
	for _, m := range r.ToolResults() {
		if s := regexp.MustCompile(`session ([a-z0-9-]+),`).FindStringSubmatch(m.Text); s != nil {
			return s[1]
		}
	}
	return "none"
}

func toolResults(t *testing.T, m *openclawtest.Model, marker string) string {
	t.Helper()
	req, ok := lastOfTurn(m, marker)
	if !ok {
		t.Fatalf("the model never saw %q", marker)
	}
	var b strings.Builder
	for _, r := range req.ToolResults() {
		b.WriteString(r.Text)
		b.WriteString("\n")
	}
	if b.Len() == 0 {
		t.Fatalf("no tool results in the turn:\n%s", req.Transcript())
	}
	return b.String()
}

// lastOfTurn returns the last model request of the turn whose prompt
// holds marker. Requests after it may repeat the turn's messages: the
// exec.finished of a node run can make OpenClaw wake the session with an
// "async command completion event" prompt of its own.
func lastOfTurn(m *openclawtest.Model, marker string) (openclawtest.Request, bool) {
	reqs := m.Requests()
	for i := len(reqs) - 1; i >= 0; i-- {
		if strings.Contains(reqs[i].LastUser(), marker) {
			return reqs[i], true
		}
	}
	return openclawtest.Request{}, false
}

func transcript(m *openclawtest.Model, marker string) string {
	req, _ := lastOfTurn(m, marker)
	return req.Transcript()
}

func runTurn(t *testing.T, gw *openclawtest.Gateway, sessionKey, prompt string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if _, err := gw.Agent(ctx, sessionKey, prompt); err != nil {
		t.Fatalf("agent turn: %v\ngateway log:\n%s", err, tailOf(gw.Log(), 6000))
	}
}

func tailOf(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// buildExecmesh builds cmd/execmesh into the test's temporary directory.
func buildExecmesh(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "execmesh")
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/execmesh")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

var deviceLine = regexp.MustCompile(`OpenClaw device ([0-9a-f]{64})`)

// startNode runs `execmesh node --openclaw-gateway` (without NATS unless
// extra says otherwise) under security full and ask off (the approvals
// file may tighten it; OpenClaw may replace the file), until the test
// ends, and waits until it is connected to OpenClaw.
func startNode(t *testing.T, bin string, gw *openclawtest.Gateway, stateDir string, extra ...string) *nodeRun {
	t.Helper()
	if stateDir == "" {
		stateDir = t.TempDir()
	}
	n := &nodeRun{out: &testutil.SyncBuffer{}, stateDir: stateDir, done: make(chan struct{})}
	n.cmd = exec.Command(bin, append([]string{"node", "--state-dir", n.stateDir, "--name", "execmesh-test-node",
		"--openclaw-gateway", "ws://127.0.0.1:" + strconv.Itoa(gw.Port), "--openclaw-approvals-set",
		"--security", "full", "--ask", "off", "--log-level", "debug"}, extra...)...)
	n.cmd.Env = os.Environ()
	if !slices.Contains(extra, "--openclaw-token") {
		n.cmd.Env = append(n.cmd.Env, "EXECMESH_OPENCLAW_TOKEN="+gw.Token)
	}
	n.cmd.Stdout, n.cmd.Stderr = n.out, n.out
	n.cmd.Dir = t.TempDir()
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = n.cmd.Wait()
		close(n.done)
	}()
	t.Cleanup(func() { n.stop(t) })
	deadline := time.Now().Add(30 * time.Second)
	for {
		s := n.out.String()
		if m := deviceLine.FindStringSubmatch(s); m != nil && strings.Contains(s, "plugin tools published") {
			n.deviceID = m[1]
			return n
		}
		select {
		case <-n.done:
			t.Fatalf("execmesh node exited:\n%s", s)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("execmesh node did not connect:\n%s", s)
		}
	}
}

// stop ends the node (SIGTERM, then SIGKILL of its group after 20 s).
func (n *nodeRun) stop(t *testing.T) {
	select {
	case <-n.done:
		return
	default:
	}
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.done:
	case <-time.After(20 * time.Second):
		_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
		<-n.done
	}
	if t.Failed() {
		t.Logf("node log:\n%s", tailOf(n.out.String(), 8000))
	}
}

// openclaw runs the OpenClaw CLI against gw and returns its stdout.
func openclaw(t *testing.T, gw *openclawtest.Gateway, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := gw.Command(ctx, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("openclaw %s: %v\n%s\n%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.Bytes()
}

// approveNode waits until the node's pairing request is pending on the
// gateway (`openclaw nodes pending`) and approves it (`openclaw nodes
// approve`), as an operator would.
func approveNode(t *testing.T, gw *openclawtest.Gateway, n *nodeRun) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		var pending []struct {
			RequestID string `json:"requestId"`
			NodeID    string `json:"nodeId"`
		}
		out := openclaw(t, gw, "nodes", "pending", "--json")
		if err := json.Unmarshal(bytes.TrimSpace(out), &pending); err != nil {
			t.Fatalf("nodes pending --json: %v\n%s", err, out)
		}
		for _, p := range pending {
			if p.NodeID == n.deviceID {
				openclaw(t, gw, "nodes", "approve", p.RequestID)
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s never pending on the gateway: %s", n.deviceID, out)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
