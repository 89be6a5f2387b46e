package host

import (
	"bufio"
	"bytes"
	"context"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/execmesh/execmesh/approvals"
	"github.com/execmesh/execmesh/protocol"
)

// gatewayEnv builds the environment of a host=gateway command: the
// request's overrides checked against the blocklists (a PATH is refused),
// the inherited environment filtered, the login shell's PATH merged in and
// tools.exec.pathPrepend in front.
func (l *Local) gatewayEnv(overrides map[string]string, s *Settings) ([]string, error) {
	if err := protocol.ValidateHostEnvOverrides(overrides); err != nil {
		return nil, err
	}
	lp := l.loginPath()
	if len(overrides) == 0 {
		if env, ok := l.envCache.get(s, lp); ok {
			return env, nil
		}
	}
	env, _, _ := protocol.SanitizeHostEnv(l.baseEnv, overrides, true)
	if lp != "" {
		env["PATH"] = mergePathEntries(lp, env["PATH"])
	}
	if len(s.PathPrepend) > 0 {
		env["PATH"] = protocol.MergePathPrepend(s.PathPrepend, env["PATH"])
	}
	list := protocol.EnvList(env)
	if len(overrides) == 0 {
		l.envCache.put(s, lp, list)
	}
	return list, nil
}

// CheckAllowlistEnv refuses a request env that sets a key outside
// allowed when the run's effective security is allowlist (DESIGN.md §3.4:
// only keys of tools.exec.allowlistEnv may be set by a request). The
// blocklists (protocol.ValidateHostEnvOverrides) still apply on top;
// under security full and deny only they do. allowed nil means
// protocol.DefaultAllowlistEnv; an empty, non-nil list lets a request set
// nothing. Keys are matched as sent, untrimmed: " TERM" is not TERM. The
// error is an ErrSecurityViolation that names every refused key, before
// anything runs.
func CheckAllowlistEnv(requested map[string]string, security string, allowed []string) error {
	if security != approvals.SecurityAllowlist || len(requested) == 0 {
		return nil
	}
	if allowed == nil {
		allowed = protocol.DefaultAllowlistEnv()
	}
	var refused []string
	for k := range requested {
		if !protocol.AllowlistEnvAllows(allowed, k) {
			refused = append(refused, strconv.Quote(k))
		}
	}
	if len(refused) == 0 {
		return nil
	}
	slices.Sort(refused)
	what := "env " + refused[0]
	if len(refused) > 1 {
		what = "env keys " + strings.Join(refused, ", ")
	}
	list := "none"
	if len(allowed) > 0 {
		list = strings.Join(allowed, ", ")
	}
	return protocol.Errorf(protocol.ErrSecurityViolation,
		"Security Violation: %s may not be set by a request under security allowlist (allowed: tools.exec.allowlistEnv: %s).", what, list)
}

// checkRequestEnv applies CheckAllowlistEnv to req under its effective
// policy. The policy is computed only when the request sets env: it reads
// the approvals file (through its cache).
func (l *Local) checkRequestEnv(req protocol.ExecRequest, s *Settings) error {
	if len(req.Args.Env) == 0 {
		return nil
	}
	return CheckAllowlistEnv(req.Args.Env, l.policy(req.Security, req.Ask, req.AgentID, s).Security, s.AllowlistEnv)
}

// envCache keeps the environment of calls without overrides, which
// depends only on the host's own environment, the login shell's PATH and
// the settings: filtering it costs tens of microseconds per call.
type envCache struct {
	mu        sync.Mutex
	ok        bool
	settings  *Settings // the settings it was built with (SetSettings replaces the pointer)
	loginPath string
	env       []string
}

// get returns a copy of the cached environment if it was built from s
// and loginPath.
func (c *envCache) get(s *Settings, loginPath string) ([]string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.ok || c.settings != s || c.loginPath != loginPath {
		return nil, false
	}
	return slices.Clone(c.env), true
}

func (c *envCache) put(s *Settings, loginPath string, env []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ok, c.settings, c.loginPath, c.env = true, s, loginPath, slices.Clone(env)
}

