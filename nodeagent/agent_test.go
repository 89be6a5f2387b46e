package nodeagent

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"go.uber.org/goleak"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
	"github.com/execmesh/execmesh/confine"
	"github.com/execmesh/execmesh/host"
	"github.com/execmesh/execmesh/protocol"
)

// TestMain lets the test binary be the confinement helper of the agents
// it starts (Config.Confine.Helper "/proc/self/exe").
func TestMain(m *testing.M) {
	confine.RunHelperIfRequested()
	goleak.VerifyTestMain(m)
}

const ownPath = "/usr/local/bin:/usr/bin:/bin"

// harness is a node agent on a real embedded server, with a client
// connection standing in for the gateway.
type harness struct {
	t   *testing.T
	srv *bus.Server
	nc  *nats.Conn
	a   *Agent
}

func newHarness(t *testing.T, mutate func(*Config)) *harness {
	t.Helper()
	srv := bustest.StartServer(t)
	nc := bustest.Connect(t, srv, bus.ClientConfig{Name: "test-gateway"})
	if err := bus.EnsureStreams(t.Context(), bustest.JetStream(t, nc), "execmesh", 1); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.StateDir = t.TempDir()
	cfg.Name = "test-node"
	cfg.Client = bus.ClientConfig{URLs: []string{srv.ClientURL()}}
	cfg.HeartbeatInterval = 50 * time.Millisecond
	cfg.Cwd = t.TempDir()
	cfg.Environ = []string{"PATH=" + ownPath, "HOME=" + cfg.Cwd, "LANG=C", "LD_PRELOAD=/evil.so", "NODE_OPTIONS=--require=/evil.js"}
	cfg.Session.Shell = "/bin/sh"
	cfg.Session.KillGrace = time.Second
	cfg.Confine = host.ConfineConfig{Helper: "/proc/self/exe"}
	if mutate != nil {
		mutate(&cfg)
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := a.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	h := &harness{t: t, srv: srv, nc: nc, a: a}
	// Wait until the endpoints answer.
	bustest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		_, err := h.raw(protocol.NodeEndpointWhich, []byte(`{"bins":[]}`), nil)
		return err
	})
	return h
}

// raw sends a request to one endpoint of the agent.
func (h *harness) raw(endpoint string, body []byte, hdr nats.Header) (*nats.Msg, error) {
	ctx, cancel := context.WithTimeout(h.t.Context(), 20*time.Second)
	defer cancel()
	return bus.RequestChunked(ctx, h.nc, protocol.Subjects("execmesh").Node(h.a.ID(), endpoint), body, hdr)
}

// call sends a request and returns the reply, or the node's error.
func (h *harness) call(endpoint string, v any, hdr nats.Header) (*nats.Msg, *protocol.Error) {
	h.t.Helper()
	body, err := json.Marshal(v)
	if err != nil {
		h.t.Fatal(err)
	}
	m, err := h.raw(endpoint, body, hdr)
	if err != nil {
		h.t.Fatalf("%s: %v", endpoint, err)
	}
	if e := bus.ReplyError(m); e != nil {
		var pe protocol.Error
		if err := json.Unmarshal(e.(*bus.ServiceError).Data, &pe); err != nil {
			h.t.Fatalf("%s: error without a protocol error: %v", endpoint, e)
		}
		return m, &pe
	}
	return m, nil
}

// execRequest is the gateway's exec request for args (a tool call's
// arguments, decoded as the gateway decodes them).
func (h *harness) execRequest(args map[string]any, security, ask string) protocol.ExecRequest {
	h.t.Helper()
	raw, _ := json.Marshal(args)
	a, err := protocol.DecodeExecArgs(raw)
	if err != nil {
		h.t.Fatalf("args %v: %v", args, err)
	}
	return protocol.ExecRequest{SessionKey: "agent:main:main", Target: protocol.TargetNode, Args: a, Security: security, Ask: ask}
}

