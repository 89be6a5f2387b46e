package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/execmesh/execmesh/protocol"
)

// fakeGateway is a scripted stand-in for the gateway's HTTP API, for the
// rendering and argument-building cases a real gateway cannot produce on
// demand (nodes, approvals, odd exit codes). It records every request.
type fakeGateway struct {
	t     *testing.T
	token string
	// operatorToken is accepted as well as token (the fake does not tell
	// operator endpoints apart; the tests read the header sent).
	operatorToken string
	srv           *httptest.Server

	mu       sync.Mutex
	requests []fakeRequest
	// results answers /tools/invoke by tool; status 0 means 200.
	results  map[string]fakeAnswer
	defaults map[string]any
}

type fakeRequest struct {
	Method, Path, Query string
	Auth                string // the Authorization header
	Body                map[string]any
}

type fakeAnswer struct {
	status int
	body   string
}

func newFakeGateway(t *testing.T) *fakeGateway {
	t.Helper()
	f := &fakeGateway{t: t, results: map[string]fakeAnswer{}, defaults: map[string]any{"host": "", "security": "", "ask": "", "node": ""}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /tools/invoke", func(w http.ResponseWriter, r *http.Request) {
		body := f.record(r)
		tool, _ := body["tool"].(string)
		f.mu.Lock()
		ans, ok := f.results[tool]
		f.mu.Unlock()
		if !ok {
			ans = fakeAnswer{404, `{"ok":false,"error":{"type":"not_found","message":"Tool not available: ` + tool + `"}}`}
		}
		writeRaw(w, ans.status, ans.body)
	})
	mux.HandleFunc("GET /v1/nodes", func(w http.ResponseWriter, r *http.Request) {
		f.record(r)
		seen := time.Now().Add(-42 * time.Second).UnixMilli()
		writeRaw(w, 200, fmt.Sprintf(`{"nodes":[
			{"id":"n-1","name":"build-1","status":"connected","paired":true,"platform":"linux/amd64","lastSeen":%d,"sessions":3,"server":"nats-a"},
			{"id":"n-2","name":"laptop","status":"unreachable","paired":false,"platform":"darwin/arm64","lastSeen":0,"sessions":0,"server":null}]}`, seen))
	})
	mux.HandleFunc("POST /v1/nodes/{id}/{verb}", func(w http.ResponseWriter, r *http.Request) {
		f.record(r)
		switch r.PathValue("id") {
		case "missing":
			writeRaw(w, 404, `{"ok":false,"error":{"type":"not_found","message":"unknown node missing"}}`)
		case "build-1":
			writeRaw(w, 200, `{"node":{"id":"n-1","name":"build-1","status":"connected","paired":true}}`)
		default:
			writeRaw(w, 200, `{"ok":true}`)
		}
	})
	mux.HandleFunc("GET /v1/nodes/{id}/approvals", func(w http.ResponseWriter, r *http.Request) {
		f.record(r)
		writeRaw(w, 200, `{"path":"/x/exec-approvals.json","exists":false,"hash":"","file":null}`)
	})
	mux.HandleFunc("POST /v1/nodes/invite", func(w http.ResponseWriter, r *http.Request) {
		f.record(r)
		writeRaw(w, 200, `{"code":"JOIN-abc","command":"execmesh node --join JOIN-abc","expiresAtMs":1}`)
	})
	mux.HandleFunc("GET /v1/approvals", func(w http.ResponseWriter, r *http.Request) {
		f.record(r)
		exp := time.Now().Add(5*time.Minute + 30*time.Second).UnixMilli()
		writeRaw(w, 200, fmt.Sprintf(`{"approvals":[{"id":"ap-1","slug":"calm-otter","command":"rm -rf\n/tmp/x","host":"gateway","nodeId":"","cwd":"/srv","agentId":"main","sessionKey":"agent:main:main","expiresAtMs":%d}]}`, exp))
	})
	mux.HandleFunc("POST /v1/approvals/{id}", func(w http.ResponseWriter, r *http.Request) {
		f.record(r)
		switch r.PathValue("id") {
		case "gone":
			writeRaw(w, 404, `{"ok":false,"error":{"type":"not_found","message":"unknown or expired approval gone"}}`)
		case "done":
			writeRaw(w, 409, `{"ok":false,"error":{"type":"conflict","message":"approval done was already decided"}}`)
		default:
			writeRaw(w, 200, `{"ok":true}`)
		}
	})
	mux.HandleFunc("GET /v1/admin/blockers", func(w http.ResponseWriter, r *http.Request) {
		f.record(r)
		writeRaw(w, 200, `{"blockers":[{"sessionId":"warm-reef","pid":4242,"command":"sleep 100"}]}`)
	})
	mux.HandleFunc("GET /v1/sessions/{key}/exec", func(w http.ResponseWriter, r *http.Request) {
		f.record(r)
		f.mu.Lock()
		defer f.mu.Unlock()
		writeJSONAny(w, f.defaults)
	})
	mux.HandleFunc("PUT /v1/sessions/{key}/exec", func(w http.ResponseWriter, r *http.Request) {
		body := f.record(r)
		f.mu.Lock()
		defer f.mu.Unlock()
		f.defaults = body
		writeJSONAny(w, f.defaults)
	})
	mux.HandleFunc("GET /v1/events", func(w http.ResponseWriter, r *http.Request) {
		f.record(r)
		writeRaw(w, 200, `{"events":[{"id":"e1","ts":1700000000000,"sessionKey":"agent:main:main","contextKey":"exec:warm-reef","kind":"exec.exit","text":"Exec completed (warm-ree, code 0) :: done"}]}`)
	})
	mux.HandleFunc("GET /v1/events/stream", func(w http.ResponseWriter, r *http.Request) {
		f.record(r)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		fmt.Fprint(w, ": connected\n\n")
		for i := 1; i <= 2; i++ {
			fmt.Fprintf(w, "id: e%d\nevent: exec.exit\ndata: {\"id\":\"e%d\",\"ts\":1700000000000,\"kind\":\"exec.exit\",\"text\":\"event %d\"}\n\n", i, i, i)
		}
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	var handler http.Handler = mux
	handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		tok, op := f.token, f.operatorToken
		f.mu.Unlock()
		if tok != "" && r.Header.Get("Authorization") != "Bearer "+tok && r.Header.Get("Authorization") != "Bearer "+op {
			writeRaw(w, 401, `{"ok":false,"error":{"type":"unauthorized","message":"unauthorized: missing or invalid bearer token"}}`)
			return
		}
		mux.ServeHTTP(w, r)
	})
	f.srv = httptest.NewServer(handler)
	t.Cleanup(f.srv.Close)
	return f
}

