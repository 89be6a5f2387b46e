package ui

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/access"
	"github.com/execmesh/execmesh/gateway"
	"github.com/execmesh/execmesh/protocol"

	"github.com/chromedp/chromedp"
)

// skipLoudly skips with a banner on stderr, so that a run without a
// browser cannot pass for a run with one.
func skipLoudly(t *testing.T, format string, args ...any) {
	t.Helper()
	bar := strings.Repeat("!", 72)
	msg := fmt.Sprintf("\n%s\n!!! SKIPPED: the headless Chromium test of the control page did not run:\n!!! %s\n%s", bar, fmt.Sprintf(format, args...), bar)
	fmt.Fprintln(os.Stderr, msg)
	t.Skip(msg)
}

// findChromium returns a Chromium binary, installing Debian's chromium
// package when none is found and the test runs as root.
func findChromium(t *testing.T) string {
	t.Helper()
	look := func() string {
		for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless-shell"} {
			if p, err := exec.LookPath(name); err == nil {
				return p
			}
		}
		return ""
	}
	if p := look(); p != "" {
		return p
	}
	if os.Geteuid() != 0 {
		skipLoudly(t, "no chromium on PATH, and not root to `apt-get install -y chromium`")
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		skipLoudly(t, "no chromium on PATH and no apt-get to install it")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	apt := func(args ...string) error {
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Logf("apt-get %s: %v\n%s", strings.Join(args, " "), err, out[max(0, len(out)-2000):])
		}
		return err
	}
	t.Log("chromium not found: installing Debian's chromium package")
	if apt("install", "-y", "-qq", "chromium") != nil {
		// The package lists may be missing or stale.
		_ = apt("update", "-qq")
		if err := apt("install", "-y", "-qq", "chromium"); err != nil {
			skipLoudly(t, "`apt-get install -y chromium` failed: %v", err)
		}
	}
	if p := look(); p != "" {
		return p
	}
	skipLoudly(t, "chromium installed but not found on PATH")
	return ""
}

// artifactDir is $ARTIFACTS_DIR when set, else a temporary directory.
func artifactDir(t *testing.T) string {
	if d := os.Getenv("ARTIFACTS_DIR"); d != "" {
		if err := os.MkdirAll(d, 0o755); err == nil {
			return d
		}
	}
	return t.TempDir()
}

// browser starts headless Chromium and returns a tab's context; extra
// adds command-line options. The browser is started here, not at the
// first action, and started again (at most twice more, each time with a
// fresh profile) when it exits before it listens: Chromium in a container
// now and then quits at start-up without a word (once in CI, at 0.5 s),
// which says nothing about the page under test.
func browser(t *testing.T, chrome string, extra ...chromedp.ExecAllocatorOption) context.Context {
	t.Helper()
	const attempts = 3
	for attempt := 1; ; attempt++ {
		opts := append([]chromedp.ExecAllocatorOption{
			chromedp.ExecPath(chrome),
			chromedp.Flag("headless", true),
			chromedp.NoSandbox,
			chromedp.Flag("disable-gpu", true),
			chromedp.Flag("disable-background-networking", true),
			chromedp.Flag("disable-component-update", true),
			chromedp.Flag("disable-sync", true),
			chromedp.Flag("disable-dev-shm-usage", true),
			chromedp.NoFirstRun,
			chromedp.UserDataDir(t.TempDir()),
			// Chromium puts its singleton socket in a directory of its own
			// under TMPDIR and leaves it there at exit.
			chromedp.Env("TMPDIR=" + t.TempDir()),
			chromedp.WindowSize(1280, 1400),
		}, extra...)
		allocCtx, cancelAlloc := chromedp.NewExecAllocator(t.Context(), opts...)
		ctx, cancelTab := chromedp.NewContext(allocCtx)
		err := chromedp.Do(ctx) // no actions: starts the browser
		if err != nil {
			cancelTab()
			cancelAlloc()
			if attempt == attempts || !strings.Contains(err.Error(), "chrome failed to start") {
				t.Fatalf("start %s (attempt %d): %v", chrome, attempt, err)
			}
			t.Logf("%s quit at start-up (attempt %d), starting it again: %v", chrome, attempt, err)
			continue
		}
		ctx, cancelTimeout := context.WithTimeout(ctx, 3*time.Minute)
		t.Cleanup(func() {
			cancelTimeout()
			cancelTab()
			cancelAlloc()
		})
		return ctx
	}
}

