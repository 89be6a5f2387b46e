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
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/execmesh/execmesh/config"

	"github.com/execmesh/execmesh/access"
	"github.com/execmesh/execmesh/approvalstore"

	"github.com/hashicorp/go-multierror"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/events"
	"github.com/execmesh/execmesh/host"
	"github.com/execmesh/execmesh/hostbus"
	"github.com/execmesh/execmesh/index"
	"github.com/execmesh/execmesh/internal/hostid"
	"github.com/execmesh/execmesh/internal/ratelog"
	"github.com/execmesh/execmesh/metrics"
	"github.com/execmesh/execmesh/nodes"
	"github.com/execmesh/execmesh/peers"
	"github.com/execmesh/execmesh/protocol"
	"github.com/execmesh/execmesh/sandbox"
	"github.com/execmesh/execmesh/session"
)

// Options carries what the gateway gets from its host process rather than
// from the configuration file.
type Options struct {
	// Conn is the gateway's NATS connection; JetStream must be reachable
	// through it (the control-plane state lives there). Required.
	Conn *nats.Conn
	// Server is the embedded NATS server, nil with an external cluster:
	// join codes admit nodes to it.
	Server *bus.Server
	// Logger receives the gateway's logs; nil discards them.
	Logger *slog.Logger
	// Environ is the environment inherited by gateway-host commands before
	// filtering; nil means os.Environ().
	Environ []string
	// Confine is the kernel confinement of the gateway host's allowlist
	// runs (host.ConfineConfig; its zero value confines nothing and asks).
	Confine host.ConfineConfig
	// Cwd is the default working directory of gateway-host commands; empty
	// means the process working directory.
	Cwd string
	// ConfigPath is the configuration file: PUT /v1/config/exec-node
	// writes the node binding there (creating the file when missing), and
	// without Load, Reload (SIGHUP) re-reads it; empty means
	// <stateDir>/config.json.
	ConfigPath string
	// Load, when set, builds the configuration Reload applies, with the
	// host process's layering (the file, which may have been created since
	// the start, the environment, the flags).
	Load func() (config.Config, error)
	// Getenv reads OPENCLAW_BASH_* overrides for the session core and the
	// EXECMESH_NODE_* tuning; nil means os.Getenv.
	Getenv func(string) string
	// Metrics, when set, records calls, sessions, approvals and nodes.
	Metrics *metrics.Metrics
	// LoginShellPath returns the login shell's PATH to merge into
	// gateway-host commands; nil probes the login shell once (spec §7.4).
	LoginShellPath func() string
	// JoinURLs returns the NATS URLs join codes carry; nil derives them
	// from Server.
	JoinURLs func() []string
	// Version is the build's version, shown to the other gateways.
	Version string
	// Reaper is the process's session Reaper, shared with the other
	// Managers of the process (`execmesh up`'s local node); nil makes the
	// gateway's session core start its own.
	Reaper *session.Reaper
}

// Tool API constants.
const (
	// DefaultSessionKey is the scope of a call that names none.
	DefaultSessionKey = "agent:main:main"
	// DefaultAgentID is the agent of a sessionKey that names none.
	DefaultAgentID = "main"
	// MaxPayloadBytes bounds an HTTP request body (413 beyond it).
	MaxPayloadBytes = 2 << 20
)