func (h *harness) exec(args map[string]any, hdr nats.Header) (protocol.Result, *protocol.Error) {
	h.t.Helper()
	m, e := h.call(protocol.NodeEndpointExec, h.execRequest(args, "full", "off"), hdr)
	if e != nil {
		return protocol.Result{}, e
	}
	var reply protocol.ExecReply
	if err := json.Unmarshal(m.Data, &reply); err != nil {
		h.t.Fatal(err)
	}
	if reply.Instance != h.a.Instance() {
		h.t.Fatalf("exec reply instance %q, want %q", reply.Instance, h.a.Instance())
	}
	return reply.Result, nil
}

func (h *harness) mustExec(args map[string]any) protocol.Result {
	h.t.Helper()
	res, e := h.exec(args, nil)
	if e != nil {
		h.t.Fatalf("exec %v: %v", args, e)
	}
	return res
}

func (h *harness) process(sessionKey string, args map[string]any) (protocol.Result, protocol.ProcessReply) {
	h.t.Helper()
	raw, _ := json.Marshal(args)
	pa, err := protocol.DecodeProcessArgs(raw)
	if err != nil {
		h.t.Fatal(err)
	}
	m, e := h.call(protocol.NodeEndpointProcess, protocol.ProcessRequest{SessionKey: sessionKey, Args: pa}, nil)
	if e != nil {
		h.t.Fatalf("process %v: %v", args, e)
	}
	var reply protocol.ProcessReply
	if err := json.Unmarshal(m.Data, &reply); err != nil {
		h.t.Fatal(err)
	}
	return reply.Result, reply
}

func (h *harness) list(sessionKey string) protocol.ListReply {
	h.t.Helper()
	m, e := h.call(protocol.NodeEndpointList, protocol.ListRequest{SessionKey: sessionKey}, nil)
	if e != nil {
		h.t.Fatal(e)
	}
	var lr protocol.ListReply
	if err := json.Unmarshal(m.Data, &lr); err != nil {
		h.t.Fatal(err)
	}
	return lr
}

func TestNodeExecAndProcess(t *testing.T) {
	h := newHarness(t, nil)
	res := h.mustExec(map[string]any{"command": "echo hi; pwd"})
	if res.Status() != protocol.StatusCompleted || !strings.Contains(res.Text(), "hi") || !strings.Contains(res.Text(), h.a.cfg.Cwd) {
		t.Fatalf("foreground: %s %v", res.Text(), res.Details)
	}
	res = h.mustExec(map[string]any{"command": "cat", "pty": true, "background": true})
	id := res.SessionID()
	if res.Status() != protocol.StatusRunning || id == "" {
		t.Fatalf("background: %s", res.Text())
	}
	if _, reply := h.process("agent:main:main", map[string]any{"action": "send-keys", "sessionId": id, "literal": "typed-text", "keys": []string{"Enter"}}); reply.Instance != h.a.Instance() || reply.Gone {
		t.Fatalf("send-keys reply: %+v", reply)
	}
	bustest.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		p, _ := h.process("agent:main:main", map[string]any{"action": "log", "sessionId": id})
		if !strings.Contains(p.Text(), "typed-text") {
			return fmt.Errorf("log: %q", p.Text())
		}
		return nil
	})
	lr := h.list("agent:main:main")
	if len(lr.Sessions) != 1 || lr.Sessions[0].SessionKey != "agent:main:main" || lr.Sessions[0].Details.SessionID.Value() != id || lr.Instance != h.a.Instance() || lr.Total != 1 {
		t.Fatalf("list: %+v", lr)
	}
	if other := h.list("agent:main:other"); len(other.Sessions) != 0 {
		t.Fatalf("another scope lists %+v", other)
	}
	// Unknown session: a failed result, marked gone.
	res, reply := h.process("agent:main:main", map[string]any{"action": "poll", "sessionId": "no-such-session"})
	if res.Status() != protocol.StatusFailed || !reply.Gone {
		t.Fatalf("unknown session: %s %+v", res.Text(), reply)
	}
	// Another scope cannot see it.
	res, reply = h.process("agent:main:other", map[string]any{"action": "poll", "sessionId": id})
	if res.Status() != protocol.StatusFailed || !reply.Gone {
		t.Fatalf("other scope: %s", res.Text())
	}
	h.process("agent:main:main", map[string]any{"action": "remove", "sessionId": id})
	if lr := h.list("agent:main:main"); len(lr.Sessions) != 0 {
		t.Fatalf("list after remove: %+v", lr)
	}
}

