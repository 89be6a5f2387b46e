package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/execmesh/execmesh/config"

	"github.com/execmesh/execmesh/access"
	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
	"github.com/execmesh/execmesh/internal/testutil"
	"github.com/execmesh/execmesh/protocol"
)

// rawAnswer is an HTTP answer read from a raw connection.
type rawAnswer struct {
	status int
	header http.Header
	body   string
	errTyp protocol.ErrorType
}

// rawRequest sends one request byte for byte (testutil.RawHTTP) and
// decodes the error type of the answer.
func rawRequest(t *testing.T, addr, from, head, body string) rawAnswer {
	t.Helper()
	r := testutil.RawHTTP(t, addr, from, head, body)
	a := rawAnswer{status: r.Status, header: r.Header, body: r.Body}
	var env struct {
		Error *protocol.Error `json:"error"`
	}
	if json.Unmarshal([]byte(r.Body), &env) == nil && env.Error != nil {
		a.errTyp = env.Error.Type
	}
	return a
}

// touchCall is a tool call that creates marker.
func touchCall(marker string) string {
	b, _ := json.Marshal(map[string]any{"tool": "exec", "args": map[string]any{"command": "touch " + marker}})
	return string(b)
}

// TestBrowserRequestsRefused (class A, raw headers): what a web
// page can make a browser send to a loopback gateway without a token is
// refused before anything runs — a cross-origin "simple" POST
// (Content-Type text/plain, Origin http://evil.example), a rebinding Host
// (rebind.evil.example), and the rest of the family — while what the
// control page, the CLI, curl and MCP clients send still runs.
func TestBrowserRequestsRefused(t *testing.T) {
	tg := startGateway(t, nil) // token-less, security full, ask off
	u, _ := url.Parse(tg.srv.URL)
	addr, port := u.Host, u.Port()
	dir := t.TempDir()
	cases := []struct {
		name    string
		headers string // beside the request line; %s is the gateway's host:port
		want    int
		typ     protocol.ErrorType
	}{
		{"cross-origin simple POST", "Host: %s\nOrigin: http://evil.example\nContent-Type: text/plain", 403, protocol.ErrForbidden},
		{"cross-origin JSON POST", "Host: %s\nOrigin: http://evil.example\nContent-Type: application/json", 403, protocol.ErrForbidden},
		{"cross-origin from another loopback port", "Host: %s\nOrigin: http://127.0.0.1:1\nContent-Type: application/json", 403, protocol.ErrForbidden},
		{"opaque origin", "Host: %s\nOrigin: null\nContent-Type: text/plain", 403, protocol.ErrForbidden},
		{"Sec-Fetch-Site cross-site", "Host: %s\nSec-Fetch-Site: cross-site\nSec-Fetch-Mode: no-cors\nContent-Type: text/plain", 403, protocol.ErrForbidden},
		{"Sec-Fetch-Site same-site", "Host: %s\nSec-Fetch-Site: same-site\nContent-Type: application/json", 403, protocol.ErrForbidden},
		{"rebinding Host", "Host: rebind.evil.example\nContent-Type: text/plain", 421, protocol.ErrMisdirected},
		{"rebinding Host with the port", "Host: rebind.evil.example:" + port + "\nOrigin: http://rebind.evil.example:" + port + "\nContent-Type: application/json", 421, protocol.ErrMisdirected},
		{"loopback Host on another port", "Host: 127.0.0.1:1\nContent-Type: application/json", 421, protocol.ErrMisdirected},
		{"text/plain without Origin", "Host: %s\nContent-Type: text/plain", 415, protocol.ErrUnsupportedMedia},
		{"form-urlencoded (curl -d)", "Host: %s\nContent-Type: application/x-www-form-urlencoded", 415, protocol.ErrUnsupportedMedia},
		{"no Content-Type", "Host: %s", 415, protocol.ErrUnsupportedMedia},
		// What the gateway's own clients send.
		{"curl with JSON", "Host: %s\nContent-Type: application/json\nUser-Agent: curl/8.5.0", 200, ""},
		{"the control page", "Host: %s\nOrigin: http://%s\nSec-Fetch-Site: same-origin\nSec-Fetch-Mode: cors\nContent-Type: application/json", 200, ""},
		{"localhost", "Host: localhost:" + port + "\nContent-Type: application/json; charset=utf-8", 200, ""},
		{"IPv6 loopback", "Host: [::1]:" + port + "\nContent-Type: application/json", 200, ""},
		{"user typed the URL", "Host: %s\nSec-Fetch-Site: none\nContent-Type: application/json", 200, ""},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			marker := filepath.Join(dir, fmt.Sprintf("m%d", i))
			head := "POST /tools/invoke HTTP/1.1\n" + strings.ReplaceAll(c.headers, "%s", addr)
			a := rawRequest(t, addr, "", head, touchCall(marker))
			_, err := os.Stat(marker)
			ran := err == nil
			if a.status != c.want || a.errTyp != c.typ {
				t.Fatalf("got %d %s, want %d %s: %s", a.status, a.errTyp, c.want, c.typ, a.body)
			}
			if ran != (c.want == 200) {
				t.Fatalf("ran=%v with answer %d: %s", ran, a.status, a.body)
			}
		})
	}

	// GETs carry no Origin from a page's <img> or <script>; Sec-Fetch-Site
	// tells them apart. /v1/events acknowledges what it returns.
	tg.g.emit(t.Context(), protocol.SystemEvent{SessionKey: DefaultSessionKey, Kind: protocol.EventExecExit, Text: "keep me"}, "")
	a := rawRequest(t, addr, "", "GET /v1/events?sessionKey=agent:main:main HTTP/1.1\nHost: "+addr+"\nSec-Fetch-Site: cross-site\nSec-Fetch-Mode: no-cors\nSec-Fetch-Dest: image", "")
	if a.status != 403 || a.errTyp != protocol.ErrForbidden {
		t.Fatalf("cross-site GET /v1/events: %d %s", a.status, a.body)
	}
	if evs, err := tg.g.TakeEvents(context.Background(), DefaultSessionKey, 0, ""); err != nil || len(evs) != 1 || evs[0].Text != "keep me" {
		t.Fatalf("the refused GET consumed events: %+v", evs)
	}
	// The refusals say what to do.
	a = rawRequest(t, addr, "", "POST /tools/invoke HTTP/1.1\nHost: rebind.evil.example\nContent-Type: application/json", "{}")
	if !strings.Contains(a.body, "gateway.allowedHosts") {
		t.Errorf("421 text: %s", a.body)
	}
	a = rawRequest(t, addr, "", "POST /tools/invoke HTTP/1.1\nHost: "+addr+"\nContent-Type: text/plain", "{}")
	if !strings.Contains(a.body, "Content-Type: application/json") {
		t.Errorf("415 text: %s", a.body)
	}
}