// Gateway serves the exec and process tools. Its zero value is not usable;
// build one with New and release it with Close.
type Gateway struct {
	opts Options
	log  *slog.Logger
	// rare logs what can repeat for every event (exit events not
	// stored, dropped) once per interval per key, with a count.
	rare *ratelog.Limiter
	id   string // the gateway's id: its local host's in the session index
	// hostID names the gateway's view of the file system (GET /healthz),
	// so that a client on the same machine can send its working directory.
	hostID string

	cfgMu sync.RWMutex
	cfg   config.Config
	// reloadMu makes reloads (SIGHUP, POST /v1/admin/reload) one at a
	// time, so that an older read of the file never replaces a newer one.
	reloadMu sync.Mutex

	// prefix and replicas are nats.prefix and nats.replicas, fixed for
	// the gateway's life (a reload cannot change them).
	prefix   string
	replicas int
	nc       *nats.Conn
	js       jetstream.JetStream
	subj     protocol.SubjectSet
	local    *host.Local
	localSv  *hostbus.Server // serves the local host to other gateways
	nodes    *nodes.Registry
	events   *events.Queue
	index    *index.Index
	appr     *approvalstore.Store
	peers    *peers.Registry
	notices  notices // Exec running notices of owned approved runs
	signer   *approvalstore.Signer
	guard    *access.Guard

	// serverWatch pings the NATS server: calls that wait on it fail
	// within seconds when it goes silent.
	serverWatch *bus.ServerWatch
	// requests carries the calls to other hosts (nodes, peer gateways)
	// over one shared reply subscription.
	requests *bus.Requester

	// bg is the root of work that outlives a call (approval runs, exit
	// event delivery); Close cancels it and waits for bgWG.
	bg       context.Context
	bgCancel context.CancelFunc
	bgWG     sync.WaitGroup

	// defaults are the per-sessionKey exec defaults (/exec), shared by
	// the gateways in the control bucket.
	defaults *bus.KVView[SessionExecDefaults]

	backlog  atomic.Int64 // local events not stored yet
	closing  atomic.Bool
	closeMu  sync.Mutex
	closed   bool
	closeErr error
	nats     *natsAPI
	// routes are extra HTTP routes (nodes, approvals).
	routes []route

	opMu        sync.Mutex
	opFileToken string // the generated operator token (operator.go)

	answerMu  sync.Mutex
	answerBuf []byte // a process list answer's buffer, kept for the next (writeList)
}

// SessionExecDefaults are per-sessionKey exec defaults set through
// PUT /v1/sessions/<sessionKey>/exec. Empty fields are unset.
type SessionExecDefaults struct {
	Host     string `json:"host,omitempty"`
	Security string `json:"security,omitempty"`
	Ask      string `json:"ask,omitempty"`
	Node     string `json:"node,omitempty"`
}