func TestNodeMalformedRequests(t *testing.T) {
	h := newHarness(t, nil)
	cases := []struct {
		endpoint, body, want string
	}{
		{protocol.NodeEndpointExec, `garbage`, "request must be a JSON object"},
		{protocol.NodeEndpointExec, `{"sessionKey":`, "malformed request"},
		{protocol.NodeEndpointExec, `{"sessionKey":5,"args":{}}`, `field "sessionKey" must be a string`},
		{protocol.NodeEndpointExec, `{"sessionKey":"k","target":"node","args":{"command":"true"},"extra":1}`, `unknown field "extra"`},
		{protocol.NodeEndpointExec, `{"sessionKey":"","target":"node","args":{"command":"true"}}`, "sessionKey is required"},
		{protocol.NodeEndpointExec, `{"sessionKey":"k","target":"gateway","args":{"command":"true"}}`, `exec target "gateway" is not served by this node host`},
		{protocol.NodeEndpointExec, `{"sessionKey":"k","target":"node","args":{"command":"true","cwd":"/"}}`, `unknown field "cwd"`},
		{protocol.NodeEndpointExec, `{"sessionKey":"k","target":"node","args":{"command":""}}`, "Provide a command to start."},
		{protocol.NodeEndpointExec, `{"sessionKey":"k","target":"node","args":{"command":"true","pty":"yes"}}`, `field "args.pty" must be a boolean`},
		{protocol.NodeEndpointExec, `{"sessionKey":"k","target":"node","args":"echo"}`, `field "args" must be an object`},
		{protocol.NodeEndpointExec, `{"sessionKey":"k","target":"node","sessionId":"NOT/VALID","args":{"command":"true"}}`, "invalid session id"},
		{protocol.NodeEndpointExec, `{"sessionKey":"k"} {"x":1}`, "trailing data"},
		{protocol.NodeEndpointProcess, `[]`, "request must be a JSON object"},
		{protocol.NodeEndpointProcess, `{"sessionKey":"k","args":{"action":"poll","timeout":"soon"}}`, `field "args.timeout" must be a number`},
		{protocol.NodeEndpointProcess, `{"sessionKey":"","args":{"action":"poll"}}`, `sessionKey is required`},
		{protocol.NodeEndpointProcess, `{"sessionKey":"k","args":{"action":"list"}}`, `list is answered by List`},
		{protocol.NodeEndpointList, `{}`, "sessionKey is required"},
		{protocol.NodeEndpointList, `{"sessionKey":"k","limit":-1}`, "limit must not be negative"},
		{protocol.NodeEndpointList, `{"all":true}`, `unknown field "all"`},
		{protocol.NodeEndpointWhich, `{"bins":"sh"}`, `field "bins" must be an array`},
		{protocol.NodeEndpointPairing, `{"status":"best-friends"}`, "unknown status"},
	}
	for _, c := range cases {
		t.Run(c.endpoint+" "+c.body, func(t *testing.T) {
			m, err := h.raw(c.endpoint, []byte(c.body), nil)
			if err != nil {
				t.Fatal(err)
			}
			e := bus.ReplyError(m)
			if e == nil {
				t.Fatalf("accepted: %s", m.Data)
			}
			se := e.(*bus.ServiceError)
			var pe protocol.Error
			if err := json.Unmarshal(se.Data, &pe); err != nil || se.Code != "400" || pe.Type != protocol.ErrInvalidRequest || !strings.Contains(pe.Message, c.want) {
				t.Fatalf("error %v (%+v), want 400 containing %q", e, pe, c.want)
			}
		})
	}
	bad := nats.Header{}
	bad.Set(protocol.NodeHeaderIdempotencyKey, "has space")
	if _, e := h.exec(map[string]any{"command": "true"}, bad); e == nil || !strings.Contains(e.Message, "invalid "+protocol.NodeHeaderIdempotencyKey) {
		t.Fatalf("bad key: %v", e)
	}
	// Nothing ran, nothing changed.
	for _, key := range []string{"k", "agent:main:main"} {
		if lr := h.list(key); len(lr.Sessions) != 0 {
			t.Fatalf("sessions after malformed requests: %+v", lr)
		}
	}
	// A request without a reply subject is ignored, not run.
	if err := h.nc.Publish(protocol.Subjects("execmesh").Node(h.a.ID(), protocol.NodeEndpointExec), []byte(`{"sessionKey":"k","target":"node","args":{"command":"touch fire-and-forget","background":true}}`)); err != nil {
		t.Fatal(err)
	}
	_ = h.nc.Flush()
	time.Sleep(200 * time.Millisecond) // nothing to poll for: the absence is the point
	if _, err := os.Stat(filepath.Join(h.a.cfg.Cwd, "fire-and-forget")); err == nil {
		t.Fatal("a request without reply subject ran")
	}
}