// record stores the request and returns its JSON body.
func (f *fakeGateway) record(r *http.Request) map[string]any {
	data, _ := io.ReadAll(r.Body)
	var body map[string]any
	if len(data) > 0 {
		if err := json.Unmarshal(data, &body); err != nil {
			f.t.Errorf("%s %s: body is not a JSON object: %s", r.Method, r.URL.Path, data)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests = append(f.requests, fakeRequest{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("Authorization"), body})
	return body
}

// last returns the last request recorded.
func (f *fakeGateway) last() fakeRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.requests) == 0 {
		f.t.Fatal("no request reached the gateway")
	}
	return f.requests[len(f.requests)-1]
}

func (f *fakeGateway) answer(tool string, status int, body string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.results[tool] = fakeAnswer{status, body}
}

func (f *fakeGateway) env() map[string]string {
	return map[string]string{envGatewayURL: f.srv.URL}
}

func writeRaw(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "application/json")
	if status == 0 {
		status = 200
	}
	w.WriteHeader(status)
	io.WriteString(w, body)
}

func writeJSONAny(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

// okResult is a 200 invoke answer with one text block and the details.
func okResult(text string, details map[string]any) string {
	b, _ := json.Marshal(map[string]any{"ok": true, "result": map[string]any{
		"content": []protocol.Content{{Type: "text", Text: text}}, "details": details}})
	return string(b)
}

func TestExecArgumentsAndExitCodes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		args     []string
		answer   fakeAnswer
		wantArgs map[string]any // the args the gateway received
		code     int
		stdout   string
		stderr   string
	}{
		{
			name:     "completed 0",
			args:     []string{"--", "echo", "hi"},
			answer:   fakeAnswer{200, okResult("hi", map[string]any{"status": "completed", "exitCode": 0})},
			wantArgs: map[string]any{"command": "echo hi", "background": true}, // waiting: background at once, follow
			stdout:   "hi\n",
		},
		{
			name:     "no-wait keeps the gateway's yield window",
			args:     []string{"--no-wait", "--", "echo", "hi"},
			answer:   fakeAnswer{200, okResult("hi", map[string]any{"status": "completed", "exitCode": 0})},
			wantArgs: map[string]any{"command": "echo hi"},
			stdout:   "hi\n",
		},
		{
			name:   "every flag",
			args:   []string{"--workdir", "/srv", "--env", "A=1", "--env", "B=x=y", "--yield-ms", "0", "--timeout", "2.5", "--pty", "--elevated=false", "--host", "node", "--security", "allowlist", "--ask", "always", "--node", "build-1", "sh", "-c", "exit 3"},
			answer: fakeAnswer{200, okResult("(no output)\n\n(Command exited with code 3)", map[string]any{"status": "completed", "exitCode": 3})},
			wantArgs: map[string]any{
				"command": "sh -c 'exit 3'", "workdir": "/srv", "env": map[string]any{"A": "1", "B": "x=y"},
				"yieldMs": 0.0, "timeout": 2.5, "pty": true, "elevated": false, "host": "node",
				"security": "allowlist", "ask": "always", "node": "build-1",
			},
			code:   3,
			stdout: "(no output)\n\n(Command exited with code 3)\n",
		},
		{
			name:     "background",
			args:     []string{"--background", "sleep 5"},
			answer:   fakeAnswer{200, okResult("Command still running (session warm-reef, pid 7).", map[string]any{"status": "running", "sessionId": "warm-reef"})},
			wantArgs: map[string]any{"command": "sleep 5", "background": true},
			stdout:   "warm-reef\n", // alone: S=$(execmesh exec --background …)
		},
		{
			name:   "background with a warning",
			args:   []string{"--background", "--node", "n1", "sleep 5"},
			answer: fakeAnswer{200, okResult("Warning: tools.exec.pathPrepend is ignored on host=node.\n\nCommand still running (session warm-reef, pid 7).", map[string]any{"status": "running", "sessionId": "warm-reef"})},
			stdout: "warm-reef\n",
			stderr: "execmesh: Warning: tools.exec.pathPrepend is ignored on host=node.\n",
		},
		{
			name:   "background awaiting approval",
			args:   []string{"--background", "rm", "-rf", "/tmp/x"},
			answer: fakeAnswer{200, okResult("Approval required (id calm-otter).", map[string]any{"status": "approval-pending", "approvalId": "ap-1", "approvalSlug": "calm-otter"})},
			code:   75,
			stdout: "ap-1\n",
			stderr: "execmesh: the command awaits an operator's approval ap-1 (calm-otter); it has not started. An operator answers with: execmesh approvals resolve ap-1 allow-once|deny; once approved it runs in the background\n",
		},
		{
			name:   "background -o json awaiting approval",
			args:   []string{"--background", "-o", "json", "rm"},
			answer: fakeAnswer{200, `{"ok":true,"result":{"content":[],"details":{"status":"approval-pending","approvalId":"ap-1"}}}`},
			code:   75,
			stdout: "{\n  \"ok\": true,\n  \"result\": {\n    \"content\": [],\n    \"details\": {\n      \"status\": \"approval-pending\",\n      \"approvalId\": \"ap-1\"\n    }\n  }\n}\n",
		},
		{
			name:   "foreground cut at the retention cap",
			args:   []string{"--yield-ms", "1000", "seq 1 100000"},
			answer: fakeAnswer{200, okResult("[earlier output was discarded at the retention cap and cannot be recovered]\n\n99999\n100000", map[string]any{"status": "completed", "exitCode": 0, "aggregated": "99999\n100000"})},
			code:   125,
			stdout: "[earlier output was discarded at the retention cap and cannot be recovered]\n\n99999\n100000\n",
			stderr: "execmesh: the output was cut: a session keeps the last 200 000 characters of a command's output (fewer when configured so), and an earlier part was dropped before execmesh could print it; it cannot be recovered (exec without --yield-ms, --no-wait and -o json streams the whole output)\n",
		},
		{
			name:   "high exit code passed through",
			args:   []string{"--", "sh", "-c", "exit 200"},
			answer: fakeAnswer{200, okResult("x", map[string]any{"status": "completed", "exitCode": 200, "aggregated": "x"})},
			code:   200,
			stdout: "x\n",
		},
		{
			name:   "not found is 127",
			args:   []string{"nosuchcmd"},
			answer: fakeAnswer{200, okResult("sh: nosuchcmd: not found\n\nCommand not found", map[string]any{"status": "failed", "exitCode": 127, "aggregated": "sh: nosuchcmd: not found"})},
			code:   127,
			stdout: "sh: nosuchcmd: not found\n\nCommand not found\n", // a foreground answer: the agent's text
		},
		{
			name:   "signal is 128+N",
			args:   []string{"kill -9 $$"},
			answer: fakeAnswer{200, okResult("Command aborted by signal SIGKILL", map[string]any{"status": "failed", "exitCode": nil, "exitSignal": "SIGKILL", "aggregated": ""})},
			code:   137,
			stderr: "execmesh: command ended by signal SIGKILL\n",
		},
		{
			name:   "timeout is 124 with the reason",
			args:   []string{"sleep 9"},
			answer: fakeAnswer{200, okResult("\n\nCommand timed out after 1 seconds.\n\nThe command was terminated…", map[string]any{"status": "failed", "exitCode": nil, "exitSignal": "SIGTERM", "timedOut": true, "aggregated": ""})},
			code:   124,
			stderr: "execmesh: Command timed out after 1 seconds.\n",
		},
		{
			name:   "could not run: the reason on stderr",
			args:   []string{"--workdir", "/nope", "true"},
			answer: fakeAnswer{200, okResult(`workdir "/nope" is unavailable or not a directory: command was not executed.`, map[string]any{"status": "failed", "exitCode": nil, "exitSignal": nil, "aggregated": ""})},
			code:   1,
			stderr: "execmesh: workdir \"/nope\" is unavailable or not a directory: command was not executed.\n",
		},
		{
			name:   "no-wait prints the agent's text",
			args:   []string{"--no-wait", "nosuchcmd"},
			answer: fakeAnswer{200, okResult("sh: nosuchcmd: not found\n\nCommand not found", map[string]any{"status": "failed", "exitCode": 127})},
			code:   127,
			stdout: "sh: nosuchcmd: not found\n\nCommand not found\n",
		},
		{
			name:   "approval pending with no-wait",
			args:   []string{"--no-wait", "rm", "-rf", "/tmp/x"},
			answer: fakeAnswer{200, okResult("Approval required (id calm-otter).", map[string]any{"status": "approval-pending", "approvalId": "ap-1"})},
			stdout: "Approval required (id calm-otter).\n",
		},
		{
			name:   "tool error",
			args:   []string{"--env", "PATH=/x", "ls"},
			answer: fakeAnswer{400, `{"ok":false,"error":{"type":"security_violation","message":"Security Violation: Custom 'PATH' variable is forbidden during host execution."}}`},
			code:   1,
			stderr: "execmesh: Security Violation: Custom 'PATH' variable is forbidden during host execution.\n",
		},
		{
			name:   "json",
			args:   []string{"--json", "true"},
			answer: fakeAnswer{200, okResult("", map[string]any{"status": "completed", "exitCode": 0})},
			stdout: "{\n  \"ok\": true,\n  \"result\": {\n    \"content\": [\n      {\n        \"type\": \"text\",\n        \"text\": \"\"\n      }\n    ],\n    \"details\": {\n      \"exitCode\": 0,\n      \"status\": \"completed\"\n    }\n  }\n}\n",
		},
		{
			name:   "json tool error",
			args:   []string{"--json", "true"},
			answer: fakeAnswer{400, `{"ok":false,"error":{"type":"denied","message":"exec denied: allowlist miss"}}`},
			code:   1,
			stdout: "{\n  \"ok\": false,\n  \"error\": {\n    \"type\": \"denied\",\n    \"message\": \"exec denied: allowlist miss\"\n  }\n}\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			gw := newFakeGateway(t)
			gw.answer("exec", tt.answer.status, tt.answer.body)
			r := runCLI(t, gw.env(), "", append([]string{"exec"}, tt.args...)...)
			if r.code != tt.code || r.stdout != tt.stdout || r.stderr != tt.stderr {
				t.Fatalf("exit %d, stdout %q, stderr %q\nwant %d, %q, %q", r.code, r.stdout, r.stderr, tt.code, tt.stdout, tt.stderr)
			}
			req := gw.last()
			if req.Body["tool"] != "exec" || req.Body["sessionKey"] != "agent:main:main" {
				t.Errorf("request %v", req.Body)
			}
			if tt.wantArgs != nil {
				got, _ := json.Marshal(req.Body["args"])
				want, _ := json.Marshal(tt.wantArgs)
				if string(got) != string(want) {
					t.Errorf("args %s, want %s", got, want)
				}
			}
		})
	}
}

