package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/execmesh/execmesh/protocol"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/execmesh/execmesh/internal/testutil"
)

// These tests are the attacks on a real `execmesh up`, one test per
// class of door (A: web pages, B: other local users on the NATS port, C:
// host=sandbox without a sandbox, F: the agent approving itself), with the
// requests of the issue. Each read the files of the daemon's state dir the
// way its operator (the same Unix user) can.

// upOutOfTheBox is the configuration `{}`: the defaults.
var upOutOfTheBox = map[string]any{}

// rawHTTP sends one request byte for byte (testutil.RawHTTP).
func rawHTTP(t *testing.T, addr, from, head, body string) (int, http.Header, string) {
	t.Helper()
	r := testutil.RawHTTP(t, addr, from, head, body)
	return r.Status, r.Header, r.Body
}

func execBody(command string, extra map[string]any) string {
	args := map[string]any{"command": command}
	for k, v := range extra {
		args[k] = v
	}
	b, _ := json.Marshal(map[string]any{"tool": "exec", "args": args})
	return string(b)
}

func mustNotExist(t *testing.T, path, what string) {
	t.Helper()
	if _, err := os.Stat(path); err == nil {
		t.Errorf("%s: the command ran (%s exists)", what, path)
	}
}

// operatorToken reads the token `execmesh up` generated in its state dir.
func (d *daemonProc) operatorToken() string {
	d.t.Helper()
	b, err := os.ReadFile(filepath.Join(d.stateDir, "operator.token"))
	if err != nil {
		d.t.Fatalf("operator token: %v", err)
	}
	return strings.TrimSpace(string(b))
}

