package host

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/approvals"
	"github.com/execmesh/execmesh/protocol"
)

// TestEnv: the environment a command gets on each host kind. The
// inherited environment is filtered (dangerous variables dropped); a
// request's overrides are checked against the blocklists; on the gateway
// a PATH is refused, the login shell's PATH is merged in and
// pathPrepend goes first; on a node a PATH is accepted only as exactly
// "PATH" and only when it prepends absolute directories to the node's own.
func TestEnv(t *testing.T) {
	t.Parallel()
	inherit := func(c *Config) {
		c.Environ = append(c.Environ, "LD_PRELOAD=/nonexistent/evil.so", "BASH_ENV=/nonexistent/rc")
		c.LoginPath = func() string { return "/opt/login/bin:/usr/bin" }
	}
	gw := newLocal(t, KindGateway, inherit)
	gwPrepend := newLocal(t, KindGateway, inherit)
	gwPrepend.SetSettings(Settings{PathPrepend: []string{"/opt/first"}})
	node := newLocal(t, KindNode, inherit)
	const show = `printf '%s|%s|%s|%s|%s' "${LD_PRELOAD-unset}" "${BASH_ENV-unset}" "${KEEP_ME-unset}" "${GREETING-unset}" "$PATH"`
	for _, tc := range []struct {
		name    string
		l       *Local
		env     map[string]string
		want    string
		errText string
	}{
		{"gateway", gw, nil, "unset|unset|kept|unset|/opt/login/bin:/usr/bin:/usr/local/bin:/bin", ""},
		{"gateway override", gw, map[string]string{"GREETING": "hi there"}, "unset|unset|kept|hi there|/opt/login/bin:/usr/bin:/usr/local/bin:/bin", ""},
		{"gateway pathPrepend", gwPrepend, nil, "unset|unset|kept|unset|/opt/first:/opt/login/bin:/usr/bin:/usr/local/bin:/bin", ""},
		{"gateway PATH", gw, map[string]string{"PATH": "/evil:" + testPath}, "", "Custom 'PATH' variable is forbidden"},
		{"gateway LD_PRELOAD", gw, map[string]string{"LD_PRELOAD": "/x.so"}, "", "'LD_PRELOAD' is forbidden"},
		{"node", node, nil, "unset|unset|kept|unset|" + testPath, ""},
		{"node PATH prepend", node, map[string]string{"PATH": "/opt/tools/bin:" + testPath}, "unset|unset|kept|unset|/opt/tools/bin:" + testPath, ""},
		{"node PATH replaced", node, map[string]string{"PATH": "/opt/tools/bin"}, "", "Custom 'PATH' variable is forbidden"},
		{"node PATH relative", node, map[string]string{"PATH": "tools:" + testPath}, "", "Custom 'PATH' variable is forbidden"},
		{"node Path spelled otherwise", node, map[string]string{"Path": "/opt/tools/bin:" + testPath}, "", "forbidden"},
		{"node LD_PRELOAD", node, map[string]string{"LD_PRELOAD": "/x.so"}, "", "'LD_PRELOAD' is forbidden"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			req := execReq(tc.l, show)
			req.Args.Env = tc.env
			got, err := runCmd(t, tc.l, req)
			if tc.errText != "" {
				if errType(err) != protocol.ErrSecurityViolation || !strings.Contains(err.Error(), tc.errText) {
					t.Fatalf("got %q %v, want a security violation mentioning %q", got, err, tc.errText)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q %v, want %q", got, err, tc.want)
			}
		})
	}
}