func TestProcessArguments(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args     []string
		wantArgs string
		answer   map[string]any
		code     int
	}{
		{[]string{"list"}, `{"action":"list"}`, map[string]any{"status": "completed"}, 0},
		{[]string{"poll", "warm-reef", "--timeout", "5000"}, `{"action":"poll","sessionId":"warm-reef","timeout":5000}`, map[string]any{"status": "running"}, 0},
		{[]string{"poll", "-s", "warm-reef"}, `{"action":"poll","sessionId":"warm-reef"}`, map[string]any{"status": "failed"}, 1},
		{[]string{"--session-id", "a", "log", "--offset", "0", "--limit", "20"}, `{"action":"log","sessionId":"a","offset":0,"limit":20}`, map[string]any{"status": "completed"}, 0},
		{[]string{"write", "a", "--data", "", "--eof"}, `{"action":"write","sessionId":"a","data":"","eof":true}`, nil, 0},
		{[]string{"send-keys", "a", "--keys", "C-c,Enter", "--keys", "Up", "--hex", "1b,5b", "--literal", "q"}, `{"action":"send-keys","sessionId":"a","keys":["C-c","Enter","Up"],"hex":["1b","5b"],"literal":"q"}`, nil, 0},
		{[]string{"paste", "a", "--text", "hi", "--no-bracketed"}, `{"action":"paste","sessionId":"a","text":"hi","bracketed":false}`, nil, 0},
		{[]string{"kill", "a", "--session-key", "agent:ops:x"}, `{"action":"kill","sessionId":"a"}`, nil, 0},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			t.Parallel()
			gw := newFakeGateway(t)
			gw.answer("process", 200, okResult("text of "+tt.args[0], tt.answer))
			r := runCLI(t, gw.env(), "", append([]string{"process"}, tt.args...)...)
			if r.code != tt.code || r.stdout != "text of "+tt.args[0]+"\n" {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit %d", r.code, r.stdout, r.stderr, tt.code)
			}
			req := gw.last()
			got, _ := json.Marshal(req.Body["args"])
			var g, w any
			json.Unmarshal(got, &g)
			json.Unmarshal([]byte(tt.wantArgs), &w)
			gj, _ := json.Marshal(g)
			wj, _ := json.Marshal(w)
			if string(gj) != string(wj) {
				t.Errorf("args %s, want %s", gj, wj)
			}
			wantKey := "agent:main:main"
			if strings.Contains(strings.Join(tt.args, " "), "agent:ops:x") {
				wantKey = "agent:ops:x"
			}
			if req.Body["sessionKey"] != wantKey {
				t.Errorf("sessionKey %v, want %s", req.Body["sessionKey"], wantKey)
			}
		})
	}
}

