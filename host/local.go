package host

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/execmesh/execmesh/applypatch"
	"github.com/execmesh/execmesh/approvals"
	"github.com/execmesh/execmesh/confine"
	"github.com/execmesh/execmesh/protocol"
	"github.com/execmesh/execmesh/sandbox"
	"github.com/execmesh/execmesh/session"
)

// Kinds of a Local host.
const (
	// KindGateway is the gateway's own machine: it runs TargetGateway
	// (through approvals) and TargetSandbox requests.
	KindGateway = "gateway"
	// KindNode is a node agent's machine: it runs TargetNode requests.
	KindNode = "node"
)

// Config configures a Local host. Logger, Kind and Session are required;
// the zero values of the others are documented per field.
type Config struct {
	Logger *slog.Logger
	// Kind is KindGateway or KindNode.
	Kind string
	// ID names the host in plans and exit events: the node id for a node,
	// the gateway id for a gateway.
	ID string
	// Session configures the session core; its OnExit is replaced (exit
	// events go to OnExit below). An empty Shell is resolved from
	// Environ's SHELL and PATH (session.ResolveShell).
	Session session.Config
	// StateDir holds the host's exec-approvals.json; empty means no
	// approvals file (nothing loosened or tightened by it, nothing
	// persisted by allow-always).
	StateDir string
	// Environ is the environment commands inherit before filtering; nil
	// means os.Environ().
	Environ []string
	// Cwd is the default working directory; empty means the process's.
	Cwd string
	// LoginPath returns the login shell's PATH merged into host=gateway
	// commands (spec §7.4); nil merges nothing.
	LoginPath func() string
	// Sandbox runs TargetSandbox requests; nil or mode off refuses them.
	Sandbox sandbox.Runtime
	// TrustedKeys returns the gateway public keys whose signed decisions
	// this host acts on; nil trusts none (no approved run can start).
	TrustedKeys func() []string
	// Ready, when set, is asked before every exec and patch: a non-nil
	// error refuses the request (a node that is not paired).
	Ready func() error
	// Confine configures the kernel confinement of security allowlist
	// runs; the zero value confines where the kernel can.
	Confine ConfineConfig
	// OnExit receives the exit event of every background session, in its
	// own goroutine; RunID is set for approval-gated runs. With
	// Session.ConfirmExits the session's record stays in the state dir
	// until OnExit's receiver calls Manager().ExitStored.
	OnExit func(protocol.ExitEvent)
}

// Settings are the parts of a host's configuration that a reload may
// change.
type Settings struct {
	// PathPrepend goes first on PATH of host=gateway and host=sandbox
	// commands (tools.exec.pathPrepend).
	PathPrepend []string
	// SafeBins and SafeBinTrustedDirs are tools.exec.safeBins and
	// tools.exec.safeBinTrustedDirs.
	SafeBins           []string
	SafeBinTrustedDirs []string
	// AllowlistEnv is tools.exec.allowlistEnv: the request env keys (and
	// KEY* prefixes) a run under security allowlist may set; nil means
	// protocol.DefaultAllowlistEnv, empty allows none (CheckAllowlistEnv).
	AllowlistEnv []string
	// AllowlistWrites are tools.exec.allowlistWrites: paths beneath which
	// a confined allowlist run may write, besides its workdir and TMPDIR.
	AllowlistWrites []string
	// Security and Ask, when set, cap what requests may use: the node
	// agent's own --security and --ask.
	Security string
	Ask      string
	// Workspace is the root of the agents' workspaces: apply_patch writes
	// only under <Workspace>/<agentId> unless the request allows any
	// workdir (the gateway's tools.exec.applyPatch.workspaceOnly is off).
	// Empty refuses such patches.
	Workspace string
}

// Local is a Host backed by a session core in this process. Build it with
// NewLocal and release it with Close.
type Local struct {
	cfg       Config
	log       *slog.Logger
	mgr       *session.Manager
	instance  string
	baseEnv   map[string]string
	loginPath func() string
	settings  atomic.Pointer[Settings]
	approvals *approvals.FileCache // the host's exec-approvals.json; nil without a state dir
	envCache  envCache             // the environment of calls without overrides (env.go)

	// The kernel confinement of allowlist runs (confine.go): the mode
	// probed at start, the helper binary (its real path), the shell's
	// real path, and the ELF interpreters of both, which every confined
	// run allows (the helper's is the system's).
	confinement Confinement
	helper      string
	shellPath   string
	baseInterps []string

	streams pendingStreams // streams bound by starts, until claimed (stream.go)

	mu      sync.Mutex
	used    map[string]time.Time // approval ids already acted on, until their decision expires
	written []string             // write roots of earlier confined runs, most recent first (wrote)
}

