package mcpserver

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/execmesh/execmesh/gateway"
	"github.com/execmesh/execmesh/protocol"
)

// headerTransport adds a header to every request.
type headerTransport struct {
	key, value string
	next       http.RoundTripper
}

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(h.key, h.value)
	return h.next.RoundTrip(r)
}

func TestStreamableHTTP(t *testing.T) {
	t.Parallel()
	emb := startEmbedded(t)
	srv := httptest.NewServer(HTTPHandler(emb.Invoker, Options{Version: "test"}))
	t.Cleanup(srv.Close)

	const key = "agent:web:main"
	hc := &http.Client{Transport: headerTransport{SessionKeyHeader, key, headerTransport{StructuredContentHeader, "1", http.DefaultTransport}}}
	sink := make(logSink, 16)
	cs, err := newClient(sink).Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: srv.URL + "/mcp", HTTPClient: hc}, nil)
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	exerciseTools(t, cs, sink)

	// The sessions belong to the header's sessionKey, not the default one.
	res := call(t, cs, "exec", map[string]any{"command": "sleep 30", "background": true})
	id, _ := details(t, res)["sessionId"].(string)
	mine, err := emb.Invoker(key).Invoke(t.Context(), "process", []byte(`{"action":"list"}`))
	if err != nil || !strings.Contains(mine.Text(), id) {
		t.Errorf("list under %s: %q %v", key, mine.Text(), err)
	}
	other, err := emb.Invoker("").Invoke(t.Context(), "process", []byte(`{"action":"list"}`))
	if err != nil || strings.Contains(other.Text(), id) {
		t.Errorf("list under the default key sees %s: %q %v", id, other.Text(), err)
	}
	call(t, cs, "process", map[string]any{"action": "kill", "sessionId": id})

	// The query parameter selects the key too; a malformed key is refused.
	cs2, err := newClient(make(logSink, 1)).Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: srv.URL + "/mcp?sessionKey=agent:q:main"}, nil)
	if err != nil {
		t.Fatalf("Connect with ?sessionKey: %v", err)
	}
	res = call(t, cs2, "process", map[string]any{"action": "list"})
	if strings.Contains(text(res), id) {
		t.Errorf("agent:q:main sees %s", id)
	}
	cs2.Close()
	resp, err := http.Post(srv.URL+"/mcp?sessionKey=bogus", "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("bad sessionKey: status %d, want 400", resp.StatusCode)
	}
}

// TestStdioSubprocess runs the server as a real stdio subprocess: this
// test binary re-executed as a tiny main (TestMain) that serves an
// embedded gateway with ServeStdio.
func TestStdioSubprocess(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+t.TempDir())
	cmd.Stderr = testWriter{t}
	sink := make(logSink, 16)
	cs, err := newClient(sink).Connect(t.Context(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	exerciseTools(t, cs, sink)
	if err := cs.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	// Closing stdin ends the server: it exits 0 on its own.
	if cmd.ProcessState == nil || !cmd.ProcessState.Success() {
		t.Errorf("server exit: %v", cmd.ProcessState)
	}
}

// TestBinaryStdio drives `execmesh mcp` of the built binary with the SDK's
// client against a gateway served over HTTP: whatever implements the
// command, a standard MCP client must be able to list and call the tools.
func TestBinaryStdio(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the execmesh binary")
	}
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "execmesh")
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Dir(filepath.Dir(file))
	build := exec.Command("go", "build", "-o", bin, "./cmd/execmesh")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Skipf("\n*** SKIPPED: cannot build ./cmd/execmesh, so `execmesh mcp` is not tested as a binary ***\n%v\n%s", err, out)
	}
	emb := startEmbedded(t)
	gw := httptest.NewServer(emb.Gateway.Handler())
	t.Cleanup(gw.Close)

	home := t.TempDir()
	cmd := exec.Command(bin, "mcp", "--gateway", gw.URL)
	cmd.Env = []string{"HOME=" + home, "EXECMESH_STATE_DIR=" + home, "PATH=" + os.Getenv("PATH")}
	cmd.Stderr = testWriter{t}
	cs, err := newClient(make(logSink, 16)).Connect(t.Context(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("Connect to `execmesh mcp`: %v", err)
	}
	defer cs.Close()
	lt, err := cs.ListTools(t.Context(), nil)
	if err != nil || len(lt.Tools) != 2 {
		t.Fatalf("ListTools: %v %v", lt, err)
	}
	res := call(t, cs, "exec", map[string]any{"command": "echo from-binary"})
	if res.IsError || !strings.Contains(text(res), "from-binary") {
		t.Errorf("exec: isError=%v %q", res.IsError, text(res))
	}
	res = call(t, cs, "exec", map[string]any{"command": 7})
	if !res.IsError {
		t.Errorf("wrong argument type: %q is not an error result", text(res))
	}
}

