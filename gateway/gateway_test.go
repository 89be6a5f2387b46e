package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/config"

	"github.com/execmesh/execmesh/access"
	"github.com/execmesh/execmesh/confine"
	"github.com/execmesh/execmesh/protocol"
)

// TestMain lets the test binary be the confinement helper of the
// gateways and nodes it starts (host.ConfineConfig.Helper
// "/proc/self/exe"), as the execmesh binary is in production.
func TestMain(m *testing.M) {
	confine.RunHelperIfRequested()
	os.Exit(m.Run())
}

func TestInvokeShapesAndStatusCodes(t *testing.T) {
	tg := startGateway(t, func(c *config.Config, _ *Options) { c.Tools.Deny = []string{"process"} })
	cases := []struct {
		name       string
		method     string
		path       string
		body       string
		wantStatus int
		wantText   string // substring of result text or error message
	}{
		{"nested shape", "POST", "/tools/invoke", `{"tool":"exec","args":{"command":"echo nested"}}`, 200, "nested"},
		{"flat shape", "POST", "/tools/invoke", `{"tool":"exec","command":"echo flat","yieldMs":1000}`, 200, "flat"},
		{"flat shape with sessionKey", "POST", "/tools/invoke", `{"tool":"exec","command":"echo k","sessionKey":"agent:main:other"}`, 200, "k"},
		{"malformed JSON", "POST", "/tools/invoke", `{"tool":`, 400, "malformed JSON"},
		{"body not an object", "POST", "/tools/invoke", `[1,2]`, 400, "must be a JSON object"},
		{"args not an object", "POST", "/tools/invoke", `{"tool":"exec","args":"echo"}`, 400, `"args" must be a JSON object`},
		{"missing tool", "POST", "/tools/invoke", `{"args":{}}`, 400, `"tool" is required`},
		{"tool not a string", "POST", "/tools/invoke", `{"tool":5}`, 400, `"tool" must be a string`},
		{"unknown tool", "POST", "/tools/invoke", `{"tool":"browser","args":{}}`, 404, "Tool not available: browser"},
		{"denied tool", "POST", "/tools/invoke", `{"tool":"process","args":{"action":"list"}}`, 404, "Tool not available: process"},
		{"wrong field type", "POST", "/tools/invoke", `{"tool":"exec","args":{"command":"echo","pty":"yes"}}`, 400, `exec parameter "pty" must be a boolean`},
		{"unknown parameter hint", "POST", "/tools/invoke", `{"tool":"exec","args":{"command":"pwd","cwd":"/"}}`, 400, `exec parameter "cwd" is unsupported; use "workdir" instead`},
		{"empty command", "POST", "/tools/invoke", `{"tool":"exec","args":{"command":""}}`, 400, "Provide a command to start."},
		{"bad sessionKey", "POST", "/tools/invoke", `{"tool":"exec","args":{"command":"echo"},"sessionKey":"bogus key"}`, 400, "invalid sessionKey"},
		{"both shapes", "POST", "/tools/invoke", `{"tool":"exec","args":{"command":"echo"},"command":"x"}`, 400, "not both"},
		{"wrong method", "GET", "/tools/invoke", ``, 405, "method GET not allowed"},
		{"unknown path", "GET", "/nope", ``, 404, "not found"},
		{"healthz", "GET", "/healthz", ``, 200, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := tg.do(c.method, c.path, []byte(c.body), nil)
			if r.Status != c.wantStatus {
				t.Fatalf("status %d, want %d: %s", r.Status, c.wantStatus, r.Raw)
			}
			var text string
			switch {
			case r.Result != nil:
				text = r.Result.Text()
			case r.Error != nil:
				text = r.Error.Message
				if r.OK {
					t.Fatal("ok=true with an error")
				}
			}
			if !strings.Contains(text, c.wantText) {
				t.Fatalf("text %q does not contain %q", text, c.wantText)
			}
		})
	}
	t.Run("3 MB body is 413 and the gateway keeps working", func(t *testing.T) {
		big := `{"tool":"exec","args":{"command":"echo ` + strings.Repeat("x", 3<<20) + `"}}`
		r := tg.do("POST", "/tools/invoke", []byte(big), nil)
		if r.Status != http.StatusRequestEntityTooLarge || r.Error == nil || r.Error.Type != protocol.ErrTooLarge {
			t.Fatalf("got %d %s", r.Status, r.Raw[:min(len(r.Raw), 200)])
		}
		if res := tg.invoke("exec", map[string]any{"command": "echo still-up"}, ""); res.Text() != "still-up" {
			t.Fatalf("after 413: %q", res.Text())
		}
	})
	t.Run("process denied makes exec synchronous with a warning", func(t *testing.T) {
		res := tg.invoke("exec", map[string]any{"command": "sleep 0.3; echo late", "background": true}, "")
		if res.Status() != "completed" || res.Text() != warnBackgroundDisabled+"\n\nlate" {
			t.Fatalf("got %s %q", res.Status(), res.Text())
		}
	})
}

