package main

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"
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

// runCLIRetrying is runCLI, run again (for up to 30 s) while the gateway
// answers with a retryable error, as a client is told to: a gateway that
// has just started on a loaded machine may not reach its JetStream store
// within the 5 s an operation waits.
func runCLIRetrying(t *testing.T, env map[string]string, stdin string, args ...string) result {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := runCLI(t, env, stdin, args...)
		retryable := strings.Contains(r.stdout, `"retryable": true`) || strings.HasSuffix(strings.TrimSpace(r.stderr), "; retry") ||
			strings.Contains(r.stderr, "Retry.")
		if r.code == 0 || !retryable || time.Now().After(deadline) {
			return r
		}
		time.Sleep(500 * time.Millisecond)
	}
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
		{name: "no args", args: nil, code: 2, stderr: []string{"Usage: execmesh COMMAND", "exec", "nodes approvals get"}, noStdout: true},
		{name: "help", args: []string{"help"}, code: 0, stdout: []string{"Usage: execmesh COMMAND"}},
		{name: "-h", args: []string{"-h"}, code: 0, stdout: []string{"Usage: execmesh COMMAND"}},
		{name: "--help", args: []string{"--help"}, code: 0, stdout: []string{"Usage: execmesh COMMAND"}},
		{name: "help exec", args: []string{"help", "exec"}, code: 0, stdout: []string{"execmesh exec [flags] [--] CMD…", "--workdir dir", "--yield-ms ms", "Examples:"}},
		{name: "exec -h", args: []string{"exec", "-h"}, code: 0, stdout: []string{"execmesh exec [flags] [--] CMD…", "--gateway URL", "--token token", "--session-key sessionKey"}},
		{name: "exec --help", args: []string{"exec", "--help"}, code: 0, stdout: []string{"--no-wait", "--background"}},
		{name: "version", args: []string{"version"}, code: 0, stdout: []string{"execmesh "}},
		{name: "--version", args: []string{"--version"}, code: 0, stdout: []string{"execmesh "}},
		{name: "unknown command", args: []string{"frobnicate"}, code: 2, stderr: []string{`unknown command "frobnicate"`}, noStdout: true},
		{name: "unknown command suggests", args: []string{"exce"}, code: 2, stderr: []string{`did you mean "exec"`}, noStdout: true},
		{name: "exec without command", args: []string{"exec"}, code: 2, stderr: []string{"no command given"}},
		{name: "exec unknown flag", args: []string{"exec", "--bogus", "--", "ls"}, code: 2, stderr: []string{"unknown flag: --bogus", "Run 'execmesh exec --help' for usage."}},
		{name: "exec background and no-wait", args: []string{"exec", "--background", "--no-wait", "true"}, code: 2, stderr: []string{"do not mix"}},
		{name: "exec negative yield", args: []string{"exec", "--yield-ms", "-5", "true"}, code: 2, stderr: []string{"--yield-ms must not be negative"}},
		{name: "exec bad env", args: []string{"exec", "--env", "NOEQUALS", "--", "ls"}, code: 2, stderr: []string{`--env "NOEQUALS"`}},
		{name: "process without action", args: []string{"process"}, code: 2, stderr: []string{"want a subcommand", "send-keys"}},
		{name: "process unknown action", args: []string{"process", "explode"}, code: 2, stderr: []string{`unknown subcommand "explode"`, "send-keys"}},
		// A missing argument is a usage error before any request.
		{name: "process poll without id", args: []string{"process", "poll"}, code: 2, stderr: []string{"no session id given"}},
		{name: "process kill without id", args: []string{"process", "kill"}, code: 2, stderr: []string{"no session id given"}},
		{name: "process list with an id", args: []string{"process", "list", "x"}, code: 2, stderr: []string{"unexpected arguments"}},
		{name: "process data on poll", args: []string{"process", "poll", "x", "--data", "y"}, code: 2, stderr: []string{"unknown flag: --data"}},
		{name: "process two ids", args: []string{"process", "poll", "a", "-s", "b"}, code: 2, stderr: []string{"two different session ids"}},
		{name: "process negative timeout", args: []string{"process", "poll", "a", "--timeout", "-1"}, code: 2, stderr: []string{"--timeout must not be negative"}},
		{name: "call not json", args: []string{"call", "{nope"}, code: 2, stderr: []string{"must be a JSON object"}},
		{name: "call no tool", args: []string{"call", `{"args":{}}`}, code: 2, stderr: []string{`no "tool"`}},
		{name: "call empty stdin", args: []string{"call"}, code: 2, stderr: []string{"no request"}},
		{name: "call two args", args: []string{"call", "{}", "{}"}, code: 2, stderr: []string{"want one JSON argument"}},
		{name: "nodes without subcommand", args: []string{"nodes"}, code: 2, stderr: []string{"want a subcommand"}},
		{name: "nodes unknown subcommand", args: []string{"nodes", "explode"}, code: 2, stderr: []string{`unknown subcommand "explode"`}},
		{name: "nodes approve without id", args: []string{"nodes", "approve"}, code: 2, stderr: []string{"want one node id or name"}},
		{name: "nodes list --name", args: []string{"nodes", "list", "--name", "x"}, code: 2, stderr: []string{"unknown flag: --name"}},
		{name: "nodes --session-key", args: []string{"nodes", "list", "--session-key", "x"}, code: 2, stderr: []string{"unknown flag: --session-key"}},
		{name: "nodes approvals set without hash", args: []string{"nodes", "approvals", "set", "n1", "f.json"}, code: 2, stderr: []string{"base-hash"}},
		{name: "nodes invite negative ttl", args: []string{"nodes", "invite", "--ttl", "-1m"}, code: 2, stderr: []string{"--ttl must not be negative"}},
		{name: "approvals bad decision", args: []string{"approvals", "resolve", "id1", "maybe"}, code: 2, stderr: []string{`invalid decision "maybe"`}},
		{name: "approvals resolve missing decision", args: []string{"approvals", "resolve", "id1"}, code: 2, stderr: []string{"want ID and a decision"}},
		{name: "approvals get without id", args: []string{"approvals", "get"}, code: 2, stderr: []string{"want one approval id"}},
		{name: "admin unknown", args: []string{"admin", "explode"}, code: 2, stderr: []string{"blockers"}},
		{name: "session without exec", args: []string{"session"}, code: 2, stderr: []string{"want a subcommand: exec"}},
		{name: "events follow and wait", args: []string{"events", "--follow", "--wait-ms", "5"}, code: 2, stderr: []string{"do not mix"}},
		{name: "config without subcommand", args: []string{"config"}, code: 2, stderr: []string{"want a subcommand"}},
		{name: "config set without value", args: []string{"config", "set", "tools.exec.host"}, code: 2, stderr: []string{"want KEYPATH and VALUE"}},
		{name: "config bad key path", args: []string{"config", "get", "tools..exec"}, code: 2, stderr: []string{"invalid key path", "empty key"}},
		{name: "config bad index", args: []string{"config", "get", "agents.list[x]"}, code: 2, stderr: []string{"invalid key path"}},
		{name: "mcp extra args", args: []string{"mcp", "extra"}, code: 2, stderr: []string{"unexpected arguments"}},
		{name: "mcp --json", args: []string{"mcp", "--json"}, code: 2, stderr: []string{"unknown flag: --json"}},
		{name: "up extra args", args: []string{"up", "extra"}, code: 2, stderr: []string{"unexpected arguments"}},
		{name: "up bad flag", args: []string{"up", "--drain-timeout", "soon"}, code: 2, stderr: []string{"--drain-timeout"}},
		{name: "completion without shell", args: []string{"completion", "nosh"}, code: 2},
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

