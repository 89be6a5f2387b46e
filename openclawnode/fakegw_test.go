package openclawnode

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/execmesh/execmesh/confine"
	"github.com/execmesh/execmesh/host"
	"github.com/execmesh/execmesh/internal/testutil"
	"github.com/execmesh/execmesh/protocol"
	"github.com/execmesh/execmesh/session"
)

// TestMain lets the test binary be the confinement helper of its hosts.
func TestMain(m *testing.M) {
	confine.RunHelperIfRequested()
	os.Exit(m.Run())
}

// fakeGateway is a Go stand-in for an OpenClaw gateway: it speaks the
// node side of protocol 4 closely enough to feed the client good and bad
// input. Only the fault tests use it; the real gateway is in
// integration/openclawnode.
type fakeGateway struct {
	t   *testing.T
	srv *httptest.Server

	// nonce returns the challenge nonce of the n-th connection (from 1).
	nonce func(n int) string
	// tickMs is hello-ok's policy.tickIntervalMs.
	tickMs int64
	// refuse, when set, answers every connect with this error.
	refuse *ErrorShape

	mu       sync.Mutex
	n        int
	connects []time.Time // when each connect request arrived
	conns    []*gwConn
	added    chan *gwConn
}

// gwConn is one node connection as the fake gateway sees it.
type gwConn struct {
	ws      *websocket.Conn
	connect ConnectParams
	sigOK   bool
	done    chan struct{}
	closeSt websocket.StatusCode

	mu   sync.Mutex
	reqs []Frame // requests from the node after the handshake
	ress []Frame // responses from the node
}

func newFakeGateway(t *testing.T) *fakeGateway {
	g := &fakeGateway{t: t, tickMs: 30000, added: make(chan *gwConn, 16),
		nonce: func(n int) string { return "nonce-" + strconv.Itoa(n) }}
	g.srv = httptest.NewServer(http.HandlerFunc(g.serve))
	t.Cleanup(g.srv.Close)
	return g
}

func (g *fakeGateway) url() string { return "ws" + strings.TrimPrefix(g.srv.URL, "http") }

func (g *fakeGateway) serve(w http.ResponseWriter, r *http.Request) {
	ws, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	ws.SetReadLimit(64 << 20)
	g.mu.Lock()
	g.n++
	n := g.n
	g.mu.Unlock()
	ctx := r.Context()
	ts := time.Now().UnixMilli()
	nonce := g.nonce(n)
	ch, _ := json.Marshal(Challenge{Nonce: nonce, TS: ts})
	_ = ws.Write(ctx, websocket.MessageText, mustJSON(Frame{Type: FrameEvent, Event: "connect.challenge", Payload: ch}))
	_, data, err := ws.Read(ctx)
	if err != nil {
		return
	}
	f, err := DecodeFrame(data)
	if err != nil || f.Method != "connect" {
		return
	}
	g.mu.Lock()
	g.connects = append(g.connects, time.Now())
	g.mu.Unlock()
	if g.refuse != nil {
		no := false
		_ = ws.Write(ctx, websocket.MessageText, mustJSON(Frame{Type: FrameRes, ID: f.ID, OK: &no, Error: g.refuse}))
		_ = ws.Close(websocket.StatusPolicyViolation, "connect failed")
		return
	}
	c := &gwConn{ws: ws, done: make(chan struct{})}
	if err := json.Unmarshal(f.Params, &c.connect); err != nil {
		return
	}
	c.sigOK = verifyConnect(c.connect, ts, nonce)
	yes := true
	hello := map[string]any{"type": "hello-ok", "protocol": 4, "server": map[string]any{"version": "fake", "connId": "c" + strconv.Itoa(n)},
		"auth":   map[string]any{"deviceToken": "devtok-" + strconv.Itoa(n), "role": "node", "scopes": []string{}},
		"policy": map[string]any{"tickIntervalMs": g.tickMs}}
	_ = ws.Write(ctx, websocket.MessageText, mustJSON(Frame{Type: FrameRes, ID: f.ID, OK: &yes, Payload: mustJSON(hello)}))
	g.mu.Lock()
	g.conns = append(g.conns, c)
	g.mu.Unlock()
	g.added <- c
	defer close(c.done)
	for {
		_, data, err := ws.Read(ctx)
		if err != nil {
			c.closeSt = websocket.CloseStatus(err)
			return
		}
		f, err := DecodeFrame(data)
		if err != nil {
			g.t.Errorf("node sent a malformed frame: %v: %s", err, data)
			continue
		}
		c.mu.Lock()
		if f.Type == FrameReq {
			c.reqs = append(c.reqs, f)
		} else {
			c.ress = append(c.ress, f)
		}
		c.mu.Unlock()
		if f.Type == FrameReq {
			_ = ws.Write(ctx, websocket.MessageText, mustJSON(Frame{Type: FrameRes, ID: f.ID, OK: &yes, Payload: []byte("{}")}))
		}
	}
}