// NewLocal builds a Local host and its session core.
func NewLocal(cfg Config) (*Local, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	switch cfg.Kind {
	case KindGateway, KindNode:
	default:
		return nil, fmt.Errorf("host: Kind: %q is not %q or %q", cfg.Kind, KindGateway, KindNode)
	}
	if cfg.Environ == nil {
		cfg.Environ = os.Environ()
	}
	if cfg.Cwd == "" {
		wd, err := os.Getwd()
		if err != nil {
			return nil, fmt.Errorf("host: working directory: %w", err)
		}
		cfg.Cwd = wd
	}
	if cfg.Sandbox == nil {
		rt, err := sandbox.New(sandbox.Config{Mode: sandbox.ModeOff})
		if err != nil {
			return nil, err
		}
		cfg.Sandbox = rt
	}
	l := &Local{
		cfg:       cfg,
		log:       cfg.Logger,
		instance:  randomHex(8),
		baseEnv:   protocol.EnvMap(cfg.Environ),
		loginPath: cfg.LoginPath,
		used:      map[string]time.Time{},
	}
	if l.loginPath == nil {
		l.loginPath = func() string { return "" }
	}
	if cfg.StateDir != "" {
		l.approvals = approvals.NewFileCache(approvals.Path(cfg.StateDir))
	}
	l.settings.Store(&Settings{})
	scfg := cfg.Session
	scfg.OnExit = nil // every request's hook reports the exit (Exec)
	if scfg.Shell == "" {
		// The shell is the one of the environment commands inherit, which
		// an embedder may give apart from the process's own (Environ).
		scfg.Shell = session.ResolveShell(l.baseEnv["SHELL"], l.baseEnv["PATH"])
	}
	m, err := session.NewManager(scfg)
	if err != nil {
		return nil, fmt.Errorf("host: session core: %w", err)
	}
	l.mgr = m
	l.confinement, l.helper = probeConfinement(cfg.Confine)
	l.shellPath = scfg.Shell
	if p, err := exec.LookPath(scfg.Shell); err == nil {
		l.shellPath = p
	}
	if p, err := filepath.EvalSymlinks(l.shellPath); err == nil {
		l.shellPath = p
	}
	for _, p := range []string{l.helper, l.shellPath} {
		if ip := confine.Interpreter(p); ip != "" && !slices.Contains(l.baseInterps, ip) {
			l.baseInterps = append(l.baseInterps, ip)
		}
	}
	if l.confinement.Mode != ModeLandlock {
		l.log.Warn("security allowlist is not confined by the kernel: every program that is not a safe bin needs approval", "host", l.label(), "why", l.confinement.Reason)
	}
	return l, nil
}

// SetSettings replaces the reloadable settings.
func (l *Local) SetSettings(s Settings) { l.settings.Store(&s) }

// Instance identifies this run of the host; a node that restarts gets a
// new one, and with it every session of the old run is gone.
func (l *Local) Instance() string { return l.instance }

// Manager returns the session core.
func (l *Local) Manager() *session.Manager { return l.mgr }

// Close ends every session's process tree (see session.Manager.Close).
func (l *Local) Close(ctx context.Context) error { return l.mgr.Close(ctx) }