// do runs browser actions and fails the test on an error.
func do(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// clickRow clicks the element with the given id in a table row. The page
// re-renders its tables from each poll, replacing the rows, so a DevTools
// click (query the node, then click it) can reach a node already gone;
// finding and clicking in one evaluation cannot.
func clickRow(t *testing.T, ctx context.Context, what, id string) {
	t.Helper()
	waitJS(t, ctx, what, `(() => { const e = document.getElementById(`+strconv.Quote(id)+`); if (!e) return false; e.click(); return true })()`)
}

// eval evaluates a JavaScript expression. DevTools evaluation is not
// subject to the page's Content-Security-Policy.
func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// waitJS waits until the expression is true in the page. (chromedp's Poll
// compiles its predicate with new Function, which the page's CSP forbids.)
func waitJS(t *testing.T, ctx context.Context, what, expr string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool]("!!("+expr+")"))
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s (%s): %v", what, expr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// clearInput empties an input. (SetValue with "" fails: chromedp checks that
// the value it set is truthy.)
func clearInput(t *testing.T, ctx context.Context, id string) {
	t.Helper()
	eval[chromedp.Void](t, ctx, `document.getElementById(`+strconv.Quote(id)+`).value = ''`)
}

func screenshot(t *testing.T, ctx context.Context, dir, name string) {
	t.Helper()
	buf, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Errorf("screenshot: %v", err)
		return
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, buf, 0o644); err != nil {
		t.Errorf("screenshot: %v", err)
		return
	}
	t.Logf("screenshot: %s (%d bytes)", p, len(buf))
}

