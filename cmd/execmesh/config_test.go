package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// readDoc reads a config file as generic JSON.
func readDoc(t *testing.T, path string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("%s is not JSON: %v\n%s", path, err, data)
	}
	return doc
}

// configStep is one command of a config scenario and what it must give.
type configStep struct {
	args   []string
	code   int
	stdout string   // exact, when not empty
	stderr []string // substrings
}

func TestConfigScenarios(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		initial string // file content; "" = no file
		steps   []configStep
		want    string // the file at the end, as JSON ("" = no check)
	}{
		{
			name: "defaults without a file",
			steps: []configStep{
				{args: []string{"get", "tools.exec.host"}, stdout: "auto\n"},
				{args: []string{"get", "tools.exec.timeoutSec"}, stdout: "1800\n"},
				{args: []string{"get", "tools.exec.killGraceMs"}, stdout: "5000\n"},
				{args: []string{"get", "tools.exec.notifyOnExit"}, stdout: "true\n"},
				{args: []string{"get", "tools.deny"}, stdout: "[]\n"},
				// The value in force, and on stderr where it comes from.
				{args: []string{"get", "tools.exec.security"}, stdout: "allowlist\n", stderr: []string{"tools.exec.security: default (no configuration file); deny when the configured host is the sandbox"}},
				{args: []string{"get", "tools.exec.ask"}, stdout: "on-miss\n", stderr: []string{"default"}},
				{args: []string{"get", "gateway.listen"}, stdout: "127.0.0.1:8420\n"},
				{args: []string{"get", "sandbox.env"}, stdout: "{}\n"},
				{args: []string{"get", "agents.list"}, stdout: "[]\n"},
				{args: []string{"get", "agents.list[0].id"}, code: 1, stderr: []string{"agents.list[0]: not set"}},
				{args: []string{"get", "tools.exec.hots"}, code: 1, stderr: []string{"unknown key path tools.exec.hots"}},
				{args: []string{"get", "tools.exec.host.x"}, code: 1, stderr: []string{"tools.exec.host is not an object"}},
				{args: []string{"get", "tools[0]"}, code: 1, stderr: []string{"tools is not a list"}},
			},
		},
		{
			name: "set strings, numbers, booleans and lists",
			steps: []configStep{
				{args: []string{"set", "tools.exec.host", "gateway"}},
				{args: []string{"set", "tools.exec.security", `"full"`}},
				{args: []string{"set", "tools.exec.timeoutSec", "120"}},
				{args: []string{"set", "tools.exec.notifyOnExit", "false"}},
				{args: []string{"set", "tools.exec.pathPrepend", `["/opt/bin","/usr/local/go/bin"]`}},
				{args: []string{"set", "tools.deny", `["exec"]`}},
				{args: []string{"set", "gateway.auth.token", "12345"}}, // a number token stays a string
				{args: []string{"set", "sandbox.env.FOO", "bar baz"}},
				{args: []string{"get", "tools.exec.host"}, stdout: "gateway\n"},
				{args: []string{"get", "tools.exec.timeoutSec"}, stdout: "120\n"},
				{args: []string{"get", "tools.exec.notifyOnExit"}, stdout: "false\n"},
				{args: []string{"get", "tools.exec.pathPrepend"}, stdout: "[\n  \"/opt/bin\",\n  \"/usr/local/go/bin\"\n]\n"},
				{args: []string{"get", "tools.exec.pathPrepend[1]"}, stdout: "/usr/local/go/bin\n"},
				{args: []string{"get", "gateway.auth.token"}, stdout: "12345\n"},
				{args: []string{"get", "sandbox.env.FOO"}, stdout: "bar baz\n"},
				{args: []string{"set", "tools.exec.pathPrepend[2]", "/srv/bin"}},
				{args: []string{"get", "tools.exec.pathPrepend[2]"}, stdout: "/srv/bin\n"},
			},
			want: `{"gateway":{"auth":{"token":"12345"}},"sandbox":{"env":{"FOO":"bar baz"}},"tools":{"deny":["exec"],"exec":{"host":"gateway","notifyOnExit":false,"pathPrepend":["/opt/bin","/usr/local/go/bin","/srv/bin"],"security":"full","timeoutSec":120}}}`,
		},
		{
			name:    "agents.list appends at its length",
			initial: `{"tools":{"exec":{"host":"node"}}}`,
			steps: []configStep{
				// An entry without an id is invalid, and the message says which key.
				{args: []string{"set", "agents.list[0].tools.exec.node", "build-1"}, code: 1, stderr: []string{"agents.list[0].id", "left unchanged"}},
				{args: []string{"set", "agents.list[0].id", "main"}},
				{args: []string{"set", "agents.list[0].tools.exec.node", "build-1"}},
				{args: []string{"set", "agents.list[1]", `{"id":"ops","tools":{"exec":{"host":"gateway"}}}`}},
				{args: []string{"set", "agents.list[3].id", "x"}, code: 1, stderr: []string{"agents.list[3]: index out of range (the list has 2 entries; [2] appends)"}},
				{args: []string{"get", "agents.list[0].tools.exec.node"}, stdout: "build-1\n"},
				{args: []string{"get", "agents.list[1].id"}, stdout: "ops\n"},
				{args: []string{"get", "agents.list[1].tools.exec.node"}, stdout: "\n"},
				{args: []string{"get", "agents.list[1].tools.elevated.enabled"}, stdout: "null\n"},
			},
			want: `{"agents":{"list":[{"id":"main","tools":{"exec":{"node":"build-1"}}},{"id":"ops","tools":{"exec":{"host":"gateway"}}}]},"tools":{"exec":{"host":"node"}}}`,
		},
		{
			name:    "invalid values are rejected and name the key",
			initial: `{"tools":{"exec":{"host":"gateway"}}}`,
			steps: []configStep{
				{args: []string{"set", "tools.exec.host", "bogus"}, code: 1, stderr: []string{"tools.exec.host", `"bogus"`}},
				{args: []string{"set", "tools.exec.timeoutSec", "soon"}, code: 1, stderr: []string{"tools.exec.timeoutSec"}},
				{args: []string{"set", "tools.exec.timeoutSec", "--", "-1"}, code: 1, stderr: []string{"tools.exec.timeoutSec", "negative"}},
				{args: []string{"set", "tools.exec.pathPrepend", `["relative/bin"]`}, code: 1, stderr: []string{"tools.exec.pathPrepend[0]"}},
				{args: []string{"set", "tools.deny", "exec"}, code: 1, stderr: []string{"tools.deny"}},
				{args: []string{"set", "tools.exec.notifyOnExit", "yes"}, code: 1, stderr: []string{"tools.exec.notifyOnExit"}},
				{args: []string{"set", "tools.exec.hots", "gateway"}, code: 1, stderr: []string{"unknown key path tools.exec.hots"}},
				{args: []string{"set", "tools.exec.host[0]", "x"}, code: 1, stderr: []string{"tools.exec.host is not a list"}},
				{args: []string{"get", "tools.exec.host"}, stdout: "gateway\n"},
			},
			want: `{"tools":{"exec":{"host":"gateway"}}}`,
		},
		{
			name:    "unset",
			initial: `{"tools":{"exec":{"host":"gateway","pathPrepend":["/a","/b","/c"]},"deny":["exec"]},"agents":{"list":[{"id":"main","tools":{"exec":{"node":"n1"}}}]}}`,
			steps: []configStep{
				{args: []string{"unset", "tools.exec.host"}},
				{args: []string{"get", "tools.exec.host"}, stdout: "auto\n"},
				{args: []string{"unset", "tools.exec.pathPrepend[1]"}},
				{args: []string{"unset", "agents.list[0].tools.exec.node"}},
				{args: []string{"unset", "tools.deny"}},
				{args: []string{"unset", "sandbox.mode"}}, // absent: nothing to do
				{args: []string{"unset", "tools.exec.nope"}, code: 1, stderr: []string{"unknown key path tools.exec.nope"}},
			},
			want: `{"agents":{"list":[{"id":"main"}]},"tools":{"exec":{"pathPrepend":["/a","/c"]}}}`,
		},
		{
			name:    "a broken file can be repaired but not made worse",
			initial: `{"tools":{"exec":{"host":"bogus"}}}`,
			steps: []configStep{
				// get shows what applies without the file, and says so.
				{args: []string{"get", "tools.exec.host"}, stdout: "auto\n", stderr: []string{"ignoring the configuration file", "tools.exec.host"}},
				{args: []string{"set", "tools.exec.ask", "off"}, code: 1, stderr: []string{"tools.exec.host", "left unchanged"}},
				{args: []string{"set", "tools.exec.host", "gateway"}, stdout: "tools.exec.host: bogus -> gateway\n"},
				{args: []string{"get", "tools.exec.host"}, stdout: "gateway\n"},
			},
			want: `{"tools":{"exec":{"host":"gateway"}}}`,
		},
		{
			name:    "invalid JSON in the file",
			initial: `{"tools":{"exec":{"host":"node"}},}`,
			steps: []configStep{
				{args: []string{"get", "tools.exec.host"}, stdout: "auto\n", stderr: []string{"ignoring the configuration file", "line 1, column 35", "a comma after the last entry"}},
				// set cannot edit what is not JSON: it starts anew and
				// keeps the file beside.
				{args: []string{"set", "tools.exec.ask", "always"}, stdout: "tools.exec.ask: on-miss -> always\n", stderr: []string{"line 1, column 35", "it is kept as", ".invalid-"}},
				{args: []string{"get", "tools.exec.host"}, stdout: "auto\n"},
			},
			want: `{"tools":{"exec":{"ask":"always"}}}`,
		},
		{
			name:    "unknown key in the file",
			initial: `{"tools":{"exec":{"hots":"gateway"}}}`,
			steps: []configStep{
				{args: []string{"get", "tools.exec.host"}, stdout: "auto\n", stderr: []string{"ignoring the configuration file", "unknown key", "hots"}},
			},
		},
		{
			name: "set and unset say what changed",
			steps: []configStep{
				{args: []string{"set", "tools.exec.ask", "always"}, stdout: "tools.exec.ask: on-miss -> always\n", stderr: []string{"no daemon answers", "SIGHUP"}},
				{args: []string{"set", "tools.exec.ask", "always"}, stdout: "tools.exec.ask: always (unchanged)\n"},
				{args: []string{"set", "tools.exec.timeoutSec", "60"}, stdout: "tools.exec.timeoutSec: 1800 -> 60\n"},
				{args: []string{"set", "tools.exec.pathPrepend", `["/opt/bin"]`}, stdout: "tools.exec.pathPrepend: null -> [\"/opt/bin\"]\n"},
				{args: []string{"unset", "tools.exec.ask"}, stdout: "tools.exec.ask: always -> on-miss (default)\n"},
			},
			want: `{"tools":{"exec":{"timeoutSec":60,"pathPrepend":["/opt/bin"]}}}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			file := filepath.Join(dir, "config.json")
			if tt.initial != "" {
				writeFile(t, file, tt.initial)
			}
			for i, st := range tt.steps {
				before, _ := os.ReadFile(file)
				args := append([]string{"config", "--config", file}, st.args...)
				// No daemon answers there: set says when the change applies.
				r := runCLI(t, map[string]string{envGatewayURL: "http://127.0.0.1:1"}, "", args...)
				if r.code != st.code {
					t.Fatalf("step %d %q: exit %d, want %d\nstdout: %s\nstderr: %s", i, st.args, r.code, st.code, r.stdout, r.stderr)
				}
				if st.stdout != "" && r.stdout != st.stdout {
					t.Errorf("step %d %q: stdout %q, want %q", i, st.args, r.stdout, st.stdout)
				}
				for _, s := range st.stderr {
					if !strings.Contains(r.stderr, s) {
						t.Errorf("step %d %q: stderr lacks %q: %s", i, st.args, s, r.stderr)
					}
				}
				if st.code != 0 {
					if after, _ := os.ReadFile(file); string(after) != string(before) {
						t.Errorf("step %d %q failed but changed the file:\n%s\n->\n%s", i, st.args, before, after)
					}
				}
			}
			if tt.want != "" {
				var want map[string]any
				if err := json.Unmarshal([]byte(tt.want), &want); err != nil {
					t.Fatal(err)
				}
				if got := readDoc(t, file); !reflect.DeepEqual(got, want) {
					g, _ := json.Marshal(got)
					t.Errorf("file:\n%s\nwant:\n%s", g, tt.want)
				}
			}
		})
	}
}

// TestConfigSetCreatesFile: set creates <state-dir>/config.json (dir 0700,
// file 0600), written with two-space indentation and no temporary files
// left behind.
func TestConfigSetCreatesFile(t *testing.T) {
	t.Parallel()
	stateDir := filepath.Join(t.TempDir(), "state", "nested")
	env := map[string]string{envStateDir: stateDir}
	if r := runCLI(t, env, "", "config", "set", "tools.exec.host", "gateway"); r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	file := filepath.Join(stateDir, "config.json")
	st, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("file mode %v, want 0600", st.Mode().Perm())
	}
	if dst, _ := os.Stat(stateDir); dst.Mode().Perm() != 0o700 {
		t.Errorf("dir mode %v, want 0700", dst.Mode().Perm())
	}
	data, _ := os.ReadFile(file)
	if want := "{\n  \"tools\": {\n    \"exec\": {\n      \"host\": \"gateway\"\n    }\n  }\n}\n"; string(data) != want {
		t.Errorf("file:\n%s\nwant:\n%s", data, want)
	}
	entries, _ := os.ReadDir(stateDir)
	if len(entries) != 1 {
		t.Errorf("state dir holds %d entries, want only config.json", len(entries))
	}
	// The client commands read the file from the state dir: the gateway
	// URL follows gateway.listen.
	if r := runCLI(t, env, "", "config", "set", "gateway.listen", "127.0.0.1:1"); r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	r := runCLI(t, env, "", "nodes", "list")
	if r.code != 1 || !strings.Contains(r.stderr, `cannot reach the gateway at http://127.0.0.1:1: is "execmesh up" running?`) {
		t.Errorf("exit %d, stderr %q", r.code, r.stderr)
	}
	// unset on a missing file writes nothing.
	other := filepath.Join(t.TempDir(), "none", "config.json")
	if r := runCLI(t, nil, "", "config", "--config", other, "unset", "tools.exec.host"); r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if _, err := os.Stat(other); !os.IsNotExist(err) {
		t.Errorf("unset created %s", other)
	}
}