// TestTrustWebPagesKeptOut (class A): with the out-of-the-box `{}`, a web
// page's cross-origin "simple" POST (Content-Type text/plain, Origin
// http://evil.example) and a request through a rebinding name (Host:
// rebind.evil.example) ran `id > pwned` on a loopback `execmesh up`. Both
// are refused; nothing runs. The daemon's other surfaces (/mcp, /metrics,
// /ui) refuse them too.
func TestTrustWebPagesKeptOut(t *testing.T) {
	d := startDaemon(t, "up", upOutOfTheBox)
	addr := strings.TrimPrefix(d.url, "http://")
	dir := t.TempDir()
	for i, c := range []struct{ name, head string }{
		{"cross-origin simple POST", "POST /tools/invoke HTTP/1.1\nHost: " + addr + "\nOrigin: http://evil.example\nContent-Type: text/plain"},
		{"rebinding Host", "POST /tools/invoke HTTP/1.1\nHost: rebind.evil.example\nContent-Type: application/json"},
		{"rebinding Host and Origin", "POST /tools/invoke HTTP/1.1\nHost: rebind.evil.example:" + strings.Split(addr, ":")[1] + "\nOrigin: http://rebind.evil.example:" + strings.Split(addr, ":")[1] + "\nContent-Type: text/plain"},
	} {
		for _, host := range []string{"sandbox", "gateway", "node"} {
			marker := filepath.Join(dir, fmt.Sprintf("pwned-%d-%s", i, host))
			status, _, body := rawHTTP(t, addr, "", c.head, execBody("id > "+marker, map[string]any{"host": host}))
			if status != http.StatusForbidden && status != http.StatusMisdirectedRequest {
				t.Errorf("%s (host=%s): %d %s", c.name, host, status, body)
			}
			mustNotExist(t, marker, c.name)
		}
	}
	for _, path := range []string{"/mcp", "/metrics", "/ui/", "/v1/approvals", "/v1/events?sessionKey=agent:main:main"} {
		method := "GET"
		if path == "/mcp" {
			method = "POST"
		}
		for _, h := range []string{"Host: rebind.evil.example", "Host: " + addr + "\nOrigin: http://evil.example\nSec-Fetch-Site: cross-site"} {
			status, _, body := rawHTTP(t, addr, "", method+" "+path+" HTTP/1.1\n"+h+"\nContent-Type: application/json", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`)
			if status != http.StatusForbidden && status != http.StatusMisdirectedRequest {
				t.Errorf("%s %s with %q: %d %.200s", method, path, h, status, body)
			}
		}
	}
	// What curl, the CLI and the control page send still works.
	status, _, body := rawHTTP(t, addr, "", "POST /tools/invoke HTTP/1.1\nHost: "+addr+"\nOrigin: "+d.url+"\nContent-Type: application/json", `{"tool":"process","args":{"action":"list"}}`)
	if status != 200 {
		t.Fatalf("same-origin call: %d %s", status, body)
	}
}

// natsAttack is what an anonymous client of the issue did once connected:
// read a node id from the presence subjects, run a command on the node
// with a made-up approval, read its approvals file. It reports every step
// that worked.
func natsAttack(t *testing.T, nc *nats.Conn, marker string) {
	t.Helper()
	sub, err := nc.SubscribeSync("execmesh.presence.>")
	if err != nil {
		t.Errorf("subscribe to presence: %v", err)
		return
	}
	msg, err := sub.NextMsg(15 * time.Second)
	if err != nil {
		return
	}
	id := strings.TrimPrefix(msg.Subject, "execmesh.presence.")
	req, _ := json.Marshal(map[string]any{
		"sessionKey": "agent:main:main",
		"args":       map[string]any{"command": "id > " + marker, "yieldMs": 5000},
		"approval":   map[string]any{"id": "forged", "decision": "allow-once"},
	})
	if reply, err := nc.Request("execmesh.node."+id+".exec", req, 10*time.Second); err == nil {
		t.Errorf("execmesh.node.%s.exec with a forged approval answered: %.300s", id, reply.Data)
	}
	if reply, err := nc.Request("execmesh.node."+id+".approvals.get", []byte("{}"), 5*time.Second); err == nil && !bytes.Contains(reply.Data, []byte(`"error"`)) {
		t.Errorf("execmesh.node.%s.approvals.get answered: %.300s", id, reply.Data)
	}
	if reply, err := nc.Request("execmesh.node."+id+".approvals.set", []byte(`{"file":{"version":1,"defaults":{"security":"full","ask":"off"}},"baseHash":""}`), 5*time.Second); err == nil && !bytes.Contains(reply.Data, []byte(`"error"`)) {
		t.Errorf("execmesh.node.%s.approvals.set answered: %.300s", id, reply.Data)
	}
}

// TestTrustNoAnonymousNATS (class B): anyone on the machine could connect
// to the loopback NATS port of `execmesh up` without credentials, read
// node ids from the presence subjects, run `execmesh.node.<id>.exec` with
// a made-up approval and rewrite the node's approvals file. Now a client
// without an identity the server knows cannot connect at all (anonymous,
// or with a key of its own making), and the operator's identity, which
// may watch, cannot send anything to a node.
func TestTrustNoAnonymousNATS(t *testing.T) {
	d := startDaemon(t, "up", upOutOfTheBox)
	natsURL := "nats://" + d.natsAddr
	marker := filepath.Join(t.TempDir(), "pwned")
	connect := func(opts ...nats.Option) (*nats.Conn, error) {
		return nats.Connect(natsURL, append([]nats.Option{nats.Timeout(5 * time.Second), nats.MaxReconnects(0), nats.NoReconnect()}, opts...)...)
	}

	anon, err := connect()
	if err == nil {
		t.Errorf("an anonymous client connected to %s", natsURL)
		natsAttack(t, anon, marker)
		anon.Close()
	} else if !errors.Is(err, nats.ErrAuthorization) && !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Errorf("anonymous connect: %v, want an authorization violation", err)
	}

	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	mine, err := connect(nats.Nkey(pub, kp.Sign))
	if err == nil {
		t.Errorf("a client with a key of its own connected")
		natsAttack(t, mine, marker)
		mine.Close()
	}
	mustNotExist(t, marker, "NATS client without an identity")

	// The operator's identity (operator.nkey in the state dir, mode 0600)
	// may watch, but not act in the gateway's name.
	seedPath := filepath.Join(d.stateDir, "operator.nkey")
	opt, err := nats.NkeyOptionFromSeed(seedPath)
	if err != nil {
		t.Fatalf("operator nkey: %v", err)
	}
	if st, err := os.Stat(seedPath); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("operator.nkey mode: %v %v", st, err)
	}
	var mu sync.Mutex
	var violations []string
	op, err := connect(opt, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		mu.Lock()
		violations = append(violations, err.Error())
		mu.Unlock()
	}))
	if err != nil {
		t.Fatalf("the operator's identity: %v", err)
	}
	defer op.Close()
	sub, _ := op.SubscribeSync("execmesh.presence.>")
	msg, err := sub.NextMsg(15 * time.Second)
	if err != nil {
		t.Fatalf("the operator reads no presence: %v", err)
	}
	id := strings.TrimPrefix(msg.Subject, "execmesh.presence.")
	req, _ := json.Marshal(map[string]any{"sessionKey": "agent:main:main", "args": map[string]any{"command": "id > " + marker},
		"approval": map[string]any{"id": "forged", "decision": "allow-once"}})
	for _, ep := range []string{"exec", "approvals.get", "approvals.set"} {
		if reply, err := op.Request("execmesh.node."+id+"."+ep, req, 2*time.Second); err == nil {
			t.Errorf("the operator's identity reached execmesh.node.%s.%s: %.200s", id, ep, reply.Data)
		}
	}
	mu.Lock()
	if len(violations) == 0 || !strings.Contains(strings.ToLower(strings.Join(violations, " ")), "permissions violation") {
		t.Errorf("no permissions violation reported: %q", violations)
	}
	mu.Unlock()
	mustNotExist(t, marker, "the operator's NATS identity")
}

// TestTrustSandboxHostNeedsSandbox (class C): with sandbox.mode off (the
// default) a per-call or per-session host=sandbox ran the command
// directly, without approval and with LD_PRELOAD or BASH_ENV reaching it.
// Now both are refused, and a configured tools.exec.host sandbox does not
// start.
func TestTrustSandboxHostNeedsSandbox(t *testing.T) {
	d := startDaemon(t, "up", upOutOfTheBox)
	addr := strings.TrimPrefix(d.url, "http://")
	marker := filepath.Join(t.TempDir(), "pwned")
	for _, env := range []map[string]any{nil, {"LD_PRELOAD": "/tmp/evil.so", "BASH_ENV": "/tmp/evil.sh"}} {
		status, _, body := rawHTTP(t, addr, "", "POST /tools/invoke HTTP/1.1\nHost: "+addr+"\nContent-Type: application/json",
			execBody("id > "+marker, map[string]any{"host": "sandbox", "env": env}))
		if status != 400 || !strings.Contains(body, "exec host not allowed (sandbox runtime is off;") {
			t.Errorf("host=sandbox without a sandbox (env %v): %d %s", env, status, body)
		}
	}
	status, _, body := rawHTTP(t, addr, "", "PUT /v1/sessions/agent:main:main/exec HTTP/1.1\nHost: "+addr+"\nContent-Type: application/json", `{"host":"sandbox"}`)
	if status != 400 || !strings.Contains(body, "exec host not allowed (sandbox runtime is off;") {
		t.Errorf("PUT session host=sandbox: %d %s", status, body)
	}
	// The session default did not stick: a call without host goes through
	// approvals (allowlist, on-miss).
	status, _, body = rawHTTP(t, addr, "", "POST /tools/invoke HTTP/1.1\nHost: "+addr+"\nContent-Type: application/json", execBody("id > "+marker, nil))
	if status != 200 || !strings.Contains(body, `"status":"approval-pending"`) {
		t.Errorf("exec after the refused session default: %d %s", status, body)
	}
	mustNotExist(t, marker, "host=sandbox")

	bin, err := execmeshBinary()
	if err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	cfgPath := filepath.Join(state, "config.json")
	if err := os.WriteFile(cfgPath, []byte(`{"tools":{"exec":{"host":"sandbox"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "up", "--state-dir", state, "--config", cfgPath, "--listen", freeAddr(t), "--nats-listen", freeAddr(t))
	cmd.Env = append(os.Environ(), "EXECMESH_GATEWAY_TOKEN=", "EXECMESH_SANDBOX_MODE=")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), `tools.exec.host: "sandbox" needs a sandbox runtime, but sandbox.mode is "off"`) {
		t.Fatalf("up with tools.exec.host sandbox and no sandbox: %v\n%s", err, out)
	}
}

// TestTrustOperatorNotAgent (class F): the same bearer token that calls
// /tools/invoke could approve its own pending command, and the limit on
// failed authentications counted per source address only, so rotating
// through 127.0.0.0/8 evaded it. Now the tool token gets 403 on operator
// endpoints, the operator token (operator.token in the state dir) decides,
// the CLI uses it, and a hundred failures from as many addresses stop
// every authentication for a while.
func TestTrustOperatorNotAgent(t *testing.T) {
	d := startDaemon(t, "up", map[string]any{"gateway": map[string]any{"auth": map[string]any{"token": "tool-tok"}}})
	addr := strings.TrimPrefix(d.url, "http://")
	call := func(from, method, path, token, body string) (int, http.Header, string) {
		return rawHTTP(t, addr, from, method+" "+path+" HTTP/1.1\nHost: "+addr+"\nContent-Type: application/json\nAuthorization: Bearer "+token, body)
	}
	status, _, body := call("", "POST", "/tools/invoke", "tool-tok", execBody("echo self-approved", nil))
	var ans struct {
		Result protocol.Result `json:"result"`
	}
	if status != 200 || json.Unmarshal([]byte(body), &ans) != nil || ans.Result.Details.Status.Value() != "approval-pending" {
		t.Fatalf("exec: %d %s", status, body)
	}
	id := ans.Result.Details.ApprovalID.Value()
	for _, decision := range []string{"allow-once", "allow-always"} {
		status, _, body := call("", "POST", "/v1/approvals/"+id, "tool-tok", `{"decision":"`+decision+`"}`)
		if status != http.StatusForbidden || !strings.Contains(body, `"type":"forbidden"`) {
			t.Fatalf("the tool token deciding %s: %d %s", decision, status, body)
		}
	}
	for _, c := range []struct{ method, path, body string }{
		{"PUT", "/v1/config/exec-node", `{"agentId":"","node":"x"}`},
		{"POST", "/v1/nodes/invite", `{}`},
	} {
		if status, _, body := call("", c.method, c.path, "tool-tok", c.body); status != http.StatusForbidden {
			t.Errorf("%s %s with the tool token: %d %s", c.method, c.path, status, body)
		}
	}
	if status, _, body := call("", "GET", "/v1/approvals", "tool-tok", ""); status != 200 || !strings.Contains(body, id) {
		t.Fatalf("still pending: %d %s", status, body)
	}
	// The operator's CLI, on the daemon's state dir.
	bin, _ := execmeshBinary()
	cli := exec.Command(bin, "approvals", "resolve", id, "deny", "--gateway", d.url)
	cli.Env = append(os.Environ(), "EXECMESH_STATE_DIR="+d.stateDir, "EXECMESH_GATEWAY_TOKEN=tool-tok", "EXECMESH_OPERATOR_TOKEN=")
	if out, err := cli.CombinedOutput(); err != nil {
		t.Fatalf("execmesh approvals resolve as the operator: %v\n%s", err, out)
	}
	if status, _, body := call("", "GET", "/v1/approvals", d.operatorToken(), ""); status != 200 || strings.Contains(body, id) {
		t.Fatalf("after the operator's decision: %d %s", status, body)
	}

	// Guesses from 100 addresses of 127.0.0.0/8, one each.
	for i := 0; i < 100; i++ {
		from := fmt.Sprintf("127.0.%d.%d", 1+i/250, 2+i%250)
		if status, _, body := call(from, "POST", "/v1/approvals/x", fmt.Sprintf("guess-%d", i), `{"decision":"allow-once"}`); status != 401 {
			t.Fatalf("guess %d from %s: %d %s", i, from, status, body)
		}
	}
	status, h, body := call("127.0.7.7", "POST", "/v1/approvals/x", d.operatorToken(), `{"decision":"allow-once"}`)
	if status != http.StatusTooManyRequests || h.Get("Retry-After") == "" {
		t.Fatalf("after 100 failures from 100 addresses: %d %s (Retry-After %q)", status, body, h.Get("Retry-After"))
	}
}

// TestTrustLocalNodeJoinsUp: a node started separately on the machine of
// a loopback `execmesh up` authenticates as the README says: by a join
// code (`execmesh nodes invite`, the operator's); without one it is
// refused by the NATS server.
func TestTrustLocalNodeJoinsUp(t *testing.T) {
	d := startDaemon(t, "up", fullAccess)
	bin, _ := execmeshBinary()

	stray := newNodeProc(t, "stray", "--nats-url", "nats://"+d.natsAddr)
	stray.start()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(strings.ToLower(stray.out.String()), "authorization violation") || !strings.Contains(stray.out.String(), "execmesh nodes invite") {
		if time.Now().After(deadline) {
			t.Fatalf("a node without a join code: no authorization violation in its log:\n%s", stray.out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}

	cli := exec.Command(bin, "nodes", "invite", "--local", "--name", "side-node", "--gateway", d.url)
	cli.Env = append(os.Environ(), "EXECMESH_STATE_DIR="+d.stateDir, "EXECMESH_OPERATOR_TOKEN=")
	out, err := cli.Output()
	if err != nil {
		t.Fatalf("nodes invite: %v %s", err, out)
	}
	line := strings.TrimSpace(string(out))
	code, ok := strings.CutPrefix(line, "execmesh node --join ")
	if !ok {
		t.Fatalf("invite printed %q", line)
	}
	np := newNodeProc(t, "", "--join", code)
	np.start()
	deadline = time.Now().Add(30 * time.Second)
	addr := strings.TrimPrefix(d.url, "http://")
	for {
		status, _, body := rawHTTP(t, addr, "", "POST /tools/invoke HTTP/1.1\nHost: "+addr+"\nContent-Type: application/json",
			execBody("echo joined", map[string]any{"host": "node", "node": "side-node"}))
		if status == 200 && strings.Contains(body, `"text":"joined"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the joined node runs nothing: %d %s\n%s", status, body, np.out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}