// nodeEnv builds the environment of a host=node command from the node's
// own environment and the request's overrides (DESIGN.md §7): overrides
// are checked with protocol.ValidateHostEnvOverrides, except that a PATH
// is accepted when it only prepends absolute directories to the node's own
// PATH (protocol.NodePathOverrideAllowed). A refused request is an
// *protocol.Error with OpenClaw's Security Violation text.
func (l *Local) nodeEnv(requested map[string]string) ([]string, error) {
	overrides := maps.Clone(requested)
	pathValue, hasPath := "", false
	for k, v := range requested {
		if !strings.EqualFold(strings.TrimSpace(k), "PATH") {
			continue
		}
		// Only the exact key PATH may prepend; "Path" or " PATH" would
		// become a second variable that some programs read instead.
		if k != "PATH" || !protocol.NodePathOverrideAllowed(v, l.baseEnv["PATH"]) {
			if err := protocol.ValidateHostEnvOverrides(requested); err != nil {
				return nil, err
			}
			return nil, protocol.Errorf(protocol.ErrSecurityViolation, "Security Violation: Custom 'PATH' variable is forbidden during host execution.")
		}
		pathValue, hasPath = v, true
		delete(overrides, k)
	}
	if err := protocol.ValidateHostEnvOverrides(overrides); err != nil {
		return nil, err
	}
	if len(requested) == 0 {
		// Only the node's own environment: the same for every such call.
		if env, ok := l.envCache.get(nil, ""); ok {
			return env, nil
		}
	}
	env, _, _ := protocol.SanitizeHostEnv(l.baseEnv, overrides, true)
	if hasPath {
		env["PATH"] = pathValue
	}
	list := protocol.EnvList(env)
	if len(requested) == 0 {
		l.envCache.put(nil, "", list)
	}
	return list, nil
}

// sandboxOverrides checks the request env of a host=sandbox command with
// the same blocklists as the other hosts (DESIGN.md §7: request env
// filtering applies on every host). A PATH is allowed there: the sandbox
// adds it after the login profile through an internal variable.
func sandboxOverrides(requested map[string]string) error {
	rest := make(map[string]string, len(requested))
	for k, v := range requested {
		if k != "PATH" {
			rest[k] = v
		}
	}
	return protocol.ValidateHostEnvOverrides(rest)
}

// resolveWorkdir resolves a requested workdir on this host: empty means
// the host's default; a relative path is taken from the default; the
// result must be an existing directory. ok is false when it is not.
func (l *Local) resolveWorkdir(requested string) (dir string, ok bool) {
	if requested == "" {
		return l.cfg.Cwd, true
	}
	dir = strings.TrimSpace(requested)
	if dir == "" {
		return requested, false
	}
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(l.cfg.Cwd, dir)
	}
	st, err := os.Stat(dir)
	if err != nil || !st.IsDir() {
		return requested, false
	}
	return dir, true
}

// mergePathEntries puts the entries of front ahead of path, de-duplicated
// (first occurrence wins) and without empty entries.
func mergePathEntries(front, path string) string {
	seen := map[string]bool{}
	var out []string
	for _, part := range append(strings.Split(front, ":"), strings.Split(path, ":")...) {
		part = strings.TrimSpace(part)
		if part == "" || seen[part] {
			continue
		}
		seen[part] = true
		out = append(out, part)
	}
	return strings.Join(out, ":")
}

// loginShellProbeTimeout bounds the one-time login-shell PATH probe.
const loginShellProbeTimeout = 15 * time.Second

// ProbeLoginShellPath asks the user's login shell for its PATH, as
// OpenClaw does (spec §7.4): $SHELL when absolute and listed in
// /etc/shells, else /bin/sh; `-l -c 'env -0'`; stdin closed; 15 s bound.
// lookup reads the daemon's environment. It returns "" on any failure.
func ProbeLoginShellPath(lookup func(string) string) string {
	shell := lookup("SHELL")
	if !filepath.IsAbs(shell) || filepath.Clean(shell) != shell || !listedInEtcShells(shell) {
		shell = "/bin/sh"
	}
	ctx, cancel := context.WithTimeout(context.Background(), loginShellProbeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, shell, "-l", "-c", "env -0")
	// Every variable from the daemon's environment, HOME too: the login
	// shell reads that home's profile, not the embedding process's.
	cmd.Env = []string{"HOME=" + lookup("HOME"), "PATH=" + lookup("PATH"), "USER=" + lookup("USER"), "LANG=" + lookup("LANG")}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	var out bytes.Buffer
	cmd.Stdout = &limitedWriter{w: &out, n: 2 << 20}
	if err := cmd.Run(); err != nil {
		return ""
	}
	for _, kv := range bytes.Split(out.Bytes(), []byte{0}) {
		if k, v, ok := strings.Cut(string(kv), "="); ok && k == "PATH" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func listedInEtcShells(shell string) bool {
	f, err := os.Open("/etc/shells")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line != "" && !strings.HasPrefix(line, "#") && line == shell {
			return true
		}
	}
	return false
}

// limitedWriter keeps the first n bytes written to it.
type limitedWriter struct {
	w *bytes.Buffer
	n int
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	if room := l.n - l.w.Len(); room > 0 {
		l.w.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}