func TestAuth(t *testing.T) {
	tg := startGateway(t, func(c *config.Config, _ *Options) { c.Gateway.Auth.Token = "s3cret" })
	body := []byte(`{"tool":"exec","args":{"command":"echo ok"}}`)
	if r := tg.do("POST", "/tools/invoke", body, tg.asAgent()); r.Status != 200 {
		t.Fatalf("with token: %d %s", r.Status, r.Raw)
	}
	if r := tg.do("GET", "/healthz", nil, http.Header{"Authorization": {"Bearer nope"}}); r.Status != 200 {
		t.Fatalf("healthz needs no token: %d", r.Status)
	}
	for i := 0; i < access.FailureLimit; i++ {
		r := tg.do("POST", "/tools/invoke", body, http.Header{"Authorization": {"Bearer wrong"}})
		if r.Status != http.StatusUnauthorized || r.Error.Type != protocol.ErrUnauthorized {
			t.Fatalf("attempt %d: %d %s", i, r.Status, r.Raw)
		}
	}
	req, _ := http.NewRequest("POST", tg.srv.URL+"/tools/invoke", strings.NewReader(string(body)))
	req.Header.Set("Authorization", "Bearer wrong")
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusTooManyRequests || res.Header.Get("Retry-After") == "" {
		t.Fatalf("after %d failures: %d Retry-After=%q", access.FailureLimit, res.StatusCode, res.Header.Get("Retry-After"))
	}
}

func TestRefuseNonLoopbackWithoutToken(t *testing.T) {
	cfg := config.Default()
	cfg.StateDir = t.TempDir()
	cfg.Gateway.Listen = "0.0.0.0:8420"
	_, err := New(t.Context(), cfg, Options{})
	if err == nil || !strings.Contains(err.Error(), "gateway.listen") {
		t.Fatalf("want a refusal naming gateway.listen, got %v", err)
	}
}

// TestSecurityViolations covers spec §23.8 case 81.
func TestSecurityViolations(t *testing.T) {
	tg := startGateway(t, nil)
	cases := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"PATH": "/x"}, "Security Violation: Custom 'PATH' variable is forbidden during host execution."},
		{map[string]string{"LD_PRELOAD": "x"}, "Security Violation: Environment variable 'LD_PRELOAD' is forbidden during host execution."},
		{map[string]string{"PATH": "x", "LD_PRELOAD": "y"}, "Security Violation: Custom 'PATH' variable is forbidden during host execution (blocked override keys: LD_PRELOAD, PATH)."},
		{map[string]string{"BAD-KEY": "1"}, "Security Violation: invalid non-portable override keys: BAD-KEY."},
	}
	marker := filepath.Join(tg.cwd, "ran")
	for _, c := range cases {
		r := tg.invokeRaw("exec", map[string]any{"command": "touch " + marker, "env": c.env, "host": "gateway"}, "")
		if r.Status != 400 || r.Error == nil || r.Error.Message != c.want || r.Error.Type != protocol.ErrSecurityViolation {
			t.Errorf("env %v: got %d %s", c.env, r.Status, r.Raw)
		}
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("a refused command ran")
	}
	// host=sandbox with the sandbox off is refused before anything runs:
	// never a direct run with less policy than host=gateway's.
	r := tg.invokeRaw("exec", map[string]any{"command": "touch " + marker, "env": map[string]string{"PATH": "/x"}, "host": "sandbox"}, "")
	if r.Status != 400 || r.Error == nil || r.Error.Type != protocol.ErrHostNotAllowed || !strings.Contains(r.Error.Message, "sandbox runtime is off") {
		t.Fatalf("host=sandbox with sandbox off: %d %s", r.Status, r.Raw)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("host=sandbox ran with the sandbox off")
	}
}

