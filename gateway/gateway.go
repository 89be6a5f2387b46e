package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-multierror"

	"github.com/execmesh/execmesh/metrics"
	"github.com/execmesh/execmesh/protocol"
	"github.com/execmesh/execmesh/sandbox"
	"github.com/execmesh/execmesh/session"
)

// Options carries what the gateway gets from its host process rather than
// from the configuration file.
type Options struct {
	// Logger receives the gateway's logs; nil discards them.
	Logger *slog.Logger
	// Environ is the environment inherited by gateway-host commands before
	// filtering; nil means os.Environ().
	Environ []string
	// Cwd is the default working directory of gateway-host commands; empty
	// means the process working directory.
	Cwd string
	// ConfigPath is re-read by Reload (SIGHUP); empty disables reloading.
	ConfigPath string
	// Getenv reads OPENCLAW_BASH_* overrides for the session core; nil
	// means os.Getenv.
	Getenv func(string) string
	// Metrics, when set, records calls, sessions, approvals and nodes.
	Metrics *metrics.Metrics
	// LoginShellPath returns the login shell's PATH to merge into
	// gateway-host commands; nil probes the login shell once (spec §7.4).
	LoginShellPath func() string
	// Reaper is the process's session Reaper, shared with the other
	// Managers of the process (`execmesh up`'s local node); nil makes the
	// gateway's session core start its own.
	Reaper *session.Reaper
}

// Gateway serves the exec and process tools. Its zero value is not usable;
// build one with New and release it with Close.
type Gateway struct {
	opts Options
	log  *slog.Logger

	cfgMu sync.RWMutex
	cfg   Config

	local     *session.Manager
	sandbox   sandbox.Runtime
	events    *eventQueue
	limiter   *authLimiter
	approvals *approvalStore

	// bg is the root of work that outlives a call (approval waits); Close
	// cancels it and waits for bgWG.
	bg       context.Context
	bgCancel context.CancelFunc
	bgWG     sync.WaitGroup

	defaultsMu   sync.Mutex
	execDefaults map[string]SessionExecDefaults // per sessionKey (/exec)

	loginPath func() string // login-shell PATH, probed once

	closing   atomic.Bool
	closeOnce sync.Once
	closeErr  error
	natsMu    sync.Mutex
	nats      *natsAPI
	nodes     nodeBackend
	// publish, when set, mirrors system events onto NATS.
	publish func(protocol.SystemEvent)
	// routes are extra HTTP routes (nodes, approvals).
	routes []route
}

// SessionExecDefaults are per-sessionKey exec defaults set through
// PUT /v1/sessions/<sessionKey>/exec. Empty fields are unset.
type SessionExecDefaults struct {
	Host     string `json:"host,omitempty"`
	Security string `json:"security,omitempty"`
	Ask      string `json:"ask,omitempty"`
	Node     string `json:"node,omitempty"`
}