// TestConfigGetOrigin: config get prints the value in force (the file,
// then EXECMESH_* over it, --state-dir for stateDir) and says on stderr
// where it comes from when the file does not set it.
func TestConfigGetOrigin(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "config.json"), `{"tools":{"exec":{"ask":"always"}}}`)
	other := filepath.Join(t.TempDir(), "elsewhere")
	tests := []struct {
		name   string
		env    map[string]string
		args   []string
		stdout string
		stderr string // "" means nothing on stderr
	}{
		{"set in the file", nil, []string{"tools.exec.ask"}, "always\n", ""},
		{"default", nil, []string{"tools.exec.security"}, "allowlist\n", "(tools.exec.security: default (not set in " + filepath.Join(dir, "config.json") + "); deny when the configured host is the sandbox)\n"},
		{"env over the default", map[string]string{"EXECMESH_EXEC_SECURITY": "full"}, []string{"tools.exec.security"}, "full\n", "(tools.exec.security: from $EXECMESH_EXEC_SECURITY)\n"},
		{"env over the file", map[string]string{"EXECMESH_EXEC_ASK": "off"}, []string{"tools.exec.ask"}, "off\n", "(tools.exec.ask: from $EXECMESH_EXEC_ASK)\n"},
		{"stateDir from the environment", nil, []string{"stateDir"}, dir + "\n", "(stateDir: from $EXECMESH_STATE_DIR)\n"},
		{"stateDir from --state-dir", nil, []string{"stateDir", "--state-dir", other}, other + "\n", "(stateDir: from --state-dir)\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{envStateDir: dir}
			for k, v := range tt.env {
				env[k] = v
			}
			r := runCLI(t, env, "", append([]string{"config", "get"}, tt.args...)...)
			if r.code != 0 || r.stdout != tt.stdout || r.stderr != tt.stderr {
				t.Fatalf("exit %d, stdout %q, stderr %q; want 0, %q, %q", r.code, r.stdout, r.stderr, tt.stdout, tt.stderr)
			}
		})
	}
}