func TestNodeEnvPolicy(t *testing.T) {
	h := newHarness(t, nil)
	// Inherited dangerous variables are dropped; OPENCLAW_CLI is set.
	res := h.mustExec(map[string]any{"command": "env"})
	out := res.Text()
	if strings.Contains(out, "LD_PRELOAD") || strings.Contains(out, "NODE_OPTIONS") || !strings.Contains(out, "OPENCLAW_CLI=1") || !strings.Contains(out, "OPENCLAW_SHELL=exec") {
		t.Fatalf("env: %s", out)
	}
	// PATH may prepend absolute directories to the node's own PATH.
	res = h.mustExec(map[string]any{"command": "echo $PATH", "env": map[string]string{"PATH": "/opt/tools/bin:" + ownPath}})
	if !strings.Contains(res.Text(), "/opt/tools/bin:"+ownPath) {
		t.Fatalf("prepend: %s", res.Text())
	}
	for _, env := range []map[string]string{
		{"PATH": "/opt/tools/bin"},
		{"PATH": "relative/bin:" + ownPath},
		{"PATH": ownPath + ":/opt/after"},
		{"Path": "/opt/x:" + ownPath},
	} {
		if _, e := h.exec(map[string]any{"command": "true", "env": env}, nil); e == nil || e.Type != protocol.ErrSecurityViolation || !strings.Contains(e.Message, "Custom 'PATH' variable is forbidden") {
			t.Fatalf("PATH %v: %v", env, e)
		}
	}
	if _, e := h.exec(map[string]any{"command": "true", "env": map[string]string{"LD_PRELOAD": "/x.so"}}, nil); e == nil || e.Message != "Security Violation: Environment variable 'LD_PRELOAD' is forbidden during host execution." {
		t.Fatalf("LD_PRELOAD: %v", e)
	}
	res = h.mustExec(map[string]any{"command": "echo $GREETING", "env": map[string]string{"GREETING": "hello"}})
	if !strings.Contains(res.Text(), "hello") {
		t.Fatalf("override: %s", res.Text())
	}
}

