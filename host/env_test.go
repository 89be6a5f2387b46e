package host

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/approvals"
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
