package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/execmesh/execmesh/internal/testutil"
)

// testTemp is where the package's tests build what has no cache
// directory to live in; TestMain removes it: a binary of 42 MB left in
// the system's temporary directory by every run adds up.
var testTemp tempRoot

// execmeshBinary builds cmd/execmesh once per test binary, into testTemp.
var execmeshBinary = sync.OnceValues(func() (string, error) {
	dir, err := testTemp.get()
	if err != nil {
		return "", err
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "execmesh")
	// -buildvcs=auto: the binary reports its commit (`execmesh version`)
	// where the tree is a git checkout, whatever GOFLAGS says.
	cmd := exec.Command("go", "build", "-buildvcs=auto", "-o", bin, "./cmd/execmesh")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, nil
})

// TestMain removes testTemp after the package's tests ran.
func TestMain(m *testing.M) {
	code := m.Run()
	if err := testTemp.remove(); err != nil {
		fmt.Fprintln(os.Stderr, "integration:", err)
	}
	os.Exit(code)
}

// tempRoot is one temporary directory, made on first use. The zero value
// is ready to use.
type tempRoot struct {
	mu      sync.Mutex
	dir     string
	removed bool
}

// get returns the directory, making it on the first call.
func (r *tempRoot) get() (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.removed {
		return "", errors.New("the test binary's temporary directory was removed")
	}
	if r.dir == "" {
		dir, err := os.MkdirTemp("", "execmesh-test-")
		if err != nil {
			return "", err
		}
		r.dir = dir
	}
	return r.dir, nil
}

// remove deletes the directory, if it was made; a later get fails.
func (r *tempRoot) remove() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	dir := r.dir
	r.dir, r.removed = "", true
	if dir == "" {
		return nil
	}
	return os.RemoveAll(dir)
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("go.mod not found")
		}
		dir = parent
	}
}

// freeAddr returns a loopback address with a port that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// daemonProc is an execmesh daemon started as a separate process.
type daemonProc struct {
	t        *testing.T
	cmd      *exec.Cmd
	url      string
	stateDir string
	natsAddr string // the embedded server's client address
	stderr   *testutil.SyncBuffer
	done     chan error
}

// startDaemon runs `execmesh <mode> --state-dir … --listen … --nats-listen …`
// with the given config and waits for /healthz.
func startDaemon(t *testing.T, mode string, config map[string]any, extra ...string) *daemonProc {
	t.Helper()
	bin, err := execmeshBinary()
	if err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	cfgPath := filepath.Join(state, "config.json")
	b, _ := json.Marshal(config)
	if err := os.WriteFile(cfgPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	listen, natsAddr := freeAddr(t), freeAddr(t)
	args := append([]string{mode, "--state-dir", state, "--config", cfgPath, "--listen", listen, "--nats-listen", natsAddr}, extra...)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "EXECMESH_GATEWAY_TOKEN=", "EXECMESH_OPERATOR_TOKEN=")
	stderr := &testutil.SyncBuffer{}
	cmd.Stderr = stderr
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &daemonProc{t: t, cmd: cmd, url: "http://" + listen, stateDir: state, natsAddr: natsAddr, stderr: stderr, done: make(chan error, 1)}
	go func() {
		_, _ = io.Copy(io.Discard, bufio.NewReader(stdout))
		d.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Signal(syscall.SIGKILL)
			<-d.done
		}
	})
	waitHealthy(t, d.url, d.done, stderr)
	return d
}