func TestNodeWorkdir(t *testing.T) {
	h := newHarness(t, nil)
	if err := os.Mkdir(filepath.Join(h.a.cfg.Cwd, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	res := h.mustExec(map[string]any{"command": "pwd", "workdir": "sub"})
	if !strings.Contains(res.Text(), filepath.Join(h.a.cfg.Cwd, "sub")) {
		t.Fatalf("relative workdir: %s", res.Text())
	}
	for _, dir := range []string{"/no/such/dir", "   ", "sub/missing"} {
		res := h.mustExec(map[string]any{"command": "touch ran", "workdir": dir})
		if res.Status() != protocol.StatusFailed || res.Details.FailureKind.Value() != "runtime-error" ||
			res.Text() != protocol.WorkdirUnavailableText(dir) {
			t.Fatalf("workdir %q: %s %v", dir, res.Text(), res.Details)
		}
	}
	if _, err := os.Stat(filepath.Join(h.a.cfg.Cwd, "ran")); err == nil {
		t.Fatal("a command ran despite an unusable workdir")
	}
}

func TestNodePolicy(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Ask = "always" })
	for _, c := range []struct{ security, ask, want string }{
		{"deny", "off", "exec denied: host=node security=deny"},
		{"full", "off", "needs approval"}, // the node's own ask=always tightens; the gateway must ask
		{"", "", "needs approval"},        // unset: allowlist/on-miss, and true is no safe bin
	} {
		_, e := h.call(protocol.NodeEndpointExec, h.execRequest(map[string]any{"command": "true"}, c.security, c.ask), nil)
		want := protocol.ErrApprovalRequired
		if c.security == "deny" {
			want = protocol.ErrDenied
		}
		if e == nil || e.Type != want || !strings.Contains(e.Message, c.want) {
			t.Fatalf("%s/%s: %v", c.security, c.ask, e)
		}
	}
	h2 := newHarness(t, nil)
	_, e := h2.call(protocol.NodeEndpointExec, h2.execRequest(map[string]any{"command": "true"}, "allowlist", "off"), nil)
	if e == nil || e.Message != "exec denied: allowlist miss" {
		t.Fatalf("allowlist miss: %v", e)
	}
}

// TestNodeApprovalsFile: the node re-checks runs with its own
// exec-approvals.json, served and replaced through approvals.get/set.
func TestNodeApprovalsFile(t *testing.T) {
	h := newHarness(t, nil)
	get := func() approvalsView {
		t.Helper()
		m, e := h.call(protocol.NodeEndpointApprovalsGet, struct{}{}, nil)
		if e != nil {
			t.Fatal(e)
		}
		var v approvalsView
		if err := json.Unmarshal(m.Data, &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	v := get()
	if v.Exists || v.Hash != "" || v.Path != filepath.Join(h.a.cfg.StateDir, "exec-approvals.json") {
		t.Fatalf("empty: %+v", v)
	}
	echo, err := filepath.EvalSymlinks("/bin/echo")
	if err != nil {
		t.Skip("no /bin/echo")
	}
	file := json.RawMessage(`{"version":1,"agents":{"*":{"allowlist":[{"pattern":"` + echo + `"}]}}}`)
	m, e := h.call(protocol.NodeEndpointApprovalsSet, map[string]any{"file": file, "baseHash": ""}, nil)
	if e != nil {
		t.Fatal(e)
	}
	var set approvalsView
	_ = json.Unmarshal(m.Data, &set)
	if !set.Exists || set.Hash == "" {
		t.Fatalf("after set: %s", m.Data)
	}
	if _, e := h.call(protocol.NodeEndpointApprovalsSet, map[string]any{"file": file, "baseHash": ""}, nil); e == nil || !strings.Contains(e.Message, "base hash required") {
		t.Fatalf("set without the base hash: %v", e)
	}
	if _, e := h.call(protocol.NodeEndpointApprovalsSet, map[string]any{"file": file, "baseHash": "stale"}, nil); e == nil || !strings.Contains(e.Message, "changed; reload and retry") {
		t.Fatalf("set with a stale hash: %v", e)
	}
	if _, e := h.call(protocol.NodeEndpointApprovalsSet, map[string]any{"file": "nope", "baseHash": set.Hash}, nil); e == nil || e.Type != protocol.ErrInvalidRequest {
		t.Fatalf("set with a bad file: %v", e)
	}
	if v := get(); v.Hash != set.Hash {
		t.Fatalf("hash %s, want %s", v.Hash, set.Hash)
	}

	// allowlist with ask off: the allowlisted echo runs (as its plan), a
	// miss is denied.
	m, e = h.call(protocol.NodeEndpointExec, h.execRequest(map[string]any{"command": "echo allowed-by-file"}, "allowlist", "off"), nil)
	if e != nil {
		t.Fatal(e)
	}
	var reply protocol.ExecReply
	_ = json.Unmarshal(m.Data, &reply)
	if !strings.Contains(reply.Result.Text(), "allowed-by-file") {
		t.Fatalf("allowlisted: %s", reply.Result.Text())
	}
	if _, e := h.call(protocol.NodeEndpointExec, h.execRequest(map[string]any{"command": "echo a; touch nope"}, "allowlist", "off"), nil); e == nil || e.Message != "exec denied: allowlist miss" {
		t.Fatalf("chained: %v", e)
	}

	// The file can tighten what the gateway sent: security deny for all.
	cur := get()
	deny := json.RawMessage(`{"version":1,"defaults":{"security":"deny"},"agents":{}}`)
	if _, e := h.call(protocol.NodeEndpointApprovalsSet, map[string]any{"file": deny, "baseHash": cur.Hash}, nil); e != nil {
		t.Fatal(e)
	}
	if _, e := h.exec(map[string]any{"command": "true"}, nil); e == nil || e.Message != "exec denied: host=node security=deny" {
		t.Fatalf("file deny: %v", e)
	}
}

func TestNodeIdempotency(t *testing.T) {
	h := newHarness(t, nil)
	hdr := nats.Header{}
	hdr.Set(protocol.NodeHeaderIdempotencyKey, "3b241101-e2bb-4255-8caf-4136c566a962")
	var wg sync.WaitGroup
	ids := make([]string, 4)
	for i := range ids {
		wg.Go(func() {
			res, e := h.exec(map[string]any{"command": "echo run >> count.txt; sleep 0.5", "yieldMs": 100}, hdr)
			if e != nil {
				t.Error(e)
				return
			}
			ids[i] = res.SessionID()
		})
	}
	wg.Wait()
	for _, id := range ids {
		if id == "" || id != ids[0] {
			t.Fatalf("session ids %v", ids)
		}
	}
	bustest.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		p, _ := h.process("agent:main:main", map[string]any{"action": "poll", "sessionId": ids[0]})
		if p.Status() == protocol.StatusRunning {
			return fmt.Errorf("running")
		}
		return nil
	})
	b, err := os.ReadFile(filepath.Join(h.a.cfg.Cwd, "count.txt"))
	if err != nil || strings.Count(string(b), "run") != 1 {
		t.Fatalf("ran %q times (%v)", b, err)
	}
}

