package openclaw

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/execmesh/execmesh/internal/openclawtest"
	"github.com/execmesh/execmesh/internal/testutil"
)

// buildDir holds the execmesh binary; TestMain removes it.
var buildDir string

// execmeshBinary builds cmd/execmesh once per test binary.
var execmeshBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "execmesh-openclaw-test-")
	if err != nil {
		return "", err
	}
	buildDir = dir
	bin := filepath.Join(dir, "execmesh")
	cmd := exec.Command("go", "build", "-buildvcs=auto", "-o", bin, "./cmd/execmesh")
	cmd.Dir = "../.."
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, nil
})

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// binary returns the execmesh binary, failing the test when it cannot be
// built.
func binary(t *testing.T) string {
	t.Helper()
	bin, err := execmeshBinary()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// daemon is a running `execmesh up`.
type daemon struct {
	url   string
	token string
	log   *testutil.SyncBuffer
}

// startDaemon runs `execmesh up` on free loopback ports with security
// full and ask off (the agent's commands run without approvals) and a
// token, and waits for /healthz.
func startDaemon(t *testing.T) *daemon {
	t.Helper()
	bin := binary(t)
	state := t.TempDir()
	d := &daemon{token: "execmesh-openclaw-tok", log: &testutil.SyncBuffer{}}
	cfg := map[string]any{"tools": map[string]any{"exec": map[string]any{"security": "full", "ask": "off", "killGraceMs": 1000}}}
	b, _ := json.Marshal(cfg)
	cfgPath := filepath.Join(state, "config.json")
	if err := os.WriteFile(cfgPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	listen, natsAddr := freeAddr(t), freeAddr(t)
	d.url = "http://" + listen
	cmd := exec.Command(bin, "up", "--state-dir", state, "--config", cfgPath, "--listen", listen, "--nats-listen", natsAddr, "--token", d.token)
	cmd.Env = append(os.Environ(), "EXECMESH_GATEWAY_TOKEN=", "EXECMESH_OPERATOR_TOKEN=")
	cmd.Stderr = d.log
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, _ = io.Copy(io.Discard, bufio.NewReader(stdout))
		done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		res, err := http.Get(d.url + "/healthz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return d
			}
		}
		select {
		case err := <-done:
			t.Fatalf("execmesh up exited: %v\n%s", err, d.log)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("execmesh up not healthy: %v\n%s", err, d.log)
		}
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

// toolCall is a model reply that calls the tool name with args.
func toolCall(name string, args map[string]any) openclawtest.Reply {
	return openclawtest.Reply{ToolCalls: []openclawtest.ToolCall{{Name: name, Args: args}}}
}

// printConfig runs `execmesh mcp --print-config <client> args…` and
// returns the configuration it printed: the tests give OpenClaw exactly
// what a user would.
func printConfig(t *testing.T, client string, args ...string) map[string]any {
	t.Helper()
	cmd := exec.Command(binary(t), append([]string{"mcp", "--print-config", client}, args...)...)
	cmd.Env = append(os.Environ(), "EXECMESH_GATEWAY_TOKEN=", "EXECMESH_GATEWAY_URL=")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("execmesh mcp --print-config %s: %v", client, err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatalf("--print-config printed no JSON: %v\n%s", err, out)
	}
	return cfg
}

// invoke calls a tool on the daemon under sessionKey.
func (d *daemon) invoke(t *testing.T, sessionKey, tool string, args map[string]any) map[string]any {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"tool": tool, "args": args, "sessionKey": sessionKey})
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, d.url+"/tools/invoke", bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+d.token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var out struct {
		Result map[string]any `json:"result"`
	}
	if err := json.NewDecoder(res.Body).Decode(&out); err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("%s %v: %d %v", tool, args, res.StatusCode, err)
	}
	return out.Result
}

// waitExited waits until the session id of sessionKey is no longer
// running, asking with process list (which takes no output and no event).
func (d *daemon) waitExited(t *testing.T, sessionKey, id string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		res := d.invoke(t, sessionKey, "process", map[string]any{"action": "list"})
		details, _ := res["details"].(map[string]any)
		sessions, _ := details["sessions"].([]any)
		for _, s := range sessions {
			m, _ := s.(map[string]any)
			if m["sessionId"] == id && m["status"] != "running" {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("session %s of %s did not exit", id, sessionKey)
}

// agentTurn runs one turn of an OpenClaw session and fails the test, with
// the gateway's log, when it fails.
func agentTurn(t *testing.T, g *openclawtest.Gateway, sessionKey, message string) openclawtest.AgentResult {
	t.Helper()
	res, err := g.Agent(t.Context(), sessionKey, message)
	if err != nil {
		t.Fatalf("%v\n%s", err, g.Log())
	}
	t.Logf("turn %q of %s: %v", message, sessionKey, res.Elapsed.Round(100*time.Millisecond))
	return res
}

// runningID is the session id in a backgrounded exec's text.
var runningID = regexp.MustCompile(`Command still running \(session (\S+), pid`)
