package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/spf13/cobra"

	"github.com/execmesh/execmesh/config"
	"github.com/execmesh/execmesh/internal/statelock"
	"github.com/execmesh/execmesh/metrics"
	"github.com/execmesh/execmesh/nodeagent"
	"github.com/execmesh/execmesh/openclawnode"
	"github.com/execmesh/execmesh/protocol"
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
	Workspace   *string `env:"NODE_WORKSPACE"`
	// Containment is the session core's containment, as the gateway's
	// tools.exec.containment: auto, cgroup or process-group.
	Containment *string `env:"EXEC_CONTAINMENT"`
	// Confine is the node's tools.exec.confine: auto or off.
	Confine *string `env:"EXEC_CONFINE"`
	// AllowlistEnv is the node's tools.exec.allowlistEnv, comma-separated:
	// unset means the default, empty lets a request set no key.
	AllowlistEnv *string `env:"NODE_ALLOWLIST_ENV"`
	// OpenClawGateway and OpenClawToken are --openclaw-gateway and
	// --openclaw-token (the token is better kept out of the command line).
	OpenClawGateway *string `env:"OPENCLAW_GATEWAY"`
	OpenClawToken   *string `env:"OPENCLAW_TOKEN"`
}

// nodeFlags are the flags of `execmesh node`.
type nodeFlags struct {
	urls                                                      listFlag
	name, stateDir, creds, seed, tlsCA, prefix, join, workdir string
	workspace                                                 string
	heartbeat                                                 time.Duration
	security, ask, logLevel, metricsAddr                      string
	confine                                                   string
	openclawGateway, openclawToken                            string
	openclawApprovalsSet                                      bool
}

func (c *cli) newNodeCmd() *cobra.Command {
	var f nodeFlags
	cmd := &cobra.Command{
		Use:   "node [flags]",
		Short: "a headless node agent (--nats-url, --name, --join CODE, …)",
		Long: "Run a node agent in the foreground (container- and systemd-friendly: logs on stderr,\n" +
			"SIGINT/SIGTERM end it cleanly). It connects to NATS (--nats-url, or the servers of an earlier\n" +
			"--join), registers and waits to be paired: by a join code from \"execmesh nodes invite\", or by\n" +
			"\"execmesh nodes approve NODE\" on the gateway. One agent per state directory.",
		Example: "  execmesh node --join eyJ2Ijox…\n" +
			"  EXECMESH_OPENCLAW_TOKEN=… execmesh node --openclaw-gateway ws://127.0.0.1:18789 --security full\n" +
			"  execmesh node --nats-url nats://gw.example:4222 --creds node.creds --name build-1\n" +
			"  execmesh node --state-dir /var/lib/execmesh-node --metrics-addr 127.0.0.1:9101",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return c.serveNode(cmd.Context(), &f) },
	}
	fs := cmd.Flags()
	f.urls.split = true
	fs.Var(&f.urls, "nats-url", "NATS server `URL`s, comma-separated or repeated (or $EXECMESH_NATS_URL; default: the servers of an earlier --join)")
	fs.StringVar(&f.name, "name", "", "display `name` (default: the host name, or the name given at invite)")
	fs.StringVar(&f.stateDir, "state-dir", "", "state `dir`ectory holding the node's key (default ~/"+nodeagent.DefaultStateDirName+", or $EXECMESH_NODE_STATE_DIR)")
	fs.StringVar(&f.creds, "creds", "", "NATS .creds `file` (external NATS with account tooling)")
	fs.StringVar(&f.seed, "nkey-seed", "", "`file` holding an nkey user seed (default: the node's own key in the state dir)")
	fs.StringVar(&f.tlsCA, "tls-ca", "", "CA `file` to verify the NATS server's certificate")
	fs.StringVar(&f.prefix, "prefix", "", "NATS subject `prefix` (default execmesh)")
	fs.StringVar(&f.join, "join", "", "join `code` from \"execmesh nodes invite\": joins and pairs this machine")
	fs.StringVar(&f.workdir, "workdir", "", "working `dir`ectory of commands that name none (default: the current directory)")
	fs.StringVar(&f.workspace, "workspace", "", "`root` of the agents' workspaces: apply_patch writes only under <root>/<agentId> (default <state-dir>/workspace, or $EXECMESH_NODE_WORKSPACE)")
	fs.DurationVar(&f.heartbeat, "heartbeat", 0, "heartbeat `interval` (default 5s)")
	fs.StringVar(&f.security, "security", "", "node-local limit on the security `mode`: deny, allowlist or full (default: as the gateway sends)")
	fs.StringVar(&f.ask, "ask", "", "node-local limit on the ask `mode`: off, on-miss or always (default: as the gateway sends)")
	fs.StringVar(&f.logLevel, "log-level", "info", "log `level`: debug, info, warn, error")
	fs.StringVar(&f.metricsAddr, "metrics-addr", "", "serve Prometheus metrics at http://`addr`/metrics, e.g. 127.0.0.1:9101 (or $EXECMESH_NODE_METRICS_ADDR; default: off)")
	fs.StringVar(&f.openclawGateway, "openclaw-gateway", "", "also serve an OpenClaw gateway as its node host, at ws://`URL` (protocol 4; or $EXECMESH_OPENCLAW_GATEWAY); without NATS settings the node serves OpenClaw only")
	fs.BoolVar(&f.openclawApprovalsSet, "openclaw-approvals-set", false, "let the OpenClaw gateway replace this node's exec-approvals.json (system.execApprovals.set); the file is the node's policy for every gateway it serves")
	fs.StringVar(&f.openclawToken, "openclaw-token", "", "the OpenClaw gateway's `token` (gateway.auth.token; or $EXECMESH_OPENCLAW_TOKEN; default: the device token the gateway issued earlier)")
	fs.StringVar(&f.confine, "confine", "", "kernel confinement of allowlist runs: auto (Landlock where the kernel has it; else every program that is not a safe bin asks) or off (always ask)")
	completeValues(cmd, "security", "deny", "allowlist", "full")
	completeValues(cmd, "confine", "auto", "off")
	completeValues(cmd, "ask", "off", "on-miss", "always")
	completeValues(cmd, "log-level", "debug", "info", "warn", "error")
	_ = cmd.MarkFlagDirname("state-dir")
	_ = cmd.MarkFlagDirname("workdir")
	_ = cmd.MarkFlagDirname("workspace")
	return cmd
}

