package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/execmesh/execmesh/metrics"
	"github.com/execmesh/execmesh/nodeagent"
)

// nodeCloseTimeout bounds the shutdown of `execmesh node`: end every
// session's process tree (SIGTERM, grace, SIGKILL), flush exit events,
// drain NATS.
const nodeCloseTimeout = 30 * time.Second

// nodeEnv are the EXECMESH_* variables of `execmesh node`; flags win over
// them. Pointers: an unset variable changes nothing.
type nodeEnv struct {
	NATSURL     *string `env:"NATS_URL"`
	Prefix      *string `env:"NATS_PREFIX"`
	Creds       *string `env:"NATS_CREDS"`
	NKeySeed    *string `env:"NATS_NKEY_SEED"`
	TLSCA       *string `env:"NATS_TLS_CA"`
	Name        *string `env:"NODE_NAME"`
	StateDir    *string `env:"NODE_STATE_DIR"`
	Join        *string `env:"NODE_JOIN"`
	HeartbeatMs *int    `env:"NODE_HEARTBEAT_MS"`
	Security    *string `env:"NODE_SECURITY"`
	Ask         *string `env:"NODE_ASK"`
	MetricsAddr *string `env:"NODE_METRICS_ADDR"`
	// Containment is the session core's containment, as the gateway's
	// tools.exec.containment: auto, cgroup or process-group.
	Containment *string `env:"EXEC_CONTAINMENT"`
}

// serveNode runs `execmesh node`: a headless node agent in the foreground
// (container- and systemd-friendly: logs go to stderr, SIGINT/SIGTERM end
// it cleanly), until ctx ends.
func serveNode(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := &cli{stdout: stdout, stderr: stderr, env: environMap(os.Environ())}
	fs := newFlagSet("node")
	urls := &listFlag{split: true}
	fs.Var(urls, "nats-url", "NATS server `URL`s, comma-separated or repeated (or $EXECMESH_NATS_URL; default: the servers of an earlier --join)")
	name := fs.String("name", "", "display `name` (default: the host name, or the name given at invite)")
	stateDir := fs.String("state-dir", "", "state `dir`ectory holding the node's key (default ~/"+nodeagent.DefaultStateDirName+", or $EXECMESH_NODE_STATE_DIR)")
	creds := fs.String("creds", "", "NATS .creds `file` (external NATS with account tooling)")
	seed := fs.String("nkey-seed", "", "`file` holding an nkey user seed (default: the node's own key in the state dir)")
	tlsCA := fs.String("tls-ca", "", "CA `file` to verify the NATS server's certificate")
	prefix := fs.String("prefix", "", "NATS subject `prefix` (default execmesh)")
	join := fs.String("join", "", "join `code` from `execmesh nodes invite`: joins and pairs this machine")
	workdir := fs.String("workdir", "", "working `dir`ectory of commands that name none (default: the current directory)")
	heartbeat := fs.Duration("heartbeat", 0, "heartbeat `interval` (default 5s)")
	security := fs.String("security", "", "node-local limit on the security mode: deny, allowlist or full (default: as the gateway sends)")
	ask := fs.String("ask", "", "node-local limit on the ask mode: off, on-miss or always (default: as the gateway sends)")
	logLevel := fs.String("log-level", "info", "log `level`: debug, info, warn, error")
	metricsAddr := fs.String("metrics-addr", "", "serve Prometheus metrics at http://`addr`/metrics, e.g. 127.0.0.1:9101 (or $EXECMESH_NODE_METRICS_ADDR; default: off)")
	pos, err := c.parseFlags(fs, "[flags]", args, true)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErrorf("node: unexpected arguments %q", pos)
	}

	var ev nodeEnv
	if err := env.ParseWithOptions(&ev, env.Options{Prefix: "EXECMESH_", Environment: c.env}); err != nil {
		return fmt.Errorf("environment: %w", err)
	}
	pick := func(flagValue string, envValue *string) string {
		if flagValue != "" {
			return flagValue
		}
		if envValue != nil {
			return strings.TrimSpace(*envValue)
		}
		return ""
	}

	log := newLogger(stderr, *logLevel).With("component", "node")
	cfg := nodeagent.DefaultConfig()
	cfg.Logger = log
	cfg.Version = version
	cfg.Session.ApplyEnv(c.getenv)
	cfg.Session.Logger = log.With("component", "session")
	if ev.Containment != nil {
		cfg.Session.Containment = strings.TrimSpace(*ev.Containment)
	}
	if d := pick(*stateDir, ev.StateDir); d != "" {
		cfg.StateDir = d
	} else if home := c.getenv("HOME"); home != "" {
		cfg.StateDir = home + "/" + nodeagent.DefaultStateDirName
	}
	cfg.Name = pick(*name, ev.Name)
	if p := pick(*prefix, ev.Prefix); p != "" {
		cfg.Prefix = p
	}
	cfg.Join = pick(*join, ev.Join)
	cfg.Cwd = *workdir
	cfg.Security = pick(*security, ev.Security)
	cfg.Ask = pick(*ask, ev.Ask)
	switch {
	case *heartbeat > 0:
		cfg.HeartbeatInterval = *heartbeat
	case ev.HeartbeatMs != nil && *ev.HeartbeatMs > 0:
		cfg.HeartbeatInterval = time.Duration(*ev.HeartbeatMs) * time.Millisecond
	}
	cfg.Client.URLs = urls.values
	if len(cfg.Client.URLs) == 0 && ev.NATSURL != nil && strings.TrimSpace(*ev.NATSURL) != "" {
		cfg.Client.URLs = []string{*ev.NATSURL}
	}
	cfg.Client.CredsFile = pick(*creds, ev.Creds)
	cfg.Client.NKeySeedFile = pick(*seed, ev.NKeySeed)
	cfg.Client.TLSCAFile = pick(*tlsCA, ev.TLSCA)
	if cfg.Client.CredsFile != "" && cfg.Client.NKeySeedFile != "" {
		return usageErrorf("node: pass --creds or --nkey-seed, not both")
	}

	agent, err := nodeagent.New(cfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "execmesh node: id %s, name %q, state %s\n", agent.ID(), agent.Name(), cfg.StateDir)
	if addr := pick(*metricsAddr, ev.MetricsAddr); addr != "" {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("node: --metrics-addr: %w", err)
		}
		mctx, stop := context.WithCancel(ctx)
		served := make(chan error, 1)
		go func() { served <- metrics.NewNode(agent.MetricsStats).Serve(mctx, ln) }()
		defer func() {
			stop()
			if err := <-served; err != nil {
				log.Warn("metrics server", "err", err)
			}
		}()
		fmt.Fprintf(stdout, "execmesh node: metrics at http://%s/metrics\n", ln.Addr())
	}
	if err := agent.Run(ctx, nodeCloseTimeout); err != nil {
		if errors.Is(err, nodeagent.ErrNoServer) {
			return usageErrorf("node: %v", err)
		}
		return err
	}
	return nil
}
