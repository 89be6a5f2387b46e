package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/execmesh/execmesh/config"

	"github.com/execmesh/execmesh/access"

	"github.com/nats-io/nats.go"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/gateway"
	"github.com/execmesh/execmesh/internal/testutil"
	"github.com/execmesh/execmesh/protocol"
)

// This file is the harness of the node tests: an embedded NATS server and
// a gateway in the test process (so that they can be restarted and
// inspected), and node agents as real `execmesh node` processes (so that
// SIGKILL and restarts are real).

// nodeHeartbeat is the node agents' heartbeat interval in these tests; a
// node is unreachable 3 s after its last one (the gateway's presence TTL
// here).
const nodeHeartbeat = 200 * time.Millisecond

// nodeServer is an embedded NATS server that can be restarted on the same
// address and store.
type nodeServer struct {
	t        *testing.T
	listen   string
	storeDir string
	cfg      bus.ServerConfig
	srv      *bus.Server
}

func startNodeServer(t *testing.T, cfg bus.ServerConfig) *nodeServer {
	t.Helper()
	if cfg.Listen == "" {
		cfg.Listen = freeAddr(t)
	}
	if cfg.StoreDir == "" {
		cfg.StoreDir = filepath.Join(t.TempDir(), "nats")
	}
	cfg.JetStream = true
	ns := &nodeServer{t: t, listen: cfg.Listen, storeDir: cfg.StoreDir, cfg: cfg}
	ns.start()
	t.Cleanup(ns.stop)
	return ns
}

func (ns *nodeServer) start() {
	ns.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := bus.StartServer(ctx, ns.cfg)
	if err != nil {
		ns.t.Fatalf("start nats: %v", err)
	}
	ns.srv = s
}

func (ns *nodeServer) stop() {
	if ns.srv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := ns.srv.Shutdown(ctx); err != nil {
		ns.t.Errorf("nats shutdown: %v", err)
	}
	ns.srv = nil
}

func (ns *nodeServer) url() string { return "nats://" + ns.listen }

// itGateway is a gateway with its NATS API, node backend and HTTP API.
type itGateway struct {
	t        *testing.T
	g        *gateway.Gateway
	nc       *nats.Conn
	http     *httptest.Server
	stateDir string
	closed   bool
}

// startItGateway starts a gateway on the server (by URL, so that it
// reconnects when the server restarts), security=full and ask=off so that
// node commands run without approvals.
func startItGateway(t *testing.T, ns *nodeServer, stateDir string, cc bus.ClientConfig, mutate ...func(*config.Config)) *itGateway {
	t.Helper()
	if stateDir == "" {
		stateDir = t.TempDir()
	}
	cfg := config.Default()
	cfg.StateDir = stateDir
	cfg.Tools.Exec.Security = "full"
	cfg.Tools.Exec.Ask = "off"
	cfg.Tools.Exec.KillGraceMs = 1000
	for _, f := range mutate {
		f(&cfg)
	}
	cwd := t.TempDir()
	if len(cc.URLs) == 0 && cc.InProcess == nil {
		cc.URLs = []string{ns.url()}
	}
	cc.Name = "gateway"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, err := bus.Connect(ctx, cc, nil)
	if err != nil {
		t.Fatalf("gateway connect: %v", err)
	}
	g, err := gateway.New(t.Context(), cfg, gateway.Options{
		Conn:    nc,
		Server:  ns.srv,
		Cwd:     cwd,
		Environ: []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + cwd, "SHELL=/bin/sh", "LANG=C"},
		// A presence TTL of 3 s: heartbeats every 0.2 s may be late on a
		// loaded machine without the node looking lost.
		// A server on loopback (as most of these tests run) takes join
		// codes only with explicit join URLs, as one behind a forward
		// would: these point at the server itself.
		Getenv: func(k string) string {
			switch {
			case k == "EXECMESH_NODE_PRESENCE_TTL_MS":
				return "3000"
			case k == "EXECMESH_NODE_JOIN_URLS" && ns != nil && ns.srv != nil && ns.srv.ListensOnLoopback():
				return ns.srv.ClientURL()
			}
			return ""
		},
		LoginShellPath: func() string { return "" },
	})
	if err != nil {
		nc.Close()
		t.Fatalf("gateway.New: %v", err)
	}
	gw := &itGateway{t: t, g: g, nc: nc, http: httptest.NewServer(g.Handler()), stateDir: stateDir}
	t.Cleanup(gw.close)
	return gw
}

// close stops the gateway in the daemon's order; the server stays.
func (gw *itGateway) close() {
	if gw.closed {
		return
	}
	gw.closed = true
	gw.http.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := gw.g.Close(ctx); err != nil {
		gw.t.Errorf("gateway close: %v", err)
	}
	gw.nc.Close()
}

