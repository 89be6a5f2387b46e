package openclawnode

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/access"
	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/config"
	"github.com/execmesh/execmesh/gateway"
	"github.com/execmesh/execmesh/internal/openclawtest"
	"github.com/execmesh/execmesh/protocol"
)

// TestNodeServesBothGateways: one execmesh node process serves an
// execmesh gateway over NATS and an OpenClaw gateway at the same time,
// with one session core: a command reaches it by either, and the
// sessions of one gateway's callers are not the other's.
func TestNodeServesBothGateways(t *testing.T) {
	in := openclawtest.Require(t)
	bin := buildExecmesh(t)

	// The execmesh side: an embedded NATS server and a gateway in the
	// test process, security full and ask off.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer scancel()
	srv, err := bus.StartServer(sctx, bus.ServerConfig{Listen: addr, StoreDir: filepath.Join(t.TempDir(), "nats"), JetStream: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	emGW := startExecmeshGateway(t, srv)

	model := openclawtest.NewModel(t, func(r openclawtest.Request) openclawtest.Reply {
		if strings.Contains(r.LastUser(), promptHostExec) && r.Step() == 0 {
			return openclawtest.Reply{ToolCalls: []openclawtest.ToolCall{{Name: "execmesh_exec",
				Args: map[string]any{"command": "echo via-openclaw; sleep 600", "background": true}}}}
		}
		return openclawtest.Reply{Text: "done"}
	})
	ocGW := openclawtest.StartGateway(t, in, openclawtest.GatewayOptions{Model: model, Config: map[string]any{
		"tools": map[string]any{"exec": map[string]any{"host": "node", "security": "full", "ask": "off"}, "toolSearch": false},
	}})

	state := t.TempDir()
	id, err := bus.LoadOrCreateNodeIdentity(state)
	if err != nil {
		t.Fatal(err)
	}
	node := startNode(t, bin, ocGW, state, "--nats-url", "nats://"+addr, "--heartbeat", "200ms")
	if strings.Contains(node.out.String(), "without NATS") {
		t.Fatalf("the node ignored --nats-url:\n%s", node.out.String())
	}
	emGW.waitNode(t, id.NodeID)
	if r := emGW.do(t, "POST", "/v1/nodes/"+id.NodeID+"/approve", nil); r.status != 200 {
		t.Fatalf("approve: %d %s", r.status, r.raw)
	}
	approveNode(t, in, ocGW, node)

	// OpenClaw's agent starts a background session through the plugin tool.
	runTurn(t, ocGW, "agent:main:main", promptHostExec)
	res := toolResults(t, model, promptHostExec)
	if !strings.Contains(res, "Command still running") {
		t.Fatalf("execmesh_exec through OpenClaw: %s", res)
	}

	// The execmesh gateway's caller runs on the same node, and does not
	// see OpenClaw's session under its own (same-named) sessionKey.
	hostname, _ := os.Hostname()
	r := emGW.do(t, "POST", "/tools/invoke", map[string]any{"tool": "exec", "sessionKey": "agent:main:main",
		"args": map[string]any{"command": "echo via-nats=$(hostname)", "host": "node", "node": id.NodeID}})
	if r.status != 200 || r.result == nil || !strings.Contains(r.result.Text(), "via-nats="+hostname) {
		t.Fatalf("exec through the execmesh gateway: %d %s", r.status, r.raw)
	}
	r = emGW.do(t, "POST", "/tools/invoke", map[string]any{"tool": "process", "sessionKey": "agent:main:main", "args": map[string]any{"action": "list"}})
	if r.status != 200 || strings.Contains(string(r.raw), "via-openclaw") {
		t.Errorf("the execmesh gateway's caller sees OpenClaw's session: %d %s", r.status, r.raw)
	}
	if nodes := emGW.do(t, "GET", "/v1/nodes", nil); !strings.Contains(string(nodes.raw), `"sessions":`) {
		t.Errorf("nodes: %s", nodes.raw)
	}
}

// execmeshGateway is an execmesh gateway in the test process with its
// HTTP API.
type execmeshGateway struct {
	g        *gateway.Gateway
	http     *httptest.Server
	stateDir string
}

func startExecmeshGateway(t *testing.T, srv *bus.Server) *execmeshGateway {
	t.Helper()
	cfg := config.Default()
	cfg.StateDir = t.TempDir()
	cfg.Tools.Exec.Security = "full"
	cfg.Tools.Exec.Ask = "off"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, err := bus.Connect(ctx, bus.ClientConfig{URLs: []string{srv.ClientURL()}, Name: "gateway"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cwd := t.TempDir()
	g, err := gateway.New(t.Context(), cfg, gateway.Options{
		Conn: nc, Server: srv, Cwd: cwd,
		Environ:        []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + cwd, "SHELL=/bin/sh", "LANG=C"},
		Getenv:         func(string) string { return "" },
		LoginShellPath: func() string { return "" },
	})
	if err != nil {
		nc.Close()
		t.Fatal(err)
	}
	eg := &execmeshGateway{g: g, http: httptest.NewServer(g.Handler()), stateDir: cfg.StateDir}
	t.Cleanup(func() {
		eg.http.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = g.Close(ctx)
		nc.Close()
	})
	return eg
}

type answer struct {
	status int
	raw    []byte
	result *protocol.Result
}

// do calls the gateway's HTTP API as its operator.
func (eg *execmeshGateway) do(t *testing.T, method, path string, body any) answer {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, eg.http.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	tok, err := access.ReadOperatorTokenFile(eg.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	a := answer{status: res.StatusCode, raw: raw}
	var ok struct {
		Result *protocol.Result `json:"result"`
	}
	if json.Unmarshal(raw, &ok) == nil {
		a.result = ok.Result
	}
	return a
}

// waitNode waits until the gateway lists node id as connected.
func (eg *execmeshGateway) waitNode(t *testing.T, id string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		var out struct {
			Nodes []gateway.NodeView `json:"nodes"`
		}
		r := eg.do(t, "GET", "/v1/nodes", nil)
		_ = json.Unmarshal(r.raw, &out)
		for _, n := range out.Nodes {
			if n.ID == id && n.Status == "connected" {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s not connected to the execmesh gateway: %s", id, r.raw)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