func TestCall(t *testing.T) {
	t.Parallel()
	gw := newFakeGateway(t)
	gw.answer("exec", 200, okResult("hi", map[string]any{"status": "completed", "exitCode": 0}))
	gw.answer("process", 200, okResult("No session found for x", map[string]any{"status": "failed"}))

	t.Run("stdin", func(t *testing.T) {
		r := runCLI(t, gw.env(), `{"tool":"exec","args":{"command":"echo hi"}}`, "call", "--session-key", "agent:ops:main")
		if r.code != 0 || !strings.Contains(r.stdout, `"text": "hi"`) {
			t.Fatalf("exit %d, stdout %s, stderr %s", r.code, r.stdout, r.stderr)
		}
		if b := gw.last().Body; b["sessionKey"] != "agent:ops:main" || b["args"].(map[string]any)["command"] != "echo hi" {
			t.Errorf("body %v", b)
		}
	})
	t.Run("argument keeps its sessionKey and flat form", func(t *testing.T) {
		r := runCLI(t, gw.env(), "", "call", `{"tool":"exec","command":"ls","sessionKey":"agent:x:y"}`)
		if r.code != 0 {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		if b := gw.last().Body; b["sessionKey"] != "agent:x:y" || b["command"] != "ls" {
			t.Errorf("body %v", b)
		}
	})
	t.Run("failed result", func(t *testing.T) {
		r := runCLI(t, gw.env(), "", "call", `{"tool":"process","args":{"action":"poll","sessionId":"x"}}`)
		if r.code != 1 || !strings.Contains(r.stdout, `"status": "failed"`) {
			t.Fatalf("exit %d, stdout %s", r.code, r.stdout)
		}
	})
	t.Run("ok false", func(t *testing.T) {
		r := runCLI(t, gw.env(), "-", "call", "-")
		if r.code != 2 {
			t.Fatalf("empty stdin: exit %d", r.code)
		}
		r = runCLI(t, gw.env(), `{"tool":"apply_patch"}`, "call")
		if r.code != 1 || !strings.Contains(r.stdout, `"ok": false`) || !strings.Contains(r.stdout, "Tool not available") {
			t.Fatalf("exit %d, stdout %s, stderr %s", r.code, r.stdout, r.stderr)
		}
	})
}

func TestAuthAndReachability(t *testing.T) {
	t.Parallel()
	gw := newFakeGateway(t)
	gw.token = "s3cret"
	gw.answer("exec", 200, okResult("hi", map[string]any{"status": "completed", "exitCode": 0}))

	r := runCLI(t, gw.env(), "", "exec", "--", "echo", "hi")
	if r.code != 1 || r.stderr != "execmesh: unauthorized: missing or invalid bearer token\n" {
		t.Errorf("no token: exit %d, stderr %q", r.code, r.stderr)
	}
	r = runCLI(t, gw.env(), "", "nodes", "list", "--token", "wrong")
	if r.code != 1 || !strings.Contains(r.stderr, "unauthorized") {
		t.Errorf("wrong token: exit %d, stderr %q", r.code, r.stderr)
	}
	for name, env := range map[string]map[string]string{
		"flag": gw.env(),
		"env":  {envGatewayURL: gw.srv.URL, envToken: "s3cret"},
	} {
		args := []string{"exec", "echo hi"}
		if name == "flag" {
			args = []string{"exec", "--token", "s3cret", "echo hi"}
		}
		if r := runCLI(t, env, "", args...); r.code != 0 || r.stdout != "hi\n" {
			t.Errorf("token from %s: exit %d, stdout %q, stderr %q", name, r.code, r.stdout, r.stderr)
		}
	}
	// The token from the config file, and the URL from gateway.listen.
	dir := t.TempDir()
	host := strings.TrimPrefix(gw.srv.URL, "http://")
	writeFile(t, dir+"/config.json", `{"gateway":{"listen":"`+host+`","auth":{"token":"s3cret"}}}`)
	if r := runCLI(t, map[string]string{envStateDir: dir}, "", "exec", "echo hi"); r.code != 0 {
		t.Errorf("token from config: exit %d, stderr %q", r.code, r.stderr)
	}

	// Connection refused: a port that was just closed.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	r = runCLI(t, map[string]string{envGatewayURL: "http://" + addr}, "", "exec", "true")
	want := fmt.Sprintf("execmesh: cannot reach the gateway at http://%s: is \"execmesh up\" running?\n", addr)
	if r.code != 1 || r.stderr != want {
		t.Errorf("refused: exit %d, stderr %q, want %q", r.code, r.stderr, want)
	}
}

func TestNodesApprovalsAdmin(t *testing.T) {
	t.Parallel()
	gw := newFakeGateway(t)
	tests := []struct {
		args   []string
		code   int
		stdout []string
		not    []string
		check  func(t *testing.T, req fakeRequest)
	}{
		{args: []string{"nodes", "list"}, stdout: []string{
			"ID   NAME     STATUS       PAIRED  PLATFORM      LAST SEEN  SESSIONS  SERVER",
			"n-1  build-1  connected    yes     linux/amd64   42s ago    3         nats-a",
			"n-2  laptop   unreachable  no      darwin/arm64  -          0         -",
		}},
		{args: []string{"nodes", "pending"}, stdout: []string{"n-2", "laptop"}, not: []string{"n-1"}},
		{args: []string{"nodes", "pending", "--json"}, stdout: []string{`"id": "n-2"`}, not: []string{"n-1"}},
		{args: []string{"nodes", "list", "--json"}, stdout: []string{`"nodes": [`, `"id": "n-1"`}},
		{args: []string{"nodes", "approve", "n-2"}, stdout: []string{"node n-2: approved"}, check: func(t *testing.T, r fakeRequest) {
			if r.Method != "POST" || r.Path != "/v1/nodes/n-2/approve" {
				t.Errorf("request %s %s", r.Method, r.Path)
			}
		}},
		{args: []string{"nodes", "reject", "n-2"}, stdout: []string{"node n-2: rejected"}, check: func(t *testing.T, r fakeRequest) {
			if r.Path != "/v1/nodes/n-2/reject" {
				t.Errorf("path %s", r.Path)
			}
		}},
		{args: []string{"nodes", "approve", "missing"}, code: 1},
		{args: []string{"nodes", "invite", "--name", "ci-7", "--ttl", "15m"}, stdout: []string{"execmesh node --join JOIN-abc\n"}, not: []string{"expires"}, check: func(t *testing.T, r fakeRequest) {
			if r.Body["name"] != "ci-7" || r.Body["ttlMs"] != 900000.0 {
				t.Errorf("invite body %v", r.Body)
			}
		}},
		{args: []string{"approvals", "list"}, stdout: []string{
			"ID    SLUG        HOST     NODE  AGENT  SESSION KEY      EXPIRES  CWD   COMMAND",
			`ap-1  calm-otter  gateway  -     main   agent:main:main  in 5m    /srv  rm -rf\n/tmp/x`, // a newline shown, not folded
		}},
		{args: []string{"approvals", "resolve", "ap-1", "allow-once"}, stdout: []string{"approval ap-1: allow-once"}, check: func(t *testing.T, r fakeRequest) {
			if r.Path != "/v1/approvals/ap-1" || r.Body["decision"] != "allow-once" {
				t.Errorf("request %s %v", r.Path, r.Body)
			}
		}},
		{args: []string{"approvals", "resolve", "gone", "deny"}, code: 1},
		{args: []string{"approvals", "resolve", "done", "allow-always"}, code: 1},
		{args: []string{"admin", "blockers"}, stdout: []string{`sessionId=warm-reef pid=4242 command="sleep 100"`}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			r := runCLI(t, gw.env(), "", tt.args...)
			if r.code != tt.code {
				t.Fatalf("exit %d, want %d; stdout %s stderr %s", r.code, tt.code, r.stdout, r.stderr)
			}
			for _, s := range tt.stdout {
				if !strings.Contains(r.stdout, s) {
					t.Errorf("stdout lacks %q:\n%s", s, r.stdout)
				}
			}
			for _, s := range tt.not {
				if strings.Contains(r.stdout, s) {
					t.Errorf("stdout has %q:\n%s", s, r.stdout)
				}
			}
			if tt.code != 0 && !strings.HasPrefix(r.stderr, "execmesh: ") {
				t.Errorf("stderr %q", r.stderr)
			}
			if tt.check != nil {
				tt.check(t, gw.last())
			}
		})
	}
}

