package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestConfigPrecedence(t *testing.T) {
	path := writeConfig(t, `{"stateDir":"/tmp/x","gateway":{"listen":"127.0.0.1:9000","auth":{"token":"file"}},
		"tools":{"exec":{"host":"gateway","timeoutSec":60,"notifyOnExit":false,"pathPrepend":["/opt/bin"]}},
		"agents":{"list":[{"id":"main","tools":{"exec":{"node":"build-1"}}}]}}`)
	cfg, err := Load(path, map[string]string{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Gateway.Listen != "127.0.0.1:9000" || cfg.Gateway.Auth.Token != "file" || cfg.Tools.Exec.TimeoutSec != 60 ||
		cfg.Tools.Exec.NotifyOnExit || cfg.Tools.Exec.Host != "gateway" || cfg.Agents.List[0].Tools.Exec.Node != "build-1" {
		t.Fatalf("file values not applied: %+v", cfg)
	}
	// Defaults survive where the file is silent.
	if cfg.NATS.Prefix != DefaultPrefix || cfg.Tools.Exec.KillGraceMs != DefaultKillGraceMs || cfg.Sandbox.Mode != "off" {
		t.Fatalf("defaults lost: %+v", cfg)
	}
	cfg, err = Load(path, map[string]string{
		"EXECMESH_GATEWAY_TOKEN":       "env",
		"EXECMESH_LISTEN":              "127.0.0.1:9001",
		"EXECMESH_EXEC_TIMEOUT_SEC":    "90",
		"EXECMESH_EXEC_NOTIFY_ON_EXIT": "true",
		"EXECMESH_SANDBOX_MODE":        "bwrap",
	})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Gateway.Auth.Token != "env" || cfg.Gateway.Listen != "127.0.0.1:9001" || cfg.Tools.Exec.TimeoutSec != 90 ||
		!cfg.Tools.Exec.NotifyOnExit || cfg.Sandbox.Mode != "bwrap" {
		t.Fatalf("env did not override the file: %+v", cfg)
	}
	if cfg.Tools.Exec.Host != "gateway" {
		t.Fatalf("unset env var changed a file value: %q", cfg.Tools.Exec.Host)
	}
}

func TestConfigErrorsNameTheKey(t *testing.T) {
	cases := []struct {
		name, body string
		env        map[string]string
		want       []string
	}{
		{"bad host", `{"tools":{"exec":{"host":"mars"}}}`, nil, []string{`tools.exec.host: invalid value "mars"`}},
		{"bad type", `{"tools":{"exec":{"timeoutSec":"long"}}}`, nil, []string{"tools.exec.timeoutSec"}},
		{"unknown key", `{"tools":{"exec":{"hots":"gateway"}}}`, nil, []string{`unknown key tools.exec.hots`}},
		{"unknown key in a list", `{"agents":{"list":[{"id":"a","tools":{"exec":{"sucurity":"full"}}}]}}`, nil, []string{`unknown key agents.list[0].tools.exec.sucurity`}},
		{"bad sandbox mode", `{"sandbox":{"mode":"docker"}}`, nil, []string{`sandbox.mode: invalid value "docker"`}},
		{"bad deny", `{"tools":{"deny":["bash"]}}`, nil, []string{"tools.deny[0]"}},
		{"bad agent", `{"agents":{"list":[{"id":"Main!"}]}}`, nil, []string{"agents.list[0].id"}},
		{"several at once", `{"tools":{"exec":{"host":"mars","security":"yolo"}}}`, nil, []string{"tools.exec.host", "tools.exec.security"}},
		{"bad env value", `{}`, map[string]string{"EXECMESH_EXEC_TIMEOUT_SEC": "soon"}, []string{"EXEC_TIMEOUT_SEC"}},
		{"bad env enum", `{}`, map[string]string{"EXECMESH_EXEC_ASK": "sometimes"}, []string{"tools.exec.ask"}},
		{"malformed", `{"tools":`, nil, []string{"invalid JSON", "line 1, column 10", "ends early"}},
		{"trailing comma", "{\n  \"tools\": {\"exec\": {\"ask\": \"always\",}}\n}\n", nil,
			[]string{"line 2, column 38", "invalid character '}'", "a comma after the last entry"}},
		{"syntax error on a later line", "{\n\"tools\": {\n\"exec\" {}}}", nil, []string{"line 3, column 8", "invalid JSON"}},
		{"bad type has a position", "{\"tools\":\n {\"exec\":{\"timeoutSec\":\"long\"}}}", nil, []string{"line 2, column", "tools.exec.timeoutSec"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			env := c.env
			if env == nil {
				env = map[string]string{}
			}
			_, err := Load(writeConfig(t, c.body), env)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestConfigClamps(t *testing.T) {
	cfg, err := Decode([]byte(`{"tools":{"exec":{"backgroundMs":5,"cleanupMs":999999999}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Tools.Exec.BackgroundMs != MinYieldMs || cfg.Tools.Exec.CleanupMs != MaxCleanupMs {
		t.Fatalf("clamps: %+v", cfg.Tools.Exec)
	}
}

// TestExecPolicyDefaults: the security and ask in force when nothing sets
// them, as DESIGN.md §3.4 says; the agent's values over the global ones.
func TestExecPolicyDefaults(t *testing.T) {
	tests := []struct {
		name     string
		mutate   func(*Config)
		sec, ask string
		agent    string
	}{
		{"defaults", nil, "allowlist", "on-miss", "main"},
		{"sandbox host", func(c *Config) { c.Tools.Exec.Host = "sandbox" }, "deny", "on-miss", "main"},
		{"auto with a sandbox", func(c *Config) { c.Sandbox.Mode = "bwrap" }, "deny", "on-miss", "main"},
		{"global values", func(c *Config) { c.Tools.Exec.Security, c.Tools.Exec.Ask = "full", "off" }, "full", "off", "main"},
		{"the agent's", func(c *Config) {
			c.Tools.Exec.Security = "full"
			c.Agents.List = []Agent{{ID: "ops", Tools: AgentTools{Exec: AgentExec{Security: "deny", Ask: "always"}}}}
		}, "deny", "always", "ops"},
	}
	for _, tt := range tests {
		cfg := Default()
		if tt.mutate != nil {
			tt.mutate(&cfg)
		}
		if sec, ask := cfg.ExecPolicy(tt.agent); sec != tt.sec || ask != tt.ask {
			t.Errorf("%s: %s %s, want %s %s", tt.name, sec, ask, tt.sec, tt.ask)
		}
	}
}

// TestEnvVarNamesTheKey: every EXECMESH_* override names its key.
func TestEnvVarNamesTheKey(t *testing.T) {
	for key, want := range map[string]string{
		"tools.exec.security":    "EXECMESH_EXEC_SECURITY",
		"stateDir":               "EXECMESH_STATE_DIR",
		"gateway.auth.token":     "EXECMESH_GATEWAY_TOKEN",
		"tools.exec.pathPrepend": "",
	} {
		if got := EnvVar(key); got != want {
			t.Errorf("EnvVar(%q) = %q, want %q", key, got, want)
		}
	}
	// Each variable sets the key its tag names.
	for key := range map[string]bool{"tools.exec.security": true, "nats.listen": true, "sandbox.mode": true} {
		v := EnvVar(key)
		val := map[string]string{"tools.exec.security": "full", "nats.listen": "127.0.0.1:5999", "sandbox.mode": "off"}[key]
		cfg, err := Load("", map[string]string{v: val})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{"tools.exec.security": cfg.Tools.Exec.Security, "nats.listen": cfg.NATS.Listen, "sandbox.mode": cfg.Sandbox.Mode}[key]
		if got != val {
			t.Errorf("%s=%s set %s to %q", v, val, key, got)
		}
	}
}

// TestLoadStateDirFromEnviron: the default state dir is the home
// directory's of the environment Load is given, never the process's; the
// file and EXECMESH_STATE_DIR still win over it.
func TestLoadStateDirFromEnviron(t *testing.T) {
	home := t.TempDir()
	withFile := writeConfig(t, `{"stateDir":"/srv/execmesh"}`)
	cases := []struct {
		name    string
		path    string
		environ map[string]string
		want    string
	}{
		{"home of the environment", "", map[string]string{"HOME": home}, filepath.Join(home, StateDirName)},
		{"no home in the environment", "", map[string]string{}, StateDirName},
		{"EXECMESH_STATE_DIR", "", map[string]string{"HOME": home, "EXECMESH_STATE_DIR": "/var/lib/execmesh"}, "/var/lib/execmesh"},
		{"the file", withFile, map[string]string{"HOME": home}, "/srv/execmesh"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := Load(c.path, c.environ)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.StateDir != c.want {
				t.Fatalf("stateDir %q, want %q", cfg.StateDir, c.want)
			}
			if want := filepath.Join(c.want, "workspace"); cfg.Sandbox.Workspace != want {
				t.Fatalf("sandbox workspace %q, want %q (it follows the state dir)", cfg.Sandbox.Workspace, want)
			}
		})
	}
	if got, want := DefaultStateDir(func(string) string { return "" }), StateDirName; got != want {
		t.Fatalf("DefaultStateDir without HOME: %q, want %q", got, want)
	}
}

// TestAllowlistEnvKey: tools.exec.allowlistEnv defaults to the short list
// of protocol.DefaultAllowlistEnv, a file replaces it ([] allows none),
// and a bad entry is an error naming the key and its index.
func TestAllowlistEnvKey(t *testing.T) {
	cfg, err := Load("", map[string]string{})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cfg.Tools.Exec.AllowlistEnv, ","); got != "TERM,LANG,LANGUAGE,LC_*,TZ,NO_COLOR,FORCE_COLOR,CLICOLOR,CI,COLUMNS,LINES" {
		t.Fatalf("default allowlistEnv %q", got)
	}
	cfg, err = Load(writeConfig(t, `{"tools":{"exec":{"allowlistEnv":["TERM","MY_*"]}}}`), map[string]string{})
	if err != nil || strings.Join(cfg.Tools.Exec.AllowlistEnv, ",") != "TERM,MY_*" {
		t.Fatalf("file value: %q %v", cfg.Tools.Exec.AllowlistEnv, err)
	}
	cfg, err = Load(writeConfig(t, `{"tools":{"exec":{"allowlistEnv":[]}}}`), map[string]string{})
	if err != nil || cfg.Tools.Exec.AllowlistEnv == nil || len(cfg.Tools.Exec.AllowlistEnv) != 0 {
		t.Fatalf("empty list: %#v %v", cfg.Tools.Exec.AllowlistEnv, err)
	}
	for _, tc := range []struct{ body, want string }{
		{`["TERM","*"]`, `tools.exec.allowlistEnv[1]: "*" would allow every key`},
		{`["LC_*","A-B"]`, `tools.exec.allowlistEnv[1]: "A-B" is not a variable name`},
		{`["1X"]`, `tools.exec.allowlistEnv[0]: "1X" is not a variable name`},
		{`["LC_*X"]`, `tools.exec.allowlistEnv[0]: "LC_*X" is not a variable name`},
		{`[""]`, `tools.exec.allowlistEnv[0]: empty pattern`},
		{`"TERM"`, `tools.exec.allowlistEnv`},
	} {
		_, err := Load(writeConfig(t, `{"tools":{"exec":{"allowlistEnv":`+tc.body+`}}}`), map[string]string{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("allowlistEnv %s: %v, want an error containing %q", tc.body, err, tc.want)
		}
	}
}
