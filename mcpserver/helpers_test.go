package mcpserver

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/config"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/execmesh/execmesh/gateway"
	"github.com/execmesh/execmesh/protocol"
)

// childEnv, when set, makes the test binary an MCP stdio server over an
// embedded gateway whose state dir is the variable's value (see TestMain).
const childEnv = "EXECMESH_MCPSERVER_TEST_CHILD"

func TestMain(m *testing.M) {
	if dir := os.Getenv(childEnv); dir != "" {
		os.Exit(runChild(dir))
	}
	os.Exit(m.Run())
}

// runChild is the tiny main of the stdio subprocess test.
func runChild(stateDir string) int {
	ctx := context.Background()
	emb, err := NewEmbedded(ctx, testConfig(stateDir), testGatewayOptions(stateDir))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer emb.Close(ctx)
	if err := ServeStdio(ctx, emb.Invoker(""), Options{Version: "test", StructuredContent: true}, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "serve:", err)
		return 1
	}
	return 0
}

// testConfig runs commands without approvals: security full, ask off.
func testConfig(stateDir string) config.Config {
	cfg := config.Default()
	cfg.StateDir = stateDir
	cfg.Tools.Exec.Security = "full"
	cfg.Tools.Exec.Ask = "off"
	cfg.Tools.Exec.KillGraceMs = 1000
	return cfg
}

func testGatewayOptions(cwd string) gateway.Options {
	return gateway.Options{
		Cwd:            cwd,
		Environ:        []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + cwd, "SHELL=/bin/sh", "LANG=C"},
		Getenv:         func(string) string { return "" },
		LoginShellPath: func() string { return "" },
	}
}

// startEmbedded starts an embedded gateway closed at the end of the test.
func startEmbedded(t *testing.T) *Embedded {
	t.Helper()
	dir := t.TempDir()
	emb, err := NewEmbedded(t.Context(), testConfig(dir), testGatewayOptions(dir))
	if err != nil {
		t.Fatalf("NewEmbedded: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := emb.Close(ctx); err != nil {
			t.Errorf("Embedded.Close: %v", err)
		}
	})
	return emb
}

// logSink collects logging notifications.
type logSink chan *mcp.LoggingMessageParams

func (s logSink) handler(_ context.Context, req *mcp.LoggingMessageRequest) {
	select {
	case s <- req.Params:
	default:
	}
}

// wait returns the first notification whose data mentions want.
func (s logSink) wait(t *testing.T, want string, within time.Duration) *mcp.LoggingMessageParams {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case p := <-s:
			b, _ := json.Marshal(p.Data)
			if strings.Contains(string(b), want) {
				return p
			}
		case <-deadline:
			t.Fatalf("no logging notification mentioning %q within %v", want, within)
			return nil
		}
	}
}

func newClient(sink logSink) *mcp.Client {
	return mcp.NewClient(&mcp.Implementation{Name: "execmesh-test", Version: "1"}, &mcp.ClientOptions{LoggingMessageHandler: sink.handler})
}

// call runs one tool call and fails the test on a protocol error.
func call(t *testing.T, cs *mcp.ClientSession, tool string, args any) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("CallTool %s %v: protocol error %v", tool, args, err)
	}
	return res
}

func text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// details returns the structured content as a map.
func details(t *testing.T, res *mcp.CallToolResult) map[string]any {
	t.Helper()
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("structured content %s: %v", b, err)
	}
	return m
}

// jsonNames returns the JSON names of a struct type's fields.
func jsonNames(v any) []string {
	var names []string
	rt := reflect.TypeOf(v)
	for i := range rt.NumField() {
		name, _, _ := strings.Cut(rt.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			names = append(names, name)
		}
	}
	return names
}

// checkTools verifies the listed tools: both present, every parameter of
// protocol.ExecArgs and ProcessArgs described, enums for the closed sets.
func checkTools(t *testing.T, cs *mcp.ClientSession) {
	t.Helper()
	lt, err := cs.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatalf("ListTools: %v", err)
	}
	tools := map[string]*mcp.Tool{}
	for _, tool := range lt.Tools {
		tools[tool.Name] = tool
	}
	if len(tools) != 2 || tools["exec"] == nil || tools["process"] == nil {
		t.Fatalf("tools: %v", tools)
	}
	wantEnums := map[string]map[string][]string{
		"exec":    {"host": hostValues, "security": securityValues, "ask": askValues},
		"process": {"action": protocol.ProcessActions},
	}
	for name, fields := range map[string][]string{"exec": jsonNames(protocol.ExecArgs{}), "process": jsonNames(protocol.ProcessArgs{})} {
		tool := tools[name]
		if len(tool.Description) < 80 {
			t.Errorf("%s: description too short: %q", name, tool.Description)
		}
		b, _ := json.Marshal(tool.InputSchema)
		var schema struct {
			Type       string   `json:"type"`
			Required   []string `json:"required"`
			Properties map[string]struct {
				Type        any      `json:"type"`
				Description string   `json:"description"`
				Enum        []string `json:"enum"`
			} `json:"properties"`
		}
		if err := json.Unmarshal(b, &schema); err != nil {
			t.Fatalf("%s schema %s: %v", name, b, err)
		}
		if schema.Type != "object" || len(schema.Required) != 1 {
			t.Errorf("%s schema: %s", name, b)
		}
		for _, f := range fields {
			p, ok := schema.Properties[f]
			if !ok || p.Type == nil || p.Description == "" {
				t.Errorf("%s: parameter %q missing, untyped or undescribed in %s", name, f, b)
			}
		}
		if len(schema.Properties) != len(fields) {
			t.Errorf("%s: %d schema properties, %d parameters", name, len(schema.Properties), len(fields))
		}
		for f, want := range wantEnums[name] {
			if got := schema.Properties[f].Enum; !reflect.DeepEqual(got, want) {
				t.Errorf("%s.%s enum = %v, want %v", name, f, got, want)
			}
		}
	}
}

