package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/execmesh/execmesh/config"
	"github.com/execmesh/execmesh/internal/httpsrv"

	"github.com/execmesh/execmesh/access"

	"github.com/hashicorp/go-multierror"
	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/gateway"
	"github.com/execmesh/execmesh/host"
	"github.com/execmesh/execmesh/internal/statelock"
	"github.com/execmesh/execmesh/mcpserver"
	"github.com/execmesh/execmesh/metrics"
	"github.com/execmesh/execmesh/nodeagent"
	"github.com/execmesh/execmesh/session"
	"github.com/execmesh/execmesh/ui"
)

// serverFlags are the flags of `execmesh up` and `execmesh gateway`.
type serverFlags struct {
	config, stateDir, listen, natsListen, natsURL, token, prefix string
	drainTimeout                                                 time.Duration
	logLevel                                                     string
	// drainSet is whether --drain-timeout was given (0 is a value).
	drainSet bool
}

func (f *serverFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.config, "config", "", "JSON configuration `file` (default <state-dir>/config.json when it exists)")
	fs.StringVar(&f.stateDir, "state-dir", "", "state `dir`ectory (default $EXECMESH_STATE_DIR, else ~/.execmesh); one daemon per directory")
	fs.StringVar(&f.listen, "listen", "", "HTTP listen `address` (default gateway.listen, 127.0.0.1:8420)")
	fs.StringVar(&f.natsListen, "nats-listen", "", "embedded NATS client `address` (default nats.listen, 127.0.0.1:4222); beyond loopback every client authenticates and nodes can join by code")
	fs.StringVar(&f.natsURL, "nats-url", "", "external NATS server `URLs`, comma-separated (no embedded server)")
	fs.StringVar(&f.token, "token", "", "bearer `token` for the HTTP API (default $EXECMESH_GATEWAY_TOKEN, else gateway.auth.token); required beyond loopback")
	fs.StringVar(&f.prefix, "prefix", "", "NATS subject `prefix` (default nats.prefix, execmesh)")
	fs.DurationVar(&f.drainTimeout, "drain-timeout", 0, "on SIGTERM, wait up to this `duration` for gateway-host background sessions before ending them (default gateway.drainTimeoutMs, 0)")
	fs.StringVar(&f.logLevel, "log-level", "info", "log `level`: debug, info, warn, error")
}

// newUpCmd is `execmesh up`.
func (c *cli) newUpCmd() *cobra.Command {
	return c.newServeCmd("up", "embedded NATS + gateway + a local node agent, in one process",
		"Run the single-host default in the foreground: the embedded NATS server, the gateway (HTTP API,\n"+
			"MCP at /mcp, control page at /ui/) and a local node agent, paired automatically. Loopback only\n"+
			"unless a token is set. SIGHUP reloads the configuration file (also one created after the start,\n"+
			"by execmesh config set); SIGINT/SIGTERM drain and stop. One daemon per state directory.",
		"  execmesh up\n  execmesh up --listen 127.0.0.1:9000\n  execmesh up --nats-listen 0.0.0.0:4222 --token \"$(openssl rand -hex 24)\"")
}

// newGatewayCmd is `execmesh gateway`.
func (c *cli) newGatewayCmd() *cobra.Command {
	return c.newServeCmd("gateway", "the gateway alone (embedded NATS unless --nats-url)",
		"Run the gateway alone in the foreground: the embedded NATS server unless --nats-url names servers\n"+
			"(then nodes connect there, see deploy/README.md). As up, without the local node agent.",
		"  execmesh gateway --nats-url nats://nats-1:4222,nats://nats-2:4222 --token \"$TOKEN\"")
}

