package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// result is what one in-process run of the CLI produced.
type result struct {
	code           int
	stdout, stderr string
}

// runCLI runs the CLI in-process with a private environment: HOME and the
// state dir point into a fresh temporary directory unless env sets them.
func runCLI(t *testing.T, env map[string]string, stdin string, args ...string) result {
	t.Helper()
	return runCLICtx(t.Context(), t, env, stdin, args...)
}

func runCLICtx(ctx context.Context, t *testing.T, env map[string]string, stdin string, args ...string) result {
	t.Helper()
	e := map[string]string{}
	if _, ok := env["HOME"]; !ok {
		e["HOME"] = t.TempDir()
	}
	for k, v := range env {
		e[k] = v
	}
	var out, errOut bytes.Buffer
	code := runEnv(ctx, args, e, strings.NewReader(stdin), &out, &errOut)
	return result{code: code, stdout: out.String(), stderr: errOut.String()}
}

func TestUsage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		args     []string
		code     int
		stdout   []string // substrings
		stderr   []string
		noStdout bool
	}{
		{name: "no args", args: nil, code: 2, stderr: []string{"Usage: execmesh COMMAND", "exec", "nodes"}, noStdout: true},
		{name: "help", args: []string{"help"}, code: 0, stdout: []string{"Usage: execmesh COMMAND"}},
		{name: "-h", args: []string{"-h"}, code: 0, stdout: []string{"Usage: execmesh COMMAND"}},
		{name: "--help", args: []string{"--help"}, code: 0, stdout: []string{"Usage: execmesh COMMAND"}},
		{name: "help exec", args: []string{"help", "exec"}, code: 0, stdout: []string{"usage: execmesh exec", "-workdir", "-yield-ms"}},
		{name: "exec -h", args: []string{"exec", "-h"}, code: 0, stdout: []string{"usage: execmesh exec", "-gateway", "-token", "-session-key"}},
		{name: "version", args: []string{"version"}, code: 0, stdout: []string{"execmesh " + version}},
		{name: "unknown command", args: []string{"frobnicate"}, code: 2, stderr: []string{`unknown command "frobnicate"`}, noStdout: true},
		{name: "exec without command", args: []string{"exec"}, code: 2, stderr: []string{"no command given"}},
		{name: "exec unknown flag", args: []string{"exec", "--bogus", "--", "ls"}, code: 2, stderr: []string{"flag provided but not defined: -bogus", "usage: execmesh exec"}},
		{name: "exec bad env", args: []string{"exec", "--env", "NOEQUALS", "--", "ls"}, code: 2, stderr: []string{`--env "NOEQUALS"`}},
		{name: "process without action", args: []string{"process"}, code: 2, stderr: []string{"no action given"}},
		{name: "process unknown action", args: []string{"process", "explode"}, code: 2, stderr: []string{`unknown action "explode"`, "send-keys"}},
		{name: "process two ids", args: []string{"process", "poll", "a", "-s", "b"}, code: 2, stderr: []string{"two different session ids"}},
		{name: "process negative timeout", args: []string{"process", "poll", "a", "--timeout", "-1"}, code: 2, stderr: []string{"--timeout must not be negative"}},
		{name: "call not json", args: []string{"call", "{nope"}, code: 2, stderr: []string{"must be a JSON object"}},
		{name: "call no tool", args: []string{"call", `{"args":{}}`}, code: 2, stderr: []string{`no "tool"`}},
		{name: "call empty stdin", args: []string{"call"}, code: 2, stderr: []string{"no request"}},
		{name: "call two args", args: []string{"call", "{}", "{}"}, code: 2, stderr: []string{"want one JSON argument"}},
		{name: "nodes without subcommand", args: []string{"nodes"}, code: 2, stderr: []string{"want a subcommand"}},
		{name: "nodes unknown subcommand", args: []string{"nodes", "explode"}, code: 2, stderr: []string{`unknown subcommand "explode"`}},
		{name: "nodes approve without id", args: []string{"nodes", "approve"}, code: 2, stderr: []string{"want one node ID"}},
		{name: "nodes list --name", args: []string{"nodes", "list", "--name", "x"}, code: 2, stderr: []string{"belong to \"nodes invite\""}},
		{name: "approvals bad decision", args: []string{"approvals", "resolve", "id1", "maybe"}, code: 2, stderr: []string{`invalid decision "maybe"`}},
		{name: "approvals resolve missing decision", args: []string{"approvals", "resolve", "id1"}, code: 2, stderr: []string{"want ID and a decision"}},
		{name: "admin unknown", args: []string{"admin", "explode"}, code: 2, stderr: []string{"admin blockers"}},
		{name: "session without exec", args: []string{"session"}, code: 2, stderr: []string{"session exec"}},
		{name: "events follow and wait", args: []string{"events", "--follow", "--wait-ms", "5"}, code: 2, stderr: []string{"do not mix"}},
		{name: "config without subcommand", args: []string{"config"}, code: 2, stderr: []string{"want a subcommand"}},
		{name: "config set without value", args: []string{"config", "set", "tools.exec.host"}, code: 2, stderr: []string{"wrong number of arguments"}},
		{name: "config bad key path", args: []string{"config", "get", "tools..exec"}, code: 2, stderr: []string{"invalid key path", "empty key"}},
		{name: "config bad index", args: []string{"config", "get", "agents.list[x]"}, code: 2, stderr: []string{"invalid key path"}},
		{name: "mcp extra args", args: []string{"mcp", "extra"}, code: 2, stderr: []string{"unexpected arguments"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// A gateway nobody listens on: usage errors must come first.
			env := map[string]string{envGatewayURL: "http://127.0.0.1:1"}
			r := runCLI(t, env, "", tt.args...)
			if r.code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", r.code, tt.code, r.stdout, r.stderr)
			}
			for _, s := range tt.stdout {
				if !strings.Contains(r.stdout, s) {
					t.Errorf("stdout lacks %q:\n%s", s, r.stdout)
				}
			}
			for _, s := range tt.stderr {
				if !strings.Contains(r.stderr, s) {
					t.Errorf("stderr lacks %q:\n%s", s, r.stderr)
				}
			}
			if tt.noStdout && r.stdout != "" {
				t.Errorf("unexpected stdout: %s", r.stdout)
			}
		})
	}
}