// takeLogs sets the session's logging level to info: the client's word
// that it takes exit notices as logging notifications.
func takeLogs(t *testing.T, cs *mcp.ClientSession) {
	t.Helper()
	if err := cs.SetLoggingLevel(t.Context(), &mcp.SetLoggingLevelParams{Level: "info"}); err != nil {
		t.Fatalf("SetLoggingLevel: %v", err)
	}
}

// exerciseTools runs the conversation every transport must support, with
// a client that takes logging notifications and structured content: a
// foreground command, a background one polled to completion, an exit
// notice as a logging notification, and tool errors for bad arguments.
func exerciseTools(t *testing.T, cs *mcp.ClientSession, sink logSink) {
	t.Helper()
	checkTools(t, cs)
	takeLogs(t, cs)

	res := call(t, cs, "exec", map[string]any{"command": "echo hello from mcp"})
	if res.IsError || text(res) != "hello from mcp" || details(t, res)["status"] != "completed" {
		t.Fatalf("foreground exec: isError=%v text=%q details=%v", res.IsError, text(res), res.StructuredContent)
	}

	res = call(t, cs, "exec", map[string]any{"command": "sleep 0.3; echo bg-done", "background": true})
	d := details(t, res)
	id, _ := d["sessionId"].(string)
	if res.IsError || d["status"] != "running" || id == "" {
		t.Fatalf("background exec: isError=%v text=%q details=%v", res.IsError, text(res), d)
	}
	var final *mcp.CallToolResult
	var polled strings.Builder
	for range 20 {
		res = call(t, cs, "process", map[string]any{"action": "poll", "sessionId": id, "timeout": 5000})
		polled.WriteString(text(res))
		if details(t, res)["status"] != "running" {
			final = res
			break
		}
	}
	if final == nil || details(t, final)["status"] != "completed" || !strings.Contains(polled.String(), "bg-done") {
		t.Fatalf("poll to completion: %v; texts %q", final, polled.String())
	}

	// A second background session, never polled: its exit is announced.
	res = call(t, cs, "exec", map[string]any{"command": "echo notify-me; exit 3", "background": true})
	id2, _ := details(t, res)["sessionId"].(string)
	msg := sink.wait(t, "notify-me", 15*time.Second)
	if msg.Level != "info" || msg.Logger != Logger {
		t.Errorf("notification level %q logger %q", msg.Level, msg.Logger)
	}
	b, _ := json.Marshal(msg.Data)
	var ev protocol.SystemEvent
	if err := json.Unmarshal(b, &ev); err != nil || ev.Kind != protocol.EventExecExit || !strings.HasPrefix(ev.Text, "Exec completed ("+id2+", ") || !strings.Contains(ev.Text, "code 3") {
		t.Errorf("exit event %s (%v)", b, err)
	}

	// Bad input is a tool error the model can read, never a protocol error.
	for _, tc := range []struct {
		tool string
		args any
		want string
	}{
		{"exec", map[string]any{"command": 42}, `"command" must be a string`},
		{"exec", map[string]any{"command": "ls", "cwd": "/"}, `use "workdir" instead`},
		{"exec", map[string]any{"command": "ls", "yieldMs": "soon"}, `"yieldMs" must be a number`},
		{"process", map[string]any{"action": "poll", "sessionId": id, "timeout": true}, `"timeout" must be`},
		{"exec", map[string]any{}, "Provide a command to start."},
		{"exec", []any{"ls"}, "must be a JSON object"},
	} {
		res := call(t, cs, tc.tool, tc.args)
		if !res.IsError || !strings.Contains(text(res), tc.want) {
			t.Errorf("%s %v: isError=%v text=%q, want an error mentioning %q", tc.tool, tc.args, res.IsError, text(res), tc.want)
		}
	}
	// A failed process action is a plain result (spec §15.2); a failed
	// exec is marked as an error (spec §12.2).
	res = call(t, cs, "process", map[string]any{"action": "poll", "sessionId": "no-such-session"})
	if res.IsError || details(t, res)["status"] != "failed" || !strings.Contains(text(res), "No session found") {
		t.Errorf("unknown session: isError=%v %q", res.IsError, text(res))
	}
	res = call(t, cs, "process", map[string]any{"action": "explode"})
	if res.IsError || !strings.Contains(text(res), "Invalid process action") {
		t.Errorf("bad action: isError=%v %q", res.IsError, text(res))
	}
	res = call(t, cs, "exec", map[string]any{"command": "no-such-command-xyz"})
	if !res.IsError || details(t, res)["status"] != "failed" {
		t.Errorf("command not found: isError=%v %q %v", res.IsError, text(res), res.StructuredContent)
	}
}
