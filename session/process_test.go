package session

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/protocol"
)

func TestExecForeground(t *testing.T) {
	t.Parallel()
	m := newManager(t, nil)
	tests := []struct {
		name, command    string
		status, text     string
		sync             bool
		timeout, yieldMs *float64
		warnings         []string
		env              []string
		failureKind      string
	}{
		{name: "exits before the yield window", command: "echo hi", status: "completed", text: "hi"},
		{name: "silent success", command: "true", status: "completed", text: "(no output)"},
		{name: "exit code", command: "echo oops >&2; exit 3", status: "completed", text: "oops\n\n(Command exited with code 3)"},
		{name: "not found", command: "nonexistent-cmd-xyz 2>/dev/null", status: "failed", text: "Command not found", failureKind: "shell-command-not-found"},
		{name: "not found with output", command: "echo before; nonexistent-cmd-xyz 2>/dev/null", status: "failed", text: "before\n\nCommand not found", failureKind: "shell-command-not-found"},
		{name: "killed by a signal", command: "echo x; kill -KILL $$", status: "failed", text: "x\n\nCommand aborted by signal SIGKILL", failureKind: "signal"},
		{name: "warnings first", command: "echo hi", status: "completed", text: "Warning: one\nWarning: two\n\nhi", warnings: []string{"Warning: one", "Warning: two"}},
		{name: "synchronous ignores the yield window", command: "sleep 0.3; echo late", status: "completed", text: "late", sync: true, yieldMs: ptr(10.0)},
		{name: "synchronous timeout has no background hint", command: "sleep 5", status: "failed", sync: true, timeout: ptr(0.3), failureKind: "overall-timeout",
			text: "Command timed out after 0.3 seconds.\n\n" + timeoutRetryGuidance},
		{name: "stdin is at EOF", command: "cat; echo after", status: "completed", text: "after"},
		{name: "OPENCLAW_SHELL is set", command: `echo "$OPENCLAW_SHELL"`, status: "completed", text: "exec"},
		{name: "no TERM added without PTY", command: `printenv TERM || echo unset`, env: []string{"PATH=" + os.Getenv("PATH")}, status: "completed", text: "unset"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			res := mustExec(t, m, ExecRequest{Command: tt.command, Synchronous: tt.sync, TimeoutSec: tt.timeout, YieldMs: tt.yieldMs, Warnings: tt.warnings, Env: tt.env})
			if res.Status() != tt.status {
				t.Fatalf("status %s, want %s: %q", res.Status(), tt.status, res.Text())
			}
			if tt.text != "" && res.Text() != tt.text {
				t.Errorf("text %q, want %q", res.Text(), tt.text)
			}
			if tt.failureKind != "" && res.Details.FailureKind.Value() != tt.failureKind {
				t.Errorf("failureKind %v, want %s", res.Details.FailureKind.Value(), tt.failureKind)
			}
		})
	}
}