func TestSessionExecDefaults(t *testing.T) {
	t.Parallel()
	gw := newFakeGateway(t)
	r := runCLI(t, gw.env(), "", "session", "exec")
	if r.code != 0 || !strings.Contains(r.stdout, "host        (config default)") {
		t.Fatalf("get: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if p := gw.last().Path; p != "/v1/sessions/agent:main:main/exec" {
		t.Errorf("path %s", p)
	}
	if r := runCLI(t, gw.env(), "", "session", "exec", "--host", "node", "--node", "build-1"); r.code != 0 {
		t.Fatalf("put: exit %d: %s", r.code, r.stderr)
	}
	// A second PUT changes only what it names.
	r = runCLI(t, gw.env(), "", "session", "exec", "--ask", "always")
	if r.code != 0 || !strings.Contains(r.stdout, "node        build-1") || !strings.Contains(r.stdout, "ask         always") {
		t.Fatalf("put: exit %d, stdout %q", r.code, r.stdout)
	}
	req := gw.last()
	if req.Method != "PUT" || req.Body["host"] != "node" || req.Body["node"] != "build-1" || req.Body["ask"] != "always" {
		t.Errorf("request %s %v", req.Method, req.Body)
	}
	r = runCLI(t, gw.env(), "", "session", "exec", "--json")
	if r.code != 0 || !strings.Contains(r.stdout, `"host": "node"`) {
		t.Errorf("json: %q", r.stdout)
	}
}

func TestEvents(t *testing.T) {
	t.Parallel()
	gw := newFakeGateway(t)
	r := runCLI(t, gw.env(), "", "events", "--wait-ms", "1500")
	want := time.UnixMilli(1700000000000).Format(time.RFC3339) + " exec.exit Exec completed (warm-ree, code 0) :: done\n"
	if r.code != 0 || r.stdout != want {
		t.Fatalf("exit %d, stdout %q, want %q (stderr %q)", r.code, r.stdout, want, r.stderr)
	}
	if q := gw.last().Query; q != "sessionKey=agent%3Amain%3Amain&waitMs=1500" {
		t.Errorf("query %q", q)
	}

	t.Run("follow", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		pr, pw := io.Pipe()
		done := make(chan int, 1)
		var errOut strings.Builder
		go func() {
			env := gw.env()
			env["HOME"] = t.TempDir()
			done <- runEnv(ctx, []string{"events", "--follow", "--json"}, env, strings.NewReader(""), pw, &errOut)
			pw.Close()
		}()
		sc := bufio.NewScanner(pr)
		for i := 1; i <= 2; i++ {
			if !sc.Scan() {
				t.Fatalf("stream ended early: %v", sc.Err())
			}
			if want := fmt.Sprintf(`"text":"event %d"`, i); !strings.Contains(sc.Text(), want) {
				t.Errorf("line %d = %q, want %s", i, sc.Text(), want)
			}
		}
		cancel() // an interrupt is the normal way to stop following
		go io.Copy(io.Discard, pr)
		if code := <-done; code != 0 {
			t.Errorf("exit %d after interrupt: %s", code, errOut.String())
		}
	})
}