// verifyConnect checks the v3 device signature of a connect request.
func verifyConnect(p ConnectParams, ts int64, nonce string) bool {
	if p.Device == nil || p.Device.Nonce != nonce || p.Device.SignedAt != ts {
		return false
	}
	pub, err := base64.RawURLEncoding.DecodeString(p.Device.PublicKey)
	if err != nil || len(pub) != ed25519.PublicKeySize {
		return false
	}
	sig, err := base64.RawURLEncoding.DecodeString(p.Device.Signature)
	if err != nil {
		return false
	}
	token := ""
	if p.Auth != nil {
		token = p.Auth.Token
		if token == "" {
			token = p.Auth.DeviceToken
		}
	}
	payload := SignaturePayload(SignatureParams{DeviceID: p.Device.ID, ClientID: p.Client.ID, ClientMode: p.Client.Mode,
		Role: p.Role, Scopes: p.Scopes, SignedAtMs: ts, Token: token, Nonce: nonce, Platform: p.Client.Platform,
		DeviceFamily: p.Client.DeviceFamily})
	return ed25519.Verify(pub, []byte(payload), sig) && deviceIDOf(pub) == p.Device.ID
}

func deviceIDOf(pub ed25519.PublicKey) string {
	return Identity{PublicKey: pub}.derivedID()
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// next waits for the next node connection.
func (g *fakeGateway) next(t *testing.T) *gwConn {
	t.Helper()
	select {
	case c := <-g.added:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no node connection")
		return nil
	}
}

// event sends an event to the node.
func (c *gwConn) event(t *testing.T, name string, payload any) {
	t.Helper()
	if err := c.ws.Write(t.Context(), websocket.MessageText, mustJSON(Frame{Type: FrameEvent, Event: name, Payload: mustJSON(payload)})); err != nil {
		t.Fatalf("send %s: %v", name, err)
	}
}

// invoke sends node.invoke.request.
func (c *gwConn) invoke(t *testing.T, id, nodeID, command string, params any, sessionKey string) {
	t.Helper()
	p := string(mustJSON(params))
	c.event(t, "node.invoke.request", InvokeRequest{ID: id, NodeID: nodeID, Command: command, ParamsJSON: &p, SessionKey: sessionKey})
}

// request waits for the node's request of method matching pred.
func (c *gwConn) request(t *testing.T, method string, pred func(json.RawMessage) bool) json.RawMessage {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		c.mu.Lock()
		for _, f := range c.reqs {
			if f.Method == method && (pred == nil || pred(f.Params)) {
				c.mu.Unlock()
				return f.Params
			}
		}
		c.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no %s from the node", method)
	return nil
}

// result waits for the node.invoke.result of invoke id.
func (c *gwConn) result(t *testing.T, id string) InvokeResult {
	t.Helper()
	var r InvokeResult
	raw := c.request(t, "node.invoke.result", func(p json.RawMessage) bool {
		var x InvokeResult
		return json.Unmarshal(p, &x) == nil && x.ID == id
	})
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// nodeEvent waits for the node.event named name and returns its payload.
func (c *gwConn) nodeEvent(t *testing.T, name string, pred func(map[string]any) bool) map[string]any {
	t.Helper()
	var out map[string]any
	c.request(t, "node.event", func(p json.RawMessage) bool {
		var e NodeEvent
		if json.Unmarshal(p, &e) != nil || e.Event != name {
			return false
		}
		var m map[string]any
		if json.Unmarshal([]byte(e.PayloadJSON), &m) != nil || (pred != nil && !pred(m)) {
			return false
		}
		out = m
		return true
	})
	return out
}

// testHost is a node host with a fixed environment and a state dir.
func testHost(t *testing.T, stateDir string, onExit func(protocol.ExitEvent)) *host.Local {
	t.Helper()
	cwd, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	scfg := session.DefaultConfig()
	scfg.KillGrace = time.Second
	scfg.DrainWait = 300 * time.Millisecond
	l, err := host.NewLocal(host.Config{
		Kind: host.KindNode, ID: "test-node", Session: scfg, StateDir: stateDir,
		Environ: []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + cwd, "SHELL=/bin/sh", "LANG=C"},
		Cwd:     cwd, Confine: host.ConfineConfig{Helper: "/proc/self/exe"}, OnExit: onExit,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = l.Close(ctx)
	})
	return l
}

// startClient runs a client against g with a fresh state dir and host;
// mutate may change the configuration. It returns the client and its log.
func startClient(t *testing.T, g *fakeGateway, mutate func(*Config)) (*Client, *testutil.SyncBuffer) {
	t.Helper()
	state := t.TempDir()
	logs := &testutil.SyncBuffer{}
	var client atomic.Pointer[Client]
	onExit := func(ev protocol.ExitEvent) {
		if c := client.Load(); c != nil {
			go c.Exit(ev)
		}
	}
	cfg := Config{
		URL: g.url(), Token: "gw-token", StateDir: state, DisplayName: "test node", Version: "1.2.3",
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Host:   testHost(t, state, onExit), Security: "full", Ask: "off",
		Which: func(bins []string) map[string]string {
			out := map[string]string{}
			for _, b := range bins {
				if p, err := exec.LookPath(b); err == nil {
					out[b] = p
				}
			}
			return out
		},
		ReconnectMin: 20 * time.Millisecond, ReconnectMax: 100 * time.Millisecond,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	client.Store(c)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return c, logs
}

// waitLog waits until the client's log holds text.
func waitLog(t *testing.T, logs *testutil.SyncBuffer, text string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), text) {
		if time.Now().After(deadline) {
			t.Fatalf("log never said %q:\n%s", text, logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