func TestExecBadInput(t *testing.T) {
	t.Parallel()
	m := newManager(t, nil)
	if _, err := m.Exec(context.Background(), ExecRequest{Command: "  "}); err == nil || err.Error() != "Provide a command to start." {
		t.Errorf("empty command: %v", err)
	}
	// An invalid workdir fails and nothing runs: the marker is not created.
	dir := t.TempDir()
	marker := filepath.Join(dir, "marker")
	for _, wd := range []string{filepath.Join(dir, "missing"), marker + "-file", "   "} {
		if strings.HasSuffix(wd, "-file") {
			if err := os.WriteFile(wd, nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		res := mustExec(t, m, ExecRequest{Command: "touch " + marker, Workdir: wd})
		want := protocol.WorkdirUnavailableText(wd)
		if res.Status() != "failed" || res.Text() != want || res.Details.FailureKind.Value() != "runtime-error" || res.Details.Cwd.Value() != wd {
			t.Errorf("workdir %q: %s %q %v", wd, res.Status(), res.Text(), res.Details)
		}
		if _, err := os.Stat(marker); err == nil {
			t.Fatalf("command ran although workdir %q is invalid", wd)
		}
	}
	// A missing program is a runtime error, not a crash.
	res := mustExec(t, m, ExecRequest{Command: "x", Argv: []string{"/nonexistent/program"}})
	if res.Status() != "failed" || res.Details.FailureKind.Value() != "runtime-error" || !strings.Contains(res.Text(), "/nonexistent/program") {
		t.Errorf("spawn error: %s %q %v", res.Status(), res.Text(), res.Details)
	}
	for _, c := range []struct {
		args protocol.ProcessArgs
		want string
	}{
		{protocol.ProcessArgs{Action: "bogus"}, "Invalid process action. Expected one of: list, poll, log, write, send-keys, submit, paste, kill, clear, remove"},
		{protocol.ProcessArgs{Action: "poll"}, "sessionId is required for this action."},
		{protocol.ProcessArgs{Action: "poll", SessionID: "nope"}, "No session found for nope"},
		{protocol.ProcessArgs{Action: "write", SessionID: "nope"}, "No active session found for nope"},
		{protocol.ProcessArgs{Action: "clear", SessionID: "nope"}, "No finished session found for nope"},
	} {
		res := proc(t, m, "", c.args)
		if res.Status() != "failed" || res.Text() != c.want || res.Details.Error.Value() != c.want {
			t.Errorf("%+v: %s %q", c.args, res.Status(), res.Text())
		}
	}
}

func TestExecRejectedAfterClose(t *testing.T) {
	t.Parallel()
	m, err := NewManager(testConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(context.Background()); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := m.Exec(context.Background(), ExecRequest{Command: "true"}); err != ErrClosed {
		t.Errorf("Exec after Close: %v", err)
	}
}

// Spec §23.5 cases 41–43, 47–48: yield, background, list names, log paging.
func TestBackgroundAndPoll(t *testing.T) {
	t.Parallel()
	m := newManager(t, nil)
	const scope = "agent:main:main"
	res := mustExec(t, m, ExecRequest{Command: "sleep 0.2; echo done", YieldMs: ptr(10.0), ScopeKey: scope})
	if res.Status() != "running" {
		t.Fatalf("yielded exec: %s %q", res.Status(), res.Text())
	}
	id := res.SessionID()
	if !regexp.MustCompile(`^[a-z]+-[a-z]+(-[0-9]+)?$`).MatchString(id) {
		t.Errorf("session id %q is not a slug", id)
	}
	if !m.Has(scope, id) || m.Has("other", id) {
		t.Errorf("Has: wrong visibility")
	}
	if r := pollUntilDone(t, m, scope, id); r.Status() != "completed" || !strings.Contains(r.Details.Aggregated.Value(), "done") {
		t.Fatalf("poll: %s %v", r.Status(), r.Details)
	}

	id2 := startBackground(t, m, ExecRequest{Command: "echo hello", ScopeKey: scope})
	id3 := startBackground(t, m, ExecRequest{Command: "echo one; echo two; echo three", ScopeKey: scope})
	waitExited(t, m, id2)
	waitExited(t, m, id3)
	list := proc(t, m, scope, protocol.ProcessArgs{Action: "list"})
	sessions := list.Details.Sessions.Value()
	if len(sessions) != 3 || sessions[0].SessionID.Value() != id3 || sessions[1].SessionID.Value() != id2 || sessions[1].Name.Value() != "echo hello" {
		t.Errorf("list: %q %v", list.Text(), sessions)
	}
	log := proc(t, m, scope, protocol.ProcessArgs{Action: "log", SessionID: id3, Limit: ptr(2)})
	if log.Text() != "two\nthree" || log.Details.TotalLines.Value() != 3 {
		t.Errorf("log limit 2: %q %v", log.Text(), log.Details)
	}
	log = proc(t, m, scope, protocol.ProcessArgs{Action: "log", SessionID: id3, Offset: ptr(1), Limit: ptr(1)})
	if log.Text() != "two" {
		t.Errorf("log offset 1 limit 1: %q", log.Text())
	}
	// A foreground session is not kept (spec §24.7).
	fg := mustExec(t, m, ExecRequest{Command: "echo fg", ScopeKey: scope})
	m.mu.Lock()
	n := len(m.sessions)
	m.mu.Unlock()
	if fg.Status() != "completed" || n != 3 {
		t.Errorf("foreground session kept: %d sessions", n)
	}
}

// Spec §23.3 cases 26–33.
func TestPollWaitAndBackoff(t *testing.T) {
	t.Parallel()
	m := newManager(t, nil)
	const scope = "s"
	t.Run("waits for exit", func(t *testing.T) {
		t.Parallel()
		// Usually one poll: the output and the exit a moment later are
		// reported together. A slow machine may need a second one.
		id := startBackground(t, m, ExecRequest{Command: "sleep 0.3; echo done", ScopeKey: scope})
		start := time.Now()
		r := pollUntilDone(t, m, scope, id)
		if r.Status() != "completed" || r.Details.Aggregated.Value() != "done\n" {
			t.Errorf("poll: %s %v", r.Status(), r.Details)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("poll took %v", d)
		}
	})
	t.Run("returns at once with pending output", func(t *testing.T) {
		t.Parallel()
		id := startBackground(t, m, ExecRequest{Command: "echo ready; sleep 30", ScopeKey: scope})
		waitOutput(t, m, id, "ready")
		start := time.Now()
		r := proc(t, m, scope, protocol.ProcessArgs{Action: "poll", SessionID: id, Timeout: ptr(20000)})
		if r.Status() != "running" || r.Text() != "ready\n\nProcess still running." || time.Since(start) > 5*time.Second {
			t.Errorf("poll: %s %q after %v", r.Status(), r.Text(), time.Since(start))
		}
		proc(t, m, scope, protocol.ProcessArgs{Action: "kill", SessionID: id})
	})
	t.Run("wakes on new output", func(t *testing.T) {
		t.Parallel()
		id := startBackground(t, m, ExecRequest{Command: "sleep 0.3; echo late; sleep 30", ScopeKey: scope})
		r := proc(t, m, scope, protocol.ProcessArgs{Action: "poll", SessionID: id, Timeout: ptr(20000)})
		if r.Status() != "running" || !strings.HasPrefix(r.Text(), "late") {
			t.Errorf("poll: %s %q", r.Status(), r.Text())
		}
		proc(t, m, scope, protocol.ProcessArgs{Action: "kill", SessionID: id})
	})
	t.Run("aborted wait returns running", func(t *testing.T) {
		t.Parallel()
		id := startBackground(t, m, ExecRequest{Command: "sleep 30", ScopeKey: scope})
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		start := time.Now()
		r := m.Process(ctx, scope, protocol.ProcessArgs{Action: "poll", SessionID: id, Timeout: ptr(30000)})
		if r.Status() != "running" || time.Since(start) > 5*time.Second {
			t.Errorf("poll: %s after %v", r.Status(), time.Since(start))
		}
		proc(t, m, scope, protocol.ProcessArgs{Action: "kill", SessionID: id})
	})
	t.Run("retryInMs backs off and resets", func(t *testing.T) {
		t.Parallel()
		id := startBackground(t, m, ExecRequest{Command: "read x < /dev/null; sleep 30", ScopeKey: scope})
		var got []any
		for i := 0; i < 5; i++ {
			r := proc(t, m, scope, protocol.ProcessArgs{Action: "poll", SessionID: id})
			got = append(got, r.Details.RetryInMs.Value())
		}
		if fmt.Sprint(got) != "[5000 10000 30000 60000 60000]" {
			t.Errorf("retryInMs = %v", got)
		}
		proc(t, m, scope, protocol.ProcessArgs{Action: "kill", SessionID: id})
		waitExited(t, m, id)
		r := proc(t, m, scope, protocol.ProcessArgs{Action: "poll", SessionID: id})
		if _, ok := r.Details.RetryInMs.Get(); ok || r.Status() != "completed" {
			t.Errorf("finished poll: %v", r.Details)
		}
	})
	t.Run("output resets the back-off", func(t *testing.T) {
		t.Parallel()
		// Silent until we type: the terminal echoes the input as output.
		id := startBackground(t, m, ExecRequest{Command: "read x; sleep 30", ScopeKey: scope, PTY: true})
		r1 := proc(t, m, scope, protocol.ProcessArgs{Action: "poll", SessionID: id})
		r2 := proc(t, m, scope, protocol.ProcessArgs{Action: "poll", SessionID: id})
		proc(t, m, scope, protocol.ProcessArgs{Action: "write", SessionID: id, Data: ptr("typed\r")})
		waitOutput(t, m, id, "typed")
		r3 := proc(t, m, scope, protocol.ProcessArgs{Action: "poll", SessionID: id})
		if fmt.Sprint(r1.Details.RetryInMs.Value(), r2.Details.RetryInMs.Value(), r3.Details.RetryInMs.Value()) != "5000 10000 5000" {
			t.Errorf("retryInMs = %v %v %v", r1.Details.RetryInMs.Value(), r2.Details.RetryInMs.Value(), r3.Details.RetryInMs.Value())
		}
		proc(t, m, scope, protocol.ProcessArgs{Action: "kill", SessionID: id})
	})
	if pollWait(ptr(999999)) != 30*time.Second || pollWait(ptr(0)) != 0 || pollWait(nil) != 0 {
		t.Errorf("poll wait is not clamped to 0..30000 ms")
	}
}

// pollUntilDone polls with a wait until the session is no longer running.
func pollUntilDone(t *testing.T, m *Manager, scope, id string) protocol.Result {
	t.Helper()
	for i := 0; i < 20; i++ {
		r := proc(t, m, scope, protocol.ProcessArgs{Action: "poll", SessionID: id, Timeout: ptr(10000)})
		if r.Status() != protocol.StatusRunning {
			return r
		}
	}
	t.Fatalf("session %s still running", id)
	return protocol.Result{}
}

// Spec §23.3 case 32: a timeout without code or signal is labelled
// "unknown exit code", never "code 0".
func TestFinishedPollUnknownExitCode(t *testing.T) {
	m := newManager(t, nil)
	s := &session{m: m, id: "tidy-reef", command: "sleep 9", scopeKey: "s", startedAt: time.Now(),
		out: newOutputBuffer(1000, 1000), done: make(chan struct{}), termDone: make(chan struct{})}
	s.exited, s.retained, s.backgrounded = true, true, true
	s.res = exitResult{status: "failed", reason: reasonTimeout}
	m.mu.Lock()
	m.sessions[s.id] = s
	m.mu.Unlock()
	r := proc(t, m, "s", protocol.ProcessArgs{Action: "poll", SessionID: s.id})
	want := "(no new output)\n\nProcess exited with unknown exit code.\n\n" + timeoutRetryGuidance
	if r.Status() != "failed" || r.Text() != want || r.Details.TimedOut.Value() != true {
		t.Errorf("poll: %s %q %v", r.Status(), r.Text(), r.Details)
	}
}

// Spec §23.3 case 35: the default log window and its paging note.
func TestLogDefaultWindow(t *testing.T) {
	t.Parallel()
	m := newManager(t, nil)
	id := startBackground(t, m, ExecRequest{Command: "i=1; while [ $i -le 250 ]; do echo line$i; i=$((i+1)); done"})
	waitExited(t, m, id)
	r := proc(t, m, "", protocol.ProcessArgs{Action: "log", SessionID: id})
	if !strings.HasPrefix(r.Text(), "line51\n") || !strings.HasSuffix(r.Text(), "line250\n\n[showing last 200 of 250 lines; pass offset/limit to page]") {
		t.Errorf("log: %q…", r.Text()[:40])
	}
	r = proc(t, m, "", protocol.ProcessArgs{Action: "log", SessionID: id, Offset: ptr(1)})
	if !strings.HasPrefix(r.Text(), "line2\n") || !strings.HasSuffix(r.Text(), "line250") {
		t.Errorf("log offset 1 is not the rest: %q", r.Text()[len(r.Text())-20:])
	}
	r = proc(t, m, "", protocol.ProcessArgs{Action: "log", SessionID: id, Limit: ptr(0)})
	if r.Text() != "(no output recorded)" {
		t.Errorf("log limit 0: %q", r.Text())
	}
}

// Spec §23.5 case 49: scopes do not see each other's sessions.
func TestScopes(t *testing.T) {
	t.Parallel()
	m := newManager(t, nil)
	a := startBackground(t, m, ExecRequest{Command: "sleep 30", ScopeKey: "agent:alpha"})
	b := startBackground(t, m, ExecRequest{Command: "sleep 30", ScopeKey: "agent:beta"})
	la := proc(t, m, "agent:alpha", protocol.ProcessArgs{Action: "list"})
	if s := la.Details.Sessions.Value(); len(s) != 1 || s[0].SessionID.Value() != a {
		t.Errorf("alpha sees %v", s)
	}
	for _, action := range []string{"poll", "log", "kill", "remove", "write"} {
		r := proc(t, m, "agent:beta", protocol.ProcessArgs{Action: action, SessionID: a})
		if r.Status() != "failed" || !strings.Contains(r.Text(), "found for "+a) {
			t.Errorf("beta %s on alpha's session: %s %q", action, r.Status(), r.Text())
		}
	}
	proc(t, m, "agent:alpha", protocol.ProcessArgs{Action: "kill", SessionID: a})
	proc(t, m, "agent:beta", protocol.ProcessArgs{Action: "kill", SessionID: b})
}

// Spec §23.4 cases 37–40: keys and submit reach an interactive program.
func TestKeysReachProgram(t *testing.T) {
	t.Parallel()
	m := newManager(t, nil)
	id := startBackground(t, m, ExecRequest{Command: "read line; echo \"got [$line]\"", PTY: true})
	// The cursor mode is unknown: an arrow is refused, Enter is not.
	r := proc(t, m, "", protocol.ProcessArgs{Action: "send-keys", SessionID: id, Keys: []string{"up"}})
	if r.Status() != "failed" || !strings.Contains(r.Text(), "cursor key mode is not known yet") {
		t.Errorf("up in unknown mode: %s %q", r.Status(), r.Text())
	}
	r = proc(t, m, "", protocol.ProcessArgs{Action: "send-keys", SessionID: id, Keys: []string{"h", "i", "Enter"}})
	if r.Status() != "running" || r.Text() != "Sent 3 bytes to session "+id+"." {
		t.Errorf("send-keys: %s %q", r.Status(), r.Text())
	}
	waitExited(t, m, id)
	r = proc(t, m, "", protocol.ProcessArgs{Action: "poll", SessionID: id})
	if r.Status() != "completed" || !strings.Contains(r.Details.Aggregated.Value(), "got [hi]") {
		t.Errorf("poll: %s %v", r.Status(), r.Details)
	}

	id = startBackground(t, m, ExecRequest{Command: "read x; echo submitted", PTY: true})
	r = proc(t, m, "", protocol.ProcessArgs{Action: "submit", SessionID: id})
	if r.Text() != "Submitted session "+id+" (sent CR)." {
		t.Errorf("submit: %q", r.Text())
	}
	waitExited(t, m, id)
	if r = proc(t, m, "", protocol.ProcessArgs{Action: "poll", SessionID: id}); !strings.Contains(r.Text(), "submitted") {
		t.Errorf("poll after submit: %q", r.Text())
	}

	// eof ends the input: Ctrl-D on a PTY; stdin is then not writable.
	id = startBackground(t, m, ExecRequest{Command: "cat; echo eof-seen", PTY: true})
	r = proc(t, m, "", protocol.ProcessArgs{Action: "write", SessionID: id, Data: ptr("abc\n"), EOF: true})
	if r.Text() != "Wrote 4 bytes to session "+id+" (stdin closed)." {
		t.Errorf("write eof: %q", r.Text())
	}
	if r = proc(t, m, "", protocol.ProcessArgs{Action: "write", SessionID: id, Data: ptr("x")}); r.Text() != "Session "+id+" stdin is not writable." && r.Text() != "No active session found for "+id {
		t.Errorf("write after eof: %q", r.Text())
	}
	waitOutput(t, m, id, "eof-seen")
}

// TestPTYEnvironment checks TERM, the 120×30 size and cursor-position
// answers inside a real PTY.
func TestPTYEnvironment(t *testing.T) {
	t.Parallel()
	m := newManager(t, nil)
	res := mustExec(t, m, ExecRequest{Command: `echo "$TERM $(stty size) $OPENCLAW_SHELL"`, PTY: true})
	if res.Status() != "completed" || res.Text() != "xterm-256color 30 120 exec" {
		t.Errorf("PTY environment: %s %q", res.Status(), res.Text())
	}
	res = mustExec(t, m, ExecRequest{Command: `echo "$TERM"`, PTY: true, Env: append(os.Environ(), "TERM=vt100")})
	if res.Text() != "vt100" {
		t.Errorf("request TERM not kept: %q", res.Text())
	}
	// A program that asks where the cursor is gets an answer, and the
	// request does not show in the output.
	res = mustExec(t, m, ExecRequest{
		Command: `stty -echo -icanon min 1; printf 'ask\033[6n'; r=$(dd bs=6 count=1 2>/dev/null | od -An -c | tr -d ' \n'); echo " reply=$r"`,
		PTY:     true,
	})
	if res.Status() != "completed" || res.Text() != `ask reply=033[1;1R` {
		t.Errorf("DSR: %s %q", res.Status(), res.Text())
	}
}

// waitingForInput after InputWaitIdle of silence on a writable stdin.
func TestWaitingForInput(t *testing.T) {
	t.Parallel()
	m := newManager(t, func(c *Config) { c.InputWaitIdle = time.Second })
	id := startBackground(t, m, ExecRequest{Command: "echo prompt; cat", PTY: true})
	pipe := startBackground(t, m, ExecRequest{Command: "sleep 30"})
	waitOutput(t, m, id, "prompt")
	r := proc(t, m, "", protocol.ProcessArgs{Action: "poll", SessionID: id})
	if r.Details.StdinWritable.Value() != true || (r.Details.WaitingForInput.Value() != false && r.Details.IdleMs.Value() < 1000) {
		t.Errorf("fresh output: %v", r.Details)
	}
	checkFor(t, waitLimit, 50*time.Millisecond, func() error {
		r = proc(t, m, "", protocol.ProcessArgs{Action: "poll", SessionID: id})
		if r.Details.WaitingForInput.Value() != true {
			return fmt.Errorf("not waiting for input yet: %v", r.Details)
		}
		return nil
	})
	if !regexp.MustCompile(`^\(no new output\)\n\nNo new output for \d+s; this session may be waiting for input\. Use process write, send-keys, submit, or paste to provide input\.$`).MatchString(r.Text()) {
		t.Errorf("hint: %q", r.Text())
	}
	list := proc(t, m, "", protocol.ProcessArgs{Action: "list"})
	if !strings.Contains(list.Text(), id+" running   ") || !strings.Contains(list.Text(), "[input-wait] :: echo prompt;") {
		t.Errorf("list: %q", list.Text())
	}
	// Pipe sessions never wait for input: their stdin is at EOF.
	r = proc(t, m, "", protocol.ProcessArgs{Action: "poll", SessionID: pipe})
	if r.Details.StdinWritable.Value() != false || r.Details.WaitingForInput.Value() != false {
		t.Errorf("pipe session: %v", r.Details)
	}
}

// TestCapsNeverKill: far more output than the caps; the command still
// succeeds and the output is cut to the retained cap.
func TestCapsNeverKill(t *testing.T) {
	t.Parallel()
	m := newManager(t, nil)
	// Everything on stderr: the order across two pipes is not defined.
	res := mustExec(t, m, ExecRequest{Command: "(head -c 3000000 /dev/zero | tr '\\0' a; echo; echo end) >&2"})
	if res.Status() != "completed" || res.Details.ExitCode.Value() != 0 {
		t.Fatalf("status %s %v", res.Status(), res.Details.ExitCode.Value())
	}
	agg := res.Details.Aggregated.Value()
	if len(agg) > 200000 || !strings.HasSuffix(agg, "end") || !strings.HasPrefix(res.Text(), RetentionCapNote) {
		t.Errorf("aggregated %d chars; text starts %q", len(agg), res.Text()[:40])
	}
	id := startBackground(t, m, ExecRequest{Command: "head -c 5000000 /dev/zero | tr '\\0' x; echo; echo end"})
	waitExited(t, m, id)
	r := proc(t, m, "", protocol.ProcessArgs{Action: "poll", SessionID: id})
	if r.Status() != "completed" || !strings.HasPrefix(r.Text(), RetentionCapNote+pollDroppedNote) || !strings.HasSuffix(r.Text(), "end\n\nProcess exited with code 0.") {
		t.Errorf("poll: %s %q…", r.Status(), r.Text()[:200])
	}
	if n := utf16Len(r.Text()); n > 30000+400 {
		t.Errorf("poll returned %d chars, more than the pending cap", n)
	}
}

// TestListText renders entries decoded from JSON, as the gateway merges them.
func TestListText(t *testing.T) {
	var entries []protocol.Details
	raw := `[{"sessionId":"a-b","status":"running","runtimeMs":65000,"command":"npm run build","name":"npm run","waitingForInput":true},
	{"sessionId":"c-d","status":"failed","runtimeMs":0,"command":"sleep 9","name":"sleep 9","exitReason":"overall-timeout"},
	{"sessionId":"e-f","status":"completed","runtimeMs":999,"command":"` + strings.Repeat("x", 130) + `"}]`
	if err := json.Unmarshal([]byte(raw), &entries); err != nil {
		t.Fatal(err)
	}
	want := "a-b running   1m5s [input-wait] :: npm run\n" +
		"c-d failed    n/a [overall-timeout] :: sleep 9\n" +
		"e-f completed 999ms :: " + strings.Repeat("x", 58) + "..." + strings.Repeat("x", 58)
	if got := ListText(entries); got != want {
		t.Errorf("ListText =\n%s\nwant\n%s", got, want)
	}
	if got := ListText(nil); got != "No running or recent sessions." {
		t.Errorf("empty: %q", got)
	}
}