func TestHTTPInvoker(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := testConfig(dir)
	cfg.Gateway.Auth.Token = "s3cret"
	emb, err := NewEmbedded(t.Context(), cfg, testGatewayOptions(dir))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { emb.Close(t.Context()) })
	srv := httptest.NewServer(emb.Gateway.Handler())
	t.Cleanup(srv.Close)

	inv := NewHTTPInvoker(srv.URL+"/", "s3cret", "", nil)
	res, err := inv.Invoke(t.Context(), "exec", []byte(`{"command":"echo hi"}`))
	if err != nil || res.Text() != "hi" {
		t.Fatalf("Invoke: %q %v", res.Text(), err)
	}
	var pe *protocol.Error
	if _, err := inv.Invoke(t.Context(), "exec", []byte(`{"command":1}`)); !errors.As(err, &pe) || pe.Type != protocol.ErrInvalidRequest {
		t.Errorf("wrong type: %v, want an invalid_request *protocol.Error", err)
	}
	if _, err := inv.Invoke(t.Context(), "exec", []byte(`{"command":`)); err == nil {
		t.Errorf("malformed JSON arguments: no error")
	}
	if _, err := NewHTTPInvoker(srv.URL, "wrong", "", nil).Invoke(t.Context(), "exec", []byte(`{"command":"true"}`)); !errors.As(err, &pe) || pe.Type != protocol.ErrUnauthorized {
		t.Errorf("wrong token: %v", err)
	}
	collect := func(wait time.Duration, fail error) ([]protocol.SystemEvent, error) {
		var evs []protocol.SystemEvent
		err := inv.Follow(t.Context(), wait, func(ev protocol.SystemEvent) error {
			evs = append(evs, ev)
			return fail
		})
		return evs, err
	}
	start := time.Now()
	evs, err := collect(50*time.Millisecond, nil)
	if err != nil || len(evs) != 0 || time.Since(start) > 5*time.Second {
		t.Errorf("Follow with nothing queued: %v %v", evs, err)
	}
	if _, err := inv.Invoke(t.Context(), "exec", []byte(`{"command":"echo bye; exit 1","background":true}`)); err != nil {
		t.Fatal(err)
	}
	// An event the session could not take stays queued and comes again.
	refused := errors.New("transport closed")
	evs, err = collect(10*time.Second, refused)
	if !errors.Is(err, refused) || len(evs) != 1 || !strings.Contains(evs[0].Text, "bye") {
		t.Fatalf("refused event: %v %v", evs, err)
	}
	evs, err = collect(10*time.Second, nil)
	if err != nil || len(evs) != 1 || !strings.Contains(evs[0].Text, "bye") || evs[0].SessionKey != gateway.DefaultSessionKey {
		t.Errorf("exit event after a refused send: %v %v", evs, err)
	}
	// Delivered once: confirmed by the next request.
	if evs, err = collect(200*time.Millisecond, nil); err != nil || len(evs) != 0 {
		t.Errorf("a delivered event came again: %v %v", evs, err)
	}
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	if _, err := NewHTTPInvoker(dead.URL, "", "", nil).Invoke(t.Context(), "exec", []byte(`{}`)); err == nil || !strings.Contains(err.Error(), "cannot reach the gateway") {
		t.Errorf("unreachable gateway: %v", err)
	}
}

// testWriter sends a subprocess's stderr to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s", strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestStreamableHTTPBehindBrowserGuard: the official SDK's streamable-HTTP
// client works through what the daemon puts in front of /mcp
// (Gateway.Protect, then the token check): its JSON POSTs, its event
// stream (GET) and its session end (DELETE) pass, with the bearer token;
// a browser's cross-origin request does not.
func TestStreamableHTTPBehindBrowserGuard(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := testConfig(dir)
	cfg.Gateway.Auth.Token = "mcp-tok"
	emb, err := NewEmbedded(t.Context(), cfg, testGatewayOptions(dir))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = emb.Close(ctx)
	})
	g := emb.Gateway
	srv := httptest.NewServer(g.Protect(g.Authed(HTTPHandler(emb.Invoker, Options{Version: "test"}))))
	t.Cleanup(srv.Close)

	hc := &http.Client{Transport: headerTransport{"Authorization", "Bearer mcp-tok", headerTransport{StructuredContentHeader, "true", http.DefaultTransport}}}
	sink := make(logSink, 16)
	cs, err := newClient(sink).Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: srv.URL + "/mcp", HTTPClient: hc}, nil)
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	exerciseTools(t, cs, sink)
	if err := cs.Close(); err != nil {
		t.Errorf("Close (DELETE): %v", err)
	}

	req, _ := http.NewRequest("POST", srv.URL+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer mcp-tok")
	req.Header.Set("Origin", "http://evil.example")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("cross-origin POST /mcp: %d", resp.StatusCode)
	}
}