// New builds a gateway from a validated configuration: the local host
// (host=gateway and host=sandbox), the node registry, the session index,
// the approvals and the event queues on JetStream, and the tool API on
// NATS. It does not wait for JetStream: what needs it answers a retryable
// 503 until it is there.
func New(ctx context.Context, cfg config.Config, opts Options) (*Gateway, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Gateway.Auth.Token == "" && !access.IsLoopbackListen(cfg.Gateway.Listen) {
		return nil, fmt.Errorf("gateway.listen: refusing to listen on non-loopback address %s without gateway.auth.token (EXECMESH_GATEWAY_TOKEN)", cfg.Gateway.Listen)
	}
	if opts.Conn == nil {
		return nil, errors.New("gateway: Options.Conn (the NATS connection) is required")
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
	id, err := gatewayIdentity(cfg)
	if err != nil {
		return nil, fmt.Errorf("gateway identity: %w", err)
	}
	js, err := jetstream.New(opts.Conn)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	g := &Gateway{
		opts:     opts,
		log:      opts.Logger,
		rare:     ratelog.New(opts.Logger, logEvery),
		id:       id.NodeID,
		cfg:      cfg,
		nc:       opts.Conn,
		js:       js,
		subj:     protocol.Subjects(cfg.NATS.Prefix),
		prefix:   cfg.NATS.Prefix,
		replicas: cfg.NATS.Replicas,
	}
	// No host id (no /proc) only means clients never take the gateway
	// for local.
	g.hostID, _ = hostid.ID()
	if err := g.ensureOperatorToken(cfg); err != nil {
		return nil, err
	}
	g.guard = access.NewGuard(g.tokens)
	g.bg, g.bgCancel = context.WithCancel(context.WithoutCancel(ctx))
	// A frozen NATS server leaves the connection looking connected for
	// minutes; the watch's pings make calls that wait on it fail within
	// seconds.
	g.serverWatch = bus.NewServerWatch(opts.Conn, bus.ServerWatchOptions{Logger: opts.Logger.With("component", "nats")})
	g.spawn(g.serverWatch.Run)
	g.requests = bus.NewRequester(opts.Conn)
	loginPath := opts.LoginShellPath
	if loginPath == nil {
		lookup := protocol.EnvMap(opts.Environ)
		loginPath = sync.OnceValue(func() string { return host.ProbeLoginShellPath(func(k string) string { return lookup[k] }) })
	}

	scfgSandbox := cfg.Sandbox
	scfgSandbox.Hide = append(slices.Clone(scfgSandbox.Hide), cfg.StateDir)
	rt, err := sandbox.New(scfgSandbox)
	if err != nil {
		return nil, err
	}
	scfg := session.DefaultConfig()
	scfg.ApplyEnv(opts.Getenv)
	scfg.Logger = opts.Logger.With("component", "session")
	applySessionConfig(&scfg, cfg)
	scfg.Reaper = opts.Reaper
	scfg.StateDir = filepath.Join(cfg.StateDir, "sessions", "gateway")
	// What a crashed earlier run left is ended while the session core
	// starts; its agents hear of it (exec.lost) once the event queues are
	// there.
	var lost []session.LostSession
	scfg.OnLost = func(l session.LostSession) { lost = append(lost, l) }
	// A session's record stays until its exit event is stored: one never
	// stored (the event store full or failing until shutdown) is
	// reported lost by the next run instead of vanishing.
	scfg.ConfirmExits = true
	if opts.Metrics != nil {
		scfg.OnOutput = opts.Metrics.AddOutputBytes
		scfg.OnUsage = opts.Metrics.ObserveUsage
	}
	g.signer = approvalstore.NewSigner(js, cfg.NATS.Prefix, cfg.NATS.Replicas, g.log)
	local, err := host.NewLocal(host.Config{
		Logger:      opts.Logger.With("component", "host"),
		Kind:        host.KindGateway,
		ID:          g.id,
		Session:     scfg,
		StateDir:    cfg.StateDir,
		Environ:     opts.Environ,
		Cwd:         opts.Cwd,
		LoginPath:   loginPath,
		Sandbox:     rt,
		TrustedKeys: g.signer.Trusted,
		Confine:     opts.Confine,
		OnExit:      g.onLocalExit,
	})
	if err != nil {
		return nil, err
	}
	g.local = local
	g.applySettings(cfg)
	opts.Metrics.RegisterSessionsFunc(local.Manager().Counts)

	g.events, err = events.New(events.Options{Logger: opts.Logger, Conn: opts.Conn, JS: js, Prefix: cfg.NATS.Prefix,
		Replicas: cfg.NATS.Replicas, MaxPerKey: cfg.Events.MaxQueued})
	if err != nil {
		return nil, g.abort(err)
	}
	g.index = index.New(js, cfg.NATS.Prefix, cfg.NATS.Replicas, g.log, g.serverWatch)
	ctlCfg, _ := bus.KeyValueConfigFor(cfg.NATS.Prefix, cfg.NATS.Replicas, bus.StreamNamesFor(cfg.NATS.Prefix).Control)
	g.defaults = bus.NewKVView[SessionExecDefaults](js, ctlCfg, defaultsKeyPrefix, g.log)
	hostname, _ := os.Hostname()
	g.peers, err = peers.Start(peers.Options{Logger: opts.Logger, JS: js, Prefix: cfg.NATS.Prefix, Replicas: cfg.NATS.Replicas,
		Self:   peers.Gateway{ID: g.id, Name: hostname, Version: opts.Version, Listen: cfg.Gateway.Listen},
		OnGone: g.onPeerGone})
	if err != nil {
		return nil, g.abort(err)
	}
	opts.Metrics.SetGateway(g.id, func() int { return len(g.peers.List()) })
	g.appr = approvalstore.New(approvalstore.Options{Logger: opts.Logger, JS: js, Prefix: cfg.NATS.Prefix, Replicas: cfg.NATS.Replicas,
		Owner: g.id, Alive: g.peers.Alive, AliveKnown: g.peers.Loaded(), OnOwned: g.actOnApproval})
	no := nodeOptionsFromEnv(opts.Getenv, g.log)
	g.nodes, err = nodes.Start(nodes.Options{
		Logger: opts.Logger, Conn: opts.Conn, JS: js, Prefix: cfg.NATS.Prefix, Replicas: cfg.NATS.Replicas,
		Server: opts.Server, PresenceTTL: no.PresenceTTL, GhostTTL: no.GhostTTL, InviteTTL: no.InviteTTL,
		JoinURLs: g.joinURLs, GatewayKeys: g.gatewayKeys,
		RequestMargin: no.RequestMargin, CallTimeout: no.CallTimeout, ServerWatch: g.serverWatch, Requests: g.requests,
		OnExit: g.onNodeExit, OnRestart: g.onNodeRestart, OnRejected: g.onNodeRejected,
	})
	if err != nil {
		return nil, g.abort(err)
	}
	for key, l := range configuredLimits(&cfg) {
		if err := g.local.Manager().CheckLimits(l); err != nil {
			return nil, g.abort(fmt.Errorf("%s: %w", key, err))
		}
	}
	for _, l := range lost {
		g.log.Warn("session lost by an earlier run", "sessionId", l.SessionID, "sessionKey", l.SessionKey,
			"command", l.Command, "startedAt", l.StartedAt, "ended", l.Ended, "reason", l.Reason)
		// Its record stays until the report is settled (stored, or
		// nothing to tell), so a stop before that reports it again.
		g.spawn(func(ctx context.Context) {
			g.untilStored(ctx, "lost report", func(ctx context.Context) error {
				return g.hostLost(ctx, l.SessionID, l.SessionKey, l.StartedAt.UnixMilli(), l.Reason, index.HostGateway, g.id)
			}, func() { g.local.Manager().ExitStored(l.SessionID) })
		})
	}
	opts.Metrics.SetConnectedNodes(func() int {
		n := 0
		for _, v := range g.nodes.List() {
			if v.Live && v.Pairing == protocol.NodePairingPaired {
				n++
			}
		}
		return n
	})
	if err := g.serveNATS(); err != nil {
		return nil, g.abort(err)
	}
	g.routes = append(g.routes, g.nodeRoutes()...)
	g.spawn(g.index.Run)
	g.spawn(g.index.Reserver(g.id, g.local.Instance()))
	g.spawn(g.sweepIndex)
	g.spawn(g.defaults.Run)
	g.spawn(g.appr.Run)
	g.spawn(g.signer.Run)
	g.spawn(func(ctx context.Context) { g.migrateInBackground(ctx, cfg.StateDir) })
	return g, nil
}

// gatewayIdentity is the gateway's identity, whose public key is its id:
// with an external NATS system and an nkey seed (nats.nkeySeedFile), that
// seed, so that a gateway restarted on an empty state dir is the same
// gateway to its peers and in the session index; else
// <stateDir>/gateway.nkey, created on first start.
func gatewayIdentity(cfg config.Config) (bus.Identity, error) {
	if f := cfg.NATS.NKeySeedFile; f != "" && cfg.NATS.URL != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return bus.Identity{}, fmt.Errorf("nats.nkeySeedFile: %w", err)
		}
		return bus.IdentityFromSeed(b)
	}
	return bus.LoadOrCreateGatewayIdentity(cfg.StateDir)
}