func (c *cli) newServeCmd(mode, short, long, example string) *cobra.Command {
	var f serverFlags
	cmd := &cobra.Command{
		Use:     mode + " [flags]",
		Short:   short,
		Long:    long,
		Example: example,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f.drainSet = cmd.Flags().Changed("drain-timeout")
			return c.serveDaemon(cmd.Context(), mode, &f)
		},
	}
	f.register(cmd.Flags())
	completeValues(cmd, "log-level", "debug", "info", "warn", "error")
	_ = cmd.MarkFlagFilename("config", "json")
	_ = cmd.MarkFlagDirname("state-dir")
	return cmd
}

// loadServerConfig applies defaults < file < EXECMESH_* < flags. The file
// is --config, else <state-dir>/config.json when it exists at the time of
// the call: a reload finds a file created after the start.
func (c *cli) loadServerConfig(f *serverFlags) (config.Config, string, error) {
	// The same default config.Load derives from this environment.
	defaultStateDir := config.DefaultStateDir(c.getenv)
	stateDir := f.stateDir
	if stateDir == "" {
		stateDir = c.getenv(envStateDir)
	}
	if stateDir == "" {
		stateDir = defaultStateDir
	}
	path := f.config
	if path == "" {
		if p := filepath.Join(stateDir, "config.json"); fileExists(p) {
			path = p
		}
	}
	cfg, err := config.Load(path, c.env)
	if err != nil {
		return cfg, path, err
	}
	if f.stateDir != "" || cfg.StateDir == defaultStateDir {
		cfg.StateDir = stateDir
		if cfg.Sandbox.Workspace == filepath.Join(defaultStateDir, "workspace") {
			cfg.Sandbox.Workspace = filepath.Join(stateDir, "workspace")
		}
	}
	set := func(dst *string, v string) {
		if v != "" {
			*dst = v
		}
	}
	set(&cfg.Gateway.Listen, f.listen)
	set(&cfg.NATS.Listen, f.natsListen)
	set(&cfg.NATS.URL, f.natsURL)
	set(&cfg.Gateway.Auth.Token, f.token)
	set(&cfg.NATS.Prefix, f.prefix)
	if f.drainSet {
		if f.drainTimeout < 0 {
			return cfg, path, usageErrorf("--drain-timeout must not be negative")
		}
		cfg.Gateway.DrainTimeoutMs = int(f.drainTimeout / time.Millisecond)
	}
	if err := cfg.Validate(); err != nil {
		return cfg, path, err
	}
	return cfg, path, nil
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

func newLogger(w io.Writer, level string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		l = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l}))
}

// daemon is a running gateway process: what it started, in start order, so
// that shutdown can undo it in reverse.
type daemon struct {
	log    *slog.Logger
	srv    *bus.Server
	nc     *nats.Conn
	gw     *gateway.Gateway
	http   *http.Server
	node   *nodeagent.Agent
	reaper *session.Reaper // the process's, shared by the gateway's and the local node's session cores
	// confine is the kernel confinement of allowlist runs, the same for
	// the gateway host and the local node.
	confine host.ConfineConfig
	metrics *metrics.Metrics
	// gwID is the gateway's identity on the embedded server (nil with an
	// external NATS): it connects with it, and it alone may send to
	// nodes' subjects there.
	gwID   *bus.Identity
	drain  time.Duration
	grace  time.Duration
	cfg    config.Config
	cfgPth string
	// reload builds the configuration a SIGHUP applies, with the same
	// layering as the start (file, EXECMESH_*, flags).
	reload func() (config.Config, error)
}

