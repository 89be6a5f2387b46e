package openclaw

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
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

// openclawConfig is OpenClaw's configuration for execmesh's MCP server
// named execmesh, as the README gives it: the built-in exec and process
// tools denied, Tool Search off, and server.
func openclawConfig(server map[string]any) map[string]any {
	return map[string]any{
		"tools": map[string]any{"profile": "coding", "deny": []any{"exec", "process"}, "toolSearch": false},
		"mcp":   map[string]any{"servers": map[string]any{"execmesh": server}},
	}
}

// stdioServer is `execmesh mcp` against d.
func stdioServer(t *testing.T, d *daemon, args ...string) map[string]any {
	return map[string]any{
		"command":          binary(t),
		"args":             append([]any{"mcp"}, toAny(args)...),
		"env":              map[string]any{"EXECMESH_GATEWAY_URL": d.url, "EXECMESH_GATEWAY_TOKEN": d.token},
		"requestTimeoutMs": 120000,
	}
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// exec calls the tool named name with args, as the model's reply.
func toolCall(name string, args map[string]any) openclawtest.Reply {
	return openclawtest.Reply{ToolCalls: []openclawtest.ToolCall{{Name: name, Args: args}}}
}