// serveNode runs `execmesh node`: a headless node agent in the foreground
// (container- and systemd-friendly: logs go to stderr, SIGINT/SIGTERM end
// it cleanly), until ctx ends.
func (c *cli) serveNode(ctx context.Context, f *nodeFlags) error {
	stdout, stderr := c.stdout, c.stderr
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

	log := newLogger(stderr, f.logLevel).With("component", "node")
	cfg := nodeagent.DefaultConfig()
	cfg.Logger = log
	cfg.Version = buildVersion().semver()
	cfg.Session.ApplyEnv(c.getenv)
	cfg.Session.Logger = log.With("component", "session")
	if ev.Containment != nil {
		cfg.Session.Containment = strings.TrimSpace(*ev.Containment)
	}
	if d := pick(f.stateDir, ev.StateDir); d != "" {
		cfg.StateDir = d
	} else if home := c.getenv("HOME"); home != "" {
		cfg.StateDir = home + "/" + nodeagent.DefaultStateDirName
	}
	cfg.Name = pick(f.name, ev.Name)
	if p := pick(f.prefix, ev.Prefix); p != "" {
		cfg.Prefix = p
	}
	cfg.Join = pick(f.join, ev.Join)
	cfg.Cwd = f.workdir
	cfg.Workspace = pick(f.workspace, ev.Workspace)
	cfg.Security = pick(f.security, ev.Security)
	cfg.Ask = pick(f.ask, ev.Ask)
	if ev.AllowlistEnv != nil {
		cfg.AllowlistEnv = []string{}
		for p := range strings.SplitSeq(*ev.AllowlistEnv, ",") {
			if p = strings.TrimSpace(p); p == "" {
				continue
			}
			if err := protocol.ValidateAllowlistEnvPattern(p); err != nil {
				return fmt.Errorf("EXECMESH_NODE_ALLOWLIST_ENV: %w", err)
			}
			cfg.AllowlistEnv = append(cfg.AllowlistEnv, p)
		}
	}
	switch {
	case f.heartbeat > 0:
		cfg.HeartbeatInterval = f.heartbeat
	case ev.HeartbeatMs != nil && *ev.HeartbeatMs > 0:
		cfg.HeartbeatInterval = time.Duration(*ev.HeartbeatMs) * time.Millisecond
	}
	cfg.Client.URLs = f.urls.values
	if len(cfg.Client.URLs) == 0 && ev.NATSURL != nil && strings.TrimSpace(*ev.NATSURL) != "" {
		cfg.Client.URLs = []string{*ev.NATSURL}
	}
	cfg.Client.CredsFile = pick(f.creds, ev.Creds)
	cfg.Client.NKeySeedFile = pick(f.seed, ev.NKeySeed)
	cfg.Client.TLSCAFile = pick(f.tlsCA, ev.TLSCA)
	if cfg.Client.CredsFile != "" && cfg.Client.NKeySeedFile != "" {
		return usageErrorf("node: pass --creds or --nkey-seed, not both")
	}
	switch mode := pick(f.confine, ev.Confine); mode {
	case "", "auto", "off":
		// The default state dir of a gateway on the same machine is
		// hidden too: its operator token approves this node's runs.
		cfg.Confine = confineConfig(mode, nodeSecrets(cfg.StateDir, cfg.Client.CredsFile, cfg.Client.NKeySeedFile, c.getenv)...)
	default:
		return usageErrorf("node: --confine: invalid value %q (allowed: auto, off)", mode)
	}

	ocURL, ocToken := pick(f.openclawGateway, ev.OpenClawGateway), pick(f.openclawToken, ev.OpenClawToken)
	if ocToken != "" && ocURL == "" {
		return usageErrorf("node: --openclaw-token needs --openclaw-gateway")
	}
	if f.openclawApprovalsSet && ocURL == "" {
		return usageErrorf("node: --openclaw-approvals-set needs --openclaw-gateway")
	}
	// The OpenClaw connection is told of the exits of its sessions; it is
	// built before the agent starts, so the hook sees it set.
	var oc *openclawnode.Client
	if ocURL != "" {
		cfg.OnExit = func(e protocol.ExitEvent) { go oc.Exit(e) }
	}

	// One agent per state dir: a second one would share the node's key
	// and identity.
	if err := nonDumpable(); err != nil {
		return err
	}
	lock, err := statelock.Acquire(cfg.StateDir)
	if err != nil {
		return err
	}
	defer lock.Release()
	cfg.StateDir = realDir(cfg.StateDir)
	agent, err := nodeagent.New(cfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "execmesh node: id %s, name %q, state %s\n", agent.ID(), agent.Name(), cfg.StateDir)
	natsLess := false
	if ocURL != "" {
		oc, err = openclawnode.New(openclawnode.Config{
			URL: ocURL, Token: ocToken, StateDir: cfg.StateDir, DisplayName: agent.Name(),
			Version: cfg.Version, PathEnv: c.getenv("PATH"), Logger: log,
			Host: agent.Host(), Which: agent.Which, ApprovalsGet: agent.ApprovalsGet, ApprovalsSet: agent.ApprovalsSet,
			Security: cfg.Security, Ask: cfg.Ask, Workdir: ocWorkdir(cfg.Cwd), ApprovalsWritable: f.openclawApprovalsSet,
		})
		if err != nil {
			return fmt.Errorf("node: --openclaw-gateway: %w", err)
		}
		fmt.Fprintf(stdout, "execmesh node: OpenClaw device %s, gateway %s (approve with: openclaw nodes approve %s)\n", oc.DeviceID(), ocURL, oc.DeviceID())
		_, joinErr := os.Stat(filepath.Join(cfg.StateDir, nodeagent.JoinFile))
		natsLess = len(cfg.Client.URLs) == 0 && cfg.Join == "" && errors.Is(joinErr, fs.ErrNotExist)
	}
	if addr := pick(f.metricsAddr, ev.MetricsAddr); addr != "" {
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
	if oc != nil {
		octx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = oc.Run(octx)
		}()
		defer func() {
			stop()
			<-done
		}()
	}
	if natsLess {
		if err := agent.StartLocal(); err != nil {
			return err
		}
		<-ctx.Done()
		log.Info("node agent stopping")
		cctx, cancel := context.WithTimeout(context.Background(), nodeCloseTimeout)
		defer cancel()
		return agent.Close(cctx)
	}
	if err := agent.Run(ctx, nodeCloseTimeout); err != nil {
		if errors.Is(err, nodeagent.ErrNoServer) {
			return usageErrorf("node: %v", err)
		}
		return err
	}
	return nil
}

// nodeSecrets are the paths a node's confined commands must not see:
// its state dir and NATS credentials, and the state dir an execmesh
// gateway on the same machine keeps by default ($EXECMESH_STATE_DIR,
// ~/.execmesh): its operator token approves this node's runs, and a
// node's gateway may well be another process of the same user on the
// same machine. They are listed whether or not they exist yet: each run
// masks what exists when it starts, so a gateway started after the node
// is hidden too.
func nodeSecrets(stateDir, creds, seed string, getenv func(string) string) []string {
	out := []string{stateDir, creds, seed}
	for _, d := range []string{getenv(envStateDir), config.DefaultStateDir(getenv)} {
		if d != "" && d != stateDir {
			out = append(out, d)
		}
	}
	return out
}

// ocWorkdir is the directory OpenClaw's runs work beneath: the node's
// --workdir, else its current directory, symbolic links resolved.
func ocWorkdir(dir string) string {
	if dir == "" {
		dir, _ = os.Getwd()
	}
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	return realDir(dir)
}