// serveDaemon runs `execmesh up` (mode "up": with a local node agent) or
// `execmesh gateway` until ctx ends.
func (c *cli) serveDaemon(ctx context.Context, mode string, f *serverFlags) error {
	cfg, path, err := c.loadServerConfig(f)
	if err != nil {
		return err
	}
	// One daemon per state dir: a second one would share the JetStream
	// store and the local node's identity.
	if err := nonDumpable(); err != nil {
		return err
	}
	lock, err := statelock.Acquire(cfg.StateDir)
	if err != nil {
		return err
	}
	defer lock.Release()
	cfg.StateDir = realDir(cfg.StateDir)
	if f.config != "" {
		// Reloads read the file found now, not where a link leads later.
		f.config = realDir(f.config)
		path = f.config
	}
	if f.stateDir != "" {
		f.stateDir = cfg.StateDir
	}
	log := newLogger(c.stderr, f.logLevel)
	d := &daemon{log: log, cfg: cfg, cfgPth: path,
		drain: time.Duration(cfg.Gateway.DrainTimeoutMs) * time.Millisecond,
		grace: time.Duration(cfg.Tools.Exec.KillGraceMs) * time.Millisecond,
		reload: func() (config.Config, error) {
			cfg, path, err := c.loadServerConfig(f)
			cfg.StateDir = realDir(cfg.StateDir)
			if err == nil && path != "" {
				log.Info("configuration file", "path", path)
			}
			return cfg, err
		}}
	if err := d.start(ctx, mode); err != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		return multierror.Append(err, d.stop(sctx)).ErrorOrNil()
	}
	fmt.Fprintf(c.stdout, "execmesh %s: serving http://%s (state %s)\n", mode, d.http.Addr, cfg.StateDir)
	fmt.Fprintf(c.stdout, "execmesh %s: NATS: %s\n", mode, d.natsDesc())
	fmt.Fprintf(c.stdout, "execmesh %s: control page: http://%s%s/\n", mode, d.http.Addr, ui.Prefix)
	if conf := d.gw.Confinement(); conf.Mode == host.ModeLandlock {
		fmt.Fprintf(c.stdout, "execmesh %s: security allowlist: confined by the kernel (Landlock): allowlisted programs can run only what is allowed, write only to their workdir and TMPDIR, and not read the state dir\n", mode)
	} else {
		fmt.Fprintf(c.stdout, "execmesh %s: security allowlist: NOT confined by the kernel (%s): every program that is not a safe bin needs approval\n", mode, conf.Reason)
	}
	if cfg.Gateway.Auth.OperatorToken == "" {
		// Where, never what: the token stays in its 0600 file.
		fmt.Fprintf(c.stdout, "execmesh %s: operator token in %s (the CLI reads it; the control page asks for it)\n",
			mode, filepath.Join(cfg.StateDir, access.OperatorTokenFile))
	}
	if d.srv != nil {
		fmt.Fprintf(c.stdout, "execmesh %s: NATS without anonymous clients; for the nats CLI: nats --server %s --nkey %s\n",
			mode, d.srv.ClientURL(), filepath.Join(cfg.StateDir, bus.OperatorKeyFile))
	}

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-hup:
			if err := d.gw.Reload(); err != nil {
				log.Error("reload failed; keeping the old configuration", "err", err)
			}
			continue
		case <-ctx.Done():
		}
		break
	}
	log.Info("shutting down")
	// Shutdown runs on its own context: the root one was just cancelled.
	sctx, cancel := context.WithTimeout(context.Background(), d.drain+d.grace+30*time.Second)
	defer cancel()
	return d.stop(sctx)
}

// natsDesc describes the bus for the start-up line: the embedded server
// by the address it listens on (every interface for 0.0.0.0:P), or the
// external servers.
func (d *daemon) natsDesc() string {
	if d.srv == nil {
		return "external servers " + bus.RedactURLs(d.cfg.NATS.URL)
	}
	desc := "embedded server on " + d.srv.ListenAddr()
	if d.srv.ListensOnLoopback() {
		return desc + ", loopback only: nodes on other machines cannot join (--nats-listen 0.0.0.0:4222 lets them)"
	}
	return desc + ", every client authenticates; nodes join with: execmesh nodes invite"
}