// Exec runs one resolved exec call through the host's pipeline.
func (l *Local) Exec(ctx context.Context, req protocol.ExecRequest) (protocol.ExecReply, error) {
	if err := l.check(req.SessionKey, req.Target); err != nil {
		return protocol.ExecReply{}, err
	}
	if strings.TrimSpace(req.Args.Command) == "" {
		return protocol.ExecReply{}, protocol.Errorf(protocol.ErrInvalidRequest, "Provide a command to start.")
	}
	if req.SessionID != "" && !session.ValidSessionID(req.SessionID) {
		return protocol.ExecReply{}, protocol.Errorf(protocol.ErrInvalidRequest, "invalid session id %q: want 1 to %d lower-case letters, digits or '-', not starting with '-'", req.SessionID, session.MaxSessionIDLen)
	}
	s := l.settings.Load()
	sreq := session.ExecRequest{
		Command:     req.Args.Command,
		YieldMs:     req.Args.YieldMs,
		Background:  req.Args.Background,
		TimeoutSec:  req.Args.Timeout,
		PTY:         req.Args.PTY,
		Synchronous: req.Sync,
		ScopeKey:    req.SessionKey,
		Warnings:    req.Warnings,
		SessionID:   req.SessionID,
	}
	if req.Stream != nil {
		// Bound before the process runs; the caller claims it (Attach).
		a, err := l.streams.add(req.Stream, req.Args.PTY)
		if err != nil {
			return protocol.ExecReply{}, err
		}
		sreq.Attach, sreq.Background, sreq.Synchronous = a, true, false
	}
	// The gateway's effective limits; a call's own may only tighten them.
	if req.Limits != nil {
		sreq.Limits = *req.Limits
	}
	if req.Args.Limits != nil {
		l, err := sreq.Limits.Tighten(*req.Args.Limits, func(k string) string { return protocol.ToolExec + ` parameter "limits.` + k + `"` })
		if err != nil {
			return protocol.ExecReply{}, err
		}
		sreq.Limits = l
	}
	var res protocol.Result
	var err error
	if req.Target == protocol.TargetSandbox {
		res, err = l.execSandbox(ctx, req, sreq, s)
	} else {
		res, err = l.execHost(ctx, req, sreq, s)
	}
	if req.Stream != nil && (err != nil || res.Status() != protocol.StatusRunning) {
		if a := l.streams.take(req.Stream.ID); a != nil {
			_ = a.Close() // nothing runs that a client could claim
		}
	}
	if err != nil {
		return protocol.ExecReply{}, err
	}
	return protocol.ExecReply{Result: res, Instance: l.instance}, nil
}

// check refuses requests this host cannot take.
func (l *Local) check(sessionKey, target string) error {
	if strings.TrimSpace(sessionKey) == "" {
		return protocol.Errorf(protocol.ErrInvalidRequest, "sessionKey is required")
	}
	switch {
	case l.cfg.Kind == KindNode && target == protocol.TargetNode,
		l.cfg.Kind == KindGateway && (target == protocol.TargetGateway || target == protocol.TargetSandbox):
	default:
		return protocol.Errorf(protocol.ErrInvalidRequest, "exec target %q is not served by this %s host", target, l.cfg.Kind)
	}
	if l.cfg.Ready != nil {
		return l.cfg.Ready()
	}
	return nil
}

// execHost runs a host=gateway or host=node request: environment,
// workdir, approvals, then the session core.
func (l *Local) execHost(ctx context.Context, req protocol.ExecRequest, sreq session.ExecRequest, s *Settings) (protocol.Result, error) {
	if err := l.checkRequestEnv(req, s); err != nil {
		return protocol.Result{}, err
	}
	var env []string
	var err error
	if l.cfg.Kind == KindNode {
		env, err = l.nodeEnv(req.Args.Env)
	} else {
		env, err = l.gatewayEnv(req.Args.Env, s)
	}
	if err != nil {
		return protocol.Result{}, err
	}
	workdir, ok := l.resolveWorkdir(req.Args.Workdir)
	switch {
	case !ok && req.Approval != nil:
		// The directory the approval was asked for is gone.
		return protocol.Result{}, protocol.Errorf(protocol.ErrDenied, "%scwd changed", BindingChanged)
	case !ok:
		return protocol.WorkdirUnavailableResult(req.Args.Workdir), nil
	}
	sreq.Env, sreq.Workdir = env, workdir
	run, err := l.authorize(req, workdir, env, s)
	if err != nil {
		return protocol.Result{}, err
	}
	sreq.Argv = run.argv
	var conf *confined
	if run.allowlistMode {
		conf, err = l.confineRun(run, workdir, protocol.EnvMap(env), s, l.confinement.Mode == ModeLandlock)
		if err != nil {
			return protocol.Result{}, err
		}
		if conf != nil {
			conf.apply(&sreq)
		}
	}
	if run.runID != "" {
		// An approved run goes to the background; its exit becomes the
		// approval's Exec finished event instead of the usual notice.
		sreq.Background, sreq.Synchronous, sreq.NotifyOff = true, false, true
	}
	if conf == nil {
		return l.start(ctx, sreq, run.runID)
	}
	spawned := conf.start()
	res, err := l.start(ctx, sreq, run.runID)
	spawned()
	return res, err
}

