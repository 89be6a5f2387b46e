package openclawtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/execmesh/execmesh/internal/testutil"
)

// Gateway is a running OpenClaw gateway (`openclaw gateway run`) on
// loopback, with its own HOME, state dir and configuration file.
type Gateway struct {
	// Port is the gateway's WebSocket and HTTP port on 127.0.0.1.
	Port int
	// Token is the gateway's auth token.
	Token string
	// Dir holds home/, state/, workspace/, openclaw.json and openclaw.log.
	Dir string
	// Config is the configuration the gateway was started with.
	Config map[string]any

	in   *Install
	env  []string
	cmd  *exec.Cmd
	out  *testutil.SyncBuffer
	done chan struct{}
}

// GatewayOptions configure StartGateway.
type GatewayOptions struct {
	// Config is merged over the base configuration (objects key by key,
	// anything else replaced): gateway.mode local on a free loopback port
	// with a token, the Model as the default agent's only model, a
	// workspace in Dir, no heartbeat cadence, a log file in Dir.
	Config map[string]any
	// Env is added to the gateway's environment (and so to its MCP
	// servers' when they name it in their env).
	Env []string
	// Model is the scripted model the agent calls; nil means a new one
	// that answers "ok".
	Model *Model
}

// StartGateway starts an OpenClaw gateway for the test, waits until it is
// ready (about 10 s on two cores) and stops it, with every process it
// started, when the test ends.
func StartGateway(t testing.TB, in *Install, opts GatewayOptions) *Gateway {
	t.Helper()
	if opts.Model == nil {
		opts.Model = NewModel(t, nil)
	}
	dir := t.TempDir()
	for _, d := range []string{"home", "state", "workspace"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	g := &Gateway{Port: port, Token: "openclawtest-" + strconv.Itoa(port), Dir: dir, in: in, out: &testutil.SyncBuffer{}, done: make(chan struct{})}
	g.Config = mergeConfig(map[string]any{
		"gateway": map[string]any{
			"mode": "local", "port": port, "bind": "loopback",
			"auth": map[string]any{"mode": "token", "token": g.Token},
		},
		"logging": map[string]any{"file": filepath.Join(dir, "openclaw.log")},
		"agents": map[string]any{"defaults": map[string]any{
			"model":         map[string]any{"primary": ModelProvider + "/" + ModelID},
			"workspace":     filepath.Join(dir, "workspace"),
			"skipBootstrap": true,
			"heartbeat":     map[string]any{"every": "0m"},
		}},
		"models": map[string]any{"mode": "merge", "providers": map[string]any{ModelProvider: map[string]any{
			"baseUrl": opts.Model.URL, "apiKey": "scripted", "api": "openai-completions",
			"models": []any{map[string]any{
				"id": ModelID, "name": ModelID, "reasoning": false, "input": []any{"text"},
				"cost":          map[string]any{"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
				"contextWindow": 200000, "maxTokens": 8192,
			}},
		}}},
	}, opts.Config)
	cfgPath := filepath.Join(dir, "openclaw.json")
	b, err := json.MarshalIndent(g.Config, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfgPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	g.env = append(cleanEnv(),
		"HOME="+filepath.Join(dir, "home"),
		"OPENCLAW_STATE_DIR="+filepath.Join(dir, "state"),
		"OPENCLAW_CONFIG_PATH="+cfgPath,
		"PATH="+filepath.Dir(in.Node)+":"+os.Getenv("PATH"),
		"TMPDIR="+dir,
	)
	g.env = append(g.env, opts.Env...)

	start := time.Now()
	for attempt := 1; ; attempt++ {
		cmd := exec.Command(in.Node, in.Entry, "gateway", "run", "--port", strconv.Itoa(port), "--bind", "loopback")
		cmd.Dir = filepath.Join(dir, "workspace")
		cmd.Env = g.env
		cmd.Stdout, cmd.Stderr = g.out, g.out
		// A process group of its own: the gateway starts helpers (a spawn
		// broker, MCP servers), and all of them end with the test.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatalf("starting the OpenClaw gateway: %v", err)
		}
		done := make(chan struct{})
		go func() {
			_ = cmd.Wait()
			close(done)
		}()
		g.cmd, g.done = cmd, done
		if attempt == 1 {
			t.Cleanup(g.stop)
		}
		err := g.waitReady(90 * time.Second)
		if err == nil {
			break
		}
		// OpenClaw gives its own start-up steps 5 s each (its state
		// lease heartbeat among them) and exits when a loaded machine
		// takes longer: that is OpenClaw's start failing, not the test.
		if errors.Is(err, errExited) && attempt < 3 {
			t.Logf("OpenClaw gateway exited while starting (attempt %d); starting it again", attempt)
			continue
		}
		t.Fatalf("OpenClaw gateway: %v\n%s", err, g.Log())
	}
	t.Logf("OpenClaw gateway on port %d ready in %v", port, time.Since(start).Round(100*time.Millisecond))
	return g
}

// errExited is waitReady's error when the gateway exited first.
var errExited = errors.New("exited before it was ready")

// waitReady polls /readyz until it answers 200.
func (g *Gateway) waitReady(within time.Duration) error {
	deadline := time.Now().Add(within)
	url := fmt.Sprintf("http://127.0.0.1:%d/readyz", g.Port)
	for {
		res, err := http.Get(url)
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-g.done:
			return fmt.Errorf("%w: %v", errExited, g.cmd.ProcessState)
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready within %v (last: %v)", within, err)
		}
	}
}

// stop ends the gateway's process group: SIGTERM, then SIGKILL after 3 s
// (its own drain budget is minutes long).
func (g *Gateway) stop() {
	pgid := g.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-g.done:
	case <-time.After(3 * time.Second):
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	<-g.done
}

// Log returns what the gateway wrote to stdout and stderr so far, and the
// tail of its log file.
func (g *Gateway) Log() string {
	s := g.out.String()
	if b, err := os.ReadFile(filepath.Join(g.Dir, "openclaw.log")); err == nil {
		s += "\n--- openclaw.log ---\n" + tail(b, 6000)
	}
	return s
}

// Command returns `openclaw <args>` set up to talk to this gateway: its
// HOME, state dir, configuration (with the gateway's port and token) and
// Node.js runtime; such as Command(ctx, "nodes", "list", "--json").
func (g *Gateway) Command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, g.in.Node, append([]string{g.in.Entry}, args...)...)
	cmd.Dir = filepath.Join(g.Dir, "workspace")
	cmd.Env = append([]string(nil), g.env...)
	return cmd
}