// TestBrowserControlPage drives the control page in headless Chromium
// against a real gateway with a real node agent on an embedded NATS
// server: the token prompt, the node and the running sessions (gateway
// and node), kill, run, the live tail over the session stream, an exec
// approved by a click that then finishes, the node binding, sign-out.
// Screenshots go to $ARTIFACTS_DIR (or a temporary directory).
func TestBrowserControlPage(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a browser")
	}
	chrome := findChromium(t)
	const token = "ui-test-token"
	g, natsSrv := startNodeGateway(t, token)
	agent := startPairedAgent(t, g, natsSrv, "build-1")
	res := invokeOK(t, g, "exec", `{"command":"sleep 300","background":true}`)
	if res.Status() != "running" {
		t.Fatalf("background exec: %v", res)
	}
	id := res.SessionID()
	nodeRes := invokeOK(t, g, "exec", `{"command":"echo node-tick; sleep 300","background":true,"host":"node"}`)
	if nodeRes.Status() != "running" {
		t.Fatalf("background exec on the node: %s %v", nodeRes.Text(), nodeRes.Details)
	}
	nodeSession := nodeRes.SessionID()

	mux := http.NewServeMux()
	mux.Handle("/", g.Handler())
	mux.Handle("/ui/", Handler())
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	shots := artifactDir(t)

	ctx := browser(t, chrome)
	do(t, ctx, "open /ui", chromedp.Navigate(srv.URL+"/ui"))

	// The API needs a token: nothing but the prompt.
	waitJS(t, ctx, "the token prompt", `!document.getElementById('login').hidden`)
	if !eval[bool](t, ctx, `document.getElementById('app').hidden && document.getElementById('logout').hidden`) {
		t.Errorf("the app is shown before a token was entered")
	}
	if eval[bool](t, ctx, `document.body.innerText.includes(`+strconv.Quote(id)+`)`) {
		t.Errorf("session data visible without a token")
	}
	screenshot(t, ctx, shots, "ui-1-token-prompt.png")

	// A wrong token is refused, and still only the prompt shows.
	do(t, ctx, "wrong token", chromedp.SendKeys(chromedp.ID("token-input"), "wrong"), chromedp.Click(chromedp.ID("token-submit")))
	waitJS(t, ctx, "the rejection", `document.getElementById('login-error').textContent.includes('rejected')`)
	if !eval[bool](t, ctx, `document.getElementById('app').hidden`) {
		t.Errorf("the app is shown after a wrong token")
	}

	// The right token opens the page; the running sessions are listed,
	// the gateway's and the node's, and so is the node, connected.
	clearInput(t, ctx, "token-input")
	do(t, ctx, "token", chromedp.SendKeys(chromedp.ID("token-input"), token), chromedp.Click(chromedp.ID("token-submit")))
	do(t, ctx, "app", chromedp.WaitVisible(chromedp.ID("app")))
	row := sessionRowJS(id)
	waitJS(t, ctx, "the running session", row+` && `+row+`.dataset.status === 'running'`)
	nodeRow := sessionRowJS(nodeSession)
	waitJS(t, ctx, "the running node session", nodeRow+` && `+nodeRow+`.dataset.status === 'running'`)
	if got := eval[string](t, ctx, `sessionStorage.getItem('execmesh.token')`); got != token {
		t.Errorf("stored token %q", got)
	}
	if got := eval[string](t, ctx, `document.getElementById('conn-status').dataset.role`); got != "agent" {
		t.Errorf("role with the tool token: %q", got)
	}
	for _, tc := range []struct{ row, want string }{{row, "gateway"}, {nodeRow, "node build-1"}} {
		if got := eval[string](t, ctx, tc.row+`.querySelector('[data-testid="session-host"]').textContent`); got != tc.want {
			t.Errorf("session host shown: %q, want %q", got, tc.want)
		}
	}
	node := `document.querySelector('[data-testid="node-row"][data-node-id=` + strconv.Quote(agent.ID()) + `]')`
	waitJS(t, ctx, "the node", node+` && `+node+`.querySelector('[data-testid="node-status"]').textContent === 'connected'`)
	if got := eval[string](t, ctx, node+`.cells[1].textContent`); got != "build-1" {
		t.Errorf("node name shown: %q", got)
	}
	if got := eval[string](t, ctx, node+`.cells[3].textContent`); got != "yes" {
		t.Errorf("node paired shown: %q", got)
	}

	// Kill it from the page.
	clickRow(t, ctx, "kill", "kill-"+id)
	waitJS(t, ctx, "the session to end", row+` && `+row+`.dataset.status !== 'running'`)
	// A kill is not shown in green, nor a non-zero exit.
	status := row + `.querySelector('[data-testid="session-status"]')`
	waitJS(t, ctx, "the killed session's outcome", status+`.dataset.outcome === 'killed' && `+status+`.className === 'status-killed'`)
	if okColor, got := eval[string](t, ctx, `getComputedStyle(document.documentElement).getPropertyValue('--ok').trim()`),
		eval[string](t, ctx, `getComputedStyle(`+status+`).color`); got == cssRGB(okColor) {
		t.Errorf("a killed session shows in the ok colour %s", got)
	}
	if got := eval[string](t, ctx, `document.getElementById('sessions-result').textContent`); !strings.HasPrefix(got, "Termination requested for session "+id) {
		t.Errorf("kill result shown: %q", got)
	}
	list := invokeOK(t, g, "process", `{"action":"list"}`)
	if !strings.Contains(list.Text(), id) || strings.Contains(list.Text(), id+" running") {
		t.Errorf("after kill, list: %q", list.Text())
	}

	// A background session that exits 3 (listed when the form's run
	// refreshes the sessions).
	nonzero := invokeOK(t, g, "exec", `{"command":"exit 3","background":true}`).SessionID()
	waitFor(t, 20*time.Second, func() error {
		if p := invokeOK(t, g, "process", `{"action":"poll","sessionId":"`+nonzero+`","timeout":1000}`); p.Status() == "running" {
			return fmt.Errorf("still running")
		}
		return nil
	})

	// Run a command from the form.
	do(t, ctx, "run", chromedp.SendKeys(chromedp.ID("run-command"), "echo ui-run-ok"), chromedp.Click(chromedp.ID("run-submit")))
	waitJS(t, ctx, "the command's output", `document.getElementById('run-output').textContent.includes('ui-run-ok')`)
	nzStatus := sessionRowJS(nonzero) + `.querySelector('[data-testid="session-status"]')`
	waitJS(t, ctx, "the non-zero exit's outcome", sessionRowJS(nonzero)+` && `+nzStatus+`.dataset.outcome === 'nonzero' && `+nzStatus+`.className === 'status-nonzero' && `+nzStatus+`.textContent.includes('exit 3')`)

	// A background run opens the live output of its session, which
	// follows the session stream: output written after the tail opened
	// (once the test creates the gate file) is pushed to the page.
	gate := filepath.Join(t.TempDir(), "gate")
	clearInput(t, ctx, "run-command")
	do(t, ctx, "run in background",
		chromedp.SendKeys(chromedp.ID("run-command"), "echo tick-1; echo tick-2; while [ ! -e "+gate+" ]; do sleep 0.1; done; echo tick-late; sleep 30"),
		chromedp.Click(chromedp.ID("run-background")),
		chromedp.Click(chromedp.ID("run-submit")))
	waitJS(t, ctx, "the live output", `!document.getElementById('tail-panel').hidden && document.getElementById('tail-output').textContent.includes('tick-2')`)
	if got := eval[string](t, ctx, `document.getElementById('tail-panel').dataset.transport`); got != "stream" {
		t.Errorf("tail transport %q, want stream", got)
	}
	waitJS(t, ctx, "the running status", `document.getElementById('tail-status').dataset.status === 'running'`)
	if eval[bool](t, ctx, `document.getElementById('tail-output').textContent.includes('tick-late')`) {
		t.Fatalf("tick-late shown before the gate opened")
	}
	screenshot(t, ctx, shots, "ui-2-sessions.png")
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, "output written after the tail opened", `document.getElementById('tail-output').textContent === 'tick-1\ntick-2\ntick-late'`)

	// The node session's output streams too; killing it from the page
	// ends its stream with the final status.
	clickRow(t, ctx, "node session output", "tail-"+nodeSession)
	waitJS(t, ctx, "the node session's output", `document.getElementById('tail-title').textContent === `+strconv.Quote(nodeSession)+
		` && document.getElementById('tail-output').textContent.includes('node-tick') && document.getElementById('tail-panel').dataset.transport === 'stream'`)
	clickRow(t, ctx, "kill the node session", "kill-"+nodeSession)
	waitJS(t, ctx, "the node session's final status", `document.getElementById('tail-status').dataset.status === 'completed' && document.getElementById('tail-status').textContent.includes('killed')`)
	waitJS(t, ctx, "the node session row to end", nodeRow+` && `+nodeRow+`.dataset.status === 'completed'`)

	// An exec waiting for approval is listed and allowed from the page,
	// then runs and finishes: its session shows completed, with its output.
	pending := invokeOK(t, g, "exec", `{"command":"echo approved-run","ask":"always"}`)
	if pending.Status() != "approval-pending" {
		t.Fatalf("exec with ask=always: %v", pending)
	}
	approvalID := pending.Details.ApprovalID.Value()
	arow := `document.querySelector('[data-testid="approval-row"][data-approval-id=` + strconv.Quote(approvalID) + `]')`
	waitJS(t, ctx, "the pending approval", arow+` && `+arow+`.querySelector('[data-testid="approval-command"]').textContent === 'echo approved-run'`)
	screenshot(t, ctx, shots, "ui-3-approval.png")

	// The tool token cannot decide it (the agent would approve itself):
	// the page says what is needed and the approval stays pending.
	clickRow(t, ctx, "allow once with the tool token", "approve-allow-once-"+approvalID)
	waitJS(t, ctx, "the refusal", `document.getElementById('approvals-result').textContent.includes('needs the operator token')`)
	if left := g.PendingApprovals(); len(left) != 1 {
		t.Fatalf("the tool token decided an approval: %+v", left)
	}
	// Signing in as the operator: the token from the state dir.
	opToken, err := access.ReadOperatorTokenFile(g.Config().StateDir)
	if err != nil {
		t.Fatal(err)
	}
	do(t, ctx, "sign in as operator", chromedp.Click(chromedp.ID("logout")))
	waitJS(t, ctx, "the prompt", `!document.getElementById('login').hidden`)
	do(t, ctx, "operator token", chromedp.SendKeys(chromedp.ID("token-input"), opToken), chromedp.Click(chromedp.ID("token-submit")))
	waitJS(t, ctx, "the operator role", `document.getElementById('conn-status').dataset.role === 'operator' && !document.getElementById('app').hidden`)
	waitJS(t, ctx, "the pending approval again", arow)
	clickRow(t, ctx, "allow once", "approve-allow-once-"+approvalID)
	waitJS(t, ctx, "the approval to go", `!`+arow+` && document.getElementById('approvals-result').textContent === 'Allow once: echo approved-run'`)
	if left := g.PendingApprovals(); len(left) != 0 {
		t.Errorf("still pending after allow-once: %+v", left)
	}
	approved := `[...document.querySelectorAll('[data-testid="session-row"]')].find((r) => r.querySelector('[data-testid="session-command"]').textContent === 'echo approved-run')`
	waitJS(t, ctx, "the approved command to finish", approved+` && `+approved+`.dataset.status === 'completed'`)
	if got := eval[string](t, ctx, approved+`.querySelector('[data-testid="session-status"]').textContent`); got != "completed · exit 0" {
		t.Errorf("approved run's status shown: %q", got)
	}
	do(t, ctx, "approved run's output", chromedp.Evaluate[chromedp.Void](approved+`.querySelector('[data-testid^="tail-"]').click()`))
	waitJS(t, ctx, "the approved run's output", `document.getElementById('tail-output').textContent.includes('approved-run') && document.getElementById('tail-status').dataset.status === 'completed'`)
	screenshot(t, ctx, shots, "ui-4-approved-finished.png")

	// The exec node binding is set for all agents and shown.
	do(t, ctx, "bind", chromedp.SendKeys(chromedp.ID("bind-node"), "build-1"), chromedp.Click(chromedp.ID("bind-save")))
	waitJS(t, ctx, "the binding", `document.getElementById('bind-current').textContent.includes('all agents → build-1')`)
	if b := g.ExecNodeBinding(); b.Default != "build-1" {
		t.Errorf("binding in the gateway: %+v", b)
	}

	// Changing the token goes back to the prompt alone.
	do(t, ctx, "change token", chromedp.Click(chromedp.ID("logout")))
	waitJS(t, ctx, "the prompt again", `!document.getElementById('login').hidden && document.getElementById('app').hidden && document.querySelectorAll('[data-testid="session-row"]').length === 0`)
}