// TestPathPrepend covers spec §23.5 case 51.
func TestPathPrepend(t *testing.T) {
	tg := startGateway(t, func(c *config.Config, o *Options) {
		c.Tools.Exec.PathPrepend = []string{"/custom/bin", "/opt/oss/bin"}
		o.Environ = []string{"PATH=/usr/bin", "SHELL=/bin/sh"}
	})
	res := tg.invoke("exec", map[string]any{"command": "echo $PATH"}, "")
	if res.Text() != "/custom/bin:/opt/oss/bin:/usr/bin" {
		t.Fatalf("PATH = %q", res.Text())
	}
}

func TestLoginShellPathMerged(t *testing.T) {
	tg := startGateway(t, func(c *config.Config, o *Options) {
		o.Environ = []string{"PATH=/usr/bin:/bin", "SHELL=/bin/sh"}
		o.LoginShellPath = func() string { return "/login/bin:/usr/bin" }
	})
	if res := tg.invoke("exec", map[string]any{"command": "echo $PATH"}, ""); res.Text() != "/login/bin:/usr/bin:/bin" {
		t.Fatalf("PATH = %q", res.Text())
	}
}

// TestScopeIsolation covers spec §23.5 case 49.
func TestScopeIsolation(t *testing.T) {
	tg := startGateway(t, nil)
	a := tg.invoke("exec", map[string]any{"command": "sleep 30", "background": true}, "agent:alpha:main")
	sid := a.SessionID()
	if sid == "" {
		t.Fatalf("no session id: %v", a.Details)
	}
	listB := tg.invoke("process", map[string]any{"action": "list"}, "agent:beta:main")
	if strings.Contains(listB.Text(), sid) {
		t.Fatalf("beta sees alpha's session: %q", listB.Text())
	}
	for _, action := range []string{"poll", "kill", "remove", "log"} {
		res := tg.invoke("process", map[string]any{"action": action, "sessionId": sid}, "agent:beta:main")
		if res.Status() != "failed" {
			t.Fatalf("beta %s alpha's session: %s %q", action, res.Status(), res.Text())
		}
	}
	listA := tg.invoke("process", map[string]any{"action": "list"}, "agent:alpha:main")
	if !strings.Contains(listA.Text(), sid+" running") {
		t.Fatalf("alpha's session disturbed: %q", listA.Text())
	}
	tg.invoke("process", map[string]any{"action": "kill", "sessionId": sid}, "agent:alpha:main")
}

// TestExitNotification covers spec §23.5 cases 50 and 90 through the events API.
func TestExitNotification(t *testing.T) {
	tg := startGateway(t, nil)
	res := tg.invoke("exec", map[string]any{"command": "printf '  line1\\n\\n line2  '; exit 2", "background": true}, "")
	sid := res.SessionID()
	r := tg.do("GET", "/v1/events?sessionKey=agent:main:main&waitMs=10000", nil, nil)
	var got struct{ Events []protocol.SystemEvent }
	if err := json.Unmarshal(r.Raw, &got); err != nil || len(got.Events) != 1 {
		t.Fatalf("events: %s (%v)", r.Raw, err)
	}
	ev := got.Events[0]
	want := fmt.Sprintf("Exec completed (%s, code 2) :: line1 line2", sid)
	if ev.Text != want || ev.Kind != protocol.EventExecExit || ev.ContextKey != "exec:"+sid || ev.SessionKey != DefaultSessionKey {
		t.Fatalf("event %+v, want text %q", ev, want)
	}
	// Reading acknowledged it.
	r = tg.do("GET", "/v1/events?sessionKey=agent:main:main", nil, nil)
	if !strings.Contains(string(r.Raw), `"events":[]`) {
		t.Fatalf("event delivered twice: %s", r.Raw)
	}
}

// A poll that delivered the terminal status drops the queued notification.
func TestTerminalPollAcknowledgesEvent(t *testing.T) {
	tg := startGateway(t, nil)
	res := tg.invoke("exec", map[string]any{"command": "echo bye; exit 1", "background": true}, "")
	sid := res.SessionID()
	// A poll that finds "bye" already pending answers at once, running
	// (spec case 28); the one after the exit is the terminal poll.
	var poll protocol.Result
	for range 20 {
		poll = tg.invoke("process", map[string]any{"action": "poll", "sessionId": sid, "timeout": 10000}, "")
		if poll.Status() != "running" {
			break
		}
	}
	if poll.Status() != "completed" {
		t.Fatalf("poll: %s %q", poll.Status(), poll.Text())
	}
	r := tg.do("GET", "/v1/events?sessionKey=agent:main:main&waitMs=300", nil, nil)
	if !strings.Contains(string(r.Raw), `"events":[]`) {
		t.Fatalf("event not suppressed by the terminal poll: %s", r.Raw)
	}
}

