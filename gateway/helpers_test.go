package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/config"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
	"github.com/execmesh/execmesh/host"
	"github.com/execmesh/execmesh/protocol"
)

// testGateway is a gateway served over a real HTTP listener. Its do sends
// the operator token unless the caller sets Authorization.
type testGateway struct {
	t     *testing.T
	g     *Gateway
	srv   *httptest.Server
	token string // the tool token, "" for none
	cwd   string
}

// asAgent is the Authorization header of the agent's tool token (none on
// a token-less gateway).
func (tg *testGateway) asAgent() http.Header {
	if tg.token == "" {
		return http.Header{"Authorization": {""}}
	}
	return http.Header{"Authorization": {"Bearer " + tg.token}}
}

// startGateway builds a gateway with a temp state dir, security=full and
// ask=off (so commands run without approvals) unless mutate changes it.
func startGateway(t *testing.T, mutate func(*config.Config, *Options)) *testGateway {
	t.Helper()
	cfg := config.Default()
	cfg.StateDir = t.TempDir()
	cfg.Tools.Exec.Security = "full"
	cfg.Tools.Exec.Ask = "off"
	cfg.Tools.Exec.KillGraceMs = 1000
	cwd := t.TempDir()
	opts := Options{
		Cwd:            cwd,
		Environ:        []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + cwd, "SHELL=/bin/sh", "LANG=C"},
		Getenv:         func(string) string { return "" },
		LoginShellPath: func() string { return "" },
		Confine:        host.ConfineConfig{Helper: "/proc/self/exe"},
	}
	if mutate != nil {
		mutate(&cfg, &opts)
	}
	if opts.Conn == nil {
		srv := bustest.StartServer(t)
		opts.Conn = bustest.Connect(t, srv, bus.ClientConfig{Name: "gateway"})
		if opts.Server == nil {
			opts.Server = srv
		}
	}
	g, err := New(t.Context(), cfg, opts)
	if err != nil {
		t.Fatalf("gateway.New: %v", err)
	}
	srv := httptest.NewServer(g.Handler())
	t.Cleanup(func() {
		srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := g.Close(ctx); err != nil {
			t.Errorf("gateway.Close: %v", err)
		}
	})
	return &testGateway{t: t, g: g, srv: srv, token: cfg.Gateway.Auth.Token, cwd: cwd}
}

// response is a decoded /tools/invoke answer.
type response struct {
	Status int
	OK     bool             `json:"ok"`
	Result *protocol.Result `json:"result"`
	Error  *protocol.Error  `json:"error"`
	Raw    []byte
}

func (tg *testGateway) do(method, path string, body []byte, header http.Header) *response {
	tg.t.Helper()
	req, err := http.NewRequest(method, tg.srv.URL+path, bytes.NewReader(body))
	if err != nil {
		tg.t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if len(body) > 0 && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	// The operator runs these tests: its token calls tools too. Tests of
	// the tool token pass their own Authorization header.
	if _, set := req.Header["Authorization"]; !set {
		req.Header.Set("Authorization", "Bearer "+tg.g.operatorToken())
	} else if req.Header.Get("Authorization") == "" {
		req.Header.Del("Authorization") // an explicit "": no token at all
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		tg.t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	r := &response{Status: res.StatusCode, Raw: raw}
	if len(raw) > 0 && raw[0] == '{' {
		if err := json.Unmarshal(raw, r); err != nil {
			tg.t.Fatalf("decode %s: %v", raw, err)
		}
	}
	return r
}

// invoke calls a tool and fails the test unless the answer is 200.
func (tg *testGateway) invoke(tool string, args any, sessionKey string) protocol.Result {
	tg.t.Helper()
	r := tg.invokeRaw(tool, args, sessionKey)
	if r.Status != http.StatusOK || r.Result == nil {
		tg.t.Fatalf("%s %v: status %d: %s", tool, args, r.Status, r.Raw)
	}
	return *r.Result
}

func (tg *testGateway) invokeRaw(tool string, args any, sessionKey string) *response {
	tg.t.Helper()
	body := map[string]any{"tool": tool, "args": args}
	if sessionKey != "" {
		body["sessionKey"] = sessionKey
	}
	b, _ := json.Marshal(body)
	return tg.do("POST", "/tools/invoke", b, nil)
}

// checkFor retries f until it returns nil or the time is up.
func checkFor(t *testing.T, total time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(total)
	var err error
	for time.Now().Before(deadline) {
		if err = f(); err == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("condition not met after %v: %v", total, err)
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