// TestWorkdir: an empty workdir is the host's cwd, a relative one is
// taken from it, and one that is not an existing directory is the
// "workdir unavailable" result (nothing runs), not an error.
func TestWorkdir(t *testing.T) {
	t.Parallel()
	l := newLocal(t, KindNode, nil)
	sub := filepath.Join(l.cfg.Cwd, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(l.cfg.Cwd, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	other := t.TempDir()
	other, _ = filepath.EvalSymlinks(other)
	for _, tc := range []struct {
		workdir string
		want    string // "" means unavailable
	}{
		{"", l.cfg.Cwd},
		{"sub", sub},
		{" " + other + " ", other},
		{other, other},
		{"/nonexistent/dir", ""},
		{"missing", ""},
		{file, ""},
		{"   ", ""},
	} {
		req := execReq(l, "pwd")
		req.Args.Workdir = tc.workdir
		rep, err := l.Exec(t.Context(), req)
		if err != nil {
			t.Errorf("workdir %q: %v", tc.workdir, err)
			continue
		}
		if tc.want == "" {
			if want := protocol.WorkdirUnavailableResult(tc.workdir); rep.Result.Text() != want.Text() || rep.Result.Status() != protocol.StatusFailed {
				t.Errorf("workdir %q: %q, want %q", tc.workdir, rep.Result.Text(), want.Text())
			}
			continue
		}
		if got := strings.TrimSpace(rep.Result.Text()); got != tc.want || rep.Result.Status() != protocol.StatusCompleted {
			t.Errorf("workdir %q: ran in %q (%s), want %q", tc.workdir, got, rep.Result.Status(), tc.want)
		}
	}
}

// writeApprovals writes the host's exec-approvals.json with f.
func writeApprovals(t *testing.T, l *Local, f func(*approvals.File) error) {
	t.Helper()
	if _, err := approvals.Update(approvals.Path(l.cfg.StateDir), f); err != nil {
		t.Fatal(err)
	}
}

// TestPolicyTightening: the effective policy is the gateway's resolved
// security and ask, capped by the host's own limits (a node's --security
// and --ask), and by the agent's entry of the host's approvals file; no
// layer loosens what another set. A request's unknown values mean the
// safe defaults (allowlist, on-miss); without a state dir askFallback is
// deny.
func TestPolicyTightening(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                  string
		security, ask         string
		settings              Settings
		file                  *approvals.Settings // the agent's entry
		noStateDir            bool
		wantSecurity, wantAsk string
		wantFallback          string
	}{
		{"request as is", "full", "off", Settings{}, nil, false, "full", "off", "deny"},
		{"host caps security", "full", "off", Settings{Security: "allowlist"}, nil, false, "allowlist", "off", "deny"},
		{"host cap does not loosen", "allowlist", "on-miss", Settings{Security: "full", Ask: "off"}, nil, false, "allowlist", "on-miss", "deny"},
		{"host caps ask", "full", "off", Settings{Ask: "always"}, nil, false, "full", "always", "deny"},
		{"host denies", "full", "off", Settings{Security: "deny"}, nil, false, "deny", "off", "deny"},
		{"file tightens", "full", "off", Settings{}, &approvals.Settings{Security: "allowlist", Ask: "on-miss"}, false, "allowlist", "on-miss", "deny"},
		{"file does not loosen", "allowlist", "always", Settings{}, &approvals.Settings{Security: "full", Ask: "off"}, false, "allowlist", "always", "deny"},
		{"file's fallback", "allowlist", "on-miss", Settings{}, &approvals.Settings{AskFallback: "allowlist"}, false, "allowlist", "on-miss", "allowlist"},
		{"unknown values", "bogus", "sometimes", Settings{}, nil, false, "allowlist", "on-miss", "deny"},
		{"no state dir", "full", "off", Settings{}, nil, true, "full", "off", "deny"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			l := newLocal(t, KindNode, func(c *Config) {
				if tc.noStateDir {
					c.StateDir = ""
				}
			})
			if tc.file != nil {
				writeApprovals(t, l, func(f *approvals.File) error {
					f.Agents["main"] = &approvals.Agent{Settings: *tc.file}
					return nil
				})
			}
			p := l.policy(tc.security, tc.ask, "main", &tc.settings)
			if p.Security != tc.wantSecurity || p.Ask != tc.wantAsk || p.AskFallback != tc.wantFallback {
				t.Fatalf("policy %s/%s/%s, want %s/%s/%s", p.Security, p.Ask, p.AskFallback, tc.wantSecurity, tc.wantAsk, tc.wantFallback)
			}
			// The run sees it: deny refuses, anything else runs a
			// command the allowlist needs no approval for under full.
			l.SetSettings(tc.settings)
			req := execReq(l, "true")
			req.Security, req.Ask = tc.security, tc.ask
			_, err := l.Exec(t.Context(), req)
			switch {
			case tc.wantSecurity == "deny":
				if errType(err) != protocol.ErrDenied {
					t.Errorf("exec under security deny: %v, want denied", err)
				}
			case tc.wantSecurity == "full" && tc.wantAsk == "off":
				if err != nil {
					t.Errorf("exec under full/off: %v", err)
				}
			}
		})
	}
	// A corrupt file loosens nothing: it counts as empty.
	l := newLocal(t, KindNode, nil)
	if err := os.WriteFile(approvals.Path(l.cfg.StateDir), []byte(`{"version":1,"agents":{"main":{"security":"full"`), 0o600); err != nil {
		t.Fatal(err)
	}
	if p := l.policy("allowlist", "on-miss", "main", &Settings{}); p.Security != "allowlist" || p.Ask != "on-miss" {
		t.Errorf("corrupt file: policy %+v", p)
	}
}

