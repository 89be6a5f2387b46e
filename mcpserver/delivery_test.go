package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/execmesh/execmesh/protocol"
)

// clientNet is the network of one MCP client: every connection it dials,
// so that the test can make the client go away without a word. vanish closes
// them all, as the kernel does for a process that
// was killed; freeze keeps them open but reads and writes nothing more,
// as a client behind a dead network path or a suspended laptop looks to
// the server (the server's writes still succeed, into socket buffers).
// Either way no new connection can be made, so no DELETE is ever sent.
type clientNet struct {
	mu     sync.Mutex
	conns  []*clientConn
	gone   bool
	frozen chan struct{} // closed by freeze
	closed chan struct{} // closed by release: frozen reads end
}

func newClientNet() *clientNet {
	return &clientNet{frozen: make(chan struct{}), closed: make(chan struct{})}
}

func (n *clientNet) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.gone {
		return nil, errors.New("the client is gone")
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	cc := &clientConn{Conn: c, n: n}
	n.conns = append(n.conns, cc)
	return cc, nil
}

// httpClient returns an HTTP client on n that sends the token and the
// sessionKey.
func (n *clientNet) httpClient(token, sessionKey string) *http.Client {
	tr := &http.Transport{DialContext: n.dial}
	return &http.Client{Transport: headerTransport{"Authorization", "Bearer " + token, headerTransport{SessionKeyHeader, sessionKey, headerTransport{StructuredContentHeader, "1", tr}}}}
}

func (n *clientNet) vanish() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.gone = true
	for _, c := range n.conns {
		c.Conn.Close()
	}
}

func (n *clientNet) freeze() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.gone = true
	close(n.frozen)
}

// release closes every connection, so that the server's handlers of a
// frozen client end and the test server can close.
func (n *clientNet) release() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.gone = true
	select {
	case <-n.closed:
	default:
		close(n.closed)
	}
	for _, c := range n.conns {
		c.Conn.Close()
	}
}

// clientConn is a connection of a clientNet: once frozen, what it reads is
// discarded (the server cannot tell) and what it writes is dropped.
type clientConn struct {
	net.Conn
	n *clientNet
}

func (c *clientConn) Read(p []byte) (int, error) {
	for {
		n, err := c.Conn.Read(p)
		select {
		case <-c.n.frozen:
			if err != nil {
				<-c.n.closed
				return 0, err
			}
			continue // read and discarded
		default:
			return n, err
		}
	}
}

func (c *clientConn) Write(p []byte) (int, error) {
	select {
	case <-c.n.frozen:
		return len(p), nil
	default:
		return c.Conn.Write(p)
	}
}