// waitHealthy waits up to a minute for a daemon's /healthz, failing the
// test with its log when it exits first (done receives its exit).
func waitHealthy(t *testing.T, url string, done <-chan error, log fmt.Stringer) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		res, err := http.Get(url + "/healthz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon did not become healthy: %v\n%s", err, log)
		}
		select {
		case err := <-done:
			t.Fatalf("daemon exited: %v\n%s", err, log)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// invoke posts a tool call and returns the decoded answer.
func (d *daemonProc) invoke(tool string, args map[string]any) map[string]any {
	d.t.Helper()
	b, _ := json.Marshal(map[string]any{"tool": tool, "args": args})
	res, err := http.Post(d.url+"/tools/invoke", "application/json", bytes.NewReader(b))
	if err != nil {
		d.t.Fatal(err)
	}
	defer res.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(res.Body).Decode(&out); err != nil {
		d.t.Fatal(err)
	}
	if res.StatusCode != 200 {
		d.t.Fatalf("%s %v: %d %v", tool, args, res.StatusCode, out)
	}
	return out["result"].(map[string]any)
}

// processesWith lists pids whose command line contains marker.
func processesWith(marker string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if strings.Contains(string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})), marker) {
			// Zombies still have a cmdline only briefly; skip state Z.
			st, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
			if i := bytes.LastIndexByte(st, ')'); i > 0 && len(st) > i+2 && st[i+2] == 'Z' {
				continue
			}
			pids = append(pids, pid)
		}
	}
	return pids
}

var fullAccess = map[string]any{"tools": map[string]any{"exec": map[string]any{"security": "full", "ask": "off", "killGraceMs": 1000}}}

