package integration

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/execmesh/execmesh/internal/testutil"
)

// The tests of this file hold `execmesh exec` and its neighbours to what
// they print: never a cut output passed off as the whole, an id alone
// where a script captures one, a broken configuration named by line and
// column, a configuration edit applied or said not to be, and events a
// follower printed never delivered again.

// TestCLIExecSaysWhatItCannotPrint: exec streams the command's bytes
// whole; where it prints the agents' text instead (--yield-ms, -o json),
// which keeps 200 000 characters and escapes bytes it cannot show, it
// says so on stderr and exits 125 for a cut, unless --allow-truncated or
// the command failed on its own.
func TestCLIExecSaysWhatItCannotPrint(t *testing.T) {
	d := trustedUp(t, t.TempDir())
	const cutNote, escNote = "the output was cut", "the output shows escaped bytes"
	// The tool's text: a command backgrounded at once and followed by
	// polls, as agents see it.
	text := []string{"--yield-ms", "10"}
	tests := []struct {
		name     string
		args     []string
		code     int
		stdout   string // exact when set
		suffix   string // of stdout
		notes    []string
		noNotes  bool
		maxBytes int // stdout is shorter than this when set
	}{
		// Streamed: the bytes, all 588 895 of them.
		{name: "streamed whole", args: []string{"seq 1 100000"}, code: 0, suffix: "\n99999\n100000\n", noNotes: true},
		{name: "streamed NUL byte", args: []string{`printf 'a\000b'`}, code: 0, stdout: "a\x00b", noNotes: true},
		{name: "streamed invalid UTF-8", args: []string{`printf 'x\377y\n'`}, code: 0, stdout: "x\xffy\n", noNotes: true},
		// The agents' text: 200 000 characters kept.
		{name: "cut", args: append(text, "sleep 0.5; seq 1 100000"), code: 125, suffix: "99999\n100000\n", notes: []string{cutNote}, maxBytes: 588895},
		{name: "cut allowed", args: append(text, "--allow-truncated", "sleep 0.5; seq 1 100000"), code: 0, suffix: "\n100000\n", notes: []string{cutNote}},
		{name: "cut of a failed command keeps its status", args: append(text, "sleep 0.5; seq 1 100000; exit 3"), code: 3, suffix: "\n100000\n", notes: []string{cutNote}},
		{name: "cut with -o json", args: []string{"-o", "json", "--", "seq", "1", "100000"}, code: 125, notes: []string{cutNote}},
		{name: "whole output has no note", args: append(text, "sleep 0.5; seq 1 10000"), code: 0, suffix: "\n10000\n", noNotes: true},
		{name: "a NUL byte", args: append(text, `sleep 0.5; printf 'a\000b'`), code: 0, stdout: `a\x00b` + "\n", notes: []string{escNote}},
		{name: "invalid UTF-8", args: append(text, `sleep 0.5; printf 'x\377y\n'`), code: 0, stdout: "x\uFFFDy\n", notes: []string{escNote}},
		{name: "plain text has no note", args: append(text, "sleep 0.5; echo plain"), code: 0, stdout: "plain\n", noNotes: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := d.cli(t.TempDir(), append([]string{"exec"}, tt.args...)...)
			if r.code != tt.code {
				t.Fatalf("exit %d, want %d\nstderr: %s\nstdout (%d bytes) ends %q", r.code, tt.code, r.stderr, len(r.stdout), r.stdout[max(0, len(r.stdout)-40):])
			}
			if tt.stdout != "" && r.stdout != tt.stdout {
				t.Errorf("stdout %q, want %q", r.stdout, tt.stdout)
			}
			if !strings.HasSuffix(r.stdout, tt.suffix) {
				t.Errorf("stdout ends %q, want %q", r.stdout[max(0, len(r.stdout)-40):], tt.suffix)
			}
			if tt.maxBytes > 0 && len(r.stdout) >= tt.maxBytes {
				t.Errorf("stdout has %d bytes: the whole output?", len(r.stdout))
			}
			for _, n := range tt.notes {
				if !strings.Contains(r.stderr, n) {
					t.Errorf("stderr lacks %q: %q", n, r.stderr)
				}
			}
			if tt.noNotes && r.stderr != "" {
				t.Errorf("stderr %q, want nothing", r.stderr)
			}
			if tt.name == "streamed whole" && len(r.stdout) != 588895 {
				t.Errorf("streamed %d bytes, want 588895", len(r.stdout))
			}
			if tt.args[0] == "-o" && !json.Valid([]byte(r.stdout)) {
				t.Errorf("-o json: stdout is not JSON: %.200s", r.stdout)
			}
		})
	}
}