// TestAllowedHosts: gateway.allowedHosts names the gateway under further
// names (a reverse proxy's), in Host and, for its control page, Origin.
func TestAllowedHosts(t *testing.T) {
	tg := startGateway(t, func(c *config.Config, _ *Options) {
		c.Gateway.AllowedHosts = []string{"Execmesh.Example.COM", "gw.internal:9443"}
	})
	addr := strings.TrimPrefix(tg.srv.URL, "http://")
	for _, c := range []struct {
		headers string
		want    int
	}{
		{"Host: execmesh.example.com\nOrigin: https://execmesh.example.com", 200},
		{"Host: execmesh.example.com:8443", 200},
		{"Host: gw.internal:9443\nOrigin: https://gw.internal:9443", 200},
		{"Host: gw.internal:9444", 421},
		{"Host: gw.internal", 421},
		{"Host: other.example.com", 421},
		{"Host: execmesh.example.com\nOrigin: https://evil.example", 403},
	} {
		a := rawRequest(t, addr, "", "POST /tools/invoke HTTP/1.1\n"+c.headers+"\nContent-Type: application/json", `{"tool":"process","args":{"action":"list"}}`)
		if a.status != c.want {
			t.Errorf("%q: %d, want %d: %s", c.headers, a.status, c.want, a.body)
		}
	}
}

