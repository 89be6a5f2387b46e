package nodeagent

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/execmesh/execmesh/approvals"
	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/host"
	"github.com/execmesh/execmesh/protocol"
	"github.com/execmesh/execmesh/session"
)

// Defaults and clamps of the node agent, in one place.
const (
	DefaultHeartbeatInterval = 5 * time.Second
	MinHeartbeatInterval     = 50 * time.Millisecond
	MaxHeartbeatInterval     = time.Minute
	DefaultIdempotencyTTL    = 15 * time.Minute
	DefaultMaxIdempotency    = 4096
	DefaultExitFlushTimeout  = 5 * time.Second
	// DefaultJoinTimeout bounds joining by code: connecting with the
	// one-time credential and waiting for the gateway's answer.
	DefaultJoinTimeout = 20 * time.Second
	// DefaultStateDirName is the state dir below the home directory.
	DefaultStateDirName = ".execmesh-node"
	// JoinFile is written into the state dir after a successful join: the
	// NATS URLs and prefix, so later starts need no flags.
	JoinFile = "node-join.json"
	// DefaultWorkspaceName is the workspace root below the state dir.
	DefaultWorkspaceName = "workspace"
)

// Config configures an Agent. Start from DefaultConfig; New validates it
// and names the offending field.
type Config struct {
	// Logger receives the agent's logs; nil discards them.
	Logger *slog.Logger

	// Client says how to reach NATS: server URLs (or an in-process
	// server), credentials, TLS. When it carries no credentials the node
	// authenticates with its own nkey (Identity), which is what a node
	// admitted by a join code needs. InboxPrefix is always replaced by
	// bus.InboxPrefix(<node id>): a node's permissions only let it read
	// replies there.
	Client bus.ClientConfig

	// Prefix is the subject prefix (default protocol.DefaultSubjectPrefix).
	Prefix string

	// StateDir holds the node's nkey (node.nkey) and, after a join, the
	// saved connection settings (JoinFile). Default ~/.execmesh-node.
	StateDir string

	// Identity overrides the key pair in StateDir (tests, embedding).
	Identity *bus.Identity

	// Confine is the kernel confinement of the node's allowlist runs
	// (host.ConfineConfig; its zero value confines nothing and asks).
	Confine host.ConfineConfig

	// Name is the display name; default the host name.
	Name string

	// Version is reported in heartbeats and micro INFO; it must be SemVer.
	Version string

	// Session configures the session core. DefaultConfig fills it from
	// session.DefaultConfig; OnExit and OnAcknowledged are set by the
	// agent.
	Session session.Config

	// Environ is the node's own environment, inherited (after
	// protocol.SanitizeHostEnv) by every command; nil means os.Environ().
	// Its PATH is the one a request may only prepend to.
	Environ []string

	// Cwd is the working directory of commands that name none; empty
	// means the agent's working directory.
	Cwd string

	// Workspace is the root of the agents' workspaces on this node:
	// apply_patch writes only under <Workspace>/<agentId> unless the
	// gateway allows any workdir (tools.exec.applyPatch.workspaceOnly
	// false). Default <StateDir>/workspace (DefaultWorkspaceName).
	Workspace string

	// Security and Ask are node-local limits: the effective policy of a
	// run is the stricter of these, what the gateway sent, and the
	// agent's entry of <state-dir>/exec-approvals.json. Empty means no
	// further limit.
	Security string
	Ask      string

	// AllowlistEnv is the node's tools.exec.allowlistEnv: the request env
	// keys a run under security allowlist may set (host.CheckAllowlistEnv);
	// nil means protocol.DefaultAllowlistEnv.
	AllowlistEnv []string
	// AllowlistWrites are paths beneath which a confined allowlist run
	// may write besides its workdir and TMPDIR (tools.exec.allowlistWrites).
	AllowlistWrites []string

	// GatewayKeys are gateway public keys the node trusts to sign approval
	// decisions, beside those it learns (GatewayKeysFile). `execmesh up`
	// passes its gateway's key to its local node.
	GatewayKeys []string

	// OnExit, when set, also receives the exit event of every background
	// session (the OpenClaw node-host connection tells OpenClaw of its
	// own); it must not block.
	OnExit func(protocol.ExitEvent)

	// HeartbeatInterval is how often the node publishes its presence
	// (default 5 s, clamped 50 ms..1 min).
	HeartbeatInterval time.Duration

	// IdempotencyTTL is how long the answer of an exec start is kept for
	// a retry carrying the same key (default 15 min); MaxIdempotencyKeys
	// bounds how many are kept (default 4096, oldest dropped first).
	IdempotencyTTL     time.Duration
	MaxIdempotencyKeys int

	// ExitFlushTimeout bounds how long Close waits for exit events still
	// being published (default 5 s).
	ExitFlushTimeout time.Duration

	// Join is a join code (`execmesh nodes invite`). Start redeems it
	// before connecting normally, and saves the URLs and prefix it
	// carries in StateDir (JoinFile).
	Join string
	// JoinTimeout bounds the join (default 20 s).
	JoinTimeout time.Duration
}