// TestHelpListsEveryCommand checks the usage against DESIGN.md §2.
func TestHelpListsEveryCommand(t *testing.T) {
	t.Parallel()
	r := runCLI(t, nil, "", "help")
	for _, cmd := range []string{
		"up", "gateway", "node", "nodes list|pending|approve ID|reject ID|invite [--name N] [--ttl D]", "call", "exec", "process",
		"nodes list|pending|approve", "approvals list|resolve", "mcp", "config get", "session exec",
		"events", "admin blockers", "version",
	} {
		if !strings.Contains(r.stdout, "\n  "+cmd) {
			t.Errorf("help does not list %q:\n%s", cmd, r.stdout)
		}
	}
}

// TestBadConfigFailsEveryCommand: a bad config makes any command that
// loads it exit non-zero with a message naming the key (DESIGN.md §7).
func TestBadConfigFailsEveryCommand(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "config.json"), `{"tools":{"exec":{"host":"bogus"}}}`)
	env := map[string]string{envStateDir: dir, envGatewayURL: "http://127.0.0.1:1"}
	for _, args := range [][]string{
		{"exec", "--", "echo", "hi"},
		{"call", `{"tool":"exec","args":{"command":"ls"}}`},
		{"process", "list"},
		{"session", "exec"},
		{"events"},
		{"nodes", "list"},
		{"approvals", "list"},
		{"admin", "blockers"},
		{"mcp"},
		{"config", "get", "tools.exec.host"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			t.Parallel()
			r := runCLI(t, env, "", args...)
			if r.code == 0 || !strings.Contains(r.stderr, "tools.exec.host") {
				t.Fatalf("exit %d, stderr %q: want non-zero naming tools.exec.host", r.code, r.stderr)
			}
			if strings.Contains(r.stderr, "cannot reach") {
				t.Errorf("the config must be checked before the gateway is called: %s", r.stderr)
			}
		})
	}
	t.Run("explicit --config", func(t *testing.T) {
		t.Parallel()
		other := filepath.Join(t.TempDir(), "c.json")
		writeFile(t, other, `{"gateway":{"listen":"nope"}}`)
		r := runCLI(t, map[string]string{envGatewayURL: "http://127.0.0.1:1"}, "", "exec", "--config", other, "--", "true")
		if r.code == 0 || !strings.Contains(r.stderr, "gateway.listen") {
			t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
		}
	})
	t.Run("missing explicit --config", func(t *testing.T) {
		t.Parallel()
		r := runCLI(t, nil, "", "nodes", "list", "--config", filepath.Join(t.TempDir(), "absent.json"))
		if r.code == 0 || !strings.Contains(r.stderr, "absent.json") {
			t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
		}
	})
	t.Run("bad environment", func(t *testing.T) {
		t.Parallel()
		r := runCLI(t, map[string]string{"EXECMESH_EXEC_HOST": "nowhere", envGatewayURL: "http://127.0.0.1:1"}, "", "nodes", "list")
		if r.code == 0 || !strings.Contains(r.stderr, "tools.exec.host") {
			t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
		}
	})
}