// TestCLIExecBackgroundPrintsTheIDAlone: `exec --background` prints the
// session id alone on stdout, so that S=$(execmesh exec --background …)
// captures it; a command that awaits approval gives the approval id alone
// and exit 75; -o json is --json wherever that exists.
func TestCLIExecBackgroundPrintsTheIDAlone(t *testing.T) {
	d := trustedUp(t, t.TempDir())
	r := d.cli(t.TempDir(), "exec", "--background", "--", "sleep", "9")
	if r.code != 0 || !regexp.MustCompile(`^[a-z0-9]+(-[a-z0-9]+)*\n$`).MatchString(r.stdout) {
		t.Fatalf("exec --background: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	id := strings.TrimSpace(r.stdout)
	if r := d.cli(t.TempDir(), "process", "poll", id, "-o", "json"); r.code != 0 || !strings.Contains(r.stdout, `"status": "running"`) || !strings.Contains(r.stdout, `"sessionId": "`+id+`"`) {
		t.Fatalf("poll %s: exit %d, stdout %q, stderr %q", id, r.code, r.stdout, r.stderr)
	}
	// -o json wherever --json is, the same output; a format it does not
	// know is a usage error.
	for _, args := range [][]string{
		{"exec", "--background", "-o", "json", "--", "sleep", "1"},
		{"process", "list", "-o", "json"},
		{"events", "-o", "json"},
		{"nodes", "list", "-o", "json"},
		{"admin", "blockers", "--output", "json"},
		{"version", "-o", "json"},
	} {
		r := d.cli(t.TempDir(), args...)
		if r.code != 0 || !json.Valid([]byte(r.stdout)) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", args, r.code, r.stdout, r.stderr)
		}
	}
	if r := d.cli(t.TempDir(), "process", "list", "-o", "yaml"); r.code != 2 || !strings.Contains(r.stderr, "want json or text") {
		t.Errorf("-o yaml: exit %d, stderr %q", r.code, r.stderr)
	}

	// Out of the box (allowlist, ask on-miss) echo awaits approval.
	state := filepath.Join(t.TempDir(), ".execmesh")
	strict := startBareDaemon(t, "up", state, t.TempDir())
	r = strict.cli(t.TempDir(), "exec", "--background", "--", "echo", "hi")
	if r.code != 75 || !regexp.MustCompile(`^\S+\n$`).MatchString(r.stdout) || !strings.Contains(r.stderr, "approval") {
		t.Fatalf("exec --background awaiting approval: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	approval := strings.TrimSpace(r.stdout)
	var pending []string
	for _, a := range httpGetJSON(t, strict.url+"/v1/approvals")["approvals"].([]any) {
		pending = append(pending, a.(map[string]any)["id"].(string))
	}
	if len(pending) != 1 || pending[0] != approval {
		t.Fatalf("stdout %q, pending approvals %q", approval, pending)
	}
	r = strict.cli(t.TempDir(), "exec", "--background", "-o", "json", "--", "echo", "hi")
	if r.code != 75 || !strings.Contains(r.stdout, `"approval-pending"`) {
		t.Errorf("-o json awaiting approval: exit %d, stdout %q", r.code, r.stdout)
	}
}

// TestCLIConfigSyntaxErrorNamesLineAndColumn: a trailing comma in the
// configuration file (the state dir's or --config's) stops the commands
// that need the file with its line and column; version, help and config
// work on and say that they ignore it, and config set repairs it.
func TestCLIConfigSyntaxErrorNamesLineAndColumn(t *testing.T) {
	home := t.TempDir()
	state := filepath.Join(home, ".execmesh")
	file := filepath.Join(state, "config.json")
	broken := "{\n  \"tools\": {\"exec\": {\"ask\": \"off\",}}\n}\n"
	if err := os.MkdirAll(state, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte(broken), 0o600); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(t.TempDir(), "other.json")
	if err := os.WriteFile(other, []byte(broken), 0o600); err != nil {
		t.Fatal(err)
	}
	const where = "line 2, column 35"
	env := map[string]string{"HOME": home, "EXECMESH_GATEWAY_URL": "http://" + freeAddr(t)}
	run := func(args ...string) cliResult { return runBinary(t, t.TempDir(), env, "", args...) }
	for _, tt := range []struct {
		args []string
		file string
		code int
	}{
		{args: []string{"exec", "--", "true"}, file: file, code: 1},
		{args: []string{"events"}, file: file, code: 1},
		{args: []string{"exec", "--config", other, "--", "true"}, file: other, code: 1},
		{args: []string{"up", "--listen", freeAddr(t), "--nats-listen", freeAddr(t)}, file: file, code: 1},
		{args: []string{"version"}, file: file},
		{args: []string{"help"}, file: file},
		{args: []string{"exec", "--help"}, file: file},
		{args: []string{"config", "get", "tools.exec.ask"}, file: file},
		{args: []string{"config", "--config", other, "get", "tools.exec.ask"}, file: other},
	} {
		r := run(tt.args...)
		if r.code != tt.code || !strings.Contains(r.stderr, tt.file) || !strings.Contains(r.stderr, where) {
			t.Errorf("%q: exit %d (want %d), stderr %q; want %s and %s", tt.args, r.code, tt.code, r.stderr, tt.file, where)
		}
		if tt.code == 0 && !strings.Contains(r.stderr, "ignoring the configuration file") {
			t.Errorf("%q: stderr does not say the file is ignored: %q", tt.args, r.stderr)
		}
		if tt.code == 0 && r.stdout == "" {
			t.Errorf("%q: no output", tt.args)
		}
	}
	if r := run("version"); !strings.HasPrefix(r.stdout, "execmesh ") {
		t.Errorf("version: stdout %q", r.stdout)
	}

	// config set starts a new file and keeps the broken one beside it.
	r := run("config", "set", "tools.exec.ask", "always")
	if r.code != 0 || r.stdout != "tools.exec.ask: on-miss -> always\n" || !strings.Contains(r.stderr, where) || !strings.Contains(r.stderr, "no daemon answers") {
		t.Fatalf("config set on the broken file: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	kept, _ := filepath.Glob(file + ".invalid-*")
	if len(kept) != 1 {
		t.Fatalf("the broken file is not kept: %q", kept)
	}
	if b, _ := os.ReadFile(kept[0]); string(b) != broken {
		t.Errorf("%s holds %q", kept[0], b)
	}
	if r := run("config", "get", "tools.exec.ask"); r.code != 0 || r.stdout != "always\n" || r.stderr != "" {
		t.Errorf("config get after the repair: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

// TestCLIConfigSetAppliesToRunningDaemon: config set prints what changed
// and applies it to the daemon at once (POST /v1/admin/reload): the next
// exec runs under it, without SIGHUP or restart; `execmesh reload` does the
// same; a change the daemon refuses leaves its old configuration and says
// so; without a daemon config set says when the change applies.
func TestCLIConfigSetAppliesToRunningDaemon(t *testing.T) {
	state := filepath.Join(t.TempDir(), ".execmesh")
	if err := os.MkdirAll(state, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(state, "config.json"), []byte(`{"tools":{"exec":{"ask":"off"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startBareDaemon(t, "up", state, t.TempDir())
	// allowlist with ask off: echo is refused.
	if r := d.cli(t.TempDir(), "exec", "--", "echo", "hi"); r.code != 1 || !strings.Contains(r.stderr, "allowlist miss") {
		t.Fatalf("before: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r := d.cli(t.TempDir(), "config", "set", "tools.exec.security", "full")
	if r.code != 0 || r.stdout != "tools.exec.security: allowlist -> full\n" || !strings.Contains(r.stderr, "applied to the running daemon at "+d.url) {
		t.Fatalf("config set: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if r := d.cli(t.TempDir(), "exec", "--", "echo", "hi"); r.code != 0 || r.stdout != "hi\n" {
		t.Fatalf("after config set: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if r := d.cli(t.TempDir(), "config", "set", "tools.exec.security", "full"); r.code != 0 || r.stdout != "tools.exec.security: full (unchanged)\n" {
		t.Errorf("the same value again: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if r := d.cli(t.TempDir(), "config", "unset", "tools.exec.security"); r.code != 0 || r.stdout != "tools.exec.security: full -> allowlist (default)\n" {
		t.Fatalf("config unset: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if r := d.cli(t.TempDir(), "exec", "--", "echo", "hi"); r.code != 1 || !strings.Contains(r.stderr, "allowlist miss") {
		t.Fatalf("after config unset: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	// A key the session core fixes at the start: said, not pretended.
	if r := d.cli(t.TempDir(), "config", "set", "tools.exec.notifyOnExit", "false"); r.code != 0 || !strings.Contains(r.stderr, "takes effect only when it restarts") {
		t.Errorf("notifyOnExit: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}

	// execmesh reload, after an edit by hand.
	if err := os.WriteFile(filepath.Join(state, "config.json"), []byte(`{"tools":{"exec":{"ask":"off","security":"full"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := d.cli(t.TempDir(), "reload"); r.code != 0 || !strings.Contains(r.stdout, "reloaded "+filepath.Join(state, "config.json")) {
		t.Fatalf("reload: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if r := d.cli(t.TempDir(), "exec", "--", "echo", "again"); r.code != 0 || r.stdout != "again\n" {
		t.Fatalf("after reload: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	// The reload is an operator call.
	if r := runBinary(t, t.TempDir(), map[string]string{"HOME": t.TempDir(), "EXECMESH_GATEWAY_URL": d.url}, "", "reload"); r.code != 1 || !strings.Contains(r.stderr, "operator") {
		t.Errorf("reload without the operator token: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if log := d.stderr.String(); !strings.Contains(log, "configuration reloaded") {
		t.Errorf("daemon log:\n%s", log)
	}

	d.stop()
	r = d.cli(t.TempDir(), "config", "set", "tools.exec.ask", "always")
	if r.code != 0 || r.stdout != "tools.exec.ask: off -> always\n" || !strings.Contains(r.stderr, "no daemon answers at "+d.url) || !strings.Contains(r.stderr, "SIGHUP") {
		t.Errorf("config set without a daemon: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

// TestCLIEventsFollowAcknowledgesWhatItPrinted: `events --follow`
// acknowledges each event as it prints it, so that after SIGINT another
// reader gets none of them again.
func TestCLIEventsFollowAcknowledgesWhatItPrinted(t *testing.T) {
	d := trustedUp(t, t.TempDir())
	waitExitEvent := func(id string) {
		t.Helper()
		// The exit event is queued once the session is listed as ended.
		deadline := time.Now().Add(20 * time.Second)
		for {
			r := d.cli(t.TempDir(), "process", "list")
			if r.code == 0 && strings.Contains(r.stdout, id) && !strings.Contains(r.stdout, "running") {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("session %s did not end: %q", id, r.stdout)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	var ids []string
	for _, word := range []string{"one", "two", "three"} {
		r := d.cli(t.TempDir(), "exec", "--background", "--", "echo", word)
		if r.code != 0 {
			t.Fatalf("exec --background: %d %q", r.code, r.stderr)
		}
		ids = append(ids, strings.TrimSpace(r.stdout))
	}
	for _, id := range ids {
		waitExitEvent(id)
	}

	bin, err := execmeshBinary()
	if err != nil {
		t.Fatal(err)
	}
	follow := exec.Command(bin, "events", "--follow")
	follow.Env = cleanEnv(map[string]string{"HOME": d.home, "EXECMESH_GATEWAY_URL": d.url, "EXECMESH_STATE_DIR": d.stateDir})
	stdout, err := follow.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &testutil.SyncBuffer{}
	follow.Stderr = stderr
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = follow.Process.Kill(); _ = follow.Wait() })
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var printed []string
	next := func() {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("events --follow ended after %q\n%s", printed, stderr.String())
			}
			printed = append(printed, l)
		case <-time.After(20 * time.Second):
			t.Fatalf("events --follow printed only %q\n%s", printed, stderr.String())
		}
	}
	for range ids {
		next()
	}
	// One more, while it follows.
	r := d.cli(t.TempDir(), "exec", "--background", "--", "echo", "four")
	if r.code != 0 {
		t.Fatalf("exec --background: %d %q", r.code, r.stderr)
	}
	ids = append(ids, strings.TrimSpace(r.stdout))
	next()
	for i, id := range ids {
		if !strings.Contains(printed[i], "exec.exit Exec completed (") || !strings.Contains(printed[i], id[:min(8, len(id))]) {
			t.Errorf("event %d %q is not the exit of %s", i, printed[i], id)
		}
	}
	if err := follow.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := follow.Wait(); err != nil {
		t.Fatalf("events --follow after SIGINT: %v\n%s", err, stderr.String())
	}
	if s := stderr.String(); s != "" {
		t.Errorf("events --follow stderr: %q", s)
	}
	// A second reader gets none of them, whichever way it reads.
	if r := d.cli(t.TempDir(), "events", "--wait-ms", "1000", "-o", "json"); r.code != 0 || strings.Join(strings.Fields(r.stdout), "") != `{"events":[]}` {
		t.Errorf("events after the follower: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}