// execSandbox runs a host=sandbox request inside the sandbox runtime: the
// agent's workspace read-write, the rest read-only, no network unless
// configured (DESIGN.md §3.3). Without a runtime nothing runs.
func (l *Local) execSandbox(ctx context.Context, req protocol.ExecRequest, sreq session.ExecRequest, s *Settings) (protocol.Result, error) {
	rt := l.cfg.Sandbox
	if rt.Mode() == sandbox.ModeOff {
		return protocol.Result{}, SandboxOffError()
	}
	if err := rt.Available(); err != nil {
		return protocol.Result{}, protocol.Errorf(protocol.ErrHostNotAllowed, "exec host=sandbox: %v", err)
	}
	if err := sandboxOverrides(req.Args.Env); err != nil {
		return protocol.Result{}, err
	}
	prep, err := rt.Prepare(sandbox.Request{
		AgentID:     req.AgentID,
		Command:     req.Args.Command,
		Workdir:     req.Args.Workdir,
		Env:         req.Args.Env,
		PathPrepend: s.PathPrepend,
		PTY:         req.Args.PTY,
	})
	var wdErr *sandbox.WorkdirError
	if errors.As(err, &wdErr) {
		return protocol.WorkdirUnavailableResult(req.Args.Workdir), nil
	}
	if err != nil {
		return protocol.Result{}, protocol.Errorf(protocol.ErrInvalidRequest, "exec host=sandbox: %v", err)
	}
	sreq.Argv, sreq.Workdir, sreq.Env = prep.Argv, prep.Workdir, prep.Env
	return l.start(ctx, sreq, "")
}

// SandboxOffError is the refusal of a host=sandbox run without a sandbox
// runtime (DESIGN.md §3.3): no request runs with less policy than
// host=gateway applies unless a real sandbox contains it.
func SandboxOffError() error {
	return protocol.Errorf(protocol.ErrHostNotAllowed,
		"exec host not allowed (sandbox runtime is off; set sandbox.mode to \"bwrap\" to run host=sandbox commands in a bubblewrap sandbox, or use host=gateway, which runs them on the gateway host through exec approvals).")
}

// start hands the request to the session core, with the hook that reports
// its exit.
func (l *Local) start(ctx context.Context, sreq session.ExecRequest, runID string) (protocol.Result, error) {
	// Without OnExit there is no hook: a hook is a promise that someone
	// takes the exit event (and confirms it with ExitStored).
	if onExit := l.cfg.OnExit; onExit != nil {
		sreq.OnExitHook = func(ev protocol.ExitEvent) {
			ev.NodeID, ev.RunID = l.cfg.ID, runID
			ev.Instance = l.instance
			onExit(ev)
		}
	}
	return l.mgr.Exec(ctx, sreq)
}

// Process runs a process action on one of the host's sessions.
func (l *Local) Process(ctx context.Context, req protocol.ProcessRequest) (protocol.ProcessReply, error) {
	if strings.TrimSpace(req.SessionKey) == "" {
		return protocol.ProcessReply{}, protocol.Errorf(protocol.ErrInvalidRequest, "process: sessionKey is required")
	}
	if req.Args.Action == "list" {
		return protocol.ProcessReply{}, protocol.Errorf(protocol.ErrInvalidRequest, "process: list is answered by List")
	}
	res := l.mgr.Process(ctx, req.SessionKey, req.Args)
	gone := req.Args.SessionID != "" && !l.mgr.Has(req.SessionKey, req.Args.SessionID)
	return protocol.ProcessReply{Result: res, Gone: gone, Instance: l.instance}, nil
}

// Has reports whether the host holds sessionID for sessionKey (running or
// retained), without a round trip.
func (l *Local) Has(sessionKey, sessionID string) bool { return l.mgr.Has(sessionKey, sessionID) }

// List returns the list entries of a sessionKey's sessions, newest first.
func (l *Local) List(ctx context.Context, req protocol.ListRequest) (protocol.ListReply, error) {
	if err := checkListRequest(req); err != nil {
		return protocol.ListReply{}, err
	}
	entries, total := l.mgr.List(req.SessionKey, req.Limit)
	out := protocol.ListReply{Instance: l.instance, Sessions: make([]protocol.ListedSession, 0, len(entries)), Total: total, Partial: total > len(entries)}
	for _, d := range entries {
		out.Sessions = append(out.Sessions, protocol.ListedSession{SessionKey: req.SessionKey, Details: d})
	}
	return out, nil
}

// AppendListJSON appends the JSON of the reply List would give, byte for
// byte ListReply.AppendJSON of it, written straight from the sessions
// (each entry's JSON is kept while it does not change): a node's list of
// ten thousand sessions without building and copying their Details.
func (l *Local) AppendListJSON(ctx context.Context, req protocol.ListRequest, dst []byte) ([]byte, error) {
	if err := checkListRequest(req); err != nil {
		return dst, err
	}
	return l.mgr.AppendListReply(dst, req.SessionKey, req.Limit, l.instance), nil
}