func (d *daemon) start(ctx context.Context, mode string) error {
	cfg := d.cfg
	ln, err := net.Listen("tcp", cfg.Gateway.Listen)
	if err != nil {
		return fmt.Errorf("gateway.listen: %w", err)
	}
	d.metrics = metrics.New()
	cc := bus.ClientConfig{Name: "execmesh-gateway", CredsFile: cfg.NATS.CredsFile, NKeySeedFile: cfg.NATS.NKeySeedFile, TLSCAFile: cfg.NATS.TLSCAFile,
		Options: []nats.Option{nats.ReconnectHandler(func(nc *nats.Conn) {
			d.metrics.IncNATSReconnects()
			d.log.Info("nats reconnected", "server", nc.ConnectedUrlRedacted())
		})}}
	if cfg.NATS.URL == "" {
		scfg := bus.DefaultServerConfig(cfg.StateDir)
		scfg.Listen = cfg.NATS.Listen
		scfg.Logger = d.log.With("component", "nats")
		// No anonymous client, loopback included: the gateway and the
		// operator have identities of their own in the state dir, the
		// local node its node key, joined nodes theirs.
		users, gwID, err := embeddedIdentities(cfg)
		if err != nil {
			ln.Close()
			return err
		}
		scfg.NKeys = users
		d.gwID = gwID
		// nats.credsFile and nats.nkeySeedFile are for external servers.
		cc.CredsFile, cc.NKeySeedFile, cc.NKeySeed = "", "", gwID.Seed
		d.srv, err = bus.StartServer(ctx, scfg)
		if err != nil {
			ln.Close()
			return fmt.Errorf("nats.listen: embedded NATS server: %w", err)
		}
		cc.InProcess = d.srv
	} else {
		cc.URLs = strings.Split(cfg.NATS.URL, ",")
		// Nothing is served until the first connection: bus.Connect
		// warns about failed attempts (with the certificate problem
		// behind a refusal) and logs "waiting for NATS" meanwhile.
		d.log.Info("connecting to NATS", "client", cc)
	}
	d.nc, err = bus.Connect(ctx, cc, d.log.With("component", "nats-client"))
	if err != nil {
		ln.Close()
		return fmt.Errorf("nats.url: %w", err)
	}
	// The exec-node binding is written to the file in force, else to
	// <state-dir>/config.json (which a reload then reads).
	cfgPath := d.cfgPth
	if cfgPath == "" {
		cfgPath = filepath.Join(cfg.StateDir, "config.json")
	}
	d.reaper = session.NewReaper(session.ReaperConfig{Logger: d.log.With("component", "session")})
	d.confine = confineConfig(cfg.Tools.Exec.Confine, cfg.StateDir, cfgPath, d.cfgPth, cfg.NATS.CredsFile, cfg.NATS.NKeySeedFile)
	d.gw, err = gateway.New(ctx, cfg, gateway.Options{Conn: d.nc, Server: d.srv, Logger: d.log, Version: buildVersion().Version, ConfigPath: cfgPath, Load: d.reload,
		Metrics: d.metrics, Reaper: d.reaper, Confine: d.confine})
	if err != nil {
		ln.Close()
		return err
	}
	if mode == "up" {
		if d.node, err = startLocalNode(ctx, d); err != nil {
			ln.Close()
			return fmt.Errorf("local node agent: %w", err)
		}
	}
	d.http = httpsrv.New(ctx, d.handler(), slog.NewLogLogger(d.log.Handler(), slog.LevelWarn))
	d.http.Addr = ln.Addr().String()
	go func() {
		if err := d.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.Error("http server stopped", "err", err)
		}
	}()
	return nil
}

// handler is the daemon's HTTP surface: the gateway API, the MCP
// streamable-HTTP transport at /mcp and GET /metrics behind the same
// token, and the control page at /ui (static files; it asks for the token
// itself). Everything is behind the gateway's browser defences (Protect:
// Host, Origin, JSON bodies); the API applies them itself.
func (d *daemon) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", d.gw.Handler())
	// A person who opens the gateway's address finds the control page.
	mux.Handle("GET /{$}", http.RedirectHandler(ui.Prefix+"/", http.StatusFound))
	page := d.gw.Protect(ui.Handler())
	mux.Handle(ui.Prefix+"/", page)
	mux.Handle(ui.Prefix, page)
	mux.Handle("GET /metrics", d.gw.Protect(d.gw.Authed(d.metrics.Handler())))
	mcp := mcpserver.HTTPHandler(func(sessionKey string) mcpserver.Invoker {
		return mcpserver.NewGatewayInvoker(d.gw, sessionKey)
	}, mcpserver.Options{Version: buildVersion().Version, Logger: d.log.With("component", "mcp"),
		ApplyPatch: func() bool { return d.gw.Config().Tools.Exec.ApplyPatch.Enabled }})
	mux.Handle("/mcp", d.gw.Protect(d.gw.Authed(mcp)))
	return d.metrics.Instrument(mux)
}