// itResponse is a decoded HTTP answer.
type itResponse struct {
	Status int
	OK     bool             `json:"ok"`
	Result *protocol.Result `json:"result"`
	Error  *protocol.Error  `json:"error"`
	Raw    []byte
}

func (gw *itGateway) do(method, path string, body any) *itResponse {
	gw.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, gw.http.URL+path, rd)
	if err != nil {
		gw.t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	// The operator drives these tests (pairing, approvals); its token
	// calls tools too.
	tok, err := access.ReadOperatorTokenFile(gw.stateDir)
	if err != nil {
		gw.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		gw.t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	r := &itResponse{Status: res.StatusCode, Raw: raw}
	if len(raw) > 0 && raw[0] == '{' {
		_ = json.Unmarshal(raw, r)
	}
	return r
}

func (gw *itGateway) invokeRaw(tool string, args map[string]any) *itResponse {
	gw.t.Helper()
	return gw.do("POST", "/tools/invoke", map[string]any{"tool": tool, "args": args})
}

// invokeAs calls a tool under another sessionKey.
func (gw *itGateway) invokeAs(sessionKey, tool string, args map[string]any) *itResponse {
	gw.t.Helper()
	return gw.do("POST", "/tools/invoke", map[string]any{"tool": tool, "args": args, "sessionKey": sessionKey})
}

// invoke calls a tool and fails unless the answer is a 200 result.
func (gw *itGateway) invoke(tool string, args map[string]any) protocol.Result {
	gw.t.Helper()
	r := gw.invokeRaw(tool, args)
	if r.Status != 200 || r.Result == nil {
		gw.t.Fatalf("%s %v: %d %s", tool, args, r.Status, r.Raw)
	}
	return *r.Result
}

// invokeErr calls a tool and fails unless the answer is an error.
func (gw *itGateway) invokeErr(tool string, args map[string]any) (int, *protocol.Error) {
	gw.t.Helper()
	r := gw.invokeRaw(tool, args)
	if r.Error == nil {
		gw.t.Fatalf("%s %v: want an error, got %d %s", tool, args, r.Status, r.Raw)
	}
	return r.Status, r.Error
}

func (gw *itGateway) nodes() []gateway.NodeView {
	gw.t.Helper()
	r := gw.do("GET", "/v1/nodes", nil)
	var out struct {
		Nodes []gateway.NodeView `json:"nodes"`
	}
	if err := json.Unmarshal(r.Raw, &out); err != nil {
		gw.t.Fatalf("nodes: %v: %s", err, r.Raw)
	}
	return out.Nodes
}

// waitNode waits until node id is listed with status (and pairing).
func (gw *itGateway) waitNode(id, status, pairing string) gateway.NodeView {
	gw.t.Helper()
	var got gateway.NodeView
	waitFor(gw.t, 60*time.Second, func() error {
		for _, n := range gw.nodes() {
			if n.ID == id {
				got = n
				if n.Status == status && (pairing == "" || n.Pairing == pairing) {
					return nil
				}
				return fmt.Errorf("node %s is %s/%s", id, n.Status, n.Pairing)
			}
		}
		return fmt.Errorf("node %s not listed", id)
	})
	return got
}

func (gw *itGateway) approve(id string) {
	gw.t.Helper()
	if r := gw.do("POST", "/v1/nodes/"+id+"/approve", nil); r.Status != 200 {
		gw.t.Fatalf("approve %s: %d %s", id, r.Status, r.Raw)
	}
}

// events takes the queued system events of the default sessionKey.
func (gw *itGateway) events(wait time.Duration) []protocol.SystemEvent {
	gw.t.Helper()
	r := gw.do("GET", fmt.Sprintf("/v1/events?sessionKey=%s&waitMs=%d", gateway.DefaultSessionKey, wait.Milliseconds()), nil)
	var out struct {
		Events []protocol.SystemEvent `json:"events"`
	}
	if err := json.Unmarshal(r.Raw, &out); err != nil {
		gw.t.Fatalf("events: %v: %s", err, r.Raw)
	}
	return out.Events
}

// waitExitEvents collects exit events until at least one arrived, then
// keeps listening for settle to catch duplicates.
func (gw *itGateway) waitExitEvents(total, settle time.Duration) []protocol.SystemEvent {
	gw.t.Helper()
	var evs []protocol.SystemEvent
	waitFor(gw.t, total, func() error {
		evs = append(evs, gw.events(250*time.Millisecond)...)
		if len(evs) == 0 {
			return fmt.Errorf("no exit event yet")
		}
		return nil
	})
	return append(evs, gw.events(settle)...)
}

// nodeProc is an `execmesh node` process.
type nodeProc struct {
	t        *testing.T
	id       string
	name     string
	stateDir string
	args     []string
	prefix   []string // command in front of the binary (ip netns exec …)
	cmd      *exec.Cmd
	out      *testutil.SyncBuffer
	done     chan struct{}
	err      error
	pids     []int // session process groups to clean up after a SIGKILL
}

// newNodeProc prepares a node agent process with a fresh state dir (its
// key created up front, so its id is known) and the given flags after
// the common ones.
func newNodeProc(t *testing.T, name string, flags ...string) *nodeProc {
	t.Helper()
	dir := t.TempDir()
	id, err := bus.LoadOrCreateNodeIdentity(dir)
	if err != nil {
		t.Fatal(err)
	}
	np := &nodeProc{t: t, id: id.NodeID, name: name, stateDir: dir}
	np.args = append([]string{"node", "--state-dir", dir, "--heartbeat", nodeHeartbeat.String(), "--log-level", "debug"}, flags...)
	if name != "" {
		np.args = append(np.args, "--name", name)
	}
	t.Cleanup(np.cleanup)
	return np
}

// start runs the process (again, after a stop or a kill).
func (np *nodeProc) start() {
	np.t.Helper()
	bin, err := execmeshBinary()
	if err != nil {
		np.t.Fatalf("build execmesh: %v", err)
	}
	argv := append(append(append([]string{}, np.prefix...), bin), np.args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = np.stateDir
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + np.stateDir, "SHELL=/bin/sh", "LANG=C"}
	np.out = &testutil.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = np.out, np.out
	if err := cmd.Start(); err != nil {
		np.t.Fatalf("start node: %v", err)
	}
	np.cmd = cmd
	np.done = make(chan struct{})
	go func() {
		np.err = cmd.Wait()
		close(np.done)
	}()
}

// wait waits for the process to exit and returns its error.
func (np *nodeProc) wait(d time.Duration) (error, bool) {
	select {
	case <-np.done:
		return np.err, true
	case <-time.After(d):
		return nil, false
	}
}

// kill sends SIGKILL and waits; the sessions' process groups survive it
// and are ended at cleanup.
func (np *nodeProc) kill() {
	np.t.Helper()
	_ = np.cmd.Process.Signal(syscall.SIGKILL)
	if _, ok := np.wait(10 * time.Second); !ok {
		np.t.Fatal("node did not die")
	}
}

// stop sends SIGTERM and waits for a clean exit.
func (np *nodeProc) stop() error {
	if np.cmd == nil {
		return nil
	}
	select {
	case <-np.done:
		return np.err
	default:
	}
	_ = np.cmd.Process.Signal(syscall.SIGTERM)
	if err, ok := np.wait(30 * time.Second); ok {
		return err
	}
	_ = np.cmd.Process.Signal(syscall.SIGKILL)
	err, _ := np.wait(10 * time.Second)
	return fmt.Errorf("node did not stop on SIGTERM: %v", err)
}

func (np *nodeProc) cleanup() {
	if err := np.stop(); err != nil && np.t.Failed() {
		np.t.Logf("node %s: %v", np.name, err)
	}
	for _, pid := range np.pids {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
	if np.t.Failed() && np.out != nil {
		out := np.out.String()
		if len(out) > 6000 {
			out = "…" + out[len(out)-6000:]
		}
		np.t.Logf("node %s output:\n%s", np.name, out)
	}
}

// track remembers the pid of a session's process group for cleanup.
func (np *nodeProc) track(res protocol.Result) {
	if pid, ok := res.Details.PID.Get(); ok {
		np.pids = append(np.pids, pid)
	}
}

// startPairedNode starts a node agent on the server, waits until the
// gateway sees it and approves it.
func startPairedNode(t *testing.T, ns *nodeServer, gw *itGateway, name string) *nodeProc {
	t.Helper()
	np := newNodeProc(t, name, "--nats-url", ns.url())
	np.start()
	gw.waitNode(np.id, "connected", "")
	gw.approve(np.id)
	return np
}

// waitFor retries f until it succeeds or total passed.
func waitFor(t *testing.T, total time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(total)
	var err error
	for {
		if err = f(); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met after %s: %v", total, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// pollUntilDone polls a session until it is no longer running.
// pollUntilDone polls id until it is no longer running. It returns the
// final poll and every poll's text joined: a poll drains pending output, so
// output the command printed may have come back in an earlier, running poll.
func (gw *itGateway) pollUntilDone(id string, total time.Duration) (last protocol.Result, seen string) {
	gw.t.Helper()
	var all strings.Builder
	waitFor(gw.t, total, func() error {
		last = gw.invoke("process", map[string]any{"action": "poll", "sessionId": id, "timeout": 1000})
		all.WriteString(last.Text())
		all.WriteByte('\n')
		if last.Status() == protocol.StatusRunning {
			return fmt.Errorf("still running")
		}
		return nil
	})
	return last, all.String()
}

func hasAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