// TestProtectUI: a link from another site to the control page opens it
// (a navigation to GET /ui); nothing else from another site passes.
func TestProtectUI(t *testing.T) {
	tg := startGateway(t, nil)
	h := tg.g.Protect(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	for _, c := range []struct {
		method, path, mode string
		want               int
	}{
		{"GET", "/ui/", "navigate", 204},
		{"GET", "/ui", "navigate", 204},
		{"GET", "/ui/app.js", "no-cors", 403},
		{"POST", "/ui/", "navigate", 403},
		{"GET", "/v1/events", "navigate", 403},
		{"GET", "/uix", "navigate", 403},
	} {
		req, _ := http.NewRequest(c.method, "http://127.0.0.1:8420"+c.path, nil)
		req.Header.Set("Sec-Fetch-Site", "cross-site")
		req.Header.Set("Sec-Fetch-Mode", c.mode)
		w := &statusRecorder{header: http.Header{}}
		h.ServeHTTP(w, req)
		if w.status != c.want {
			t.Errorf("%s %s (%s): %d, want %d", c.method, c.path, c.mode, w.status, c.want)
		}
	}
}

type statusRecorder struct {
	header http.Header
	status int
}

func (r *statusRecorder) Header() http.Header         { return r.header }
func (r *statusRecorder) Write(b []byte) (int, error) { return len(b), nil }
func (r *statusRecorder) WriteHeader(s int)           { r.status = s }

func TestAllowedHostsValidation(t *testing.T) {
	for _, bad := range []string{"", "http://x.example", "x.example/path", "*.example.com", "x.example:0", "x.example:http", "a b"} {
		cfg := config.Default()
		cfg.Gateway.AllowedHosts = []string{"ok.example", bad}
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), "gateway.allowedHosts[1]") {
			t.Errorf("%q: %v", bad, err)
		}
	}
	cfg := config.Default()
	cfg.Gateway.AllowedHosts = []string{"GW.Example.", "[::1]:8443", "10.0.0.5"}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cfg.Gateway.AllowedHosts, ","); got != "gw.example,[::1]:8443,10.0.0.5" {
		t.Errorf("normalised: %s", got)
	}
}