// stop undoes start in reverse order: stop taking calls, let active
// background sessions finish (up to the drain timeout), end every process
// tree, close the bus.
func (d *daemon) stop(ctx context.Context) error {
	var errs *multierror.Error
	if d.http != nil {
		hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := d.http.Shutdown(hctx); err != nil {
			errs = multierror.Append(errs, fmt.Errorf("http shutdown: %w", err))
		}
		cancel()
	}
	if d.gw != nil && d.drain > 0 {
		d.waitBlockers(ctx)
	}
	if d.node != nil {
		if err := d.node.Close(ctx); err != nil {
			errs = multierror.Append(errs, fmt.Errorf("local node: %w", err))
		}
	}
	if d.gw != nil {
		if err := d.gw.Close(ctx); err != nil {
			errs = multierror.Append(errs, err)
		}
	}
	if d.reaper != nil {
		if err := d.reaper.Close(ctx); err != nil {
			errs = multierror.Append(errs, err)
		}
	}
	if d.nc != nil {
		if err := d.nc.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			d.nc.Close()
		}
		for i := 0; i < 100 && !d.nc.IsClosed(); i++ {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if d.srv != nil {
		if err := d.srv.Shutdown(ctx); err != nil {
			errs = multierror.Append(errs, fmt.Errorf("nats shutdown: %w", err))
		}
	}
	return errs.ErrorOrNil()
}

// waitBlockers waits up to the drain timeout for gateway-host background
// sessions (removed ones included) to exit on their own.
func (d *daemon) waitBlockers(ctx context.Context) {
	deadline := time.NewTimer(d.drain)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		b := d.gw.Blockers()
		if len(b) == 0 {
			return
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			d.log.Warn("drain timeout reached; ending remaining sessions", "sessions", len(b))
			return
		case <-ctx.Done():
			return
		}
	}
}

// embeddedIdentities returns the identities the embedded server starts
// with: the gateway's (everything) and the operator's (bus.OperatorPermissions),
// both nkeys kept in the state dir, and the gateway's identity.
func embeddedIdentities(cfg config.Config) ([]bus.NKeyUser, *bus.Identity, error) {
	gwID, err := bus.LoadOrCreateGatewayIdentity(cfg.StateDir)
	if err != nil {
		return nil, nil, fmt.Errorf("gateway identity: %w", err)
	}
	opID, err := bus.LoadOrCreateIdentity(filepath.Join(cfg.StateDir, bus.OperatorKeyFile))
	if err != nil {
		return nil, nil, fmt.Errorf("operator identity: %w", err)
	}
	opPerms, err := bus.OperatorPermissions(cfg.NATS.Prefix)
	if err != nil {
		return nil, nil, fmt.Errorf("nats.prefix: %w", err)
	}
	return []bus.NKeyUser{
		{PublicKey: gwID.PublicKey},
		{PublicKey: opID.PublicKey, Permissions: opPerms},
	}, &gwID, nil
}

// localNodeHeartbeat is how often the local node of `execmesh up` sends
// its heartbeat (its presence TTL is three of them, its liveness probe
// every other one): it runs in the gateway's process over an in-process
// connection, so no link can fail between them, and a daemon left idle
// wakes for it three times less often than for a node's default 5 s.
const localNodeHeartbeat = 15 * time.Second

