package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-multierror"
	"github.com/nats-io/nats.go"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/gateway"
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
}

func (f *serverFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.config, "config", "", "JSON configuration file (default <state-dir>/config.json when it exists)")
	fs.StringVar(&f.stateDir, "state-dir", "", "state directory (default ~/.execmesh, or EXECMESH_STATE_DIR)")
	fs.StringVar(&f.listen, "listen", "", "HTTP listen address (default 127.0.0.1:8420)")
	fs.StringVar(&f.natsListen, "nats-listen", "", "embedded NATS client address (default 127.0.0.1:4222; beyond loopback every client authenticates)")
	fs.StringVar(&f.natsURL, "nats-url", "", "external NATS server URL(s), comma-separated (no embedded server)")
	fs.StringVar(&f.token, "token", "", "bearer token for the HTTP API (or EXECMESH_GATEWAY_TOKEN)")
	fs.StringVar(&f.prefix, "prefix", "", "NATS subject prefix (default execmesh)")
	fs.DurationVar(&f.drainTimeout, "drain-timeout", -1, "on SIGTERM, wait up to this long for gateway-host background sessions before ending them")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn, error")
}

// loadServerConfig applies defaults < file < EXECMESH_* < flags.
func (c *cli) loadServerConfig(f *serverFlags) (gateway.Config, string, error) {
	stateDir := f.stateDir
	if stateDir == "" {
		stateDir = c.getenv(envStateDir)
	}
	if stateDir == "" {
		stateDir = gateway.DefaultConfig().StateDir
	}
	path := f.config
	if path == "" {
		if p := filepath.Join(stateDir, "config.json"); fileExists(p) {
			path = p
		}
	}
	cfg, err := gateway.LoadConfig(path, c.env)
	if err != nil {
		return cfg, path, err
	}
	if f.stateDir != "" || cfg.StateDir == gateway.DefaultConfig().StateDir {
		cfg.StateDir = stateDir
		if cfg.Sandbox.Workspace == filepath.Join(gateway.DefaultConfig().StateDir, "workspace") {
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
	if f.drainTimeout >= 0 {
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

// serveUp runs `execmesh up`: embedded NATS, the gateway and a local node
// agent in one process, until ctx ends.
func serveUp(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return serveDaemon(ctx, "up", args, stdout, stderr)
}

// serveGateway runs `execmesh gateway` until ctx ends.
func serveGateway(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return serveDaemon(ctx, "gateway", args, stdout, stderr)
}

// daemon is a running gateway process: what it started, in start order, so
// that shutdown can undo it in reverse.
type daemon struct {
	log     *slog.Logger
	srv     *bus.Server
	nc      *nats.Conn
	gw      *gateway.Gateway
	http    *http.Server
	node    *nodeagent.Agent
	reaper  *session.Reaper // the process's, shared by the gateway's and the local node's session cores
	metrics *metrics.Metrics
	authOn  bool // the embedded server requires authentication
	drain   time.Duration
	grace   time.Duration
	cfg     gateway.Config
	cfgPth  string
}

func serveDaemon(ctx context.Context, mode string, args []string, stdout, stderr io.Writer) error {
	c := &cli{stdout: stdout, stderr: stderr, env: environMap(os.Environ())}
	var f serverFlags
	fs := newFlagSet(mode)
	f.register(fs)
	if _, err := c.parseFlags(fs, "[flags]", args, true); err != nil {
		return err
	}
	cfg, path, err := c.loadServerConfig(&f)
	if err != nil {
		return err
	}
	log := newLogger(stderr, f.logLevel)
	d := &daemon{log: log, cfg: cfg, cfgPth: path,
		drain: time.Duration(cfg.Gateway.DrainTimeoutMs) * time.Millisecond,
		grace: time.Duration(cfg.Tools.Exec.KillGraceMs) * time.Millisecond}
	if err := d.start(ctx, mode); err != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		return multierror.Append(err, d.stop(sctx)).ErrorOrNil()
	}
	fmt.Fprintf(stdout, "execmesh %s: serving http://%s (NATS %s, state %s)\n", mode, d.http.Addr, d.natsDesc(), cfg.StateDir)

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

func (d *daemon) natsDesc() string {
	if d.srv != nil {
		return "embedded " + d.srv.ClientURL()
	}
	return d.cfg.NATS.URL
}

func (d *daemon) start(ctx context.Context, mode string) error {
	cfg := d.cfg
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("stateDir: %w", err)
	}
	// Bind the HTTP port first: a second daemon on the same state dir fails
	// here, before it touches NATS or JetStream state.
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
		if !isLoopbackAddr(cfg.NATS.Listen) {
			// Beyond loopback every client authenticates: the gateway gets
			// its own user; nodes join by code with their own nkeys.
			pw, err := randomSecret()
			if err != nil {
				ln.Close()
				return err
			}
			scfg.Users = []bus.User{{Name: "execmesh-gateway", Password: pw}}
			cc.User, cc.Password = "execmesh-gateway", pw
			d.authOn = true
		}
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
	d.reaper = session.NewReaper(session.ReaperConfig{Logger: d.log.With("component", "session")})
	d.gw, err = gateway.New(ctx, cfg, gateway.Options{Logger: d.log, ConfigPath: d.cfgPth, Metrics: d.metrics, Reaper: d.reaper})
	if err != nil {
		ln.Close()
		return err
	}
	if err := d.gw.ServeNATS(d.nc, cfg.NATS.Prefix); err != nil {
		ln.Close()
		return err
	}
	if d.srv != nil {
		// Join by code adds nodes to the embedded server's users.
		if err := d.gw.SetEmbeddedServer(d.srv); err != nil {
			ln.Close()
			return err
		}
	}
	if mode == "up" {
		if d.node, err = startLocalNode(ctx, d); err != nil {
			ln.Close()
			return fmt.Errorf("local node agent: %w", err)
		}
	}
	d.http = &http.Server{
		Addr:              ln.Addr().String(),
		Handler:           d.handler(),
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ErrorLog:          slog.NewLogLogger(d.log.Handler(), slog.LevelWarn),
	}
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
// itself).
func (d *daemon) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", d.gw.Handler())
	mux.Handle(ui.Prefix+"/", ui.Handler())
	mux.Handle(ui.Prefix, ui.Handler())
	mux.Handle("GET /metrics", d.gw.Authed(d.metrics.Handler()))
	mcp := mcpserver.HTTPHandler(func(sessionKey string) mcpserver.Invoker {
		return mcpserver.NewGatewayInvoker(d.gw, sessionKey)
	}, mcpserver.Options{Version: version, Logger: d.log.With("component", "mcp")})
	mux.Handle("/mcp", d.gw.Authed(mcp))
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
	if d.gw != nil {
		if err := d.gw.CloseNodes(ctx); err != nil {
			errs = multierror.Append(errs, fmt.Errorf("node backend: %w", err))
		}
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

func isLoopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func randomSecret() (string, error) {
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("random secret: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// startLocalNode starts the node agent of `execmesh up`. It shares the
// gateway's state dir (and so its exec-approvals.json, DESIGN.md §7) and
// is paired before its first heartbeat.
func startLocalNode(ctx context.Context, d *daemon) (*nodeagent.Agent, error) {
	id, err := bus.LoadOrCreateNodeIdentity(d.cfg.StateDir)
	if err != nil {
		return nil, err
	}
	if err := d.gw.ApproveNode(id.NodeID); err != nil {
		return nil, err
	}
	cfg := nodeagent.DefaultConfig()
	cfg.Logger = d.log.With("component", "node")
	cfg.Session.Reaper = d.reaper
	cfg.Session.Containment = d.cfg.Tools.Exec.Containment
	cfg.Prefix = d.cfg.NATS.Prefix
	cfg.StateDir = d.cfg.StateDir
	cfg.Identity = &id
	if host, err := os.Hostname(); err == nil && host != "" {
		cfg.Name = host
	} else {
		cfg.Name = "local"
	}
	if d.srv != nil {
		cfg.Client = bus.ClientConfig{Name: "execmesh-node-local", InProcess: d.srv}
		if d.authOn {
			u, err := bus.NodeUser(d.cfg.NATS.Prefix, id.PublicKey)
			if err != nil {
				return nil, err
			}
			if err := d.srv.AddNKeyUser(u); err != nil {
				return nil, err
			}
		}
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
