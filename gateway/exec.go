package gateway

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"

	"github.com/execmesh/execmesh/protocol"
	"github.com/execmesh/execmesh/sandbox"
	"github.com/execmesh/execmesh/session"
)

// warnBackgroundDisabled is prefixed when the process tool is denied and a
// call asked for background or yieldMs (spec §11).
const warnBackgroundDisabled = "Warning: background execution is disabled; running synchronously."

// plan is an exec call after resolution, ready to run on its host.
type plan struct {
	host       string // sandbox, gateway or node
	args       protocol.ExecArgs
	security   string
	ask        string
	node       string
	warnings   []string
	sync       bool
	background bool
	limits     protocol.Limits // effective resource limits (effectiveLimits)
}

func (c *call) exec(ctx context.Context, args protocol.ExecArgs) (protocol.Result, error) {
	p := plan{args: args, background: args.Background}
	defaults := c.g.sessionDefaults(c.sessionKey)
	limits, err := effectiveLimits(&c.cfg, c.agentID, args.Limits)
	if err != nil {
		return protocol.Result{}, err
	}
	p.limits = limits

	// The process tool denied means no pollable sessions: run synchronously.
	if !toolAllowed(&c.cfg, c.agentID, protocol.ToolProcess, "") {
		p.sync = true
		if args.Background || args.YieldMs != nil {
			p.warnings = append(p.warnings, warnBackgroundDisabled)
		}
	}

	elevated := args.Elevated != nil && *args.Elevated
	if elevated {
		if err := checkElevated(&c.cfg, c.agentID, c.sessionKey); err != nil {
			return protocol.Result{}, err
		}
	}

	requested, err := parseRequestedHost(args.Host)
	if err != nil {
		return protocol.Result{}, err
	}
	if requested == "" && defaults.Host != "" {
		requested = defaults.Host
	}
	configured := configuredHost(&c.cfg, c.agentID)
	sandboxOn := c.cfg.Sandbox.Mode != "off"
	p.host, err = resolveHost(configured, requested, sandboxOn, elevated)
	if err != nil {
		return protocol.Result{}, err
	}

	// Security and ask only tighten from the configured values (spec §5).
	p.security, p.ask = c.policy(configured, sandboxOn, defaults, args)
	if p.host != hostSandbox && p.security == "deny" {
		return protocol.Result{}, protocol.Errorf(protocol.ErrDenied, "exec denied: host=%s security=deny", p.host)
	}

	switch p.host {
	case hostSandbox:
		return c.runSandbox(ctx, &p)
	case hostGateway:
		return c.runGateway(ctx, &p)
	default:
		return c.runNode(ctx, &p)
	}
}

// policy resolves the effective security and ask modes.
func (c *call) policy(configured string, sandboxOn bool, d SessionExecDefaults, args protocol.ExecArgs) (security, ask string) {
	security = c.cfg.Tools.Exec.Security
	ask = c.cfg.Tools.Exec.Ask
	if a, ok := c.cfg.Agent(c.agentID); ok {
		if a.Tools.Exec.Security != "" {
			security = a.Tools.Exec.Security
		}
		if a.Tools.Exec.Ask != "" {
			ask = a.Tools.Exec.Ask
		}
	}
	if security == "" {
		// DESIGN.md §3.4: deny when the configured host is the sandbox,
		// allowlist for gateway and node hosts.
		if configured == hostSandbox || (configured == "auto" && sandboxOn) {
			security = "deny"
		} else {
			security = "allowlist"
		}
	}
	if ask == "" {
		ask = "on-miss"
	}
	for _, v := range []string{d.Security, strings.ToLower(strings.TrimSpace(args.Security))} {
		if v != "" {
			security = minSecurity(security, v)
		}
	}
	for _, v := range []string{d.Ask, strings.ToLower(strings.TrimSpace(args.Ask))} {
		if v != "" {
			ask = maxAsk(ask, v)
		}
	}
	return security, ask
}

// localWorkdir resolves the working directory of a gateway-host command.
// ok is false when an explicit workdir cannot be used.
func (c *call) localWorkdir(requested string) (dir string, ok bool) {
	if requested == "" {
		return c.g.opts.Cwd, true
	}
	dir = strings.TrimSpace(requested)
	if dir == "" {
		return requested, false
	}
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(c.g.opts.Cwd, dir)
	}
	st, err := os.Stat(dir)
	if err != nil || !st.IsDir() {
		return requested, false
	}
	return dir, true
}

// hostEnv builds the environment of a gateway-host command: the request env
// checked against the blocklists, the inherited env filtered, the login
// shell's PATH merged and tools.exec.pathPrepend in front.
func (c *call) hostEnv(overrides map[string]string) ([]string, error) {
	if err := protocol.ValidateHostEnvOverrides(overrides); err != nil {
		return nil, err
	}
	env, _, _ := protocol.SanitizeHostEnv(protocol.EnvMap(c.g.opts.Environ), overrides, true)
	if lp := c.g.loginPath(); lp != "" {
		env["PATH"] = mergePathEntries(lp, env["PATH"])
	}
	if len(c.cfg.Tools.Exec.PathPrepend) > 0 {
		env["PATH"] = protocol.MergePathPrepend(c.cfg.Tools.Exec.PathPrepend, env["PATH"])
	}
	return protocol.EnvList(env), nil
}