// abort releases what New built before it failed with err, and returns
// err.
func (g *Gateway) abort(err error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if g.nats != nil {
		g.nats.stop()
	}
	if g.nodes != nil {
		_ = g.nodes.Close(ctx)
	}
	if g.peers != nil {
		_ = g.peers.Close(ctx)
	}
	if g.local != nil {
		_ = g.local.Close(ctx)
	}
	g.bgCancel()
	g.bgWG.Wait()
	g.requests.Close()
	return err
}

// ID returns the gateway's id.
func (g *Gateway) ID() string { return g.id }

// gatewayKeys returns the keys nodes are to trust with their pairing or
// join, waiting (bounded) for the signing key while JetStream starts: a
// node told none would refuse every approved run.
func (g *Gateway) gatewayKeys() []string {
	ctx, cancel := context.WithTimeout(g.bg, 15*time.Second)
	defer cancel()
	if _, err := g.signer.PublicKey(ctx); err != nil {
		g.log.Warn("approval signing key not known yet; a node paired now learns it at its next pairing check", "err", err)
	}
	return g.signer.Trusted()
}

// SigningKey returns the public key the gateways sign approval decisions
// with, once it is known (it lives in JetStream, shared by the gateways
// of a deployment); ctx bounds the wait.
func (g *Gateway) SigningKey(ctx context.Context) (string, error) { return g.signer.PublicKey(ctx) }