func TestNodeWhichAndPairing(t *testing.T) {
	h := newHarness(t, nil)
	m, e := h.call(protocol.NodeEndpointWhich, WhichRequest{Bins: []string{"sh", "definitely-not-a-binary", "/bin/sh", ""}}, nil)
	if e != nil {
		t.Fatal(e)
	}
	var w WhichResponse
	_ = json.Unmarshal(m.Data, &w)
	if len(w.Bins) != 1 || !strings.HasSuffix(w.Bins["sh"], "/sh") {
		t.Fatalf("which: %+v", w)
	}
	if _, e := h.call(protocol.NodeEndpointPairing, PairingNotice{Status: PairingRejected}, nil); e != nil {
		t.Fatal(e)
	}
	if h.a.Pairing() != PairingRejected {
		t.Fatalf("pairing %q", h.a.Pairing())
	}
	if _, e := h.exec(map[string]any{"command": "true"}, nil); e == nil || !strings.Contains(e.Message, "not paired") {
		t.Fatalf("exec while rejected: %v", e)
	}
	h.call(protocol.NodeEndpointPairing, PairingNotice{Status: PairingPaired}, nil)
	h.mustExec(map[string]any{"command": "true"})
}

func TestNodePresenceAndDiscovery(t *testing.T) {
	h := newHarness(t, nil)
	sub, err := h.nc.SubscribeSync("execmesh.presence.*")
	if err != nil {
		t.Fatal(err)
	}
	m, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var hb Heartbeat
	if err := json.Unmarshal(m.Data, &hb); err != nil {
		t.Fatal(err)
	}
	if hb.NodeID != h.a.ID() || hb.PublicKey != h.a.PublicKey() || hb.Name != "test-node" || hb.Instance != h.a.Instance() || hb.Server == "" || hb.IntervalMs != 50 || m.Subject != "execmesh.presence."+h.a.ID() {
		t.Fatalf("heartbeat %s: %+v", m.Subject, hb)
	}
	// micro discovery: $SRV.PING/INFO answer with the node's metadata.
	reply, err := h.nc.Request("$SRV.INFO.execmesh-node", nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var info micro.Info
	if err := json.Unmarshal(reply.Data, &info); err != nil {
		t.Fatal(err)
	}
	if info.Name != "execmesh-node" || info.Metadata["nodeId"] != h.a.ID() || len(info.Endpoints) != 10 {
		t.Fatalf("info: %+v", info)
	}
	subjects := map[string]bool{}
	for _, ep := range info.Endpoints {
		subjects[ep.Subject] = true
	}
	for _, s := range []string{"exec", "process", "list", "ping", "approvals.get", "approvals.set", "which", "pairing", "applypatch", "attach"} {
		if !subjects["execmesh.node."+h.a.ID()+"."+s] {
			t.Fatalf("endpoint %s missing: %v", s, subjects)
		}
	}
}

func TestNodeExitEventPublished(t *testing.T) {
	h := newHarness(t, nil)
	js := bustest.JetStream(t, h.nc)
	res := h.mustExec(map[string]any{"command": "echo bye; exit 2", "background": true})
	id := res.SessionID()
	stream, err := js.Stream(t.Context(), bus.StreamNamesFor("execmesh").Exit)
	if err != nil {
		t.Fatal(err)
	}
	var ev protocol.ExitEvent
	bustest.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		m, err := stream.GetLastMsgForSubject(t.Context(), "execmesh.events.exit."+h.a.ID())
		if err != nil {
			return err
		}
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			return err
		}
		if m.Header.Get("Nats-Msg-Id") != bus.ExitMsgID(ev) {
			return fmt.Errorf("msg id %q", m.Header.Get("Nats-Msg-Id"))
		}
		return nil
	})
	if ev.SessionID != id || ev.NodeID != h.a.ID() || ev.SessionKey != "agent:main:main" || !ev.Notify || ev.Text != "Exec completed ("+id+", code 2) :: bye" {
		t.Fatalf("exit event: %+v", ev)
	}
}