// startLocalNode starts the node agent of `execmesh up`. It shares the
// gateway's state dir (and so its exec-approvals.json, DESIGN.md §7) and
// is paired before its first heartbeat.
func startLocalNode(ctx context.Context, d *daemon) (*nodeagent.Agent, error) {
	id, err := bus.LoadOrCreateNodeIdentity(d.cfg.StateDir)
	if err != nil {
		return nil, err
	}
	name := "local"
	if host, err := os.Hostname(); err == nil && host != "" {
		name = host
	}
	if d.srv != nil {
		// The embedded server admits no client without an identity: the
		// local node's key joins its identities, confined to its own
		// subjects like a node joined by code.
		if err := d.gw.AdmitNode(id.PublicKey, name); err != nil {
			return nil, err
		}
	} else if err := d.gw.ApproveNode(id.NodeID); err != nil {
		return nil, err
	}
	kctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	key, err := d.gw.SigningKey(kctx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("the gateway's approval signing key: %w", err)
	}
	cfg := nodeagent.DefaultConfig()
	cfg.HeartbeatInterval = localNodeHeartbeat
	cfg.GatewayKeys = []string{key}
	cfg.Logger = d.log.With("component", "node")
	cfg.Session.Reaper = d.reaper
	cfg.Session.Containment = d.cfg.Tools.Exec.Containment
	cfg.Prefix = d.cfg.NATS.Prefix
	cfg.StateDir = d.cfg.StateDir
	cfg.Workspace = d.cfg.Sandbox.Workspace // one workspace root for the gateway and its local node
	cfg.AllowlistEnv = d.cfg.Tools.Exec.AllowlistEnv
	cfg.AllowlistWrites = d.cfg.Tools.Exec.AllowlistWrites
	cfg.Confine = d.confine // one state dir, one config: the same things hidden
	cfg.Identity = &id
	cfg.Name = name
	if d.srv != nil {
		cfg.Client = bus.ClientConfig{Name: "execmesh-node-local", InProcess: d.srv}
	} else {
		cfg.Client = bus.ClientConfig{Name: "execmesh-node-local", URLs: strings.Split(d.cfg.NATS.URL, ","),
			CredsFile: d.cfg.NATS.CredsFile, NKeySeedFile: d.cfg.NATS.NKeySeedFile, TLSCAFile: d.cfg.NATS.TLSCAFile}
	}
	a, err := nodeagent.New(cfg)
	if err != nil {
		return nil, err
	}
	if err := a.Start(ctx); err != nil {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return nil, multierror.Append(err, a.Close(cctx)).ErrorOrNil()
	}
	return a, nil
}

// confineConfig is the kernel confinement of a daemon's allowlist runs:
// this binary is the helper (main calls confine.RunHelperIfRequested),
// and what holds the daemon's secrets is hidden from the commands: the
// state dir (operator token, nkey seeds, approvals, records), the config
// file, NATS credentials.
func confineConfig(mode string, paths ...string) host.ConfineConfig {
	c := host.ConfineConfig{Off: mode == "off", Helper: "/proc/self/exe"}
	for _, p := range paths {
		if p == "" {
			continue
		}
		abs, err := filepath.Abs(p)
		if err != nil {
			continue
		}
		if real, err := filepath.EvalSymlinks(abs); err == nil {
			abs = real
		}
		if !slices.Contains(c.Hide, abs) {
			c.Hide = append(c.Hide, abs)
		}
	}
	return c
}

// nonDumpable makes the daemon non-dumpable: a process of the same user
// (a command under security full among them) cannot read its memory,
// environment or descriptors through /proc or ptrace, nor make it dump
// core.
func nonDumpable() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_SET_DUMPABLE): %w", err)
	}
	return nil
}

// realDir is dir with its symbolic links resolved, once, at start: a
// link a command could write (a state dir reached through a link in its
// workdir) must not lead the daemon to another policy later.
func realDir(dir string) string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return dir
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		return real
	}
	return abs
}