// ListEntries is List with the entries kept as their JSON
// (protocol.DecodeListEntries of AppendListJSON's reply), for a gateway
// that merges them.
func (l *Local) ListEntries(ctx context.Context, req protocol.ListRequest) (protocol.ListEntries, error) {
	b, err := l.AppendListJSON(ctx, req, nil)
	if err != nil {
		return protocol.ListEntries{}, err
	}
	return protocol.DecodeListEntries(b)
}

// checkListRequest refuses a list request without a sessionKey or with a
// negative limit.
func checkListRequest(req protocol.ListRequest) error {
	if strings.TrimSpace(req.SessionKey) == "" {
		return protocol.Errorf(protocol.ErrInvalidRequest, "list: sessionKey is required")
	}
	if req.Limit < 0 {
		return protocol.Errorf(protocol.ErrInvalidRequest, "list: limit must not be negative")
	}
	return nil
}

// ApplyPatch applies a patch under the requested workdir (the agent's
// workspace for a sandbox target). The host's security applies (deny
// refuses); a patch that would leave its root is a security violation and
// changes nothing.
func (l *Local) ApplyPatch(ctx context.Context, req protocol.ApplyPatchRequest) (protocol.Result, error) {
	if err := l.check(req.SessionKey, req.Target); err != nil {
		return protocol.Result{}, err
	}
	var root string
	s := l.settings.Load()
	switch {
	case req.Target == protocol.TargetSandbox:
		rt := l.cfg.Sandbox
		if rt.Mode() == sandbox.ModeOff {
			return protocol.Result{}, SandboxOffError()
		}
		ws, err := rt.Workspace(req.AgentID)
		if err != nil {
			return protocol.Result{}, protocol.Errorf(protocol.ErrInvalidRequest, "apply_patch host=sandbox: %v", err)
		}
		dir, err := applypatch.WorkdirIn(ws, req.Args.Workdir)
		if err != nil {
			return protocol.WorkdirUnavailableResult(req.Args.Workdir), nil
		}
		root = dir
	case l.policy(req.Security, "", req.AgentID, s).Security == approvals.SecurityDeny:
		return protocol.Result{}, protocol.Errorf(protocol.ErrDenied, "apply_patch denied: host=%s security=deny", req.Target)
	case req.AnyWorkdir:
		dir, ok := l.resolveWorkdir(req.Args.Workdir)
		if !ok {
			return protocol.WorkdirUnavailableResult(req.Args.Workdir), nil
		}
		root = dir
	default:
		// The workspace rule: only under the agent's own workspace, so
		// that a patch plants nothing (hooks, config) where an
		// allowlisted tool later runs outside it.
		if s.Workspace == "" {
			return protocol.Result{}, protocol.Errorf(protocol.ErrSecurityViolation, "apply_patch: %s has no workspace root, and patches are allowed only in the agent's workspace (tools.exec.applyPatch.workspaceOnly)", l.label())
		}
		ws, err := applypatch.AgentWorkspace(s.Workspace, req.AgentID)
		if err != nil {
			return protocol.Result{}, protocol.Errorf(protocol.ErrInvalidRequest, "apply_patch: %v", err)
		}
		dir, err := applypatch.WorkdirIn(ws, req.Args.Workdir)
		switch {
		case errors.Is(err, applypatch.ErrOutsideWorkspace):
			return protocol.Result{}, protocol.Errorf(protocol.ErrSecurityViolation, "apply_patch: %v (tools.exec.applyPatch.workspaceOnly)", err)
		case err != nil:
			return protocol.WorkdirUnavailableResult(req.Args.Workdir), nil
		}
		root = dir
	}
	return PatchResult(applypatch.Apply(ctx, root, req.Args.Input, applypatch.Options{}))
}

// PatchResult turns applypatch's outcome into the tool's answer: escapes
// from the root are refused as security violations, other failures are
// failed results the model can read.
func PatchResult(sum applypatch.Summary, err error) (protocol.Result, error) {
	switch {
	case err == nil:
		return sum.Result(), nil
	case errors.Is(err, applypatch.ErrOutsideRoot):
		return protocol.Result{}, protocol.Errorf(protocol.ErrSecurityViolation, "%v", err)
	default:
		return protocol.FailedResult(err.Error()), nil
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