// AgentResult is the answer of `openclaw agent --json`.
type AgentResult struct {
	// Raw is the JSON the CLI printed.
	Raw json.RawMessage
	// Text is the reply's text (the payloads' texts joined).
	Text string
	// Elapsed is how long the turn took, CLI start included.
	Elapsed time.Duration
}

// Agent runs one agent turn through the gateway: `openclaw agent
// --session-key <sessionKey> --message <message> --json`. sessionKey
// names an OpenClaw session (agent:main:<name>); each gets its own
// conversation and its own MCP server connections.
func (g *Gateway) Agent(ctx context.Context, sessionKey, message string) (AgentResult, error) {
	start := time.Now()
	cmd := g.Command(ctx, "agent", "--session-key", sessionKey, "--message", message, "--json", "--timeout", "120")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := AgentResult{Raw: stdout.Bytes(), Elapsed: time.Since(start)}
	if err != nil {
		return res, fmt.Errorf("openclaw agent --session-key %s: %w\nstdout: %s\nstderr: %s", sessionKey, err, tail(stdout.Bytes(), 4000), tail(stderr.Bytes(), 4000))
	}
	var ans struct {
		Result struct {
			Payloads []struct {
				Text string `json:"text"`
			} `json:"payloads"`
		} `json:"result"`
		Payloads []struct {
			Text string `json:"text"`
		} `json:"payloads"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &ans); err != nil {
		return res, fmt.Errorf("openclaw agent --json printed no JSON: %w\n%s", err, tail(stdout.Bytes(), 4000))
	}
	var texts []string
	for _, p := range append(ans.Result.Payloads, ans.Payloads...) {
		texts = append(texts, p.Text)
	}
	res.Text = strings.Join(texts, "\n")
	return res, nil
}

// mergeConfig returns base with over merged in: objects key by key,
// anything else replaced.
func mergeConfig(base, over map[string]any) map[string]any {
	out := maps.Clone(base)
	for k, v := range over {
		bm, ok1 := out[k].(map[string]any)
		om, ok2 := v.(map[string]any)
		if ok1 && ok2 {
			out[k] = mergeConfig(bm, om)
			continue
		}
		out[k] = v
	}
	return out
}

// cleanEnv is the test's environment without what would point OpenClaw
// at another installation or at real model providers.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "OPENCLAW_") || strings.HasSuffix(k, "_API_KEY") || k == "HOME" || k == "PATH" || k == "TMPDIR" {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// freePort returns a loopback port that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