func TestJoinCommand(t *testing.T) {
	t.Parallel()
	tests := []struct {
		words []string
		want  string
	}{
		{[]string{"echo hi | wc -c"}, "echo hi | wc -c"},
		{[]string{"echo", "hi"}, "echo hi"},
		{[]string{"sh", "-c", "exit 3"}, "sh -c 'exit 3'"},
		{[]string{"printf", "%s\n", "it's"}, `printf '%s` + "\n" + `' 'it'\''s'`},
		{[]string{"ls", "-la", "/tmp/a_b.c", "key=v:1,2@x+y"}, "ls -la /tmp/a_b.c key=v:1,2@x+y"},
		{[]string{"echo", "", "$HOME", "*"}, `echo '' '$HOME' '*'`},
	}
	for _, tt := range tests {
		if got := joinCommand(tt.words); got != tt.want {
			t.Errorf("joinCommand(%q) = %q, want %q", tt.words, got, tt.want)
		}
	}
}

func TestParseArgsInterspersed(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		pos  []string
		sid  string
	}{
		{[]string{"poll", "-s", "x"}, []string{"poll"}, "x"},
		{[]string{"-s", "x", "poll"}, []string{"poll"}, "x"},
		{[]string{"poll", "id1", "--json"}, []string{"poll", "id1"}, ""},
		{[]string{"write", "--", "-s", "y"}, []string{"write", "-s", "y"}, ""},
	}
	for _, tt := range tests {
		fs := newFlagSet("t")
		sid := fs.String("s", "", "")
		fs.Bool("json", false, "")
		pos, err := parseArgs(fs, tt.args, true)
		if err != nil {
			t.Fatalf("%q: %v", tt.args, err)
		}
		if strings.Join(pos, "|") != strings.Join(tt.pos, "|") || *sid != tt.sid {
			t.Errorf("%q: pos %q sid %q, want %q %q", tt.args, pos, *sid, tt.pos, tt.sid)
		}
	}
}

func TestListenURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"127.0.0.1:8420": "http://127.0.0.1:8420",
		"0.0.0.0:9000":   "http://127.0.0.1:9000",
		":8420":          "http://127.0.0.1:8420",
		"[::]:8420":      "http://[::1]:8420",
		"gw.example:80":  "http://gw.example:80",
	} {
		if got := listenURL(in); got != want {
			t.Errorf("listenURL(%q) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[string]string{
		"127.0.0.1:8420":          "http://127.0.0.1:8420",
		"https://gw.example/":     "https://gw.example",
		"http://127.0.0.1:1/base": "http://127.0.0.1:1/base",
	} {
		if got, err := normalizeURL(in); err != nil || got != want {
			t.Errorf("normalizeURL(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := normalizeURL("ftp://x"); err == nil {
		t.Error("normalizeURL(ftp://x) succeeded")
	}
}