// TestGatewaySIGTERMLeavesNoProcess: SIGTERM with running background
// sessions (one of them a setsid escapee) ends every process tree and the
// daemon exits 0.
func TestGatewaySIGTERMLeavesNoProcess(t *testing.T) {
	d := startDaemon(t, "gateway", fullAccess)
	marker := fmt.Sprintf("%d", time.Now().UnixNano()%1000000+4000000)
	for _, c := range []string{
		"sleep " + marker,
		"setsid sleep " + marker + " & sleep " + marker,
		"trap '' TERM; sleep " + marker,
	} {
		res := d.invoke("exec", map[string]any{"command": c, "background": true})
		if res["details"].(map[string]any)["status"] != "running" {
			t.Fatalf("%q: %v", c, res)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(processesWith("sleep "+marker)) < 4 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := len(processesWith("sleep " + marker)); n < 4 {
		t.Fatalf("expected 4 sleeps running, found %d", n)
	}
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-d.done:
		if err != nil {
			t.Fatalf("daemon exit: %v\n%s", err, d.stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("daemon did not exit after SIGTERM\n%s", d.stderr.String())
	}
	if left := processesWith("sleep " + marker); len(left) > 0 {
		t.Fatalf("processes left behind after SIGTERM: %v", left)
	}
}

// TestGatewayDrainTimeoutWaits: with --drain-timeout a short background
// command finishes on its own before the daemon exits.
func TestGatewayDrainTimeoutWaits(t *testing.T) {
	d := startDaemon(t, "gateway", fullAccess, "--drain-timeout", "20s")
	out := filepath.Join(t.TempDir(), "finished")
	d.invoke("exec", map[string]any{"command": "sleep 1; echo ok > " + out, "background": true})
	blockers := httpGetJSON(t, d.url+"/v1/admin/blockers")
	if n := len(blockers["blockers"].([]any)); n != 1 {
		t.Fatalf("blockers: %v", blockers)
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(30 * time.Second):
		t.Fatal("daemon did not exit")
	}
	if b, err := os.ReadFile(out); err != nil || strings.TrimSpace(string(b)) != "ok" {
		t.Fatalf("background command was not allowed to finish: %v %q", err, b)
	}
}

func httpGetJSON(t *testing.T, url string) map[string]any {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(res.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestUpRunsLocalNode: `execmesh up` pairs its own node; host=node runs
// there, backgrounded node sessions are pollable, and their exit events
// reach the sessionKey once.
func TestUpRunsLocalNode(t *testing.T) {
	d := startDaemon(t, "up", fullAccess)
	deadline := time.Now().Add(20 * time.Second)
	for {
		nodes := httpGetJSON(t, d.url+"/v1/nodes")["nodes"].([]any)
		if len(nodes) == 1 && nodes[0].(map[string]any)["status"] == "connected" && nodes[0].(map[string]any)["paired"] == true {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("local node not connected and paired: %v", nodes)
		}
		time.Sleep(50 * time.Millisecond)
	}
	res := d.invoke("exec", map[string]any{"command": "echo on-node", "host": "node"})
	if res["content"].([]any)[0].(map[string]any)["text"] != "on-node" {
		t.Fatalf("node exec: %v", res)
	}
	res = d.invoke("exec", map[string]any{"command": "echo node-bg; exit 5", "host": "node", "background": true})
	sid := res["details"].(map[string]any)["sessionId"].(string)
	var events []any
	for time.Now().Before(deadline.Add(10*time.Second)) && len(events) == 0 {
		events = httpGetJSON(t, d.url+"/v1/events?sessionKey=agent:main:main&waitMs=2000")["events"].([]any)
	}
	if len(events) != 1 || events[0].(map[string]any)["text"] != fmt.Sprintf("Exec completed (%s, code 5) :: node-bg", sid) {
		t.Fatalf("events: %v", events)
	}
	if more := httpGetJSON(t, d.url+"/v1/events?sessionKey=agent:main:main&waitMs=500")["events"].([]any); len(more) != 0 {
		t.Fatalf("event delivered twice: %v", more)
	}
	poll := d.invoke("process", map[string]any{"action": "poll", "sessionId": sid})
	if !strings.Contains(poll["content"].([]any)[0].(map[string]any)["text"].(string), "Process exited with code 5.") {
		t.Fatalf("poll of a node session: %v", poll)
	}
}

// TestDaemonSurfaces: /metrics (behind the token), /ui and /mcp are
// served by the daemon; counters move with calls.
func TestDaemonSurfaces(t *testing.T) {
	cfg := map[string]any{"gateway": map[string]any{"auth": map[string]any{"token": "tok"}},
		"tools": map[string]any{"exec": map[string]any{"security": "full", "ask": "off"}}}
	d := startDaemon(t, "gateway", cfg)
	get := func(path, token string) (int, string) {
		req, _ := http.NewRequest("GET", d.url+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	if code, _ := get("/metrics", ""); code != 401 {
		t.Fatalf("/metrics without token: %d", code)
	}
	for i := 0; i < 3; i++ {
		b, _ := json.Marshal(map[string]any{"tool": "exec", "args": map[string]any{"command": "echo m"}})
		req, _ := http.NewRequest("POST", d.url+"/tools/invoke", bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer tok")
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
	}
	code, body := get("/metrics", "tok")
	if code != 200 || !strings.Contains(body, `execmesh_tool_calls_total{action="",status="completed",tool="exec"} 3`) {
		t.Fatalf("/metrics: %d\n%s", code, body)
	}
	// Three runs of `echo m` wrote "m\n" each.
	if !strings.Contains(body, "\nexecmesh_output_bytes_total 6\n") {
		t.Fatalf("/metrics output bytes after three echoes:\n%s", body)
	}
	if code, body := get("/ui/", ""); code != 200 || !strings.Contains(body, "<html") {
		t.Fatalf("/ui/: %d %.200s", code, body)
	}
	if code, _ := get("/mcp", ""); code != 401 {
		t.Fatalf("/mcp without token: %d", code)
	}
}

// TestGatewaySIGHUPReloads: SIGHUP re-reads the configuration file without
// dropping sessions; a broken file keeps the old configuration.
func TestGatewaySIGHUPReloads(t *testing.T) {
	d := startDaemon(t, "gateway", fullAccess)
	res := d.invoke("exec", map[string]any{"command": "sleep 30", "background": true})
	sid := res["details"].(map[string]any)["sessionId"].(string)

	cfgPath := d.cmd.Args[slicesIndex(d.cmd.Args, "--config")+1]
	write := func(v any) {
		b, _ := json.Marshal(v)
		if err := os.WriteFile(cfgPath, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	status := func() int {
		b, _ := json.Marshal(map[string]any{"tool": "exec", "args": map[string]any{"command": "echo x"}})
		r, err := http.Post(d.url+"/tools/invoke", "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		return r.StatusCode
	}
	write(map[string]any{"tools": map[string]any{"deny": []string{"exec"}, "exec": map[string]any{"security": "full", "ask": "off"}}})
	_ = d.cmd.Process.Signal(syscall.SIGHUP)
	deadline := time.Now().Add(10 * time.Second)
	for status() != 404 {
		if time.Now().After(deadline) {
			t.Fatalf("exec still allowed after SIGHUP\n%s", d.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The running session survived the reload.
	list := d.invoke("process", map[string]any{"action": "list"})
	if !strings.Contains(list["content"].([]any)[0].(map[string]any)["text"].(string), sid+" running") {
		t.Fatalf("session lost on reload: %v", list)
	}
	// A broken file is refused; the configuration in force stays.
	if err := os.WriteFile(cfgPath, []byte(`{"tools":{"exec":{"host":"mars"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	_ = d.cmd.Process.Signal(syscall.SIGHUP)
	time.Sleep(300 * time.Millisecond)
	if s := status(); s != 404 {
		t.Fatalf("a bad reload changed the configuration: exec answers %d", s)
	}
	if !strings.Contains(d.stderr.String(), "tools.exec.host") {
		t.Fatalf("the failed reload does not name the key:\n%s", d.stderr.String())
	}
	d.invoke("process", map[string]any{"action": "kill", "sessionId": sid})
}

func slicesIndex(list []string, v string) int {
	for i, s := range list {
		if s == v {
			return i
		}
	}
	return -1
}

// TestNodeApprovalsFileEdit: `execmesh nodes approvals get|set` reads and
// replaces a node's own exec-approvals.json with optimistic concurrency,
// as the operator (the token in the daemon's state dir).
func TestNodeApprovalsFileEdit(t *testing.T) {
	d := startDaemon(t, "up", fullAccess)
	bin, _ := execmeshBinary()
	var nodeID string
	deadline := time.Now().Add(20 * time.Second)
	for nodeID == "" {
		if nodes := httpGetJSON(t, d.url+"/v1/nodes")["nodes"].([]any); len(nodes) == 1 {
			nodeID = nodes[0].(map[string]any)["id"].(string)
		} else if time.Now().After(deadline) {
			t.Fatal("no local node")
		} else {
			time.Sleep(50 * time.Millisecond)
		}
	}
	cli := func(stdin string, args ...string) (string, error) {
		cmd := exec.Command(bin, append(args, "--gateway", d.url)...)
		cmd.Stdin = strings.NewReader(stdin)
		// The operator's CLI, on the daemon's state dir (operator.token).
		cmd.Env = append(os.Environ(), "EXECMESH_STATE_DIR="+d.stateDir)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := cli("", "nodes", "approvals", "get", nodeID)
	var view struct {
		Exists bool   `json:"exists"`
		Hash   string `json:"hash"`
	}
	if err != nil || json.Unmarshal([]byte(out), &view) != nil || view.Exists {
		t.Fatalf("get: %v %s", err, out)
	}
	file := `{"version":1,"agents":{"main":{"allowlist":[{"pattern":"/usr/bin/echo"}]}}}`
	if out, err := cli(file, "nodes", "approvals", "set", nodeID, "-"); err == nil || !strings.Contains(out, "--base-hash is required") {
		t.Fatalf("set without base hash: %v %s", err, out)
	}
	if out, err := cli(file, "nodes", "approvals", "set", nodeID, "-", "--base-hash", ""); err != nil || !strings.Contains(out, "/usr/bin/echo") {
		t.Fatalf("set: %v %s", err, out)
	}
	out, _ = cli("", "nodes", "approvals", "get", nodeID)
	if err := json.Unmarshal([]byte(out), &view); err != nil || !view.Exists || view.Hash == "" || !strings.Contains(out, "/usr/bin/echo") {
		t.Fatalf("get after set: %s", out)
	}
	// A writer with a stale hash is refused; the file keeps its content.
	if out, err := cli(`{"version":1,"agents":{}}`, "nodes", "approvals", "set", nodeID, "-", "--base-hash", "stale"); err == nil || !strings.Contains(out, "changed") {
		t.Fatalf("stale set: %v %s", err, out)
	}
	if out, _ := cli("", "nodes", "approvals", "get", nodeID); !strings.Contains(out, "/usr/bin/echo") {
		t.Fatalf("stale write changed the file: %s", out)
	}
}