// TestConfinementModes: with the kernel confinement, an allowlisted
// program runs and runs only what is allowed; without it (no helper, or
// tools.exec.confine off) every program that is not a safe bin asks, and
// a pipeline of safe bins still runs, as judged.
func TestConfinementModes(t *testing.T) {
	t.Parallel()
	allow := func(l *Local) {
		writeApprovals(t, l, func(f *approvals.File) error {
			f.Agents["main"] = &approvals.Agent{Allowlist: []approvals.Entry{{Pattern: "/usr/bin/printenv"}, {Pattern: "/usr/bin/find"}}}
			return nil
		})
	}
	confined := newLocal(t, KindGateway, nil)
	if got := confined.Confinement(); got.Mode != ModeLandlock {
		t.Skipf("no kernel confinement here: %+v", got)
	}
	allow(confined)
	req := execReq(confined, "printenv OPENCLAW_SHELL")
	req.Security, req.Ask = "allowlist", "off"
	if got, err := runCmd(t, confined, req); err != nil || got != "exec" {
		t.Errorf("confined printenv: %q %v", got, err)
	}
	req = execReq(confined, "find . -maxdepth 0 -exec /usr/bin/id {} +")
	req.Security, req.Ask = "allowlist", "off"
	if got, _ := runCmd(t, confined, req); !strings.Contains(got, "exec refused by policy: /usr/bin/id") {
		t.Errorf("confined find -exec id: %q", got)
	}

	for name, cfg := range map[string]ConfineConfig{"no helper": {}, "off": {Off: true, Helper: "/proc/self/exe"}} {
		l := newLocal(t, KindGateway, func(c *Config) { c.Confine = cfg })
		if got := l.Confinement(); got.Mode != ModeAsk || got.Reason == "" {
			t.Fatalf("%s: %+v", name, got)
		}
		allow(l)
		req := execReq(l, "printenv OPENCLAW_SHELL")
		req.Security, req.Ask = "allowlist", "on-miss"
		var need *ApprovalNeededError
		if _, err := runCmd(t, l, req); !errors.As(err, &need) || !strings.Contains(need.Request.Reason, approvals.ReasonUnconfined) {
			t.Errorf("%s: allowlisted printenv did not ask: %v", name, err)
		}
		req.Ask = "off"
		if _, err := runCmd(t, l, req); errType(err) != protocol.ErrDenied || !strings.Contains(err.Error(), approvals.ReasonUnconfined) {
			t.Errorf("%s: with ask off: %v", name, err)
		}
		req = execReq(l, "head -c 0 | wc -l")
		req.Security, req.Ask = "allowlist", "off"
		if got, err := runCmd(t, l, req); err != nil || got != "0" {
			t.Errorf("%s: safe bins: %q %v", name, got, err)
		}
	}
}

// TestRequestChecks: what a host refuses before anything runs.
func TestRequestChecks(t *testing.T) {
	t.Parallel()
	notReady := errors.New("node is not paired")
	node := newLocal(t, KindNode, func(c *Config) { c.Ready = func() error { return notReady } })
	gw := newLocal(t, KindGateway, nil)
	for _, tc := range []struct {
		name string
		l    *Local
		edit func(*protocol.ExecRequest)
		want error
		text string
	}{
		{"no sessionKey", gw, func(r *protocol.ExecRequest) { r.SessionKey = " " }, nil, "sessionKey is required"},
		{"node target on the gateway", gw, func(r *protocol.ExecRequest) { r.Target = protocol.TargetNode }, nil, `exec target "node" is not served by this gateway host`},
		{"gateway target on a node", node, func(r *protocol.ExecRequest) { r.Target = protocol.TargetGateway }, nil, `exec target "gateway" is not served by this node host`},
		{"not ready", node, nil, notReady, ""},
		{"empty command", gw, func(r *protocol.ExecRequest) { r.Args.Command = "  " }, nil, "Provide a command to start."},
		{"bad session id", gw, func(r *protocol.ExecRequest) { r.SessionID = "Bad_Id" }, nil, "invalid session id"},
		// The text states the rule the session core applies.
		{"long session id", gw, func(r *protocol.ExecRequest) { r.SessionID = strings.Repeat("a", 65) }, nil, "want 1 to 64 lower-case letters, digits or '-', not starting with '-'"},
		{"session id starting with '-'", gw, func(r *protocol.ExecRequest) { r.SessionID = "-abc" }, nil, "not starting with '-'"},
		{"sandbox off", gw, func(r *protocol.ExecRequest) { r.Target = protocol.TargetSandbox }, nil, "sandbox runtime is off"},
		{"limits loosened", gw, func(r *protocol.ExecRequest) {
			r.Limits = &protocol.Limits{PidsMax: 10}
			r.Args.Limits = &protocol.Limits{PidsMax: 100}
		}, nil, "limits.pidsMax"},
	} {
		req := execReq(tc.l, "echo ran")
		if tc.edit != nil {
			tc.edit(&req)
		}
		rep, err := tc.l.Exec(t.Context(), req)
		switch {
		case err == nil:
			t.Errorf("%s: ran: %q", tc.name, rep.Result.Text())
		case tc.want != nil && !errors.Is(err, tc.want):
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		case tc.text != "" && !strings.Contains(err.Error(), tc.text):
			t.Errorf("%s: %v, want it to mention %q", tc.name, err, tc.text)
		}
	}
}