// New builds a gateway from a validated configuration.
func New(ctx context.Context, cfg Config, opts Options) (*Gateway, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Gateway.Auth.Token == "" && !isLoopbackListen(cfg.Gateway.Listen) {
		return nil, fmt.Errorf("gateway.listen: refusing to listen on non-loopback address %s without gateway.auth.token (EXECMESH_GATEWAY_TOKEN)", cfg.Gateway.Listen)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Environ == nil {
		opts.Environ = os.Environ()
	}
	if opts.Cwd == "" {
		wd, err := os.Getwd()
		if err != nil {
			return nil, fmt.Errorf("working directory: %w", err)
		}
		opts.Cwd = wd
	}
	if opts.Getenv == nil {
		opts.Getenv = os.Getenv
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("stateDir: %w", err)
	}
	g := &Gateway{
		opts:         opts,
		log:          opts.Logger,
		cfg:          cfg,
		events:       openEventQueue(filepath.Join(cfg.StateDir, "events.json"), opts.Logger.With("component", "events")),
		limiter:      newAuthLimiter(),
		execDefaults: map[string]SessionExecDefaults{},
		approvals:    newApprovalStore(),
	}
	g.bg, g.bgCancel = context.WithCancel(context.WithoutCancel(ctx))
	g.loginPath = opts.LoginShellPath
	if g.loginPath == nil {
		g.loginPath = sync.OnceValue(func() string { return probeLoginShellPath(envLookup(opts.Environ)) })
	}

	scfgSandbox := cfg.Sandbox
	scfgSandbox.Hide = append(slices.Clone(scfgSandbox.Hide), cfg.StateDir)
	rt, err := sandbox.New(scfgSandbox)
	if err != nil {
		return nil, err
	}
	g.sandbox = rt

	scfg := session.DefaultConfig()
	scfg.ApplyEnv(opts.Getenv)
	scfg.Logger = opts.Logger.With("component", "session")
	applySessionConfig(&scfg, cfg)
	scfg.Reaper = opts.Reaper
	scfg.StateDir = filepath.Join(cfg.StateDir, "sessions", "gateway")
	scfg.OnLost = func(l session.LostSession) {
		// The exec.lost event for the session's agent comes with the
		// event queues' rework (issue 17); until then the log says it.
		g.log.Warn("session lost by an earlier run", "session", l.SessionID, "sessionKey", l.SessionKey,
			"command", l.Command, "startedAt", l.StartedAt, "reason", l.Reason)
	}
	scfg.OnExit = g.onLocalExit
	scfg.OnAcknowledged = func(scope, id string) { g.events.acknowledge(scope, "exec:"+id) }
	if opts.Metrics != nil {
		scfg.OnOutput = opts.Metrics.AddOutputBytes
		scfg.OnUsage = opts.Metrics.ObserveUsage
	}
	m, err := session.NewManager(scfg)
	if err != nil {
		return nil, fmt.Errorf("session core: %w", err)
	}
	for key, l := range configuredLimits(&cfg) {
		if err := m.CheckLimits(l); err != nil {
			_ = m.Close(context.Background())
			return nil, fmt.Errorf("%s: %w", key, err)
		}
	}
	g.local = m
	opts.Metrics.RegisterSessionsFunc(m.Counts)
	opts.Metrics.SetConnectedNodes(func() int {
		n := 0
		for _, v := range g.Nodes() {
			if v.Status == "connected" && v.Paired {
				n++
			}
		}
		return n
	})
	return g, nil
}

// applySessionConfig copies the tools.exec settings the session core uses.
func applySessionConfig(s *session.Config, cfg Config) {
	e := cfg.Tools.Exec
	if e.BackgroundMs > 0 {
		s.DefaultYieldMs = e.BackgroundMs
	}
	s.DefaultTimeoutSec = e.TimeoutSec
	if e.CleanupMs > 0 {
		s.JobTTL = time.Duration(e.CleanupMs) * time.Millisecond
	}
	s.KillGrace = time.Duration(e.KillGraceMs) * time.Millisecond
	s.NotifyOnExit = e.NotifyOnExit
	s.NotifyOnExitEmptySuccess = e.NotifyOnExitEmptySuccess
	s.Containment = e.Containment
}

// Config returns a copy of the configuration in force.
func (g *Gateway) Config() Config {
	g.cfgMu.RLock()
	defer g.cfgMu.RUnlock()
	return g.cfg
}

// Reload re-reads the configuration file (SIGHUP). Sessions are kept; the
// listen addresses and state dir cannot change without a restart.
func (g *Gateway) Reload() error {
	if g.opts.ConfigPath == "" {
		return errors.New("no configuration file to reload")
	}
	cfg, err := LoadConfig(g.opts.ConfigPath, nil)
	if err != nil {
		return err
	}
	g.cfgMu.Lock()
	old := g.cfg
	cfg.Gateway.Listen, cfg.StateDir, cfg.NATS = old.Gateway.Listen, old.StateDir, old.NATS
	g.cfg = cfg
	g.cfgMu.Unlock()
	g.log.Info("configuration reloaded", "path", g.opts.ConfigPath)
	return nil
}

// onLocalExit turns a local session's exit into a system event.
func (g *Gateway) onLocalExit(ev protocol.ExitEvent) {
	if !ev.Notify || ev.Text == "" || ev.SessionKey == "" {
		return
	}
	g.emit(protocol.SystemEvent{
		SessionKey: ev.SessionKey,
		ContextKey: "exec:" + ev.SessionID,
		Kind:       protocol.EventExecExit,
		Text:       ev.Text,
	})
}

// emit queues a system event and mirrors it onto NATS.
func (g *Gateway) emit(ev protocol.SystemEvent) {
	if !g.events.push(ev) {
		return
	}
	g.natsMu.Lock()
	publish := g.publish
	g.natsMu.Unlock()
	if publish != nil {
		publish(ev)
	}
}

// Events returns and acknowledges the queued events of sessionKey, waiting
// up to wait for the first one.
func (g *Gateway) Events(ctx context.Context, sessionKey string, wait time.Duration) []protocol.SystemEvent {
	return g.events.take(ctx, sessionKey, wait)
}

// Blockers lists the gateway-host sessions that block a safe restart.
func (g *Gateway) Blockers() []session.Blocker { return g.local.Blockers() }

// Authed wraps h with the gateway's bearer-token check and failure rate
// limit, for handlers mounted beside the API (such as /mcp and /metrics).
func (g *Gateway) Authed(h http.Handler) http.Handler { return g.authed(h.ServeHTTP) }

// Close stops taking calls and ends every gateway-host process tree.
func (g *Gateway) Close(ctx context.Context) error {
	g.closeOnce.Do(func() {
		g.closing.Store(true)
		var errs *multierror.Error
		// The node backend first: it stops taking node messages and
		// drains the exit-event consumer (idempotent with CloseNodes).
		if nodes := g.nodeBackend(); nodes != nil {
			if err := nodes.Close(ctx); err != nil {
				errs = multierror.Append(errs, fmt.Errorf("node backend: %w", err))
			}
		}
		g.natsMu.Lock()
		api := g.nats
		g.nats, g.publish = nil, nil
		g.natsMu.Unlock()
		if api != nil {
			api.stop()
		}
		g.bgCancel()
		g.bgWG.Wait()
		if err := g.local.Close(ctx); err != nil {
			errs = multierror.Append(errs, fmt.Errorf("session core: %w", err))
		}
		g.closeErr = errs.ErrorOrNil()
	})
	return g.closeErr
}

// InvokeRequest is one tool call, from HTTP or NATS.
type InvokeRequest struct {
	Tool       string          `json:"tool"`
	Args       json.RawMessage `json:"args,omitempty"`
	SessionKey string          `json:"sessionKey,omitempty"`
	Model      string          `json:"model,omitempty"`
}

// sessionKeyRe is agent:<agentId>:<rest>.
var sessionKeyRe = regexp.MustCompile(`^agent:([a-z0-9][a-z0-9_-]{0,63}):([A-Za-z0-9._:@/+=-]{1,190})$`)

// ParseSessionKey validates a sessionKey and returns its agent id. The empty
// key is the default `agent:main:main`.
func ParseSessionKey(key string) (sessionKey, agentID string, err error) {
	if key == "" {
		key = DefaultSessionKey
	}
	m := sessionKeyRe.FindStringSubmatch(key)
	if m == nil {
		return "", "", protocol.Errorf(protocol.ErrInvalidRequest, "invalid sessionKey %q: expected agent:<agentId>:<name> (agent id: lower-case letters, digits, '-', '_')", key)
	}
	return key, m[1], nil
}

// toolAllowed applies tools.allow/tools.deny and the agent's tools.deny.
// apply_patch is a sub-tool of exec: allowing exec allows it, denying exec
// denies it, and it must be enabled (and the model allowed) on its own.
func toolAllowed(cfg *Config, agentID, tool, model string) bool {
	names := []string{tool}
	if tool == protocol.ToolApplyPatch {
		ap := cfg.Tools.Exec.ApplyPatch
		if !ap.Enabled || (len(ap.AllowModels) > 0 && !slices.Contains(ap.AllowModels, model)) {
			return false
		}
		names = append(names, protocol.ToolExec)
	}
	if len(cfg.Tools.Allow) > 0 && !slices.ContainsFunc(names, func(n string) bool { return slices.Contains(cfg.Tools.Allow, n) }) {
		return false
	}
	denied := func(list []string) bool {
		return slices.ContainsFunc(names, func(n string) bool { return slices.Contains(list, n) })
	}
	if denied(cfg.Tools.Deny) {
		return false
	}
	if a, ok := cfg.Agent(agentID); ok && denied(a.Tools.Deny) {
		return false
	}
	return true
}

// Invoke runs one tool call. The error, when not nil, is a *protocol.Error
// raised before anything ran.
func (g *Gateway) Invoke(ctx context.Context, req InvokeRequest) (res protocol.Result, err error) {
	if m := g.opts.Metrics; m != nil {
		start := time.Now()
		defer func() {
			status := res.Status()
			if err != nil {
				status = "error"
			}
			m.ObserveCall(req.Tool, invokeAction(req), status, time.Since(start))
		}()
	}
	if g.closing.Load() {
		return protocol.Result{}, &protocol.Error{Type: protocol.ErrUnavailable, Message: "gateway is shutting down", Retryable: true}
	}
	sessionKey, agentID, err := ParseSessionKey(req.SessionKey)
	if err != nil {
		return protocol.Result{}, err
	}
	cfg := g.Config()
	switch req.Tool {
	case protocol.ToolExec, protocol.ToolProcess, protocol.ToolApplyPatch:
	default:
		return protocol.Result{}, protocol.Errorf(protocol.ErrNotFound, "Tool not available: %s", req.Tool)
	}
	if !toolAllowed(&cfg, agentID, req.Tool, req.Model) {
		return protocol.Result{}, protocol.Errorf(protocol.ErrNotFound, "Tool not available: %s", req.Tool)
	}
	call := &call{g: g, cfg: cfg, sessionKey: sessionKey, agentID: agentID}
	if req.Tool == protocol.ToolApplyPatch {
		args, err := protocol.DecodeApplyPatchArgs(req.Args)
		if err != nil {
			return protocol.Result{}, err
		}
		return call.applyPatch(ctx, args)
	}
	if req.Tool == protocol.ToolExec {
		args, err := protocol.DecodeExecArgs(req.Args)
		if err != nil {
			return protocol.Result{}, err
		}
		return call.exec(ctx, args)
	}
	args, err := protocol.DecodeProcessArgs(req.Args)
	if err != nil {
		return protocol.Result{}, err
	}
	return call.process(ctx, args)
}

// invokeAction is the process action of a call, for metrics.
func invokeAction(req InvokeRequest) string {
	if req.Tool != protocol.ToolProcess {
		return ""
	}
	var a struct {
		Action string `json:"action"`
	}
	_ = json.Unmarshal(req.Args, &a)
	return a.Action
}

// call is the state of one tool invocation.
type call struct {
	g          *Gateway
	cfg        Config
	sessionKey string
	agentID    string
}

func (c *call) process(ctx context.Context, args protocol.ProcessArgs) (protocol.Result, error) {
	if args.Action == "list" {
		return c.list(ctx, args)
	}
	nodes := c.g.nodeBackend()
	if nodes == nil {
		return c.g.local.Process(ctx, c.sessionKey, args), nil
	}
	if args.SessionID != "" && !c.g.local.Has(c.sessionKey, args.SessionID) {
		res, handled, err := nodes.Process(ctx, c.sessionKey, args)
		if err != nil {
			return protocol.Result{}, err
		}
		if handled {
			return res, nil
		}
	}
	return c.g.local.Process(ctx, c.sessionKey, args), nil
}

// list answers process list: the gateway's sessions and the nodes'. With
// offset or limit (session.ListPage) every host lists only its End newest
// entries, and the page is cut from their merge.
func (c *call) list(ctx context.Context, args protocol.ProcessArgs) (protocol.Result, error) {
	page, err := session.ListPageOf(args)
	if err != nil {
		return protocol.Result{}, err
	}
	nodes := c.g.nodeBackend()
	if nodes == nil {
		return c.g.local.Process(ctx, c.sessionKey, args), nil
	}
	if !page.Paged {
		local := c.g.local.Process(ctx, c.sessionKey, args)
		remote, _, err := nodes.ListPage(ctx, c.sessionKey, 0)
		if err != nil {
			c.g.log.Warn("listing node sessions", "err", err)
		}
		if len(remote) == 0 {
			return local, nil
		}
		return mergeLists(local, remote), nil
	}
	end := page.End()
	first := 0
	largs := protocol.ProcessArgs{Action: "list", Offset: &first}
	if end > 0 {
		largs.Limit = &end
	}
	local := c.g.local.Process(ctx, c.sessionKey, largs)
	total, _ := local.Details["total"].(int)
	remote, remoteTotal, err := nodes.ListPage(ctx, c.sessionKey, end)
	if err != nil {
		c.g.log.Warn("listing node sessions", "err", err)
	}
	total += remoteTotal
	all := append(listEntries(local), remote...)
	sortNewestFirst(all)
	lo, hi := page.Bounds(total)
	lo, hi = min(lo, len(all)), min(hi, len(all))
	return session.PagedListResult(page, all[lo:hi], total), nil
}

// mergeLists adds node sessions to a local list result, newest first.
func mergeLists(local protocol.Result, remote []protocol.Details) protocol.Result {
	all := append(listEntries(local), remote...)
	sortNewestFirst(all)
	return protocol.TextResult(session.ListText(all), protocol.Details{"status": protocol.StatusCompleted, "sessions": all})
}

// listEntries returns the entries of a list result: []protocol.Details
// from the session core, []any after a JSON round trip.
func listEntries(res protocol.Result) []protocol.Details {
	var all []protocol.Details
	if l, ok := res.Details["sessions"].([]protocol.Details); ok {
		all = append(all, l...)
	} else if l, ok := res.Details["sessions"].([]any); ok {
		for _, e := range l {
			if d, ok := e.(map[string]any); ok {
				all = append(all, protocol.Details(d))
			}
		}
	}
	return all
}

// sortNewestFirst orders list entries by startedAt, newest first; entries
// that started in the same millisecond keep their order.
func sortNewestFirst(all []protocol.Details) {
	slices.SortStableFunc(all, func(a, b protocol.Details) int {
		return cmpNumber(b["startedAt"], a["startedAt"])
	})
}

func cmpNumber(a, b any) int {
	fa, fb := toFloat(a), toFloat(b)
	switch {
	case fa < fb:
		return -1
	case fa > fb:
		return 1
	}
	return 0
}

func toFloat(v any) float64 {
	switch n := v.(type) {
	case float64:
		return n
	case int64:
		return float64(n)
	case int:
		return float64(n)
	case json.Number:
		f, _ := n.Float64()
		return f
	}
	return 0
}

// nodeBackend returns the node router, or nil before one is attached.
func (g *Gateway) nodeBackend() nodeBackend {
	g.natsMu.Lock()
	defer g.natsMu.Unlock()
	return g.nodes
}

// execDefaults returns the /exec defaults of a sessionKey.
func (g *Gateway) sessionDefaults(sessionKey string) SessionExecDefaults {
	g.defaultsMu.Lock()
	defer g.defaultsMu.Unlock()
	return g.execDefaults[sessionKey]
}

// SetSessionDefaults validates and stores per-sessionKey exec defaults.
// The host must pass the same override rule as a per-call host.
func (g *Gateway) SetSessionDefaults(sessionKey string, d SessionExecDefaults) error {
	key, agentID, err := ParseSessionKey(sessionKey)
	if err != nil {
		return err
	}
	d.Host = strings.ToLower(strings.TrimSpace(d.Host))
	d.Security = strings.ToLower(strings.TrimSpace(d.Security))
	d.Ask = strings.ToLower(strings.TrimSpace(d.Ask))
	d.Node = strings.TrimSpace(d.Node)
	if d.Host == "auto" {
		d.Host = ""
	}
	if d.Host != "" && !slices.Contains(hostValues, d.Host) {
		return protocol.Errorf(protocol.ErrInvalidRequest, "Invalid exec host %q. Allowed values: auto, sandbox, gateway, node.", d.Host)
	}
	if d.Security != "" && !slices.Contains(securityValues, d.Security) {
		return protocol.Errorf(protocol.ErrInvalidRequest, "Invalid exec security %q. Allowed values: deny, allowlist, full.", d.Security)
	}
	if d.Ask != "" && !slices.Contains(askValues, d.Ask) {
		return protocol.Errorf(protocol.ErrInvalidRequest, "Invalid exec ask %q. Allowed values: off, on-miss, always.", d.Ask)
	}
	cfg := g.Config()
	if d.Host != "" {
		if _, err := resolveHost(configuredHost(&cfg, agentID), d.Host, cfg.Sandbox.Mode != "off", false); err != nil {
			return err
		}
	}
	g.defaultsMu.Lock()
	defer g.defaultsMu.Unlock()
	if d == (SessionExecDefaults{}) {
		delete(g.execDefaults, key)
	} else {
		g.execDefaults[key] = d
	}
	return nil
}

// SessionDefaults returns the per-sessionKey exec defaults.
func (g *Gateway) SessionDefaults(sessionKey string) (SessionExecDefaults, error) {
	key, _, err := ParseSessionKey(sessionKey)
	if err != nil {
		return SessionExecDefaults{}, err
	}
	return g.sessionDefaults(key), nil
}