func TestNodeCloseRefusesRequests(t *testing.T) {
	h := newHarness(t, nil)
	res := h.mustExec(map[string]any{"command": "sleep 30", "background": true})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	start := time.Now()
	if err := h.a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// Bounded: the grace (1 s) plus the flush, with room for a loaded machine.
	if d := time.Since(start); d > 25*time.Second {
		t.Fatalf("close took %s", d)
	}
	// The endpoints are gone: requests find no responder.
	_, err := h.raw(protocol.NodeEndpointProcess, []byte(`{"sessionKey":"agent:main:main","args":{"action":"poll","sessionId":"`+res.SessionID()+`"}}`), nil)
	if err == nil || !strings.Contains(err.Error(), "no responders") {
		t.Fatalf("after close: %v", err)
	}
	if err := h.a.Start(t.Context()); err == nil {
		t.Fatal("Start after Close succeeded")
	}
}

func TestNodeJoinCodeDecoding(t *testing.T) {
	good, err := EncodeJoinCode(JoinCode{V: 1, URLs: []string{"nats://10.0.0.1:4222"}, Prefix: "execmesh", Secret: "s"})
	if err != nil {
		t.Fatal(err)
	}
	if c, err := DecodeJoinCode(" " + good + "\n"); err != nil || c.URLs[0] != "nats://10.0.0.1:4222" {
		t.Fatalf("decode: %+v %v", c, err)
	}
	enc := func(v any) string {
		b, _ := json.Marshal(v)
		return base64.RawURLEncoding.EncodeToString(b)
	}
	for name, code := range map[string]string{
		"empty":       "",
		"not base64":  "!!!",
		"not json":    base64.RawURLEncoding.EncodeToString([]byte("hello")),
		"no urls":     enc(map[string]any{"v": 1, "prefix": "execmesh", "secret": "s"}),
		"no secret":   enc(map[string]any{"v": 1, "urls": []string{"nats://x:1"}, "prefix": "execmesh"}),
		"bad prefix":  enc(map[string]any{"v": 1, "urls": []string{"nats://x:1"}, "prefix": "a.b", "secret": "s"}),
		"bad version": enc(map[string]any{"v": 2, "urls": []string{"nats://x:1"}, "prefix": "execmesh", "secret": "s"}),
		"unknown key": enc(map[string]any{"v": 1, "urls": []string{"nats://x:1"}, "prefix": "execmesh", "secret": "s", "admin": true}),
	} {
		if _, err := DecodeJoinCode(code); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestNodeNoServerConfigured(t *testing.T) {
	cfg := DefaultConfig()
	cfg.StateDir = t.TempDir()
	cfg.Cwd = t.TempDir()
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(t.Context()); err != ErrNoServer {
		t.Fatalf("Start: %v", err)
	}
	if err := a.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Prefix: "bad prefix", StateDir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "Prefix") {
		t.Fatalf("bad prefix: %v", err)
	}
	if _, err := New(Config{Security: "most", StateDir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "Security") {
		t.Fatalf("bad security: %v", err)
	}
}

// TestNodePairingNoticeWinsOverStaleAnswer: the gateway's pairing notice
// (the operator approved) can overtake the answer to an announcement
// the gateway computed just before: that older "pending" must not undo
// the newer "paired" (the node would refuse work until it asked again).
func TestNodePairingNoticeWinsOverStaleAnswer(t *testing.T) {
	h := newHarness(t, nil)
	var announces atomic.Int32
	answered := make(chan struct{})
	sub, err := h.nc.Subscribe(protocol.Subjects("execmesh").PairRequest, func(m *nats.Msg) {
		status := PairingPaired
		if announces.Add(1) == 1 {
			// Approved while this announcement is in flight: the notice
			// first, then the answer from before the decision.
			if _, err := h.raw(protocol.NodeEndpointPairing, []byte(`{"status":"paired"}`), nil); err != nil {
				t.Errorf("pairing notice: %v", err)
			}
			defer close(answered)
			status = PairingPending
		}
		b, _ := json.Marshal(PairResponse{Status: status, NodeID: h.a.ID()})
		_ = m.Respond(b)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	select {
	case <-answered:
	case <-time.After(10 * time.Second):
		t.Fatal("the node did not announce itself")
	}
	// Several heartbeats: a node that took the stale answer is pending
	// and announces itself again.
	time.Sleep(300 * time.Millisecond)
	if p, n := h.a.Pairing(), announces.Load(); p != PairingPaired || n != 1 {
		t.Fatalf("pairing %q after %d announcements, want paired after one", p, n)
	}
}

// TestNodeHeartbeatAfterReconnect: with a heartbeat interval far longer
// than the test, the agent still beats and announces itself as soon as
// its connection comes back (the connection's status wakes it, not a
// poll).
func TestNodeHeartbeatAfterReconnect(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	srv := bustest.StartServer(t, bustest.WithListen(addr))
	cfg := DefaultConfig()
	cfg.StateDir = t.TempDir()
	cfg.Name = "reconnecting"
	cfg.Client = bus.ClientConfig{URLs: []string{srv.ClientURL()}}
	cfg.HeartbeatInterval = time.Hour
	cfg.Cwd = t.TempDir()
	cfg.Session.Shell = "/bin/sh"
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		_ = a.Close(ctx)
	})
	rctx, rcancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer rcancel()
	if err := a.Ready(rctx); err != nil {
		t.Fatalf("%v: status %v, last error %v, url %s", err, a.Conn().Status(), a.Conn().LastError(), srv.ClientURL())
	}
	if err := srv.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	srv2 := bustest.StartServer(t, bustest.WithListen(addr))
	nc := bustest.Connect(t, srv2, bus.ClientConfig{Name: "watcher"})
	presence, err := nc.SubscribeSync("execmesh.presence." + a.ID())
	if err != nil {
		t.Fatal(err)
	}
	pairing, err := nc.SubscribeSync("execmesh.pair.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := presence.NextMsg(20 * time.Second); err != nil {
		t.Fatalf("no heartbeat after the reconnect: %v", err)
	}
	if _, err := pairing.NextMsg(5 * time.Second); err != nil {
		t.Fatalf("no announcement after the reconnect: %v", err)
	}
}
