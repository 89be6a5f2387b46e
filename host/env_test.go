package host

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/approvals"
	"github.com/execmesh/execmesh/protocol"
	"github.com/execmesh/execmesh/session"
)

func newTestLocal(t *testing.T, kind string, env []string, stateDir string) *Local {
	t.Helper()
	l, err := NewLocal(Config{Kind: kind, ID: "h", Environ: env, Cwd: t.TempDir(), StateDir: stateDir,
		Session: session.Config{Containment: session.ContainmentProcessGroup}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(t.Context()) })
	return l
}

// TestEnvCache: the environment of calls without overrides is built once
// per settings and login PATH, and is the one built without the cache;
// overrides still apply, and the cached copy is the caller's to change.
func TestEnvCache(t *testing.T) {
	t.Parallel()
	base := []string{"PATH=/usr/bin:/bin", "HOME=/home/x", "LANG=C", "BASH_ENV=/evil"}
	l := newTestLocal(t, KindGateway, base, "")
	lp := "/opt/login/bin"
	l.loginPath = func() string { return lp }
	s := l.settings.Load()
	first, err := l.gatewayEnv(nil, s)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(first, "PATH=/opt/login/bin:/usr/bin:/bin") || slices.ContainsFunc(first, func(kv string) bool { return strings.HasPrefix(kv, "BASH_ENV=") }) {
		t.Fatalf("env %q", first)
	}
	first[0] = "CHANGED=1"
	again, _ := l.gatewayEnv(map[string]string{}, s)
	if again[0] == "CHANGED=1" {
		t.Error("the cached environment was shared with a caller")
	}
	withOverride, _ := l.gatewayEnv(map[string]string{"FOO": "bar"}, s)
	if !slices.Contains(withOverride, "FOO=bar") {
		t.Errorf("override lost: %q", withOverride)
	}
	if after, _ := l.gatewayEnv(nil, s); slices.Contains(after, "FOO=bar") {
		t.Errorf("an override leaked into the cache: %q", after)
	}
	l.SetSettings(Settings{PathPrepend: []string{"/first"}})
	if env, _ := l.gatewayEnv(nil, l.settings.Load()); !slices.Contains(env, "PATH=/first:/opt/login/bin:/usr/bin:/bin") {
		t.Errorf("after SetSettings: %q", env)
	}
	lp = "/other/login"
	if env, _ := l.gatewayEnv(nil, l.settings.Load()); !slices.Contains(env, "PATH=/first:/other/login:/usr/bin:/bin") {
		t.Errorf("after a login PATH change: %q", env)
	}

	n := newTestLocal(t, KindNode, base, "")
	ne, _ := n.nodeEnv(nil)
	ne2, _ := n.nodeEnv(map[string]string{"PATH": "/extra:/usr/bin:/bin"})
	ne3, _ := n.nodeEnv(nil)
	if !slices.Contains(ne, "PATH=/usr/bin:/bin") || !slices.Contains(ne2, "PATH=/extra:/usr/bin:/bin") || !slices.Equal(ne, ne3) {
		t.Errorf("node env %q, with PATH %q, again %q", ne, ne2, ne3)
	}
}

// TestPolicyFollowsApprovalsFile: the policy reads the approvals file
// through its cache and sees every change, one made an instant after the
// last read included.
func TestPolicyFollowsApprovalsFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	l := newTestLocal(t, KindGateway, []string{"PATH=/usr/bin:/bin"}, dir)
	s := &Settings{}
	path := approvals.Path(dir)
	if p := l.policy("full", "off", "main", s); p.Security != approvals.SecurityFull {
		t.Fatalf("no file: %+v", p)
	}
	write := func(sec string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(`{"version":1,"agents":{"main":{"security":"`+sec+`"}}}`), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("deny")
	if p := l.policy("full", "off", "main", s); p.Security != approvals.SecurityDeny {
		t.Errorf("file says deny: %+v", p)
	}
	write("full") // same size, within the same timestamp tick
	if p := l.policy("full", "off", "main", s); p.Security != approvals.SecurityFull {
		t.Errorf("rewritten to full: %+v", p)
	}
	write("deny")
	old := time.Now().Add(-time.Minute)
	if err := os.Chtimes(path, old, old); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if p := l.policy("full", "off", "main", s); p.Security != approvals.SecurityDeny {
			t.Errorf("cached deny: %+v", p)
		}
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if p := l.policy("full", "off", "main", s); p.Security != approvals.SecurityFull {
		t.Errorf("file removed: %+v", p)
	}
}

// TestLoginShellProbeUsesGivenHome: the login-shell PATH probe runs the
// shell with the HOME of the environment it is given, so the profile it
// reads is that home's, not the embedding process's.
func TestLoginShellProbeUsesGivenHome(t *testing.T) {
	home := t.TempDir()
	profile := "PATH=/execmesh-probe-marker:$PATH\nexport PATH\n"
	if err := os.WriteFile(home+"/.profile", []byte(profile), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"SHELL": "/bin/sh", "HOME": home, "PATH": "/usr/bin:/bin"}
	got := ProbeLoginShellPath(func(k string) string { return env[k] })
	if !slices.Contains(strings.Split(got, ":"), "/execmesh-probe-marker") {
		t.Fatalf("login PATH %q: the profile in the given HOME %s was not read", got, home)
	}
}