// TestHelpListsEveryCommand checks the usage against DESIGN.md §2: every
// command with its synopsis, subcommands included (nodes
// approvals get|set at the top level).
func TestHelpListsEveryCommand(t *testing.T) {
	t.Parallel()
	r := runCLI(t, nil, "", "help")
	for _, cmd := range []string{
		"up", "gateway", "node", "nodes list | pending | approve NODE | reject NODE | invite [--name N] [--ttl D]", "call", "exec", "process",
		"nodes approvals get NODE | set NODE FILE|- --base-hash H", "approvals list | get ID | resolve ID allow-once|allow-always|deny",
		"mcp", "config get", "session exec", "events", "admin blockers", "version", "completion bash|zsh|fish", "help",
	} {
		if !strings.Contains(r.stdout, "\n  "+cmd) {
			t.Errorf("help does not list %q:\n%s", cmd, r.stdout)
		}
	}
}

// TestBadConfigFailsEveryCommand: a bad config makes any command that
// needs it exit non-zero with a message naming the key (DESIGN.md §7);
// those that do not need it (version, help, config) work and name it.
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
	// The commands that do not need the file work, and say that they
	// ignore it, naming the key.
	for _, args := range [][]string{
		{"version"},
		{"help"},
		{"exec", "--help"},
		{"config", "get", "tools.exec.host"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			t.Parallel()
			r := runCLI(t, env, "", args...)
			if r.code != 0 || r.stdout == "" || !strings.Contains(r.stderr, "ignoring the configuration file") || !strings.Contains(r.stderr, "tools.exec.host") {
				t.Fatalf("exit %d, stdout %q, stderr %q: want 0, output, and a note naming tools.exec.host", r.code, r.stdout, r.stderr)
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

// TestVersionFromBuildInfo: the version comes from the build information:
// the module version, the VCS revision and the dirty flag; -ldflags
// -X main.version wins; SemVer for the node's micro service.
func TestVersionFromBuildInfo(t *testing.T) {
	t.Parallel()
	bi := &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: "github.com/execmesh/execmesh", Version: "v0.0.0-20261201092819-8d63f4e5d1bc+dirty"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "8d63f4e5d1bcb407d3afebf3ecd480bd9a8282d5"}, {Key: "vcs.time", Value: "2026-12-01T09:28:19Z"}, {Key: "vcs.modified", Value: "true"}}}
	v := versionFrom(bi, "")
	if got, want := v.short(), "execmesh v0.0.0-20261201092819-8d63f4e5d1bc+dirty (commit 8d63f4e5d1bc, modified, 2026-12-01T09:28:19Z, go1.26.0 "+v.Platform+")"; got != want {
		t.Errorf("short() = %q, want %q", got, want)
	}
	if v.semver() != "0.0.0-20261201092819-8d63f4e5d1bc+dirty" {
		t.Errorf("semver() = %q", v.semver())
	}
	if v := versionFrom(bi, "1.4.0"); v.Version != "1.4.0" || v.Revision == "" {
		t.Errorf("override: %+v", v)
	}
	dev := versionFrom(&debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}}, "")
	if dev.Version != "devel" || dev.semver() != "0.0.0-devel" || !strings.Contains(dev.short(), "no commit recorded") {
		t.Errorf("devel build: %+v %q", dev, dev.short())
	}
	r := runCLI(t, nil, "", "version", "--json")
	var got versionInfo
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &got) != nil || got.GoVersion == "" {
		t.Errorf("version --json: %d %q", r.code, r.stdout)
	}
}