// TestSandboxHostNeedsRuntime (class C): without a sandbox
// runtime (sandbox.mode off, the default) host=sandbox is refused with a
// clear error, per call and per session, and nothing runs; a configured
// tools.exec.host sandbox is a start-up error naming the keys.
func TestSandboxHostNeedsRuntime(t *testing.T) {
	tg := startApprovalGateway(t, "", nil) // out of the box: allowlist, on-miss
	marker := filepath.Join(t.TempDir(), "pwned")
	for _, args := range []map[string]any{
		{"command": "id > " + marker, "host": "sandbox"},
		{"command": "id > " + marker, "host": "sandbox", "env": map[string]string{"LD_PRELOAD": "/tmp/x.so", "BASH_ENV": "/tmp/x"}},
	} {
		r := tg.invokeRaw("exec", args, "")
		if r.Status != 400 || r.Error == nil || r.Error.Type != protocol.ErrHostNotAllowed || r.Error.Message != sandboxOffError {
			t.Fatalf("host=sandbox without a runtime: %d %s", r.Status, r.Raw)
		}
	}
	path := "/v1/sessions/" + url.PathEscape(DefaultSessionKey) + "/exec"
	r := tg.do("PUT", path, []byte(`{"host":"sandbox"}`), tg.asAgent())
	if r.Status != 400 || r.Error == nil || r.Error.Type != protocol.ErrHostNotAllowed || !strings.HasPrefix(r.Error.Message, "exec host not allowed (sandbox runtime is off;") {
		t.Fatalf("PUT session host=sandbox: %d %s", r.Status, r.Raw)
	}
	if d, _ := tg.g.SessionDefaults(DefaultSessionKey); d.Host != "" {
		t.Fatalf("the refused session default was kept: %+v", d)
	}
	// Without the per-call host the same command goes through approvals.
	res := tg.invoke("exec", map[string]any{"command": "id > " + marker}, "")
	if res.Status() != protocol.StatusApprovalPending {
		t.Fatalf("host=gateway: %s %q", res.Status(), res.Text())
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("a command ran")
	}

	for _, c := range []struct{ doc, key string }{
		{`{"tools":{"exec":{"host":"sandbox"}}}`, "tools.exec.host"},
		{`{"agents":{"list":[{"id":"ops","tools":{"exec":{"host":"sandbox"}}}]}}`, "agents.list[0].tools.exec.host"},
		{`{"tools":{"exec":{"host":"sandbox"}},"sandbox":{"mode":"off"}}`, "tools.exec.host"},
	} {
		_, err := config.Decode([]byte(c.doc))
		if err == nil || !strings.Contains(err.Error(), c.key+`: "sandbox" needs a sandbox runtime, but sandbox.mode is "off"`) {
			t.Errorf("%s: %v", c.doc, err)
		}
	}
	if _, err := config.Decode([]byte(`{"tools":{"exec":{"host":"sandbox"}},"sandbox":{"mode":"bwrap"}}`)); err != nil {
		t.Errorf("host sandbox with bwrap: %v", err)
	}
	cfg := config.Default()
	cfg.StateDir = t.TempDir()
	cfg.Tools.Exec.Host = "sandbox"
	if _, err := New(t.Context(), cfg, Options{Cwd: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "sandbox.mode") {
		t.Fatalf("New with host sandbox and no runtime: %v", err)
	}
}

// TestSandboxEnvBlocklist (class C): in a real sandbox the
// request env meets host=gateway's blocklists (LD_PRELOAD, BASH_ENV, …);
// only PATH is allowed, applied inside.
func TestSandboxEnvBlocklist(t *testing.T) {
	tg := startSandboxGateway(t, nil)
	marker := filepath.Join(tg.g.Config().Sandbox.Workspace, "main", "ran")
	for _, env := range []map[string]string{
		{"LD_PRELOAD": "/tmp/x.so"},
		{"BASH_ENV": "/tmp/x"},
		{"PATH": "/x", "LD_AUDIT": "y"},
		{"BAD-KEY": "1"},
	} {
		r := tg.invokeRaw("exec", map[string]any{"command": "touch ran", "env": env}, "")
		if r.Status != 400 || r.Error == nil || r.Error.Type != protocol.ErrSecurityViolation {
			t.Errorf("env %v in the sandbox: %d %s", env, r.Status, r.Raw)
		}
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("a refused command ran")
	}
	res := tg.invoke("exec", map[string]any{"command": "echo $PATH; echo $GREETING", "env": map[string]string{"PATH": "/x", "GREETING": "hi"}}, "")
	if !strings.HasPrefix(res.Text(), "/x:") || !strings.HasSuffix(res.Text(), "\nhi") {
		t.Fatalf("sandbox PATH and env: %q", res.Text())
	}
}

// operatorCase is a request to an endpoint that needs the operator token.
type operatorCase struct {
	method, path, body string
	// ok is the status the operator gets (the endpoint's own answer).
	ok int
}

// checkOperatorOnly sends each case with the agent's credential (the tool
// token, or none on a token-less gateway), a wrong token and the operator
// token: 403 forbidden, 401, and the endpoint's answer.
func checkOperatorOnly(t *testing.T, tg *testGateway, cases []operatorCase) {
	t.Helper()
	for _, c := range cases {
		r := tg.do(c.method, c.path, []byte(c.body), tg.asAgent())
		if r.Status != 403 || r.Error == nil || r.Error.Type != protocol.ErrForbidden || !strings.Contains(r.Error.Message, "needs the operator token") {
			t.Errorf("%s %s as the agent: %d %s", c.method, c.path, r.Status, r.Raw)
		}
		if r := tg.do(c.method, c.path, []byte(c.body), http.Header{"Authorization": {"Bearer not-a-token"}}); r.Status != 401 {
			t.Errorf("%s %s with a wrong token: %d %s", c.method, c.path, r.Status, r.Raw)
		}
		if r := tg.do(c.method, c.path, []byte(c.body), nil); r.Status != c.ok {
			t.Errorf("%s %s as the operator: %d (want %d) %s", c.method, c.path, r.Status, c.ok, r.Raw)
		}
	}
}

// TestOperatorAuthority (class F): the agent's credential — the
// tool token, or none on a token-less loopback gateway — cannot decide
// approvals or change configuration (403 forbidden, nothing decided); the
// operator token can, and calls tools too.
func TestOperatorAuthority(t *testing.T) {
	for _, toolToken := range []string{"", "tool-tok"} {
		t.Run("toolToken="+toolToken, func(t *testing.T) {
			tg := startApprovalGateway(t, "", func(c *config.Config) { c.Gateway.Auth.Token = toolToken })
			b, _ := json.Marshal(map[string]any{"tool": "exec", "args": map[string]any{"command": "echo self-approved"}})
			r := tg.do("POST", "/tools/invoke", b, tg.asAgent())
			if r.Status != 200 || r.Result.Details.Status.Value() != protocol.StatusApprovalPending {
				t.Fatalf("exec as the agent: %d %s", r.Status, r.Raw)
			}
			id := r.Result.Details.ApprovalID.Value()
			// The agent approving its own command: refused, still pending.
			for _, decision := range []string{DecisionAllowOnce, DecisionAllowAlways} {
				r := tg.do("POST", "/v1/approvals/"+id, []byte(`{"decision":"`+decision+`"}`), tg.asAgent())
				if r.Status != 403 || r.Error.Type != protocol.ErrForbidden {
					t.Fatalf("self-approval %s: %d %s", decision, r.Status, r.Raw)
				}
			}
			if left := tg.g.PendingApprovals(); len(left) != 1 || left[0].ID != id {
				t.Fatalf("pending after the agent's decisions: %+v", left)
			}
			checkOperatorOnly(t, tg, []operatorCase{
				{"POST", "/v1/approvals/" + id, `{"decision":"deny"}`, 200},
				{"PUT", "/v1/config/exec-node", `{"agentId":"","node":"build-1"}`, 200},
			})
			if ev := tg.waitEvent(protocol.EventExecDenied); !strings.Contains(ev.Text, "user-denied") {
				t.Fatalf("denied event: %q", ev.Text)
			}
			// Reading stays the agent's; the operator token calls tools.
			if r := tg.do("GET", "/v1/approvals", nil, tg.asAgent()); r.Status != 200 {
				t.Errorf("GET /v1/approvals as the agent: %d", r.Status)
			}
			if r := tg.do("POST", "/tools/invoke", []byte(`{"tool":"process","args":{"action":"list"}}`), nil); r.Status != 200 {
				t.Errorf("a tool call with the operator token: %d %s", r.Status, r.Raw)
			}
			for _, c := range []struct {
				header http.Header
				want   string
			}{{tg.asAgent(), "agent"}, {nil, "operator"}} {
				r := tg.do("GET", "/v1/whoami", nil, c.header)
				if r.Status != 200 || !strings.Contains(string(r.Raw), `"role":"`+c.want+`"`) {
					t.Errorf("whoami: %d %s, want %s", r.Status, r.Raw, c.want)
				}
			}
		})
	}
}

// TestOperatorTokenFile: without gateway.auth.operatorToken the gateway
// keeps its operator token in <state-dir>/operator.token (0600), the same
// across restarts; a file others may read is replaced; a configured token
// replaces the file's.
func TestOperatorTokenFile(t *testing.T) {
	dir := t.TempDir()
	start := func(mutate func(*config.Config)) *testGateway {
		return startGateway(t, func(c *config.Config, _ *Options) {
			c.StateDir = dir
			if mutate != nil {
				mutate(c)
			}
		})
	}
	tg := start(nil)
	path := filepath.Join(dir, OperatorTokenFile)
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("operator.token: %v %v", st, err)
	}
	tok, err := access.ReadOperatorTokenFile(dir)
	if err != nil || len(tok) != 64 || tok != tg.g.operatorToken() {
		t.Fatalf("token %q %v", tok, err)
	}
	if again := start(nil); again.g.operatorToken() != tok {
		t.Fatal("a restart changed the token")
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := access.ReadOperatorTokenFile(dir); err == nil || !strings.Contains(err.Error(), "others may read it") {
		t.Fatalf("reading a 0644 token: %v", err)
	}
	replaced := start(nil)
	if replaced.g.operatorToken() == tok {
		t.Fatal("a token others could read was kept")
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Fatalf("replaced file mode %v", st.Mode())
	}
	// A configured token is the only one.
	conf := start(func(c *config.Config) { c.Gateway.Auth.OperatorToken = "configured-operator-token" })
	if r := conf.do("PUT", "/v1/config/exec-node", []byte(`{"agentId":"","node":"n"}`), http.Header{"Authorization": {"Bearer configured-operator-token"}}); r.Status != 200 {
		t.Fatalf("configured operator token: %d %s", r.Status, r.Raw)
	}
	fileTok, _ := access.ReadOperatorTokenFile(dir)
	if r := conf.do("PUT", "/v1/config/exec-node", []byte(`{"agentId":"","node":"n"}`), http.Header{"Authorization": {"Bearer " + fileTok}}); r.Status != 401 {
		t.Fatalf("the file's token with a configured one: %d %s", r.Status, r.Raw)
	}
	// The operator's token may not be the agents'.
	cfg := config.Default()
	cfg.Gateway.Auth.Token, cfg.Gateway.Auth.OperatorToken = "same", "same"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "gateway.auth.operatorToken: must differ from gateway.auth.token") {
		t.Fatalf("equal tokens: %v", err)
	}
	if c, err := config.Load("", map[string]string{"EXECMESH_OPERATOR_TOKEN": "from-env"}); err != nil || c.Gateway.Auth.OperatorToken != "from-env" {
		t.Fatalf("EXECMESH_OPERATOR_TOKEN: %+v %v", c.Gateway.Auth, err)
	}
}

