package openclawnode

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/execmesh/execmesh/host"
	"github.com/execmesh/execmesh/internal/testutil"
	"github.com/execmesh/execmesh/nodeagent"
)

func TestSignaturePayload(t *testing.T) {
	tests := []struct {
		name string
		p    SignatureParams
		want string
	}{
		{"node host with a token",
			SignatureParams{DeviceID: "abc", ClientID: "node-host", ClientMode: "node", Role: "node", Scopes: []string{},
				SignedAtMs: 1765000000000, Token: "tok", Nonce: "n-1", Platform: "linux"},
			"v3|abc|node-host|node|node||1765000000000|tok|n-1|linux|"},
		{"no token, scopes joined",
			SignatureParams{DeviceID: "abc", ClientID: "cli", ClientMode: "cli", Role: "operator", Scopes: []string{"operator.read", "operator.write"},
				SignedAtMs: 7, Nonce: "n"},
			"v3|abc|cli|cli|operator|operator.read,operator.write|7||n||"},
		{"platform and family trimmed, ASCII upper case lowered only",
			SignatureParams{DeviceID: "d", ClientID: "node-host", ClientMode: "node", Role: "node",
				SignedAtMs: 1, Token: "T", Nonce: "N", Platform: "  Linux ", DeviceFamily: "ÉPC"},
			"v3|d|node-host|node|node||1|T|N|linux|Épc"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := SignaturePayload(tt.p); got != tt.want {
				t.Errorf("SignaturePayload = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestIdentity(t *testing.T) {
	dir := t.TempDir()
	id, err := LoadOrCreateIdentity(dir)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(id.PublicKey)
	if id.DeviceID != hex.EncodeToString(sum[:]) {
		t.Errorf("deviceId %s is not hex(sha256(public key))", id.DeviceID)
	}
	st, err := os.Stat(filepath.Join(dir, IdentityFile))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("identity file: %v, mode %v", err, st.Mode())
	}
	again, err := LoadOrCreateIdentity(dir)
	if err != nil || again.DeviceID != id.DeviceID {
		t.Fatalf("reloaded identity %s, %v; want %s", again.DeviceID, err, id.DeviceID)
	}
	pub, _ := base64.RawURLEncoding.DecodeString(id.PublicKeyBase64URL())
	sig, _ := base64.RawURLEncoding.DecodeString(id.Sign("v3|x"))
	if !ed25519.Verify(pub, []byte("v3|x"), sig) {
		t.Error("signature does not verify with the published key")
	}

	bad := []struct{ name, content, want string }{
		{"not JSON", "{", "openclawnode:"},
		{"bad seed", `{"version":1,"deviceId":"x","seed":"!!"}`, "not a base64url Ed25519 seed"},
		{"id of another key", `{"version":1,"deviceId":"beef","seed":"` + base64.RawURLEncoding.EncodeToString(make([]byte, 32)) + `"}`, "does not match its key"},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			d := t.TempDir()
			if err := os.WriteFile(filepath.Join(d, IdentityFile), []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := LoadOrCreateIdentity(d); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestDecodeFrame(t *testing.T) {
	tests := []struct {
		name, in, wantErr string
	}{
		{"request", `{"type":"req","id":"1","method":"node.invoke.result","params":{}}`, ""},
		{"response", `{"type":"res","id":"1","ok":false,"error":{"code":"X","message":"m"}}`, ""},
		{"event", `{"type":"event","event":"tick","payload":{"ts":1},"seq":3}`, ""},
		{"request without method", `{"type":"req","id":"1"}`, "without id or method"},
		{"response without ok", `{"type":"res","id":"1"}`, "without id or ok"},
		{"event without name", `{"type":"event"}`, "without an event name"},
		{"unknown type", `{"type":"hello"}`, `unknown type "hello"`},
		{"trailing data", `{"type":"event","event":"tick"} {}`, "data after the JSON object"},
		{"not JSON", `tick`, "malformed frame"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeFrame([]byte(tt.in))
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("DecodeFrame(%s) = %v, want %q", tt.in, err, tt.wantErr)
			}
		})
	}
}

func TestConnectSignsAndKeepsDeviceToken(t *testing.T) {
	g := newFakeGateway(t)
	c, _ := startClient(t, g, nil)
	gc := g.next(t)
	p := gc.connect
	if !gc.sigOK {
		t.Fatal("the connect request's v3 device signature does not verify")
	}
	if p.Client.ID != ClientID || p.Client.Mode != ClientMode || p.Role != Role || p.MinProtocol != 4 || p.MaxProtocol != 4 ||
		p.Auth == nil || p.Auth.Token != "gw-token" || p.Device.ID != c.DeviceID() || len(p.Scopes) != 0 {
		t.Errorf("connect params %+v", p)
	}
	for _, cmd := range []string{CmdSystemRun, CmdSystemRunPrepare, CmdSystemWhich, CmdExecApprovalsGet, CmdExecApprovalsSet, CmdMCPToolsCall} {
		if !strings.Contains(strings.Join(p.Commands, ","), cmd) {
			t.Errorf("command %s not declared: %v", cmd, p.Commands)
		}
	}
	tools := gc.request(t, "node.pluginTools.update", nil)
	var upd struct{ Tools []ToolDescriptor }
	if err := json.Unmarshal(tools, &upd); err != nil || len(upd.Tools) != 2 || upd.Tools[0].Name != ToolExecName ||
		upd.Tools[0].PluginID != "node-mcp" || upd.Tools[1].MCP.Tool != "process" {
		t.Errorf("plugin tools %s (%v)", tools, err)
	}
	// hello-ok's device token is kept for this gateway, private.
	data, err := os.ReadFile(filepath.Join(c.cfg.StateDir, DeviceTokenFile))
	if err != nil || !strings.Contains(string(data), `"devtok-1"`) {
		t.Fatalf("device token file: %s, %v", data, err)
	}
	if st, _ := os.Stat(filepath.Join(c.cfg.StateDir, DeviceTokenFile)); st.Mode().Perm() != 0o600 {
		t.Errorf("device token file mode %v", st.Mode())
	}
}

func TestDeviceTokenWithoutGatewayToken(t *testing.T) {
	g := newFakeGateway(t)
	state := t.TempDir()
	if err := saveDeviceToken(state, deviceToken{Gateway: g.url(), DeviceID: mustIdentity(t, state).DeviceID, Role: "node", Token: "saved"}); err != nil {
		t.Fatal(err)
	}
	startClient(t, g, func(c *Config) { c.Token, c.StateDir = "", state })
	gc := g.next(t)
	if gc.connect.Auth == nil || gc.connect.Auth.DeviceToken != "saved" || gc.connect.Auth.Token != "" || !gc.sigOK {
		t.Errorf("auth %+v, signature ok %v: want the saved device token, signed", gc.connect.Auth, gc.sigOK)
	}
}

func mustIdentity(t *testing.T, dir string) Identity {
	t.Helper()
	id, err := LoadOrCreateIdentity(dir)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestSystemRun(t *testing.T) {
	g := newFakeGateway(t)
	c, _ := startClient(t, g, nil)
	gc := g.next(t)
	argv := []string{"/bin/sh", "-lc", "echo out-$((6*7)); echo err >&2; exit 3"}
	gc.invoke(t, "p1", c.DeviceID(), CmdSystemRunPrepare, map[string]any{"command": argv, "rawCommand": argv[2], "agentId": "main", "sessionKey": "agent:main:main"}, "")
	r := gc.result(t, "p1")
	var prep struct {
		Plan runPlan `json:"plan"`
	}
	if !r.OK || json.Unmarshal([]byte(r.PayloadJSON), &prep) != nil || prep.Plan.CommandText != argv[2] || len(prep.Plan.Argv) != 3 {
		t.Fatalf("prepare: %+v", r)
	}
	gc.invoke(t, "r1", c.DeviceID(), CmdSystemRun, map[string]any{"command": argv, "rawCommand": argv[2], "systemRunPlan": prep.Plan,
		"agentId": "main", "sessionKey": "agent:main:main", "runId": "run-1", "timeoutMs": 30000}, "")
	r = gc.result(t, "r1")
	var out struct {
		ExitCode *int   `json:"exitCode"`
		Success  bool   `json:"success"`
		Stdout   string `json:"stdout"`
	}
	if !r.OK || json.Unmarshal([]byte(r.PayloadJSON), &out) != nil || out.ExitCode == nil || *out.ExitCode != 3 || out.Success ||
		!strings.Contains(out.Stdout, "out-42") || !strings.Contains(out.Stdout, "err") {
		t.Fatalf("system.run result %+v", r)
	}
	ev := gc.nodeEvent(t, "exec.finished", func(m map[string]any) bool { return m["runId"] == "run-1" })
	if ev["exitCode"] != float64(3) || ev["success"] != false || ev["sessionKey"] != "agent:main:main" || ev["host"] != "node" {
		t.Errorf("exec.finished %v", ev)
	}

	gc.invoke(t, "w1", c.DeviceID(), CmdSystemWhich, map[string]any{"bins": []string{"sh", "no-such-bin-x"}}, "")
	r = gc.result(t, "w1")
	if !r.OK || !strings.Contains(r.PayloadJSON, `"sh":"/`) || strings.Contains(r.PayloadJSON, "no-such-bin-x") {
		t.Errorf("system.which %+v", r)
	}
}

// TestSystemRunDeniedByNodePolicy: what the node's policy would not run
// is OpenClaw's SYSTEM_RUN_DENIED with an exec.denied event, and runs
// nothing, whatever OpenClaw's own approval says.
func TestSystemRunDeniedByNodePolicy(t *testing.T) {
	tests := []struct {
		name, security, ask string
		env                 map[string]string
		reason, msg         string
	}{
		{"allowlist miss, ask off", "allowlist", "off", nil, "security-policy", "SYSTEM_RUN_DENIED: exec denied: allowlist miss"},
		{"allowlist miss, ask on-miss", "allowlist", "on-miss", nil, "approval-required", "SYSTEM_RUN_DENIED: approval required (execmesh node policy:"},
		{"security deny", "deny", "off", nil, "security-policy", "SYSTEM_RUN_DENIED: "},
		{"a loader hook in env", "full", "off", map[string]string{"LD_PRELOAD": "/tmp/x.so"}, "security-policy", "SYSTEM_RUN_DENIED: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := newFakeGateway(t)
			marker := filepath.Join(t.TempDir(), "ran")
			c, _ := startClient(t, g, func(c *Config) { c.Security, c.Ask = tt.security, tt.ask })
			gc := g.next(t)
			argv := []string{"/bin/sh", "-lc", "touch " + marker}
			// An OpenClaw approval does not loosen the node's policy.
			gc.invoke(t, "d1", c.DeviceID(), CmdSystemRun, map[string]any{"command": argv, "sessionKey": "agent:main:main", "runId": "run-d",
				"approved": true, "approvalDecision": "allow-once", "env": tt.env}, "")
			r := gc.result(t, "d1")
			if r.OK || r.Error == nil || r.Error.Code != CodeSystemRunDenied || !strings.HasPrefix(r.Error.Message, tt.msg) {
				t.Fatalf("result %+v, want SYSTEM_RUN_DENIED %q", r, tt.msg)
			}
			ev := gc.nodeEvent(t, "exec.denied", func(m map[string]any) bool { return m["runId"] == "run-d" })
			if ev["host"] != "node" || ev["command"] != "touch "+marker || ev["reason"] != tt.reason || ev["sessionKey"] != "agent:main:main" {
				t.Errorf("exec.denied %v", ev)
			}
			if _, err := os.Stat(marker); err == nil {
				t.Error("the denied command ran")
			}
		})
	}
}

func TestBadInput(t *testing.T) {
	g := newFakeGateway(t)
	c, logs := startClient(t, g, nil)
	gc := g.next(t)
	marker := filepath.Join(t.TempDir(), "ran")
	run := map[string]any{"command": []string{"/bin/sh", "-lc", "touch " + marker}, "sessionKey": "s"}

	// A request for a method the node does not have.
	if err := gc.ws.Write(t.Context(), websocket.MessageText, []byte(`{"type":"req","id":"q1","method":"node.reboot","params":{}}`)); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, id, nodeID, command string
		params                    any
		raw                       *string
		code, msg                 string
	}{
		{"unknown command", "b1", c.DeviceID(), "camera.snap", map[string]any{}, nil, CodeUnavailable, "command not supported"},
		{"another node's invoke", "b2", "someone-else", CmdSystemRun, run, nil, CodeInvalidRequest, "reached node"},
		{"malformed params", "b3", c.DeviceID(), CmdSystemRun, nil, ptr(`{"command":`), CodeInvalidRequest, "INVALID_REQUEST"},
		{"command of the wrong type", "b4", c.DeviceID(), CmdSystemRun, nil, ptr(`{"command":"touch x"}`), CodeInvalidRequest, "INVALID_REQUEST"},
		{"oversized params", "b5", c.DeviceID(), CmdSystemRun, nil, ptr(`{"command":["` + strings.Repeat("a", maxParamsBytes) + `"]}`), CodeInvalidRequest, "paramsJSON of"},
		{"plan for another command", "b6", c.DeviceID(), CmdSystemRun, map[string]any{"command": []string{"/bin/sh", "-lc", "touch " + marker},
			"systemRunPlan": runPlan{Argv: []string{"/bin/sh", "-lc", "true"}, CommandText: "true"}}, nil, CodeInvalidRequest, "plan mismatch"},
		{"rawCommand that is not the command", "b7", c.DeviceID(), CmdSystemRun, map[string]any{"command": []string{"/bin/sh", "-lc", "touch " + marker},
			"rawCommand": "true"}, nil, CodeInvalidRequest, "rawCommand does not match"},
		{"which without bins", "b8", c.DeviceID(), CmdSystemWhich, map[string]any{}, nil, CodeInvalidRequest, "bins required"},
		{"MCP call to another server", "b9", c.DeviceID(), CmdMCPToolsCall, map[string]any{"server": "other", "tool": "exec"}, nil, "MCP_SERVER_UNAVAILABLE", "not on this node"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := tt.raw
			if p == nil {
				s := string(mustJSON(tt.params))
				p = &s
			}
			gc.event(t, "node.invoke.request", InvokeRequest{ID: tt.id, NodeID: tt.nodeID, Command: tt.command, ParamsJSON: p})
			r := gc.result(t, tt.id)
			if r.OK || r.Error == nil || r.Error.Code != tt.code || !strings.Contains(r.Error.Message, tt.msg) {
				t.Errorf("result %+v, want %s %q", r, tt.code, tt.msg)
			}
			if r.NodeID != c.DeviceID() {
				t.Errorf("result names node %q", r.NodeID)
			}
		})
	}
	t.Run("replayed invoke id", func(t *testing.T) {
		gc.invoke(t, "b1", c.DeviceID(), CmdSystemRun, run, "")
		deadline := time.Now().Add(10 * time.Second)
		for {
			gc.mu.Lock()
			n := 0
			var last InvokeResult
			for _, f := range gc.reqs {
				var r InvokeResult
				if f.Method == "node.invoke.result" && json.Unmarshal(f.Params, &r) == nil && r.ID == "b1" {
					n, last = n+1, r
				}
			}
			gc.mu.Unlock()
			if n == 2 {
				if last.OK || last.Error.Code != CodeInvalidRequest || !strings.Contains(last.Error.Message, "received before") {
					t.Errorf("replay answered %+v", last)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("no answer to the replayed invoke")
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	t.Run("unknown method", func(t *testing.T) {
		deadline := time.Now().Add(10 * time.Second)
		for {
			gc.mu.Lock()
			var found *Frame
			for i, f := range gc.ress {
				if f.ID == "q1" {
					found = &gc.ress[i]
				}
			}
			gc.mu.Unlock()
			if found != nil {
				if *found.OK || found.Error.Code != CodeInvalidRequest || found.Error.Message != "unknown method: node.reboot" {
					t.Errorf("answer %+v", found)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("no answer to the unknown method")
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	if _, err := os.Stat(marker); err == nil {
		t.Error("a refused invoke ran its command")
	}
	for _, line := range []string{"unknown method on the node", "invoke for another node refused", "invoke id replayed", "does not serve", "plan does not match"} {
		waitLog(t, logs, line)
	}
}

func ptr(s string) *string { return &s }

func TestReplayedNonceRefused(t *testing.T) {
	g := newFakeGateway(t)
	g.nonce = func(int) string { return "the-same-nonce" }
	_, logs := startClient(t, g, nil)
	first := g.next(t)
	if !first.sigOK {
		t.Fatal("first connect not signed")
	}
	// The gateway drops the socket and challenges with the same nonce.
	_ = first.ws.Close(websocket.StatusGoingAway, "restart")
	waitLog(t, logs, "replays nonce")
	select {
	case c := <-g.added:
		t.Fatalf("the node signed a replayed nonce: %+v", c.connect.Device)
	case <-time.After(300 * time.Millisecond):
	}
}

func TestOversizedFrameClosesCleanly(t *testing.T) {
	g := newFakeGateway(t)
	_, logs := startClient(t, g, func(c *Config) { c.MaxFrameBytes = 4096 })
	gc := g.next(t)
	gc.event(t, "tick", map[string]any{"pad": strings.Repeat("x", 8192)})
	<-gc.done
	if gc.closeSt != websocket.StatusMessageTooBig {
		t.Errorf("close status %v, want 1009", gc.closeSt)
	}
	waitLog(t, logs, "above the size limit")
	g.next(t) // and it reconnects
}

func TestTickTimeoutReconnects(t *testing.T) {
	g := newFakeGateway(t)
	g.tickMs = 100
	_, logs := startClient(t, g, nil)
	first := g.next(t)
	<-first.done // no ticks: the node closes
	waitLog(t, logs, "no tick from the OpenClaw gateway")
	g.next(t)
}

func TestSocketDropMidInvoke(t *testing.T) {
	g := newFakeGateway(t)
	c, logs := startClient(t, g, nil)
	gc := g.next(t)
	token := testutil.SleepToken()
	gc.invoke(t, "long", c.DeviceID(), CmdSystemRun, map[string]any{"command": []string{"/bin/sh", "-lc", "sleep " + token}, "sessionKey": "s"}, "")
	deadline := time.Now().Add(10 * time.Second)
	for len(testutil.ProcsWith(token)) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the command never started")
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = gc.ws.CloseNow()
	waitLog(t, logs, "invoke result not delivered: the connection to the OpenClaw gateway was lost")
	deadline = time.Now().Add(10 * time.Second)
	for len(testutil.ProcsWith(token)) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the run of a lost invoke still runs")
		}
		time.Sleep(20 * time.Millisecond)
	}
	g.next(t) // reconnected
}

func TestPluginToolsScopedBySessionKey(t *testing.T) {
	g := newFakeGateway(t)
	c, _ := startClient(t, g, nil)
	gc := g.next(t)
	call := func(id, key, tool string, args map[string]any) map[string]any {
		t.Helper()
		gc.invoke(t, id, c.DeviceID(), CmdMCPToolsCall, map[string]any{"server": "execmesh", "tool": tool, "arguments": args}, key)
		r := gc.result(t, id)
		if !r.OK {
			t.Fatalf("%s: %+v", id, r.Error)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(r.PayloadJSON), &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	res := call("e1", "agent:main:main", "exec", map[string]any{"command": "echo started; sleep 60", "background": true})
	// The text alone: OpenClaw would show structured content to the
	// model too, repeating the output.
	if _, ok := res["structuredContent"]; ok {
		t.Errorf("exec result carries structured content: %v", res)
	}
	m := regexp.MustCompile(`session ([a-z0-9-]+)`).FindStringSubmatch(mustText(res))
	if m == nil || !strings.Contains(mustText(res), "running") {
		t.Fatalf("exec result %v", res)
	}
	id := m[1]
	// The follow-up names the tool OpenClaw's agent has, not "process".
	if txt := mustText(res); !strings.Contains(txt, "Use execmesh_process (list/poll") || strings.Contains(txt, "Use process (") {
		t.Errorf("follow-up hint: %q", txt)
	}
	other := call("e2", "agent:other:main", "process", map[string]any{"action": "poll", "sessionId": id})
	if other["isError"] != true {
		t.Errorf("another sessionKey polled the session: %v", other)
	}
	poll := call("e3", "agent:main:main", "process", map[string]any{"action": "poll", "sessionId": id, "timeout": 2000})
	if poll["isError"] == true || !strings.Contains(mustText(poll), "started") || !strings.Contains(mustText(poll), "running") {
		t.Errorf("poll %v", poll)
	}
	list := call("e4", "agent:main:main", "process", map[string]any{"action": "list"})
	if !strings.Contains(mustText(list), id) {
		t.Errorf("list %v", list)
	}
	call("e5", "agent:main:main", "process", map[string]any{"action": "kill", "sessionId": id})
	ev := gc.nodeEvent(t, "exec.finished", func(m map[string]any) bool { return m["runId"] == id })
	if ev["sessionKey"] != "agent:main:main" {
		t.Errorf("exec.finished %v", ev)
	}
	bad := call("e6", "agent:main:main", "exec", map[string]any{"command": "true", "host": "gateway"})
	if bad["isError"] != true || !strings.Contains(mustText(bad), "host not allowed") {
		t.Errorf("host=gateway through the node's tool: %v", bad)
	}
}

func mustText(m map[string]any) string {
	var b strings.Builder
	content, _ := m["content"].([]any)
	for _, c := range content {
		if c, ok := c.(map[string]any); ok {
			s, _ := c["text"].(string)
			b.WriteString(s)
		}
	}
	return b.String()
}

// TestExecApprovalsGetSet: system.execApprovals.get on a node without an
// approvals file creates an empty one (as OpenClaw's node host does), so
// that a replace has a base hash; set replaces it given that hash and
// refuses a stale one. The node agent's own file store serves both.
func TestExecApprovalsGetSet(t *testing.T) {
	cfg := nodeagent.DefaultConfig()
	cfg.StateDir = t.TempDir()
	cfg.Cwd = t.TempDir()
	cfg.Confine = host.ConfineConfig{Helper: "/proc/self/exe"}
	a, err := nodeagent.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.StartLocal(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close(context.Background()) })
	file := map[string]any{"version": 1, "agents": map[string]any{"main": map[string]any{"security": "allowlist", "allowlist": []any{map[string]any{"pattern": "/usr/bin/id"}}}}}

	// By default the OpenClaw gateway may read the file, not replace it:
	// it is the node's policy for every gateway the node serves.
	ro := newFakeGateway(t)
	rc, _ := startClient(t, ro, func(c *Config) {
		c.Host, c.ApprovalsGet, c.ApprovalsSet = a.Host(), a.ApprovalsGet, a.ApprovalsSet
	})
	rgc := ro.next(t)
	rgc.invoke(t, "ro-g", rc.DeviceID(), CmdExecApprovalsGet, map[string]any{}, "")
	var before struct {
		Hash string `json:"hash"`
	}
	if r := rgc.result(t, "ro-g"); !r.OK || json.Unmarshal([]byte(r.PayloadJSON), &before) != nil {
		t.Fatalf("get: %+v", r)
	}
	rgc.invoke(t, "ro-s", rc.DeviceID(), CmdExecApprovalsSet, map[string]any{"file": file, "baseHash": before.Hash}, "")
	if r := rgc.result(t, "ro-s"); r.OK || !strings.Contains(r.Error.Message, "read-only to the OpenClaw gateway") {
		t.Fatalf("set without ApprovalsWritable: %+v", r)
	}

	g := newFakeGateway(t)
	c, _ := startClient(t, g, func(c *Config) {
		c.Host, c.ApprovalsGet, c.ApprovalsSet = a.Host(), a.ApprovalsGet, a.ApprovalsSet
		c.ApprovalsWritable = true
	})
	gc := g.next(t)
	type view struct {
		Exists bool           `json:"exists"`
		Hash   string         `json:"hash"`
		File   map[string]any `json:"file"`
	}
	get := func(id string) view {
		gc.invoke(t, id, c.DeviceID(), CmdExecApprovalsGet, map[string]any{}, "")
		r := gc.result(t, id)
		var v view
		if !r.OK || json.Unmarshal([]byte(r.PayloadJSON), &v) != nil {
			t.Fatalf("get: %+v", r)
		}
		return v
	}
	v := get("g1")
	if !v.Exists || v.Hash == "" || v.Hash != before.Hash {
		t.Fatalf("get: %+v, want the empty file the read-only client saw (hash %s)", v, before.Hash)
	}
	gc.invoke(t, "s1", c.DeviceID(), CmdExecApprovalsSet, map[string]any{"file": file, "baseHash": "stale"}, "")
	if r := gc.result(t, "s1"); r.OK || !strings.Contains(r.Error.Message, "changed; reload and retry") {
		t.Errorf("set on a stale hash: %+v", r)
	}
	gc.invoke(t, "s2", c.DeviceID(), CmdExecApprovalsSet, map[string]any{"file": file, "baseHash": v.Hash}, "")
	if r := gc.result(t, "s2"); !r.OK || !strings.Contains(r.PayloadJSON, "/usr/bin/id") {
		t.Fatalf("set: %+v", r)
	}
	if v2 := get("g2"); v2.Hash == v.Hash || !strings.Contains(fmt.Sprint(v2.File), "/usr/bin/id") {
		t.Errorf("after set: %+v", v2)
	}
}

// TestInvokeFloodAndCancel: invokes beyond MaxInvokes are answered
// UNAVAILABLE and run nothing; node.invoke.cancel stops a running one.
func TestInvokeFloodAndCancel(t *testing.T) {
	g := newFakeGateway(t)
	c, logs := startClient(t, g, func(c *Config) { c.MaxInvokes = 2 })
	gc := g.next(t)
	tokens := []string{testutil.SleepToken(), testutil.SleepToken(), testutil.SleepToken()}
	for i, tok := range tokens[:2] {
		gc.invoke(t, "long"+strconv.Itoa(i), c.DeviceID(), CmdSystemRun, map[string]any{"command": []string{"/bin/sh", "-lc", "sleep " + tok}, "sessionKey": "s"}, "")
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(testutil.ProcsWith(tokens[0])) == 0 || len(testutil.ProcsWith(tokens[1])) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the first two runs never started")
		}
		time.Sleep(20 * time.Millisecond)
	}
	gc.invoke(t, "third", c.DeviceID(), CmdSystemRun, map[string]any{"command": []string{"/bin/sh", "-lc", "sleep " + tokens[2]}, "sessionKey": "s"}, "")
	if r := gc.result(t, "third"); r.OK || r.Error.Code != CodeUnavailable || !strings.Contains(r.Error.Message, "node busy") {
		t.Errorf("third invoke: %+v", r)
	}
	if len(testutil.ProcsWith(tokens[2])) != 0 {
		t.Error("the refused invoke ran")
	}
	waitLog(t, logs, "too many at once")
	for i := range 2 {
		gc.event(t, "node.invoke.cancel", InvokeCancel{InvokeID: "long" + strconv.Itoa(i), NodeID: c.DeviceID()})
	}
	deadline = time.Now().Add(10 * time.Second)
	for len(testutil.ProcsWith(tokens[0]))+len(testutil.ProcsWith(tokens[1])) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("cancelled runs still run")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Cancelled runs are answered (the gateway gave up on them), and
	// the slots are free again.
	gc.result(t, "long0")
	gc.invoke(t, "after", c.DeviceID(), CmdSystemWhich, map[string]any{"bins": []string{"sh"}}, "")
	if r := gc.result(t, "after"); !r.OK {
		t.Errorf("invoke after the cancels: %+v", r)
	}
}

// TestRefusedConnectBacksOff: a gateway that refuses the connect is
// retried with a growing delay, and the refusal is logged with the
// gateway's reason.
func TestRefusedConnectBacksOff(t *testing.T) {
	g := newFakeGateway(t)
	g.refuse = &ErrorShape{Code: "INVALID_REQUEST", Message: "unauthorized: gateway token mismatch", Details: json.RawMessage(`{"code":"AUTH_TOKEN_MISMATCH"}`)}
	_, logs := startClient(t, g, func(c *Config) { c.ReconnectMin, c.ReconnectMax = 20*time.Millisecond, 400*time.Millisecond })
	var at []time.Time
	deadline := time.Now().Add(20 * time.Second)
	for len(at) < 6 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d connects", len(at))
		}
		time.Sleep(20 * time.Millisecond)
		g.mu.Lock()
		at = append([]time.Time(nil), g.connects...)
		g.mu.Unlock()
	}
	first, last := at[1].Sub(at[0]), at[5].Sub(at[4])
	if last < 3*first || last < 100*time.Millisecond {
		t.Errorf("no backoff: gaps %v then %v (connects at %v)", first, last, at)
	}
	waitLog(t, logs, "gateway token mismatch")
	waitLog(t, logs, "refused the node's connect")
}

// TestRunsStayBeneathWorkdir: OpenClaw's runs work beneath the node's
// working directory. A cwd outside it (an absolute one, a relative one
// climbing out, a symbolic link pointing out) is refused by prepare, by
// system.run and by execmesh_exec, and nothing runs; a cwd beneath it
// runs there, and no cwd runs in the workdir itself. A confined command
// may write beneath its working directory, so a gateway choosing /etc
// could otherwise plant what runs later outside any policy.
func TestRunsStayBeneathWorkdir(t *testing.T) {
	work, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	outside := t.TempDir()
	if err := os.Mkdir(filepath.Join(work, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(work, "out")); err != nil {
		t.Fatal(err)
	}
	g := newFakeGateway(t)
	c, _ := startClient(t, g, func(c *Config) { c.Workdir = work })
	gc := g.next(t)
	run := func(id, cwd string) InvokeResult {
		t.Helper()
		params := map[string]any{"command": []string{"/bin/sh", "-lc", "pwd > ran"}, "sessionKey": "agent:main:main"}
		if cwd != "" {
			params["cwd"] = cwd
		}
		gc.invoke(t, id, c.DeviceID(), CmdSystemRun, params, "")
		return gc.result(t, id)
	}
	for i, cwd := range []string{outside, "/etc", "../", "out", filepath.Join(work, "sub", "..", "..")} {
		if r := run(fmt.Sprint("bad", i), cwd); r.OK || r.Error == nil || r.Error.Code != CodeInvalidRequest || !strings.Contains(r.Error.Message, "outside this node's working directory") {
			t.Errorf("system.run with cwd %q: %+v", cwd, r)
		}
		gc.invoke(t, fmt.Sprint("prep", i), c.DeviceID(), CmdSystemRunPrepare, map[string]any{"command": []string{"/bin/true"}, "cwd": cwd}, "")
		if r := gc.result(t, fmt.Sprint("prep", i)); r.OK {
			t.Errorf("prepare with cwd %q: %+v", cwd, r)
		}
		gc.invoke(t, fmt.Sprint("tool", i), c.DeviceID(), CmdMCPToolsCall, map[string]any{"server": "execmesh", "tool": "exec",
			"arguments": map[string]any{"command": "pwd > ran", "workdir": cwd}}, "agent:main:main")
		if r := gc.result(t, fmt.Sprint("tool", i)); !r.OK || !strings.Contains(r.PayloadJSON, `"isError":true`) || !strings.Contains(r.PayloadJSON, "outside this node") {
			t.Errorf("execmesh_exec with workdir %q: %+v", cwd, r)
		}
	}
	if _, err := os.Stat(filepath.Join(outside, "ran")); err == nil {
		t.Fatal("a run refused for its cwd wrote outside the workdir")
	}
	for _, tc := range []struct{ cwd, dir string }{{"", work}, {"sub", filepath.Join(work, "sub")}, {filepath.Join(work, "sub"), filepath.Join(work, "sub")}} {
		if r := run("ok-"+tc.cwd, tc.cwd); !r.OK {
			t.Fatalf("system.run with cwd %q: %+v", tc.cwd, r)
		}
		if b, err := os.ReadFile(filepath.Join(tc.dir, "ran")); err != nil || strings.TrimSpace(string(b)) != tc.dir {
			t.Errorf("cwd %q ran in %q (%v), want %s", tc.cwd, b, err, tc.dir)
		}
	}
}

// TestCallSecurityTightensSystemRun: a system.run that asks for security
// deny or ask always is refused although the node's base would run it,
// and one whose security or ask the node cannot read is refused too.
func TestCallSecurityTightensSystemRun(t *testing.T) {
	g := newFakeGateway(t)
	c, _ := startClient(t, g, nil) // base: security full, ask off
	gc := g.next(t)
	marker := filepath.Join(t.TempDir(), "ran")
	for i, p := range []map[string]any{{"security": "deny"}, {"ask": "always"}} {
		p["command"] = []string{"/bin/sh", "-lc", "touch " + marker}
		p["sessionKey"] = "agent:main:main"
		gc.invoke(t, fmt.Sprint("t", i), c.DeviceID(), CmdSystemRun, p, "")
		if r := gc.result(t, fmt.Sprint("t", i)); r.OK || r.Error == nil || r.Error.Code != CodeSystemRunDenied {
			t.Errorf("system.run with %v: %+v", p, r)
		}
	}
	for i, p := range []map[string]any{{"security": "bogus"}, {"ask": "never"}} {
		p["command"] = []string{"/bin/sh", "-lc", "touch " + marker}
		gc.invoke(t, fmt.Sprint("u", i), c.DeviceID(), CmdSystemRun, p, "")
		if r := gc.result(t, fmt.Sprint("u", i)); r.OK || r.Error == nil || r.Error.Code != CodeInvalidRequest {
			t.Errorf("system.run with %v: %+v, want INVALID_REQUEST", p, r)
		}
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("a run the call's own policy refuses ran")
	}
}