// spawn runs f in a goroutine counted in bgWG, bound to bg.
func (g *Gateway) spawn(f func(ctx context.Context)) {
	g.bgWG.Add(1)
	go func() {
		defer g.bgWG.Done()
		f(g.bg)
	}()
}

// applySessionConfig copies the tools.exec settings the session core uses.
func applySessionConfig(s *session.Config, cfg config.Config) {
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

// applySettings gives the local host the reloadable tools.exec settings.
func (g *Gateway) applySettings(cfg config.Config) {
	e := cfg.Tools.Exec
	g.local.SetSettings(host.Settings{PathPrepend: e.PathPrepend, SafeBins: e.SafeBins, SafeBinTrustedDirs: e.SafeBinTrustedDirs,
		AllowlistEnv: e.AllowlistEnv, AllowlistWrites: e.AllowlistWrites, Workspace: cfg.Sandbox.Workspace})
}

// config.Config returns a copy of the configuration in force.
func (g *Gateway) Config() config.Config {
	g.cfgMu.RLock()
	defer g.cfgMu.RUnlock()
	return g.cfg
}

// configPath is the file Reload reads: the configured one, else
// <stateDir>/config.json (which `execmesh config set` creates).
func (g *Gateway) configPath() string {
	if g.opts.ConfigPath != "" {
		return g.opts.ConfigPath
	}
	return filepath.Join(g.Config().StateDir, "config.json")
}

// Reload re-reads the configuration (SIGHUP): Options.Load, else the
// configuration file. Sessions are kept; the listen addresses, the state
// dir and NATS settings cannot change without a restart, and a gateway
// listening beyond loopback keeps a token.
func (g *Gateway) Reload() error {
	g.reloadMu.Lock()
	defer g.reloadMu.Unlock()
	var cfg config.Config
	var err error
	if g.opts.Load != nil {
		cfg, err = g.opts.Load()
	} else {
		path := g.configPath()
		if _, serr := os.Stat(path); serr != nil {
			return fmt.Errorf("no configuration file to reload (%s): %w", path, serr)
		}
		cfg, err = config.Load(path, nil)
	}
	if err != nil {
		return err
	}
	old := g.Config()
	cfg.Gateway.Listen, cfg.StateDir, cfg.NATS = old.Gateway.Listen, old.StateDir, old.NATS
	if cfg.Gateway.Auth.Token == "" && !access.IsLoopbackListen(cfg.Gateway.Listen) {
		return fmt.Errorf("gateway.auth.token: the gateway listens on %s, beyond loopback, and the new configuration has no token", cfg.Gateway.Listen)
	}
	if err := g.ensureOperatorToken(cfg); err != nil {
		return err
	}
	g.cfgMu.Lock()
	g.cfg = cfg
	g.cfgMu.Unlock()
	g.applySettings(cfg)
	g.log.Info("configuration reloaded")
	return nil
}

// Healthy reports what keeps the gateway from serving every call: it is
// shutting down, its NATS connection is down, the event store failed
// (events that could not be stored are being retried), or its state dir
// cannot take session records.
func (g *Gateway) Healthy() error {
	switch {
	case g.closing.Load():
		return errors.New("shutting down")
	case !g.nc.IsConnected():
		return errors.New("not connected to NATS")
	}
	if err := g.serverWatch.Healthy(); err != nil {
		return err
	}
	if err := g.events.Healthy(); err != nil {
		return err
	}
	if n := g.backlog.Load(); n > 0 {
		return fmt.Errorf("%d system event(s) not stored yet", n)
	}
	if err := g.nodes.FeedHealthy(); err != nil {
		return err
	}
	if err := g.local.Manager().RecordsHealthy(); err != nil {
		return err // the state dir is full or read-only: no local start is accepted
	}
	return g.index.Healthy()
}

// Blockers lists the gateway-host sessions that block a safe restart.
func (g *Gateway) Blockers() []session.Blocker {
	b := g.local.Manager().Blockers()
	if b == nil {
		b = []session.Blocker{}
	}
	return b
}

// Authed wraps h with the gateway's bearer-token check (the tool token or
// the operator token) and the failure limits, for handlers mounted beside
// the API (such as /mcp and /metrics).
func (g *Gateway) Authed(h http.Handler) http.Handler { return g.authed(h.ServeHTTP) }

// Close stops taking calls and ends every gateway-host process tree: the
// NATS API and the node registry stop (the exit feed drains, so what was
// delivered is handled), background work ends, the session core ends its
// trees, and exit events still to store get a last chance. It is
// idempotent.
func (g *Gateway) Close(ctx context.Context) error {
	g.closeMu.Lock()
	defer g.closeMu.Unlock()
	if g.closed {
		return g.closeErr
	}
	g.closed = true
	g.closing.Store(true)
	var errs *multierror.Error
	if g.nats != nil {
		g.nats.stop()
	}
	if g.localSv != nil {
		if err := g.localSv.Close(ctx); err != nil {
			errs = multierror.Append(errs, err)
		}
	}
	if err := g.nodes.Close(ctx); err != nil {
		errs = multierror.Append(errs, fmt.Errorf("node registry: %w", err))
	}
	// The session core first: its exits are stored while bg still runs.
	if err := g.local.Close(ctx); err != nil {
		errs = multierror.Append(errs, fmt.Errorf("session core: %w", err))
	}
	g.notices.stop()
	g.appr.Stop()
	// Peers take over at once what this gateway leaves (its approvals;
	// its host's sessions, which ended with the session core).
	if err := g.peers.Close(ctx); err != nil {
		errs = multierror.Append(errs, err)
	}
	g.flushBacklog(ctx)
	g.bgCancel()
	g.bgWG.Wait()
	g.requests.Close()
	g.closeErr = errs.ErrorOrNil()
	return g.closeErr
}

// InvokeRequest is one tool call, from HTTP or NATS.
type InvokeRequest struct {
	Tool       string          `json:"tool"`
	Args       json.RawMessage `json:"args,omitempty"`
	SessionKey string          `json:"sessionKey,omitempty"`
	Model      string          `json:"model,omitempty"`
	// IdempotencyKey, from the Idempotency-Key header, makes an exec
	// start idempotent across retries and gateways (idempotency.go).
	IdempotencyKey string `json:"-"`
	// stream, for an exec started on an attach socket (attach.go), is
	// bound to the session on its host before it runs.
	stream *protocol.StreamSpec
}

// ParseSessionKey validates a sessionKey and returns its agent id. The empty
// key is the default `agent:main:main`. A key is agent:<agentId>:<name>:
// the agent id 1 to 64 of [a-z0-9_-], starting with a letter or digit, the
// name 1 to 190 of [A-Za-z0-9._:@/+=-] (checked by hand: every call parses
// one, and the regular expression this replaces cost microseconds).
func ParseSessionKey(key string) (sessionKey, agentID string, err error) {
	if key == "" {
		key = DefaultSessionKey
	}
	agent, ok := splitSessionKey(key)
	if !ok {
		return "", "", protocol.Errorf(protocol.ErrInvalidRequest, "invalid sessionKey %q: expected agent:<agentId>:<name> (agent id: lower-case letters, digits, '-', '_')", key)
	}
	return key, agent, nil
}

// splitSessionKey returns the agent id of a well-formed session key.
func splitSessionKey(key string) (agent string, ok bool) {
	rest, ok := strings.CutPrefix(key, "agent:")
	i := strings.IndexByte(rest, ':')
	if !ok || i < 1 || i > 64 {
		return "", false
	}
	agent, name := rest[:i], rest[i+1:]
	for j := 0; j < len(agent); j++ {
		c := agent[j]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || j > 0 && (c == '_' || c == '-')) {
			return "", false
		}
	}
	if len(name) < 1 || len(name) > 190 {
		return "", false
	}
	for j := 0; j < len(name); j++ {
		c := name[j]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("._:@/+=-", c) >= 0) {
			return "", false
		}
	}
	return agent, true
}