// cssRGB turns "#rrggbb" into the "rgb(r, g, b)" getComputedStyle reports.
func cssRGB(hex string) string {
	var r, g, b int
	if _, err := fmt.Sscanf(strings.TrimPrefix(hex, "#"), "%02x%02x%02x", &r, &g, &b); err != nil {
		return hex
	}
	return fmt.Sprintf("rgb(%d, %d, %d)", r, g, b)
}

// sessionRowJS is the JavaScript expression of a session's row.
func sessionRowJS(id string) string {
	return `document.querySelector('[data-testid="session-row"][data-session-id=` + strconv.Quote(id) + `]')`
}

// invokeKey runs a tool call on g under sessionKey and fails the test on
// a refusal.
func invokeKey(t *testing.T, g *gateway.Gateway, sessionKey, tool, args string) protocol.Result {
	t.Helper()
	res, err := g.Invoke(t.Context(), gateway.InvokeRequest{Tool: tool, Args: []byte(args), SessionKey: sessionKey})
	if err != nil {
		t.Fatalf("%s %s as %s: %v", tool, args, sessionKey, err)
	}
	return res
}

// invokeHTTPKey runs a tool call through POST /tools/invoke under
// sessionKey, as an agent with token would.
func invokeHTTPKey(t *testing.T, base, token, sessionKey, tool, args string) protocol.Result {
	t.Helper()
	body := `{"tool":` + strconv.Quote(tool) + `,"sessionKey":` + strconv.Quote(sessionKey) + `,"args":` + args + `}`
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/tools/invoke", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s as %s: %v", tool, args, sessionKey, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var ans struct {
		OK     bool            `json:"ok"`
		Result protocol.Result `json:"result"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &ans) != nil || !ans.OK {
		t.Fatalf("%s %s as %s: %d %s", tool, args, sessionKey, resp.StatusCode, b)
	}
	return ans.Result
}

// TestBrowserAllSessionKeys: signed in as the operator, the session table
// shows the sessions of every sessionKey (GET /v1/sessions, then process
// list of each) with their keys, by default; the filter matches a key;
// the terminal, the output, the input and kill of a row act on the
// session under that row's sessionKey, not the key box's. Show lists one
// key, and the tool token still sees one key only.
func TestBrowserAllSessionKeys(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a browser")
	}
	chrome := findChromium(t)
	const token = "ui-keys-token"
	const mainKey, deployKey, opsKey = "agent:main:main", "agent:main:deploy", "agent:ops:nightly"
	g, _ := startNodeGateway(t, token)
	start := func(key, args string) string {
		t.Helper()
		res := invokeKey(t, g, key, "exec", args)
		if res.Status() != "running" {
			t.Fatalf("exec %s as %s: %s %v", args, key, res.Text(), res.Details)
		}
		return res.SessionID()
	}
	mainSleep := start(mainKey, `{"command":"sleep 300","background":true}`)
	deploySleep := start(deployKey, `{"command":"sleep 300","background":true}`)
	deployDone := invokeKey(t, g, deployKey, "exec", `{"command":"echo deploy-done","background":true}`).SessionID()
	if deployDone == "" {
		t.Fatalf("background echo as %s: no session", deployKey)
	}
	waitFor(t, 20*time.Second, func() error {
		if p := invokeKey(t, g, deployKey, "process", `{"action":"poll","sessionId":"`+deployDone+`","timeout":1000}`); p.Status() == "running" {
			return fmt.Errorf("%s still running", deployDone)
		}
		return nil
	})
	opsShell := start(opsKey, `{"command":"sh","pty":true,"background":true}`)
	keyOf := map[string]string{mainSleep: mainKey, deploySleep: deployKey, deployDone: deployKey, opsShell: opsKey}

	opToken, err := access.ReadOperatorTokenFile(g.Config().StateDir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, srv, _ := termPage(t, g, chrome, opToken)
	waitJS(t, ctx, "the operator role", `document.getElementById('conn-status').dataset.role === 'operator'`)

	// Every key's sessions, each with its sessionKey, by default.
	rows := `document.querySelectorAll('[data-testid="session-row"]')`
	keyHeader := `getComputedStyle(document.querySelector('#sessions-table th.col-key')).display`
	waitJS(t, ctx, "all sessionKeys, the default", `document.getElementById('sessions-all').checked && !document.getElementById('sessions-all-label').hidden && document.getElementById('sessions-table').dataset.scope === 'all'`)
	waitJS(t, ctx, "every key's sessions", rows+`.length === 4 && document.getElementById('sessions-status').textContent.startsWith('4 sessions under 3 sessionKeys')`)
	for id, key := range keyOf {
		row := sessionRowJS(id)
		waitJS(t, ctx, "the row of "+id, row+` && `+row+`.dataset.sessionKey === `+strconv.Quote(key))
		if got := eval[string](t, ctx, row+`.querySelector('[data-testid="session-row-key"]').textContent`); got != key {
			t.Errorf("sessionKey shown for %s: %q, want %q", id, got, key)
		}
	}
	if got := eval[string](t, ctx, keyHeader); got == "none" {
		t.Errorf("the sessionKey column is hidden in the view of every key")
	}
	// Newest first across keys: the shell started last, the main sleep first.
	order := eval[[]string](t, ctx, `[...`+rows+`].map((r) => r.dataset.sessionId)`)
	if len(order) != 4 || order[0] != opsShell || order[3] != mainSleep {
		t.Errorf("rows in the order %q, want %s first and %s last", order, opsShell, mainSleep)
	}
	screenshot(t, ctx, artifactDir(t), "ui-7-all-session-keys.png")

	// The filter matches a sessionKey.
	setFilter := func(v string) {
		t.Helper()
		eval[chromedp.Void](t, ctx, `(() => { const f = document.getElementById('sessions-filter'); f.value = `+strconv.Quote(v)+`; f.dispatchEvent(new Event('input')); })()`)
	}
	setFilter(deployKey)
	waitJS(t, ctx, "the deploy key's sessions", rows+`.length === 2 && [...`+rows+`].every((r) => r.dataset.sessionKey === `+strconv.Quote(deployKey)+`) && document.getElementById('sessions-page').textContent.startsWith('1–2 of 2 matching')`)
	setFilter("agent:ops:")
	waitJS(t, ctx, "the other agent's session", rows+`.length === 1 && `+sessionRowJS(opsShell))
	setFilter("")
	waitJS(t, ctx, "every session again", rows+`.length === 4`)

	// The terminal of a row under another key than the key box's attaches
	// to that session: what is typed reaches it, and the agent reads it
	// back under that key.
	if got := eval[string](t, ctx, `document.getElementById('session-key').value`); got != mainKey {
		t.Fatalf("key box %q", got)
	}
	clickRow(t, ctx, "the ops shell's terminal", "terminal-"+opsShell)
	waitJS(t, ctx, "the terminal attached read-write", termCard+`.dataset.state === 'attached' && `+termCard+`.dataset.mode === 'rw' && `+termCard+`.dataset.sessionKey === `+strconv.Quote(opsKey))
	if got := eval[string](t, ctx, `document.getElementById('term-title').textContent`); got != opsShell {
		t.Errorf("terminal title %q, want %q", got, opsShell)
	}
	typeKeys(t, ctx, "echo nightly-$((6*7))\r")
	waitJS(t, ctx, "the typed line's output", termHas("nightly-42"))
	waitFor(t, 20*time.Second, func() error {
		if log := invokeHTTPKey(t, srv.URL, token, opsKey, "process", `{"action":"log","sessionId":"`+opsShell+`"}`).Text(); !strings.Contains(log, "echo nightly-$((6*7))") || !strings.Contains(log, "nightly-42") {
			return fmt.Errorf("process log under %s: %q", opsKey, log)
		}
		return nil
	})
	if log := invokeHTTPKey(t, srv.URL, token, mainKey, "process", `{"action":"log","sessionId":"`+opsShell+`"}`).Text(); strings.Contains(log, "nightly-42") {
		t.Errorf("%s's session read under %s: %q", opsKey, mainKey, log)
	}
	do(t, ctx, "close the terminal", chromedp.Click(chromedp.ID("term-close")))
	waitJS(t, ctx, "the panel to close", termCard+`.hidden`)

	// Its output streams under its key, and input goes to it.
	clickRow(t, ctx, "the ops shell's output", "tail-"+opsShell)
	waitJS(t, ctx, "the ops shell's output", `document.getElementById('tail-panel').dataset.sessionKey === `+strconv.Quote(opsKey)+
		` && document.getElementById('tail-panel').dataset.transport === 'stream' && document.getElementById('tail-output').textContent.includes('nightly-42')`)
	do(t, ctx, "input", chromedp.SendKeys(chromedp.ID("input-text"), "echo via-input-$((2+3))"), chromedp.Click(chromedp.ID("input-send")))
	waitJS(t, ctx, "the input's output", `document.getElementById('tail-output').textContent.includes('via-input-5')`)
	if got := eval[string](t, ctx, `document.getElementById('input-status').textContent`); strings.Contains(strings.ToLower(got), "no session") {
		t.Errorf("input status %q", got)
	}
	waitFor(t, 20*time.Second, func() error {
		if log := invokeHTTPKey(t, srv.URL, token, opsKey, "process", `{"action":"log","sessionId":"`+opsShell+`"}`).Text(); !strings.Contains(log, "via-input-5") {
			return fmt.Errorf("process log under %s: %q", opsKey, log)
		}
		return nil
	})
	do(t, ctx, "close the output", chromedp.Click(chromedp.ID("tail-close")))

	// Kill on a row of another key kills that session, and only it.
	clickRow(t, ctx, "kill the deploy sleep", "kill-"+deploySleep)
	deployRow := sessionRowJS(deploySleep)
	waitJS(t, ctx, "the deploy sleep killed", deployRow+` && `+deployRow+`.dataset.status !== 'running' && `+deployRow+`.querySelector('[data-testid="session-status"]').dataset.outcome === 'killed'`)
	if got := eval[string](t, ctx, `document.getElementById('sessions-result').textContent`); !strings.HasPrefix(got, "Termination requested for session "+deploySleep) {
		t.Errorf("kill result shown: %q", got)
	}
	waitFor(t, 20*time.Second, func() error {
		if p := invokeHTTPKey(t, srv.URL, token, deployKey, "process", `{"action":"poll","sessionId":"`+deploySleep+`"}`); p.Status() == "running" {
			return fmt.Errorf("%s still running under %s", deploySleep, deployKey)
		}
		return nil
	})
	for _, id := range []string{mainSleep, opsShell} {
		if p := invokeKey(t, g, keyOf[id], "process", `{"action":"poll","sessionId":"`+id+`"}`); p.Status() != "running" {
			t.Errorf("%s (%s) after killing %s: %s %q", id, keyOf[id], deploySleep, p.Status(), p.Text())
		}
	}

	// Show lists the key box's key alone, without the key column; All
	// sessionKeys again lists them all.
	clearInput(t, ctx, "session-key")
	do(t, ctx, "show one key", chromedp.SendKeys(chromedp.ID("session-key"), opsKey), chromedp.Click(chromedp.ID("sessions-refresh")))
	waitJS(t, ctx, "the one key's sessions", `!document.getElementById('sessions-all').checked && document.getElementById('sessions-table').dataset.scope === 'one' && `+rows+`.length === 1 && `+sessionRowJS(opsShell))
	if got := eval[string](t, ctx, keyHeader); got != "none" {
		t.Errorf("the sessionKey column shows (%q) in the view of one key", got)
	}
	do(t, ctx, "all sessionKeys", chromedp.Click(chromedp.ID("sessions-all")))
	waitJS(t, ctx, "every key's sessions again", `document.getElementById('sessions-table').dataset.scope === 'all' && `+rows+`.length === 4`)
	do(t, ctx, "focus the key box", chromedp.Focus(chromedp.ID("session-key")))
	waitJS(t, ctx, "the keys suggested", `['agent:main:deploy', 'agent:ops:nightly'].every((k) => [...document.querySelectorAll('#session-keys option')].some((o) => o.value === k))`)
	noCSPViolations(t, ctx)

	// The tool token sees one key (the key box's) and no choice of all.
	do(t, ctx, "change token", chromedp.Click(chromedp.ID("logout")))
	waitJS(t, ctx, "the prompt", `!document.getElementById('login').hidden`)
	do(t, ctx, "tool token", chromedp.SendKeys(chromedp.ID("token-input"), token), chromedp.Click(chromedp.ID("token-submit")))
	waitJS(t, ctx, "the agent role", `document.getElementById('conn-status').dataset.role === 'agent' && !document.getElementById('app').hidden`)
	waitJS(t, ctx, "one key's sessions", `document.getElementById('sessions-all-label').hidden && document.getElementById('sessions-table').dataset.scope === 'one' && `+rows+`.length === 1 && `+sessionRowJS(opsShell))
	if got := eval[string](t, ctx, keyHeader); got != "none" {
		t.Errorf("the sessionKey column shows (%q) to the tool token", got)
	}
}