// TestAuthFailuresLimitedGlobally (class F): a guesser that
// rotates its source address through 127.0.0.0/8 never reaches ten
// failures from one address, but a hundred from all addresses within a
// minute stop every further authentication with 429 and Retry-After —
// even with the right token — until the window moves on.
func TestAuthFailuresLimitedGlobally(t *testing.T) {
	tg := startGateway(t, func(c *config.Config, _ *Options) { c.Gateway.Auth.Token = "tool-tok" })
	addr := strings.TrimPrefix(tg.srv.URL, "http://")
	head := func(token string) string {
		return "POST /v1/approvals/guess HTTP/1.1\nHost: " + addr + "\nContent-Type: application/json\nAuthorization: Bearer " + token
	}
	for i := 0; i < access.GlobalFailureLimit; i++ {
		from := fmt.Sprintf("127.0.%d.%d", 1+i/250, 2+i%250)
		if a := rawRequest(t, addr, from, head(fmt.Sprintf("guess-%d", i)), `{"decision":"allow-once"}`); a.status != 401 {
			t.Fatalf("guess %d from %s: %d %s", i, from, a.status, a.body)
		}
	}
	for _, tok := range []string{"another-guess", "tool-tok", tg.g.operatorToken()} {
		a := rawRequest(t, addr, "127.0.9.9", "POST /tools/invoke HTTP/1.1\nHost: "+addr+"\nContent-Type: application/json\nAuthorization: Bearer "+tok, `{"tool":"process","args":{"action":"list"}}`)
		if a.status != 429 || a.errTyp != protocol.ErrRateLimited || a.header.Get("Retry-After") == "" {
			t.Fatalf("after %d failures from as many addresses: %d %s (Retry-After %q)", access.GlobalFailureLimit, a.status, a.body, a.header.Get("Retry-After"))
		}
	}
}