// toolAllowed applies tools.allow/tools.deny and the agent's tools.deny.
// apply_patch is a sub-tool of exec: allowing exec allows it, denying exec
// denies it, and it must be enabled (and the model allowed) on its own.
func toolAllowed(cfg *config.Config, agentID, tool, model string) bool {
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

// ToolsFor lists the tools the agent of sessionKey may call (MCP offers
// these).
func (g *Gateway) ToolsFor(sessionKey string) []string {
	_, agentID, err := ParseSessionKey(sessionKey)
	if err != nil {
		return nil
	}
	cfg := g.Config()
	var out []string
	for _, t := range []string{protocol.ToolExec, protocol.ToolProcess, protocol.ToolApplyPatch} {
		if toolAllowed(&cfg, agentID, t, "") {
			out = append(out, t)
		}
	}
	return out
}

// Invoke runs one tool call. The error, when not nil, is a *protocol.Error
// raised before anything ran.
func (g *Gateway) Invoke(ctx context.Context, req InvokeRequest) (protocol.Result, error) {
	a, err := g.invoke(ctx, req)
	return a.result(), err
}

// answer is the result of a tool call: res, or for process list the list
// with its entries kept as their hosts encoded them, which an HTTP answer
// writes as they are.
type answer struct {
	res  protocol.Result
	list *protocol.ListResult
}

// result is the answer's Result.
func (a *answer) result() protocol.Result {
	if a.list != nil {
		return a.list.Result()
	}
	return a.res
}

// invoke is Invoke, answering process list with its entries' JSON.
func (g *Gateway) invoke(ctx context.Context, req InvokeRequest) (a answer, err error) {
	if m := g.opts.Metrics; m != nil {
		start := time.Now()
		defer func() {
			status := a.res.Status()
			if a.list != nil {
				status = a.list.Details.Status.Value()
			}
			if err != nil {
				status = "error"
			}
			m.ObserveCall(req.Tool, invokeAction(req), status, time.Since(start))
		}()
	}
	if g.closing.Load() {
		return answer{}, &protocol.Error{Type: protocol.ErrUnavailable, Message: "gateway is shutting down", Retryable: true}
	}
	sessionKey, agentID, err := ParseSessionKey(req.SessionKey)
	if err != nil {
		return answer{}, err
	}
	cfg := g.Config()
	switch req.Tool {
	case protocol.ToolExec, protocol.ToolProcess, protocol.ToolApplyPatch:
	default:
		return answer{}, protocol.Errorf(protocol.ErrNotFound, "Tool not available: %s", req.Tool)
	}
	if !toolAllowed(&cfg, agentID, req.Tool, req.Model) {
		return answer{}, protocol.Errorf(protocol.ErrNotFound, "Tool not available: %s", req.Tool)
	}
	c := &call{g: g, cfg: cfg, sessionKey: sessionKey, agentID: agentID, stream: req.stream}
	switch req.Tool {
	case protocol.ToolApplyPatch:
		args, err := protocol.DecodeApplyPatchArgs(req.Args)
		if err != nil {
			return answer{}, err
		}
		a.res, err = c.applyPatch(ctx, args)
		return a, err
	case protocol.ToolExec:
		args, err := protocol.DecodeExecArgs(req.Args)
		if err != nil {
			return answer{}, err
		}
		if req.IdempotencyKey != "" {
			a.res, err = c.execOnce(ctx, req.IdempotencyKey, args)
			return a, err
		}
		a.res, err = c.exec(ctx, args)
		return a, err
	}
	args, err := protocol.DecodeProcessArgs(req.Args)
	if err != nil {
		return answer{}, err
	}
	if args.Action == "list" {
		lr, err := c.listEntries(ctx, args)
		if err != nil {
			return answer{}, err
		}
		return answer{list: &lr}, nil
	}
	a.res, err = c.process(ctx, args)
	return a, err
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
	cfg        config.Config
	sessionKey string
	agentID    string
	// stream, for a start attached to a WebSocket (attach.go), is bound
	// to the session on its host before it runs.
	stream *protocol.StreamSpec
}

// defaultsKeyPrefix starts the control-bucket keys of the per-sessionKey
// exec defaults: defaults.<sessionKey token>.
const defaultsKeyPrefix = "defaults."

// sessionDefaults returns the /exec defaults of a sessionKey.
func (g *Gateway) sessionDefaults(sessionKey string) SessionExecDefaults {
	d, _ := g.defaults.Get(defaultsKeyPrefix + protocol.EncodeSessionKeyToken(sessionKey))
	return d
}

// SetSessionDefaults validates and stores per-sessionKey exec defaults,
// for every gateway of the deployment. The host must pass the same
// override rule as a per-call host.
func (g *Gateway) SetSessionDefaults(ctx context.Context, sessionKey string, d SessionExecDefaults) error {
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
	if d.Host != "" && !config.ValidHost(d.Host) {
		return protocol.Errorf(protocol.ErrInvalidRequest, "Invalid exec host %q. Allowed values: auto, sandbox, gateway, node.", d.Host)
	}
	if d.Security != "" && !config.ValidSecurity(d.Security) {
		return protocol.Errorf(protocol.ErrInvalidRequest, "Invalid exec security %q. Allowed values: deny, allowlist, full.", d.Security)
	}
	if d.Ask != "" && !config.ValidAsk(d.Ask) {
		return protocol.Errorf(protocol.ErrInvalidRequest, "Invalid exec ask %q. Allowed values: off, on-miss, always.", d.Ask)
	}
	cfg := g.Config()
	if d.Host != "" {
		if _, err := resolveHost(cfg.ExecHost(agentID), d.Host, cfg.Sandbox.Mode != sandbox.ModeOff, false); err != nil {
			return err
		}
	}
	k := defaultsKeyPrefix + protocol.EncodeSessionKeyToken(key)
	if d == (SessionExecDefaults{}) {
		err = g.defaults.Delete(ctx, k)
	} else {
		err = g.defaults.Put(ctx, k, d)
	}
	if err != nil {
		return &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true, Message: fmt.Sprintf("per-session exec defaults not stored (JetStream: %v); retry", err)}
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

// NodeOptions tunes the node registry; the defaults can be set through
// the environment the gateway reads (Options.Getenv):
// EXECMESH_NODE_PRESENCE_TTL_MS, EXECMESH_NODE_GHOST_TTL_MS,
// EXECMESH_NODE_REQUEST_MARGIN_MS, EXECMESH_NODE_CALL_TIMEOUT_MS and
// EXECMESH_NODE_INVITE_TTL_MS.
type NodeOptions struct {
	PresenceTTL   time.Duration
	GhostTTL      time.Duration
	RequestMargin time.Duration
	CallTimeout   time.Duration
	InviteTTL     time.Duration
}

// nodeOptionsFromEnv reads EXECMESH_NODE_*; zero values keep the defaults.
func nodeOptionsFromEnv(getenv func(string) string, log *slog.Logger) NodeOptions {
	o := NodeOptions{}
	ms := func(key string, dst *time.Duration) {
		v := strings.TrimSpace(getenv(key))
		if v == "" {
			return
		}
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			log.Warn("ignoring invalid setting", "key", key, "value", v)
			return
		}
		*dst = time.Duration(n) * time.Millisecond
	}
	ms("EXECMESH_NODE_PRESENCE_TTL_MS", &o.PresenceTTL)
	ms("EXECMESH_NODE_GHOST_TTL_MS", &o.GhostTTL)
	ms("EXECMESH_NODE_REQUEST_MARGIN_MS", &o.RequestMargin)
	ms("EXECMESH_NODE_CALL_TIMEOUT_MS", &o.CallTimeout)
	ms("EXECMESH_NODE_INVITE_TTL_MS", &o.InviteTTL)
	return o
}