// TestExitEventsSurviveGoneClient: an MCP client of the streamable-HTTP
// transport (the official SDK's, through the gateway's browser defences
// and token check) starts a background command and goes away before the
// command exits: by closing its session (DELETE), by vanishing (its
// connections closed, no DELETE; its server-side session lives on) or by
// freezing (its connections stay open, nothing is read: the server's
// writes succeed and nobody reads them). The exit event must not be taken
// by the session that is gone: GET /v1/events for the sessionKey returns
// it, exactly once; so it does for a client whose logging level is above
// info (the SDK drops the message without an error). A live client gets it
// as one logging notification,
// and then it is confirmed (GET /v1/events has nothing).
func TestExitEventsSurviveGoneClient(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := testConfig(dir)
	cfg.Gateway.Auth.Token = "gone-tok"
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
	// As the daemon mounts it (cmd/execmesh): the API, and /mcp behind the
	// browser defences and the token check.
	mux := http.NewServeMux()
	mux.Handle("/", g.Handler())
	mux.Handle("/mcp", g.Protect(g.Authed(HTTPHandler(emb.Invoker, Options{Version: "test", AckTimeout: 2 * time.Second}))))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	takeEvents := func(t *testing.T, key string, wait time.Duration) []protocol.SystemEvent {
		t.Helper()
		q := url.Values{"sessionKey": {key}, "waitMs": {fmt.Sprint(wait.Milliseconds())}}
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL+"/v1/events?"+q.Encode(), nil)
		req.Header.Set("Authorization", "Bearer gone-tok")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET /v1/events: %v", err)
		}
		defer resp.Body.Close()
		var ans struct {
			Events []protocol.SystemEvent `json:"events"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&ans); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /v1/events: %d %v", resp.StatusCode, err)
		}
		return ans.Events
	}
	mentioning := func(evs []protocol.SystemEvent, marker string) int {
		n := 0
		for _, ev := range evs {
			if strings.Contains(ev.Text, marker) {
				n++
			}
		}
		return n
	}

	for _, tc := range []struct {
		name string
		// leave makes the client go away; nil stays connected.
		leave func(cs *mcp.ClientSession, n *clientNet)
	}{
		{"live", nil},
		{"close", func(cs *mcp.ClientSession, _ *clientNet) {
			if err := cs.Close(); err != nil {
				t.Errorf("Close (DELETE): %v", err)
			}
		}},
		{"vanish", func(_ *mcp.ClientSession, n *clientNet) { n.vanish() }},
		{"freeze", func(_ *mcp.ClientSession, n *clientNet) { n.freeze() }},
		// Not gone, but it asked for warnings and worse only: the SDK
		// drops an info message without an error.
		{"level-warning", func(cs *mcp.ClientSession, _ *clientNet) {
			if err := cs.SetLoggingLevel(t.Context(), &mcp.SetLoggingLevelParams{Level: "warning"}); err != nil {
				t.Errorf("SetLoggingLevel: %v", err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			key := "agent:gone-" + tc.name + ":main"
			cn := newClientNet()
			t.Cleanup(cn.release) // before srv.Close: a frozen client's handlers end
			sink := make(logSink, 64)
			cs, err := newClient(sink).Connect(t.Context(), &mcp.StreamableClientTransport{
				Endpoint: srv.URL + "/mcp", HTTPClient: cn.httpClient("gone-tok", key), MaxRetries: -1,
			}, nil)
			if err != nil {
				t.Fatalf("Connect: %v", err)
			}
			t.Cleanup(func() { cs.Close() })
			takeLogs(t, cs)
			// Cleanups run last first: the connections are released before
			// Close, which waits for a reader that a frozen connection holds
			// until its release (make test hung there once for 20 minutes).
			t.Cleanup(cn.release)
			// The client's event stream works: a first exit arrives.
			call(t, cs, "exec", map[string]any{"command": "echo warm-up", "background": true})
			sink.wait(t, "warm-up", 15*time.Second)

			// A command that exits once the client is gone.
			gate := filepath.Join(t.TempDir(), "gate")
			marker := "bye-" + tc.name
			res := call(t, cs, "exec", map[string]any{
				"command":    fmt.Sprintf("while [ ! -e %s ]; do sleep 0.02; done; echo %s", gate, marker),
				"background": true,
			})
			if details(t, res)["status"] != "running" {
				t.Fatalf("background exec: %q %v", text(res), res.StructuredContent)
			}
			if tc.leave != nil {
				tc.leave(cs, cn)
			}
			if err := os.WriteFile(gate, nil, 0o600); err != nil {
				t.Fatal(err)
			}

			if tc.leave == nil {
				sink.wait(t, marker, 15*time.Second)
				// Long enough for a second delivery (the forwarding retries
				// after a second) to show.
				time.Sleep(1500 * time.Millisecond)
				n := 1
				for len(sink) > 0 {
					p := <-sink
					if b, _ := json.Marshal(p.Data); strings.Contains(string(b), marker) {
						n++
					}
				}
				if n != 1 {
					t.Errorf("the exit event came %d times as a notification, want once", n)
				}
				if evs := takeEvents(t, key, 0); len(evs) != 0 {
					t.Errorf("GET /v1/events after the client got the event: %v, want nothing (it was confirmed)", evs)
				}
				return
			}
			// Give the session that is gone time to take the event, as
			// an earlier forwarding did, before the poll.
			time.Sleep(time.Second)
			evs := takeEvents(t, key, 15*time.Second)
			if mentioning(evs, marker) != 1 {
				t.Fatalf("GET /v1/events after the client went away: %v, want the exit event once", evs)
			}
			// The next poll confirms it: nothing comes twice, however long
			// the session that is gone keeps trying.
			if evs := takeEvents(t, key, 3*time.Second); mentioning(evs, marker) != 0 {
				t.Errorf("the exit event came again: %v", evs)
			}
		})
	}
}