// TestNodeOperatorEndpoints (class F): node pairing (invite,
// approve, reject) and node approvals files are the operator's; reading
// the registry stays the agent's.
func TestNodeOperatorEndpoints(t *testing.T) {
	env := startNodeGateway(t, nil, "", func(c *config.Config, o *Options) {
		c.Gateway.Auth.Token = "tool-tok"
		// Codes name an address other machines reach (the test server
		// listens on loopback, where invites are refused).
		o.JoinURLs = func() []string { return []string{"nats://192.0.2.1:4222"} }
	})
	checkOperatorOnly(t, env.testGateway, []operatorCase{
		{"POST", "/v1/nodes/invite", `{"name":"n1","ttlMs":60000}`, 200},
		{"POST", "/v1/nodes/unknown-node/approve", "", 404},
		{"POST", "/v1/nodes/unknown-node/reject", "", 404},
		{"GET", "/v1/nodes/unknown-node/approvals", "", 404},
		{"PUT", "/v1/nodes/unknown-node/approvals", `{"file":{"version":1},"baseHash":""}`, 404},
	})
	if r := env.do("GET", "/v1/nodes", nil, env.asAgent()); r.Status != 200 {
		t.Fatalf("GET /v1/nodes as the agent: %d %s", r.Status, r.Raw)
	}
}

// BenchmarkProtect is what the browser defences and the token check add
// to a request: Protect and the operator check around an empty handler,
// for a same-origin JSON POST with the operator token.
func BenchmarkProtect(b *testing.B) {
	cfg := config.Default()
	cfg.StateDir = b.TempDir()
	cfg.Gateway.Auth.Token = "tool-tok"
	srv := bustest.StartServer(b)
	g, err := New(b.Context(), cfg, Options{Conn: bustest.Connect(b, srv, bus.ClientConfig{Name: "gateway"}), Server: srv,
		Cwd: b.TempDir(), LoginShellPath: func() string { return "" }})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = g.Close(context.Background()) })
	h := g.Protect(g.operator(func(w http.ResponseWriter, r *http.Request) {}))
	req, _ := http.NewRequest("POST", "http://127.0.0.1:8420/v1/approvals/x", nil)
	req.Header.Set("Origin", "http://127.0.0.1:8420")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+g.operatorToken())
	w := &statusRecorder{header: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		w.status = 0
		h.ServeHTTP(w, req)
		if w.status != 0 {
			b.Fatalf("refused: %d", w.status)
		}
	}
}