// TestConfigUnknownKeyNamesItsPath: a file with an unknown key fails with
// the key's full path, also inside lists.
func TestConfigUnknownKeyNamesItsPath(t *testing.T) {
	t.Parallel()
	for doc, want := range map[string]string{
		`{"tools":{"exec":{"sucurity":"full"}}}`:                                    "unknown key tools.exec.sucurity",
		`{"agents":{"list":[{"id":"a"},{"id":"b","tools":{"exec":{"hots":"x"}}}]}}`: "unknown key agents.list[1].tools.exec.hots",
		`{"Tools":{"Exec":{"Host":"gateway","nope":1}}}`:                            "unknown key Tools.Exec.nope",
	} {
		file := filepath.Join(t.TempDir(), "config.json")
		writeFile(t, file, doc)
		r := runCLI(t, nil, "", "config", "get", "tools.exec.host", "--config", file)
		if r.code != 0 || !strings.Contains(r.stderr, want) || !strings.Contains(r.stderr, "ignoring the configuration file") {
			t.Errorf("%s: exit %d, stderr %q; want %q", doc, r.code, r.stderr, want)
		}
	}
}

func TestConfigGetWhole(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "c.json")
	writeFile(t, file, `{"tools":{"exec":{"host":"gateway"}}}`)
	r := runCLI(t, nil, "", "config", "get", "--config", file)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	var doc map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, r.stdout)
	}
	exec := doc["tools"].(map[string]any)["exec"].(map[string]any)
	if exec["host"] != "gateway" || exec["timeoutSec"] != 1800.0 {
		t.Errorf("tools.exec = %v", exec)
	}
}

func TestParseKeyPath(t *testing.T) {
	t.Parallel()
	good := map[string]string{
		"tools.exec.host":                "tools.exec.host",
		"agents.list[0].tools.exec.node": "agents.list[0].tools.exec.node",
		"a[1][2].b":                      "a[1][2].b",
	}
	for in, want := range good {
		p, err := parseKeyPath(in)
		if err != nil || keyPathString(p) != want {
			t.Errorf("parseKeyPath(%q) = %q, %v", in, keyPathString(p), err)
		}
	}
	for _, in := range []string{"", ".a", "a.", "a[", "a[]", "a[-1]", "a[01]", "a]", "a[1]x", "[0]", "a[1"} {
		if p, err := parseKeyPath(in); err == nil {
			t.Errorf("parseKeyPath(%q) = %q, want an error", in, keyPathString(p))
		}
	}
}