// sessionRequest turns a plan into the session core's request.
func (c *call) sessionRequest(p *plan, workdir string, env []string) session.ExecRequest {
	return session.ExecRequest{
		Command:     p.args.Command,
		Workdir:     workdir,
		Env:         env,
		YieldMs:     p.args.YieldMs,
		Background:  p.background,
		TimeoutSec:  p.args.Timeout,
		PTY:         p.args.PTY,
		Synchronous: p.sync,
		ScopeKey:    c.sessionKey,
		Warnings:    p.warnings,
		Limits:      p.limits,
	}
}

func (c *call) runGateway(ctx context.Context, p *plan) (protocol.Result, error) {
	env, err := c.hostEnv(p.args.Env)
	if err != nil {
		return protocol.Result{}, err
	}
	workdir, ok := c.localWorkdir(p.args.Workdir)
	if !ok {
		return protocol.WorkdirUnavailableResult(p.args.Workdir), nil
	}
	run, pending, err := c.authorizeGateway(ctx, p, c.sessionRequest(p, workdir, env))
	if err != nil {
		return protocol.Result{}, err
	}
	if pending != nil {
		return *pending, nil
	}
	return c.g.local.Exec(ctx, *run)
}

// runSandbox runs a host=sandbox call. With sandbox.mode off the command
// runs directly on the gateway host without approvals (DESIGN.md §3.3); the
// request env is not blocklisted there, and a requested PATH is applied
// after the shell starts through an internal variable.
func (c *call) runSandbox(ctx context.Context, p *plan) (protocol.Result, error) {
	if c.g.sandbox.Mode() != sandbox.ModeOff {
		return c.runBwrap(ctx, p)
	}
	workdir, ok := c.localWorkdir(p.args.Workdir)
	if !ok {
		return protocol.WorkdirUnavailableResult(p.args.Workdir), nil
	}
	env, _, _ := protocol.SanitizeHostEnv(protocol.EnvMap(c.g.opts.Environ), nil, true)
	var prepend []string
	for k, v := range p.args.Env {
		if strings.EqualFold(k, "PATH") {
			if v != "" {
				prepend = append(prepend, v)
			}
			continue
		}
		env[k] = v
	}
	prepend = append(prepend, c.cfg.Tools.Exec.PathPrepend...)
	req := c.sessionRequest(p, workdir, nil)
	if len(prepend) > 0 {
		env["OPENCLAW_PREPEND_PATH"] = strings.Join(prepend, ":")
		req.Argv = []string{"/bin/sh", "-c", `export PATH="${OPENCLAW_PREPEND_PATH}:$PATH"; unset OPENCLAW_PREPEND_PATH; ` + p.args.Command}
	}
	req.Env = protocol.EnvList(env)
	return c.g.local.Exec(ctx, req)
}

// runBwrap runs a host=sandbox call inside the sandbox runtime: the
// agent's workspace read-write, the rest read-only, no network unless
// configured (DESIGN.md §3.3).
func (c *call) runBwrap(ctx context.Context, p *plan) (protocol.Result, error) {
	rt := c.g.sandbox
	if err := rt.Available(); err != nil {
		return protocol.Result{}, protocol.Errorf(protocol.ErrHostNotAllowed, "exec host=sandbox: %v", err)
	}
	prep, err := rt.Prepare(sandbox.Request{
		AgentID:     c.agentID,
		Command:     p.args.Command,
		Workdir:     p.args.Workdir,
		Env:         p.args.Env,
		PathPrepend: c.cfg.Tools.Exec.PathPrepend,
		PTY:         p.args.PTY,
	})
	var wdErr *sandbox.WorkdirError
	if errors.As(err, &wdErr) {
		return protocol.WorkdirUnavailableResult(p.args.Workdir), nil
	}
	if err != nil {
		return protocol.Result{}, protocol.Errorf(protocol.ErrInvalidRequest, "exec host=sandbox: %v", err)
	}
	req := c.sessionRequest(p, prep.Workdir, prep.Env)
	req.Argv = prep.Argv
	return c.g.local.Exec(ctx, req)
}

// runNode runs a host=node call on a node agent.
func (c *call) runNode(ctx context.Context, p *plan) (protocol.Result, error) {
	nodes := c.g.nodeBackend()
	if nodes == nil {
		return protocol.Result{}, protocol.Errorf(protocol.ErrHostNotAllowed, "exec host=node requires a paired node (none available). This requires a companion app or node host.")
	}
	req := NodeExecRequest{
		SessionKey: c.sessionKey,
		AgentID:    c.agentID,
		Requested:  strings.TrimSpace(p.args.Node),
		ConfigNode: c.cfg.Tools.Exec.Node,
		Args:       p.args,
		Security:   p.security,
		Ask:        p.ask,
		Warnings:   p.warnings,
		Sync:       p.sync,
		Limits:     p.limits,
	}
	if req.Requested == "" {
		req.Requested = c.g.sessionDefaults(c.sessionKey).Node
	}
	if a, ok := c.cfg.Agent(c.agentID); ok {
		req.AgentNode = a.Tools.Exec.Node
	}
	if len(c.cfg.Tools.Exec.PathPrepend) > 0 {
		req.Warnings = append(req.Warnings, protocol.PathPrependIgnoredOnNodeWarning)
	}
	// The request env is checked here as for host=gateway (DESIGN.md §7);
	// the node applies its own policy again.
	if err := protocol.ValidateHostEnvOverrides(p.args.Env); err != nil {
		return protocol.Result{}, err
	}
	return nodes.Exec(ctx, req)
}