func TestReadSSE(t *testing.T) {
	t.Parallel()
	in := ": hello\n\nid: 1\nevent: x\ndata: a\ndata:b\n\ndata: c\n\nretry: 5\n\ndata: unterminated"
	var got []string
	if err := readSSE(strings.NewReader(in), func(d string) error { got = append(got, d); return nil }); err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, "|") != "a\nb|c" {
		t.Errorf("got %q", got)
	}
}

func TestAnswerError(t *testing.T) {
	t.Parallel()
	tests := []struct {
		status int
		body   string
		typ    protocol.ErrorType
		msg    string
	}{
		{401, `{"ok":false,"error":{"type":"unauthorized","message":"unauthorized: x"}}`, protocol.ErrUnauthorized, "unauthorized: x"},
		{404, `{"error":{"message":"no such approval"}}`, protocol.ErrNotFound, "no such approval"},
		{409, `{"error":"already decided"}`, protocol.ErrConflict, "already decided"},
		{502, `<html>bad gateway</html>`, protocol.ErrInternal, "gateway answered 502 Bad Gateway: <html>bad gateway</html>"},
		{503, ``, protocol.ErrUnavailable, "gateway answered 503 Service Unavailable"},
	}
	for _, tt := range tests {
		e := answerError(tt.status, []byte(tt.body))
		if e.Type != tt.typ || e.Message != tt.msg {
			t.Errorf("answerError(%d, %q) = %q %q, want %q %q", tt.status, tt.body, e.Type, e.Message, tt.typ, tt.msg)
		}
	}
}