func TestEventStream(t *testing.T) {
	tg := startGateway(t, nil)
	req, _ := http.NewRequest("GET", tg.srv.URL+"/v1/events/stream?sessionKey=agent:main:main", nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if ct := res.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	out := tg.invoke("exec", map[string]any{"command": "echo streamed; exit 3", "background": true}, "")
	sid := out.SessionID()
	buf := make([]byte, 4096)
	var seen strings.Builder
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && !strings.Contains(seen.String(), "data: ") {
		n, err := res.Body.Read(buf)
		seen.Write(buf[:n])
		if err != nil {
			break
		}
	}
	if !strings.Contains(seen.String(), "event: exec.exit") || !strings.Contains(seen.String(), "Exec completed ("+sid+", code 3) :: streamed") {
		t.Fatalf("stream: %q", seen.String())
	}
}

// sandboxOffError is the refusal of host=sandbox without a sandbox runtime.
const sandboxOffError = `exec host not allowed (sandbox runtime is off; set sandbox.mode to "bwrap" to run host=sandbox commands in a bubblewrap sandbox, or use host=gateway, which runs them on the gateway host through exec approvals).`

func TestHostResolution(t *testing.T) {
	cases := []struct {
		configured, requested string
		sandbox, elevated     bool
		want, err             string
	}{
		{"auto", "", false, false, "gateway", ""},
		{"auto", "", true, false, "sandbox", ""},
		{"auto", "gateway", false, false, "gateway", ""},
		{"auto", "node", false, false, "node", ""},
		{"auto", "sandbox", true, false, "sandbox", ""},
		// host=sandbox runs in a sandbox or not at all (DESIGN.md §3.3).
		{"auto", "sandbox", false, false, "", sandboxOffError},
		{"sandbox", "", false, false, "", sandboxOffError},
		{"sandbox", "sandbox", false, false, "", sandboxOffError},
		{"sandbox", "", false, true, "gateway", ""},
		{"auto", "gateway", true, false, "", "exec host not allowed (requested gateway; configured host is auto; set tools.exec.host=gateway to allow this override)."},
		{"auto", "node", true, false, "", "exec host not allowed (requested node; configured host is auto; set tools.exec.host=node to allow this override)."},
		{"sandbox", "gateway", false, false, "", "exec host not allowed (requested gateway; configured host is sandbox; set tools.exec.host=gateway or auto to allow this override)."},
		{"gateway", "node", false, false, "", "exec host not allowed (requested node; configured host is gateway; set tools.exec.host=node or auto to allow this override)."},
		{"gateway", "gateway", false, false, "gateway", ""},
		{"sandbox", "", true, true, "gateway", ""},
		{"node", "", false, true, "node", ""},
	}
	for _, c := range cases {
		got, err := resolveHost(c.configured, c.requested, c.sandbox, c.elevated)
		if c.err != "" {
			if err == nil || err.Error() != c.err {
				t.Errorf("%+v: err %v, want %q", c, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%+v: got %q %v", c, got, err)
		}
	}
	if _, err := parseRequestedHost("mars"); err == nil || err.Error() != `Invalid exec host "mars". Allowed values: auto, sandbox, gateway, node.` {
		t.Errorf("invalid host: %v", err)
	}
}

// TestHostNotAllowedOverHTTP checks the error reaches the caller as a 400.
func TestHostNotAllowedOverHTTP(t *testing.T) {
	tg := startGateway(t, func(c *config.Config, _ *Options) { c.Tools.Exec.Host = "gateway" })
	r := tg.invokeRaw("exec", map[string]any{"command": "echo", "host": "node"}, "")
	if r.Status != 400 || r.Error.Type != protocol.ErrHostNotAllowed || !strings.HasPrefix(r.Error.Message, "exec host not allowed (requested node;") {
		t.Fatalf("%d %s", r.Status, r.Raw)
	}
	r = tg.invokeRaw("exec", map[string]any{"command": "echo", "host": "mars"}, "")
	if r.Status != 400 || !strings.Contains(r.Error.Message, `Invalid exec host "mars"`) {
		t.Fatalf("%d %s", r.Status, r.Raw)
	}
}

func TestSecurityAskTightenOnly(t *testing.T) {
	tg := startGateway(t, nil) // full/off
	c := &call{g: tg.g, cfg: tg.g.Config(), sessionKey: DefaultSessionKey, agentID: DefaultAgentID}
	for _, tc := range []struct {
		sessionSec, callSec, callAsk string
		security, ask                string
	}{
		{"", "", "", "full", "off"},
		{"allowlist", "full", "", "allowlist", "off"}, // a call cannot loosen the session's
		{"", "allowlist", "always", "allowlist", "always"},
		{"", "bogus", "sometimes", "full", "off"}, // invalid values are ignored
		{"deny", "", "on-miss", "deny", "on-miss"},
	} {
		sec, ask := c.policy(SessionExecDefaults{Security: tc.sessionSec}, protocol.ExecArgs{Security: tc.callSec, Ask: tc.callAsk})
		if sec != tc.security || ask != tc.ask {
			t.Errorf("%+v: got %s/%s", tc, sec, ask)
		}
	}
	r := tg.invokeRaw("exec", map[string]any{"command": "echo hi", "security": "deny"}, "")
	if r.Status != 400 || r.Error.Message != "exec denied: host=gateway security=deny" {
		t.Fatalf("per-call deny: %d %s", r.Status, r.Raw)
	}
}

func TestElevatedGates(t *testing.T) {
	tg := startGateway(t, nil)
	r := tg.invokeRaw("exec", map[string]any{"command": "echo hi", "elevated": true}, "")
	if r.Status != 400 || !strings.Contains(r.Error.Message, "Failing gates: enabled (tools.elevated.enabled") ||
		!strings.Contains(r.Error.Message, "Context: session=agent:main:main") {
		t.Fatalf("%d %s", r.Status, r.Raw)
	}
	tg2 := startGateway(t, func(c *config.Config, _ *Options) {
		c.Tools.Elevated.Enabled = true
		c.Tools.Elevated.AllowFrom = []string{"ops"}
	})
	r = tg2.invokeRaw("exec", map[string]any{"command": "echo hi", "elevated": true}, "")
	if r.Status != 400 || !strings.Contains(r.Error.Message, "Failing gates: allowFrom") {
		t.Fatalf("%d %s", r.Status, r.Raw)
	}
	if res := tg2.invoke("exec", map[string]any{"command": "echo hi", "elevated": true}, "agent:ops:main"); res.Text() != "hi" {
		t.Fatalf("allowed agent: %q", res.Text())
	}
}

func TestSessionExecDefaults(t *testing.T) {
	tg := startGateway(t, nil)
	r := tg.do("PUT", "/v1/sessions/agent:main:main/exec", []byte(`{"security":"deny"}`), nil)
	if r.Status != 200 {
		t.Fatalf("put: %d %s", r.Status, r.Raw)
	}
	if r := tg.invokeRaw("exec", map[string]any{"command": "echo"}, ""); r.Status != 400 || !strings.Contains(r.Error.Message, "security=deny") {
		t.Fatalf("defaults not applied: %d %s", r.Status, r.Raw)
	}
	// Other sessionKeys are unaffected.
	if res := tg.invoke("exec", map[string]any{"command": "echo other"}, "agent:main:other"); res.Text() != "other" {
		t.Fatalf("other key: %q", res.Text())
	}
	// Loosening is not possible: full stays allowlist-bounded by config.
	if r := tg.do("PUT", "/v1/sessions/agent:main:main/exec", []byte(`{"host":"mars"}`), nil); r.Status != 400 {
		t.Fatalf("bad host accepted: %d", r.Status)
	}
	if r := tg.do("PUT", "/v1/sessions/agent:main:main/exec", []byte(`{"bogus":1}`), nil); r.Status != 400 {
		t.Fatalf("unknown field accepted: %d", r.Status)
	}
	if r := tg.do("GET", "/v1/sessions/nonsense/exec", nil, nil); r.Status != 400 {
		t.Fatalf("bad key: %d", r.Status)
	}
	r = tg.do("GET", "/v1/sessions/agent:main:main/exec", nil, nil)
	if r.Status != 200 || !strings.Contains(string(r.Raw), `"security":"deny"`) {
		t.Fatalf("get: %d %s", r.Status, r.Raw)
	}
}

func TestExecTimeoutParamAndCwdHint(t *testing.T) {
	tg := startGateway(t, nil)
	res := tg.invoke("exec", map[string]any{"command": "echo start; sleep 5", "timeout": 1}, "")
	if res.Status() != "failed" || !strings.HasPrefix(res.Text(), "start\n\nCommand timed out after 1 seconds.") {
		t.Fatalf("timeout (seconds): %s %q", res.Status(), res.Text())
	}
	r := tg.invokeRaw("exec", map[string]any{"command": "pwd", "cwd": "/"}, "")
	if r.Status != 400 || r.Error.Message != `exec parameter "cwd" is unsupported; use "workdir" instead` {
		t.Fatalf("cwd: %d %s", r.Status, r.Raw)
	}
}

func TestToolsDenyExecKeepsProcess(t *testing.T) {
	tg := startGateway(t, nil)
	res := tg.invoke("exec", map[string]any{"command": "sleep 30", "background": true}, "")
	sid := res.SessionID()
	cfg := tg.g.Config()
	cfg.Tools.Deny = []string{"exec"}
	tg.g.cfgMu.Lock()
	tg.g.cfg = cfg
	tg.g.cfgMu.Unlock()
	if r := tg.invokeRaw("exec", map[string]any{"command": "echo"}, ""); r.Status != 404 {
		t.Fatalf("denied exec: %d", r.Status)
	}
	if res := tg.invoke("process", map[string]any{"action": "kill", "sessionId": sid}, ""); res.Status() != "completed" {
		t.Fatalf("process on a running session: %s %q", res.Status(), res.Text())
	}
}

func TestExecNodeBindingWritesConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(path, []byte(`{"gateway":{"drainTimeoutMs":5}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	tg := startGateway(t, func(_ *config.Config, o *Options) { o.ConfigPath = path })
	if r := tg.do("PUT", "/v1/config/exec-node", []byte(`{"agentId":"","node":"build-1"}`), nil); r.Status != 200 {
		t.Fatalf("%d %s", r.Status, r.Raw)
	}
	if r := tg.do("PUT", "/v1/config/exec-node", []byte(`{"agentId":"ops","node":"gpu-2"}`), nil); r.Status != 200 {
		t.Fatalf("%d %s", r.Status, r.Raw)
	}
	if r := tg.do("PUT", "/v1/config/exec-node", []byte(`{"agentId":"Bad!","node":"x"}`), nil); r.Status != 400 {
		t.Fatalf("bad agent: %d", r.Status)
	}
	cfg, err := config.Load(path, map[string]string{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Tools.Exec.Node != "build-1" || cfg.Gateway.DrainTimeoutMs != 5 {
		t.Fatalf("file: %+v", cfg)
	}
	if a, ok := cfg.Agent("ops"); !ok || a.Tools.Exec.Node != "gpu-2" {
		t.Fatalf("agent binding not written: %+v", cfg.Agents)
	}
	b := tg.g.ExecNodeBinding()
	if b.Default != "build-1" || b.Agents["ops"] != "gpu-2" {
		t.Fatalf("in memory: %+v", b)
	}
}

func TestApplyPatchTool(t *testing.T) {
	patch := "*** Begin Patch\n*** Add File: hello.txt\n+hello\n*** End Patch\n"
	t.Run("disabled by default", func(t *testing.T) {
		tg := startGateway(t, nil)
		if r := tg.invokeRaw("apply_patch", map[string]any{"input": patch}, ""); r.Status != 404 {
			t.Fatalf("%d %s", r.Status, r.Raw)
		}
	})
	tg := startGateway(t, func(c *config.Config, _ *Options) {
		c.Tools.Exec.ApplyPatch.Enabled = true
		c.Tools.Exec.ApplyPatch.AllowModels = []string{"gpt-5-codex"}
	})
	body := func(model string, args map[string]any) []byte {
		b, _ := json.Marshal(map[string]any{"tool": "apply_patch", "model": model, "args": args})
		return b
	}
	if r := tg.do("POST", "/tools/invoke", body("other-model", map[string]any{"input": patch}), nil); r.Status != 404 {
		t.Fatalf("model gate: %d %s", r.Status, r.Raw)
	}
	// tools.exec.applyPatch.workspaceOnly (the default): the agent's
	// workspace is the default workdir, and the only place patches go.
	ws := filepath.Join(tg.g.Config().Sandbox.Workspace, "main")
	r := tg.do("POST", "/tools/invoke", body("gpt-5-codex", map[string]any{"input": patch}), nil)
	if r.Status != 200 || !strings.Contains(r.Result.Text(), "A hello.txt") {
		t.Fatalf("apply: %d %s", r.Status, r.Raw)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "hello.txt")); err != nil || string(b) != "hello\n" {
		t.Fatalf("file: %q %v", b, err)
	}
	escape := "*** Begin Patch\n*** Add File: ../escaped.txt\n+x\n*** End Patch\n"
	if r := tg.do("POST", "/tools/invoke", body("gpt-5-codex", map[string]any{"input": escape}), nil); r.Status != 400 || r.Error.Type != protocol.ErrSecurityViolation {
		t.Fatalf("escape: %d %s", r.Status, r.Raw)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(ws), "escaped.txt")); err == nil {
		t.Fatal("escape written")
	}
	// A workdir outside the workspace, and a .git directory inside it,
	// are refused with nothing written.
	for _, args := range []map[string]any{
		{"input": patch, "workdir": tg.cwd},
		{"input": patch, "workdir": "../.."},
		{"input": "*** Begin Patch\n*** Add File: repo/.git/config\n+[alias]\n+\tst = !touch M\n*** End Patch\n"},
	} {
		r := tg.do("POST", "/tools/invoke", body("gpt-5-codex", args), nil)
		if r.Status != 400 || r.Error.Type != protocol.ErrSecurityViolation {
			t.Fatalf("%v: %d %s", args["workdir"], r.Status, r.Raw)
		}
	}
	if _, err := os.Stat(filepath.Join(tg.cwd, "hello.txt")); err == nil {
		t.Fatal("patch written outside the workspace")
	}
	if _, err := os.Stat(filepath.Join(ws, "repo")); err == nil {
		t.Fatal(".git patch written")
	}
	// workspaceOnly false: any workdir, the gateway's cwd by default.
	tgAny := startGateway(t, func(c *config.Config, _ *Options) {
		c.Tools.Exec.ApplyPatch.Enabled = true
		c.Tools.Exec.ApplyPatch.WorkspaceOnly = false
	})
	if r := tgAny.invokeRaw("apply_patch", map[string]any{"input": patch}, ""); r.Status != 200 {
		t.Fatalf("workspaceOnly false: %d %s", r.Status, r.Raw)
	}
	if b, err := os.ReadFile(filepath.Join(tgAny.cwd, "hello.txt")); err != nil || string(b) != "hello\n" {
		t.Fatalf("file in cwd: %q %v", b, err)
	}
	if r := tgAny.invokeRaw("apply_patch", map[string]any{"input": "*** Begin Patch\n*** Add File: .git/hooks/post-checkout\n+x\n*** End Patch\n"}, ""); r.Status != 400 || r.Error.Type != protocol.ErrSecurityViolation {
		t.Fatalf(".git with workspaceOnly false: %d %s", r.Status, r.Raw)
	}
	bad := "*** Begin Patch\n*** Update File: hello.txt\n@@\n-nothere\n+x\n*** End Patch\n"
	r = tg.do("POST", "/tools/invoke", body("gpt-5-codex", map[string]any{"input": bad}), nil)
	if r.Status != 200 || r.Result.Status() != "failed" || !strings.Contains(r.Result.Text(), "hello.txt") {
		t.Fatalf("failing hunk: %d %s", r.Status, r.Raw)
	}
	// tools.allow ["exec"] implies apply_patch; tools.deny ["exec"] removes it.
	tg2 := startGateway(t, func(c *config.Config, _ *Options) {
		c.Tools.Exec.ApplyPatch.Enabled = true
		c.Tools.Allow = []string{"exec"}
	})
	if r := tg2.invokeRaw("apply_patch", map[string]any{"input": patch}, ""); r.Status != 200 {
		t.Fatalf("allow exec: %d %s", r.Status, r.Raw)
	}
	tg3 := startGateway(t, func(c *config.Config, _ *Options) {
		c.Tools.Exec.ApplyPatch.Enabled = true
		c.Tools.Deny = []string{"exec"}
	})
	if r := tg3.invokeRaw("apply_patch", map[string]any{"input": patch}, ""); r.Status != 404 {
		t.Fatalf("deny exec: %d %s", r.Status, r.Raw)
	}
}