// TestCheckAllowlistEnv: under security allowlist a request may set only
// keys of tools.exec.allowlistEnv (exact names and KEY* prefixes, the
// default list when unset); anything else is a security violation naming
// every refused key; under full and deny only the blocklists apply.
func TestCheckAllowlistEnv(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		env      map[string]string
		security string
		allowed  []string
		errText  string // "" means accepted
	}{
		{"no env", nil, "allowlist", nil, ""},
		{"default key", map[string]string{"TERM": "dumb", "TZ": "UTC"}, "allowlist", nil, ""},
		{"LC_ALL via LC_*", map[string]string{"LC_ALL": "C.UTF-8"}, "allowlist", nil, ""},
		{"FOO refused", map[string]string{"FOO": "1", "TERM": "dumb"}, "allowlist", nil,
			`Security Violation: env "FOO" may not be set by a request under security allowlist (allowed: tools.exec.allowlistEnv: TERM, LANG, LANGUAGE, LC_*, TZ, NO_COLOR, FORCE_COLOR, CLICOLOR, CI, COLUMNS, LINES).`},
		{"several refused, sorted", map[string]string{"ZED": "1", "PAGER": "cat"}, "allowlist", nil, `env keys "PAGER", "ZED" may not be set`},
		{"case matters", map[string]string{"term": "dumb"}, "allowlist", nil, `env "term"`},
		{"untrimmed key", map[string]string{" TERM": "dumb"}, "allowlist", nil, `env " TERM"`},
		{"prefix needs the prefix", map[string]string{"LC": "x"}, "allowlist", nil, `env "LC"`},
		{"configured list", map[string]string{"MY_FLAG": "1"}, "allowlist", []string{"MY_*"}, ""},
		{"configured list replaces default", map[string]string{"TERM": "dumb"}, "allowlist", []string{"MY_*"}, `(allowed: tools.exec.allowlistEnv: MY_*)`},
		{"empty list allows none", map[string]string{"TERM": "dumb"}, "allowlist", []string{}, `(allowed: tools.exec.allowlistEnv: none)`},
		{"security full unaffected", map[string]string{"FOO": "1"}, "full", nil, ""},
		{"security deny unaffected", map[string]string{"FOO": "1"}, "deny", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckAllowlistEnv(tc.env, tc.security, tc.allowed)
			if tc.errText == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if errType(err) != protocol.ErrSecurityViolation || !strings.Contains(err.Error(), tc.errText) {
				t.Fatalf("got %v, want a security violation containing %q", err, tc.errText)
			}
		})
	}
}

// TestAllowlistEnvEnforced: the check runs in Exec on both host kinds
// under the effective policy, before anything runs: under allowlist (a
// request's, or one the approvals file imposes on a request that said
// full) a refused key leaves no marker, allowed keys let a run start (a
// safe bin, which runs with or without the kernel's confinement); under
// full the refused key runs. Settings.AllowlistEnv replaces the default.
func TestAllowlistEnvEnforced(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{KindGateway, KindNode} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			l := newLocal(t, kind, nil)
			marker := filepath.Join(l.cfg.Cwd, "marker")
			run := func(security, command string, env map[string]string) error {
				req := execReq(l, command)
				req.Security, req.Ask, req.Args.Env = security, "off", env
				_, err := runCmd(t, l, req)
				return err
			}
			if err := run("allowlist", "touch "+marker, map[string]string{"FOO": "1"}); errType(err) != protocol.ErrSecurityViolation || !strings.Contains(err.Error(), `env "FOO"`) {
				t.Fatalf("FOO under allowlist: %v, want a security violation naming FOO", err)
			}
			if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the refused command ran: %v", err)
			}
			if err := run("allowlist", "head -n 1", map[string]string{"TERM": "dumb", "LC_ALL": "C"}); err != nil {
				t.Fatalf("allowed keys: %v", err)
			}
			if err := run("full", "touch "+marker, map[string]string{"FOO": "1"}); err != nil {
				t.Fatalf("FOO under full: %v", err)
			}
			if err := os.Remove(marker); err != nil {
				t.Fatalf("the command under full did not run: %v", err)
			}
			// The approvals file tightens full to allowlist: the key is
			// refused again.
			writeApprovals(t, l, func(f *approvals.File) error {
				f.Agents["main"] = &approvals.Agent{Settings: approvals.Settings{Security: approvals.SecurityAllowlist}}
				return nil
			})
			if err := run("full", "touch "+marker, map[string]string{"FOO": "1"}); errType(err) != protocol.ErrSecurityViolation {
				t.Fatalf("FOO under a file's allowlist: %v, want a security violation", err)
			}
			l.SetSettings(Settings{AllowlistEnv: []string{"FOO"}})
			if err := run("allowlist", "head -n 1", map[string]string{"FOO": "1"}); err != nil {
				t.Fatalf("FOO allowed by Settings.AllowlistEnv: %v", err)
			}
		})
	}
}