// TestOperatorToken: the commands that call operator endpoints send the
// operator token: --operator-token, else $EXECMESH_OPERATOR_TOKEN, else
// <state-dir>/operator.token, else the tool token; every other call sends
// the tool token (the operator-token contract).
func TestOperatorToken(t *testing.T) {
	t.Parallel()
	gw := newFakeGateway(t)
	gw.token = "tool-tok"
	gw.answer("exec", 200, okResult("hi", map[string]any{"status": "completed", "exitCode": 0}))
	withFile := t.TempDir()
	// The gateway writes 64 hex characters, mode 0600; the CLI reads
	// nothing else (a token others may know is no operator's).
	const fileToken = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0"
	writeFile(t, filepath.Join(withFile, "operator.token"), fileToken+"\n")
	operator := [][]string{
		{"approvals", "resolve", "ap-1", "allow-once"},
		{"nodes", "approve", "n-2"},
		{"nodes", "reject", "n-2"},
		{"nodes", "invite", "--name", "x"},
		{"nodes", "approvals", "get", "n-1"},
	}
	plain := [][]string{{"approvals", "list"}, {"nodes", "list"}, {"exec", "--no-wait", "true"}, {"admin", "blockers"}}
	for _, tt := range []struct {
		name string
		env  map[string]string
		flag []string
		want string
	}{
		{"file in the state dir", map[string]string{envStateDir: withFile}, nil, "Bearer " + fileToken},
		{"environment over the file", map[string]string{envStateDir: withFile, envOperatorToken: "op-from-env"}, nil, "Bearer op-from-env"},
		{"flag over both", map[string]string{envStateDir: withFile, envOperatorToken: "op-from-env"}, []string{"--operator-token", "op-flag"}, "Bearer op-flag"},
		{"none: the tool token", map[string]string{envStateDir: t.TempDir()}, nil, "Bearer tool-tok"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			env := gw.env()
			env[envToken] = "tool-tok"
			for k, v := range tt.env {
				env[k] = v
			}
			gw.mu.Lock()
			gw.operatorToken = strings.TrimPrefix(tt.want, "Bearer ")
			gw.mu.Unlock()
			for _, args := range operator {
				r := runCLI(t, env, "", append(args, tt.flag...)...)
				if r.code != 0 {
					t.Fatalf("%q: exit %d: %s", args, r.code, r.stderr)
				}
				if got := gw.last().Auth; got != tt.want {
					t.Errorf("%q sent %q, want %q", args, got, tt.want)
				}
			}
			for _, args := range plain {
				if r := runCLI(t, env, "", args...); r.code != 0 {
					t.Fatalf("%q: exit %d: %s", args, r.code, r.stderr)
				}
				if got := gw.last().Auth; got != "Bearer tool-tok" {
					t.Errorf("%q sent %q, want the tool token", args, got)
				}
			}
		})
	}
}

