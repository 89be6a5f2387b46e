package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/config"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
	"github.com/execmesh/execmesh/gateway"
)

// startGateway runs a real gateway (host=gateway, security full, ask off,
// so commands run without approval) behind an httptest server and returns
// the client environment that points at it.
func startGateway(t *testing.T, mutate func(*config.Config)) map[string]string {
	t.Helper()
	cfg := config.Default()
	cfg.StateDir = t.TempDir()
	cfg.Sandbox.Workspace = ""
	cfg.Tools.Exec.Security = "full"
	cfg.Tools.Exec.Ask = "off"
	if mutate != nil {
		mutate(&cfg)
	}
	ns := bustest.StartServer(t)
	gw, err := gateway.New(t.Context(), cfg, gateway.Options{
		Conn:           bustest.Connect(t, ns, bus.ClientConfig{Name: "gateway"}),
		Server:         ns,
		Cwd:            t.TempDir(),
		LoginShellPath: func() string { return "" }, // no login-shell probe in tests
	})
	if err != nil {
		t.Fatalf("gateway.New: %v", err)
	}
	srv := httptest.NewServer(gw.Handler())
	t.Cleanup(func() {
		srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := gw.Close(ctx); err != nil {
			t.Errorf("gateway Close: %v", err)
		}
	})
	if cfg.Tools.Exec.Security == "full" && cfg.Tools.Exec.Ask == "off" {
		warmUp(t, srv.URL, cfg.Gateway.Auth.Token)
	}
	return map[string]string{envGatewayURL: srv.URL}
}