// TestShellFromEnviron: commands run in the shell of the environment the
// host was given (Config.Environ), not the one of the process that embeds
// it; an explicit Session.Shell wins.
func TestShellFromEnviron(t *testing.T) {
	if _, err := os.Stat("/bin/bash"); err != nil {
		t.Skip("no /bin/bash")
	}
	for _, tc := range []struct {
		name, environ, process, explicit, want string
	}{
		{name: "environ sh, process bash", environ: "/bin/sh", process: "/bin/bash", want: "/bin/sh"},
		{name: "environ bash, process sh", environ: "/bin/bash", process: "/bin/sh", want: "/bin/bash"},
		{name: "explicit shell wins", environ: "/bin/bash", process: "/bin/bash", explicit: "/bin/sh", want: "/bin/sh"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("SHELL", tc.process)
			l := newLocal(t, KindGateway, func(c *Config) {
				c.Environ = []string{"PATH=" + testPath, "HOME=" + c.Cwd, "SHELL=" + tc.environ, "LANG=C"}
				c.Session.Shell = tc.explicit
			})
			out, err := runCmd(t, l, execReq(l, `echo "$0"`))
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.TrimSpace(out); got != tc.want {
				t.Errorf("shell %q, want %q", got, tc.want)
			}
		})
	}
}

// TestConfinedTMPDIRRemoved: a confined run gets a TMPDIR of its own,
// which it may write, and which is gone once its last process is.
func TestConfinedTMPDIRRemoved(t *testing.T) {
	t.Parallel()
	l := newLocal(t, KindGateway, nil)
	if got := l.Confinement(); got.Mode != ModeLandlock {
		t.Skipf("no kernel confinement here: %+v", got)
	}
	writeApprovals(t, l, func(f *approvals.File) error {
		f.Agents["main"] = &approvals.Agent{Allowlist: []approvals.Entry{{Pattern: "/usr/bin/printenv"}}}
		return nil
	})
	req := execReq(l, "printenv TMPDIR")
	req.Security, req.Ask = "allowlist", "off"
	tmp, err := runCmd(t, l, req)
	if err != nil || !filepath.IsAbs(tmp) || !strings.Contains(filepath.Base(tmp), "execmesh-") {
		t.Fatalf("TMPDIR %q %v", tmp, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(tmp); os.IsNotExist(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the session's TMPDIR %s is still there", tmp)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestLaterRead: a workdir in or above the system's directories, above
// the home directory or another account's, another account's home
// itself, or a dot-directory of any home is no place for a confined
// command to write; a project directory, the user's own home (documented)
// and the temporary directory are.
func TestLaterRead(t *testing.T) {
	home := "/home/u"
	tests := []struct{ workdir, want string }{
		{"/etc", "/etc"},
		{"/etc/cron.d", "/etc"},
		{"/usr/local/lib", "/usr"},
		{"/var", "/var/lib"},
		{"/var/spool/cron", "/var/spool"},
		{"/boot", "/boot"},
		{"/home", "/home/u"},
		{"/home/u/.ssh", "/home/u/.ssh"},
		{"/home/u/.config/autostart", "/home/u/.config"},
		{"/home/u", ""},
		{"/home/u/project", ""},
		{"/home/u/project/.git", ""},
		{"/srv/app", ""},
		{"/tmp/x", ""},
		{"/var/tmp/x", ""},
		{"/etcetera", ""},
		{"/opt", "/opt"},
		{"/run/user/0/systemd", "/run"},
		{"/home/v", "/home/v"},
		{"/home/v/.bashrc.d", "/home/v/.bashrc.d"},
		{"/home/v/project", ""},
		{"/var/www", "/var/www"},
		{"/var/www/site", ""},
	}
	others := []string{"/home/v", "/var/www", home}
	for _, tt := range tests {
		if got := laterRead(tt.workdir, home, others); got != tt.want {
			t.Errorf("laterRead(%q, %q) = %q, want %q", tt.workdir, home, got, tt.want)
		}
	}
	if got := laterRead("/home", "", nil); got != "" {
		t.Errorf("without a home: %q", got)
	}
}