// TestUsageErrorsSendNothing: a missing argument is a usage error (exit
// 2) found before any request reaches the gateway.
func TestUsageErrorsSendNothing(t *testing.T) {
	t.Parallel()
	gw := newFakeGateway(t)
	for _, args := range [][]string{
		{"process", "poll"}, {"process", "write", "--data", "x"}, {"nodes", "approve"}, {"nodes", "approvals", "set", "n1", "-"},
		{"approvals", "resolve", "ap-1"}, {"approvals", "resolve", "ap-1", "maybe"}, {"exec", "--env", "X", "true"}, {"call"},
	} {
		if r := runCLI(t, gw.env(), "", args...); r.code != 2 {
			t.Errorf("%q: exit %d, stderr %q", args, r.code, r.stderr)
		}
	}
	gw.mu.Lock()
	defer gw.mu.Unlock()
	if len(gw.requests) != 0 {
		t.Errorf("usage errors sent requests: %+v", gw.requests)
	}
}

// TestNodesByName: nodes approve/reject pass a name through; the answer's
// id is shown.
func TestNodesByName(t *testing.T) {
	t.Parallel()
	gw := newFakeGateway(t)
	r := runCLI(t, gw.env(), "", "nodes", "approve", "build-1")
	if r.code != 0 || r.stdout != "node build-1 (id n-1): approved\n" || gw.last().Path != "/v1/nodes/build-1/approve" {
		t.Fatalf("exit %d, stdout %q, path %s", r.code, r.stdout, gw.last().Path)
	}
}