// warmUp starts a background session under a sessionKey of its own until
// one starts: a gateway just made, on a machine loaded by the other test
// packages, may take longer than an operation's 5 s to reach its
// JetStream store, and answers a retryable 503 meanwhile. The tests then
// meet a gateway whose store answers. Only under security full and ask
// off: elsewhere the start would leave an approval behind.
func warmUp(t *testing.T, url, token string) {
	t.Helper()
	body := `{"tool":"exec","sessionKey":"agent:warmup:main","args":{"command":"true","background":true}}`
	deadline := time.Now().Add(60 * time.Second)
	for {
		req, _ := http.NewRequest(http.MethodPost, url+"/tools/invoke", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("warm-up call: %v", err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		switch {
		case res.StatusCode == http.StatusOK:
			return
		case res.StatusCode != http.StatusServiceUnavailable || time.Now().After(deadline):
			t.Fatalf("warm-up call: %d %s", res.StatusCode, b)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestE2EExec(t *testing.T) {
	t.Parallel()
	env := startGateway(t, nil)
	notExecutable := filepath.Join(t.TempDir(), "data.txt")
	if err := os.WriteFile(notExecutable, []byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		args   []string
		code   int
		stdout string // exact when set
		has    string // substring of stdout
		hasErr string // substring of stderr
		stderr string // exact when set
	}{
		{name: "echo", args: []string{"--", "echo", "hi"}, stdout: "hi\n"},
		{name: "one word is a shell line", args: []string{"echo a; echo b"}, stdout: "a\nb\n"},
		// Like ssh host cmd: the command's output only, its exit status.
		{name: "non-zero exit", args: []string{"--", "sh", "-c", "echo out; exit 3"}, code: 3, stdout: "out\n"},
		{name: "not found is 127", args: []string{"--", "execmesh-no-such-command-xyz"}, code: 127, hasErr: "not found"},
		{name: "not executable is 126", args: []string{"--", notExecutable}, code: 126, hasErr: "ermission denied"},
		// The real bytes: stdout and stderr apart, each in order, binary whole.
		{name: "stderr apart", args: []string{"echo out1; echo err >&2; echo out2"}, stdout: "out1\nout2\n", stderr: "err\n"},
		{name: "binary", args: []string{`printf 'a\000\377b'`}, stdout: "a\x00\xffb"},
		{name: "signal is 128+N", args: []string{"kill -9 $$"}, code: 137, stderr: "execmesh: command ended by signal SIGKILL\n"},
		{name: "env and workdir", args: []string{"--env", "GREETING=hello", "--workdir", "/", "--", "sh", "-c", `echo "$GREETING from $(pwd)"`}, stdout: "hello from /\n"},
		{name: "timeout is 124 with the reason", args: []string{"--timeout", "1", "--", "sleep", "30"}, code: 124, stderr: "execmesh: command timed out: the exec timeout ended it (SIGTERM)\n"},
		{name: "longer than the yield window", args: []string{"sleep 0.3; echo late"}, stdout: "late\n"},
		{name: "no-wait returns at the yield", args: []string{"--no-wait", "--yield-ms", "100", "sleep 2; echo x"}, has: "Command still running"},
		{name: "no-wait foreground text", args: []string{"--no-wait", "--", "sh", "-c", "exit 3"}, code: 3, has: "(Command exited with code 3)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := runCLI(t, env, "", append([]string{"exec"}, tt.args...)...)
			if r.code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout: %q\nstderr: %q", r.code, tt.code, r.stdout, r.stderr)
			}
			if tt.stdout != "" && r.stdout != tt.stdout {
				t.Errorf("stdout %q, want %q", r.stdout, tt.stdout)
			}
			if !strings.Contains(r.stdout, tt.has) {
				t.Errorf("stdout %q lacks %q", r.stdout, tt.has)
			}
			if !strings.Contains(r.stderr, tt.hasErr) {
				t.Errorf("stderr %q lacks %q", r.stderr, tt.hasErr)
			}
			if tt.stderr != "" && r.stderr != tt.stderr {
				t.Errorf("stderr %q, want %q", r.stderr, tt.stderr)
			}
		})
	}
}

// TestE2EBackgroundAndPoll: --background returns a session id; process
// poll follows it to its exit; events then carry nothing for a session
// whose exit a poll already delivered, while an unpolled one notifies.
func TestE2EBackgroundAndPoll(t *testing.T) {
	t.Parallel()
	env := startGateway(t, nil)
	r := runCLI(t, env, "", "exec", "--json", "--background", "--", "sh", "-c", "echo started; sleep 0.2; echo done")
	if r.code != 0 {
		t.Fatalf("exit %d: %s %s", r.code, r.stdout, r.stderr)
	}
	var ans invokeAnswer
	if err := json.Unmarshal([]byte(r.stdout), &ans); err != nil {
		t.Fatal(err)
	}
	id := ans.Result.SessionID()
	if ans.Result.Status() != "running" || id == "" {
		t.Fatalf("background answer: %s", r.stdout)
	}
	if !strings.Contains(ans.Result.Text(), "Command still running (session "+id) {
		t.Errorf("text %q", ans.Result.Text())
	}

	var out strings.Builder
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(out.String(), "Process exited with code 0") {
		if time.Now().After(deadline) {
			t.Fatalf("no exit after polling: %q", out.String())
		}
		r := runCLI(t, env, "", "process", "poll", "-s", id, "--timeout", "5000")
		if r.code != 0 {
			t.Fatalf("poll: exit %d: %s %s", r.code, r.stdout, r.stderr)
		}
		out.WriteString(r.stdout)
	}
	if !strings.Contains(out.String(), "started") || !strings.Contains(out.String(), "done") {
		t.Errorf("poll output %q", out.String())
	}
	if r := runCLI(t, env, "", "process", "list"); r.code != 0 || !strings.Contains(r.stdout, id) {
		t.Errorf("list: exit %d, %q", r.code, r.stdout)
	}
	if r := runCLI(t, env, "", "process", "poll", "no-such-session"); r.code != 1 {
		t.Errorf("poll of an unknown session: exit %d, %q", r.code, r.stdout)
	}
	// Another sessionKey does not see the session.
	if r := runCLI(t, env, "", "process", "list", "--session-key", "agent:other:main"); strings.Contains(r.stdout, id) {
		t.Errorf("agent:other:main sees %s: %q", id, r.stdout)
	}

	// An unpolled background session notifies on exit.
	if r := runCLI(t, env, "", "exec", "--background", "--", "echo", "bye"); r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	r = runCLI(t, env, "", "events", "--wait-ms", "10000")
	if r.code != 0 || !strings.Contains(r.stdout, "exec.exit Exec completed (") || !strings.Contains(r.stdout, ":: bye") {
		t.Errorf("events: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

func TestE2ECallAndAuth(t *testing.T) {
	t.Parallel()
	env := startGateway(t, func(c *config.Config) { c.Gateway.Auth.Token = "right-token" })

	r := runCLI(t, env, `{"tool":"exec","args":{"command":"echo via-call"}}`, "call", "--token", "right-token")
	if r.code != 0 {
		t.Fatalf("call: exit %d: %s %s", r.code, r.stdout, r.stderr)
	}
	var ans invokeAnswer
	if err := json.Unmarshal([]byte(r.stdout), &ans); err != nil || !ans.OK || !strings.Contains(ans.Result.Text(), "via-call") {
		t.Errorf("call answer %s (%v)", r.stdout, err)
	}

	r = runCLI(t, env, `{"tool":"exec","args":{"cwd":"/"}}`, "call", "--token", "right-token")
	if r.code != 1 || !strings.Contains(r.stdout, `"ok": false`) || !strings.Contains(r.stdout, "workdir") {
		t.Errorf("invalid call: exit %d, stdout %s", r.code, r.stdout)
	}

	for _, args := range [][]string{
		{"exec", "--token", "wrong", "--", "echo", "hi"},
		{"admin", "blockers", "--token", "wrong"},
		{"events", "--token", "wrong"},
	} {
		r := runCLI(t, env, "", args...)
		if r.code != 1 || !strings.Contains(r.stderr, "unauthorized") || r.stdout != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", args, r.code, r.stdout, r.stderr)
		}
	}
	r = runCLI(t, env, "", "call", "--token", "wrong", `{"tool":"exec","args":{"command":"true"}}`)
	if r.code != 1 || !strings.Contains(r.stdout, "unauthorized") {
		t.Errorf("call with a wrong token: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

func TestE2ESessionDefaultsAndAdmin(t *testing.T) {
	t.Parallel()
	env := startGateway(t, nil)
	if r := runCLIRetrying(t, env, "", "session", "exec", "--ask", "always"); r.code != 0 || !strings.Contains(r.stdout, "always") {
		t.Fatalf("set: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	if r := runCLI(t, env, "", "session", "exec", "--json"); r.code != 0 || !strings.Contains(r.stdout, `"ask": "always"`) {
		t.Errorf("get: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	if r := runCLI(t, env, "", "session", "exec", "--host", "bogus"); r.code != 1 {
		t.Errorf("bad host: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	if r := runCLI(t, env, "", "admin", "blockers"); r.code != 0 {
		t.Errorf("blockers: exit %d, %q", r.code, r.stderr)
	}
}

// TestE2EFollow: `exec --follow` streams a command's output until it exits
// and takes its exit status; `process poll --follow` tails a background
// session the same way.
func TestE2EFollow(t *testing.T) {
	t.Parallel()
	env := startGateway(t, nil)
	for _, args := range [][]string{{"exec", "--follow"}, {"exec"}} {
		r := runCLI(t, env, "", append(args, "--", "sh", "-c", "echo first; sleep 0.3; echo second; exit 4")...)
		if r.code != 4 || r.stdout != "first\nsecond\n" || r.stderr != "" {
			t.Fatalf("%q: exit %d, stdout %q, stderr %q", args, r.code, r.stdout, r.stderr)
		}
	}
	r := runCLI(t, env, "", "exec", "--background", "--", "sh", "-c", "sleep 0.2; echo tailed")
	// The session id alone on stdout.
	sid := regexp.MustCompile(`^([a-z0-9-]+)\n$`).FindStringSubmatch(r.stdout)
	if r.code != 0 || sid == nil {
		t.Fatalf("background: %d %q", r.code, r.stdout)
	}
	r = runCLI(t, env, "", "process", "poll", sid[1], "--follow")
	if r.code != 0 || !strings.Contains(r.stdout, "tailed") || !strings.Contains(r.stdout, "Process exited with code 0.") {
		t.Fatalf("poll --follow: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if r := runCLI(t, env, "", "process", "log", sid[1], "--follow"); r.code != 2 {
		t.Fatalf("--follow on log: exit %d", r.code)
	}
}

// TestE2EExitNoticeNamesWholeSessionID: the exit notice of a background
// session names the session by its whole id (DESIGN.md §3.5), not by the
// 8 characters OpenClaw keeps of its random ids, and process poll finds
// the session by the id the notice gives.
func TestE2EExitNoticeNamesWholeSessionID(t *testing.T) {
	t.Parallel()
	env := startGateway(t, nil)
	var id string
	// Readable ids are mostly longer than 8 characters; a short one
	// would prove nothing, so it is stopped (which sends no notice) and
	// another started.
	for range 20 {
		r := runCLI(t, env, "", "exec", "--json", "--background", "--", "sh", "-c", "sleep 0.3; echo whole-id-output; exit 3")
		var ans invokeAnswer
		if err := json.Unmarshal([]byte(r.stdout), &ans); err != nil || ans.Result.SessionID() == "" {
			t.Fatalf("background: exit %d, stdout %q, stderr %q (%v)", r.code, r.stdout, r.stderr, err)
		}
		if id = ans.Result.SessionID(); len(id) > 8 {
			break
		}
		runCLI(t, env, "", "process", "kill", id)
	}
	if len(id) <= 8 {
		t.Fatalf("no session id longer than 8 characters in 20 starts (last %q)", id)
	}
	r := runCLI(t, env, "", "events", "--wait-ms", "10000")
	m := regexp.MustCompile(`exec\.exit Exec completed \(([^,]+), code 3\) :: whole-id-output`).FindStringSubmatch(r.stdout)
	if r.code != 0 || m == nil {
		t.Fatalf("events: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if m[1] != id {
		t.Fatalf("the notice names %q, the session is %q", m[1], id)
	}
	r = runCLI(t, env, "", "process", "poll", m[1])
	if r.code != 0 || !strings.Contains(r.stdout, "whole-id-output") || !strings.Contains(r.stdout, "Process exited with code 3") {
		t.Fatalf("poll %s: exit %d, stdout %q, stderr %q", m[1], r.code, r.stdout, r.stderr)
	}
}
