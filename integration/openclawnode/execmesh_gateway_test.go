package openclawnode

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/execmesh/execmesh/access"
	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/config"
	"github.com/execmesh/execmesh/gateway"
	"github.com/execmesh/execmesh/protocol"
)

// execmeshGateway is an execmesh gateway in the test process with its
// HTTP API.
type execmeshGateway struct {
	g        *gateway.Gateway
	http     *httptest.Server
	stateDir string
}

// startExecmeshGateway starts an embedded NATS server and an execmesh
// gateway on it (security full, ask off), both ended with the test; it
// returns the server's URL.
func startExecmeshGateway(t *testing.T) (string, *execmeshGateway) {
	t.Helper()
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
	return "nats://" + addr, eg
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