// DefaultConfig returns a fresh configuration with every default set.
func DefaultConfig() Config {
	return Config{
		Prefix:             protocol.DefaultSubjectPrefix,
		StateDir:           defaultStateDir(),
		Version:            "0.0.0-dev",
		Session:            session.DefaultConfig(),
		HeartbeatInterval:  DefaultHeartbeatInterval,
		IdempotencyTTL:     DefaultIdempotencyTTL,
		MaxIdempotencyKeys: DefaultMaxIdempotency,
		ExitFlushTimeout:   DefaultExitFlushTimeout,
		JoinTimeout:        DefaultJoinTimeout,
	}
}

func defaultStateDir() string {
	home, err := os.UserHomeDir()
	if err != nil || home == "" {
		return DefaultStateDirName
	}
	return filepath.Join(home, DefaultStateDirName)
}

// normalize fills in defaults and clamps, and checks what can be checked
// without touching the disk. Errors name the field.
func (c *Config) normalize() error {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Prefix == "" {
		c.Prefix = protocol.DefaultSubjectPrefix
	}
	if err := protocol.ValidateSubjectPrefix(c.Prefix); err != nil {
		return fmt.Errorf("nodeagent: Prefix: %w", err)
	}
	if c.StateDir == "" && c.Identity == nil {
		c.StateDir = defaultStateDir()
	}
	if c.Version == "" {
		c.Version = "0.0.0-dev"
	}
	if err := approvals.ParseLevels(approvals.Levels{Security: c.Security, Ask: c.Ask}); err != nil {
		return fmt.Errorf("nodeagent: %w", err)
	}
	for i, p := range c.AllowlistEnv {
		if err := protocol.ValidateAllowlistEnvPattern(p); err != nil {
			return fmt.Errorf("nodeagent: AllowlistEnv[%d]: %w", i, err)
		}
	}
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	c.HeartbeatInterval = min(max(c.HeartbeatInterval, MinHeartbeatInterval), MaxHeartbeatInterval)
	if c.IdempotencyTTL <= 0 {
		c.IdempotencyTTL = DefaultIdempotencyTTL
	}
	if c.MaxIdempotencyKeys <= 0 {
		c.MaxIdempotencyKeys = DefaultMaxIdempotency
	}
	if c.ExitFlushTimeout <= 0 {
		c.ExitFlushTimeout = DefaultExitFlushTimeout
	}
	if c.JoinTimeout <= 0 {
		c.JoinTimeout = DefaultJoinTimeout
	}
	if c.Environ == nil {
		c.Environ = os.Environ()
	}
	if c.Cwd == "" {
		wd, err := os.Getwd()
		if err != nil {
			return fmt.Errorf("nodeagent: Cwd: %w", err)
		}
		c.Cwd = wd
	}
	if st, err := os.Stat(c.Cwd); err != nil || !st.IsDir() {
		return fmt.Errorf("nodeagent: Cwd: %q is not a directory", c.Cwd)
	}
	if c.Workspace == "" && c.StateDir != "" {
		c.Workspace = filepath.Join(c.StateDir, DefaultWorkspaceName)
	}
	if c.Workspace != "" {
		abs, err := filepath.Abs(c.Workspace)
		if err != nil {
			return fmt.Errorf("nodeagent: Workspace: %w", err)
		}
		c.Workspace = abs
	}
	return nil
}
