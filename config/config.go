// Package config holds the gateway's configuration: the JSON file of
// DESIGN.md §4 with OpenClaw's key names, the EXECMESH_* environment
// overrides, every default (Default) and every clamp and check (Validate)
// in one place.
package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/execmesh/execmesh/access"

	"github.com/caarlos0/env/v11"
	"github.com/hashicorp/go-multierror"

	"github.com/execmesh/execmesh/protocol"
	"github.com/execmesh/execmesh/sandbox"
)

// Config is the gateway configuration: the JSON file of DESIGN.md §4 with
// OpenClaw's key names, overridden by EXECMESH_* environment variables.
// Build it with Default or Load; every default and clamp lives
// in Default and Validate.
type Config struct {
	StateDir string         `json:"stateDir,omitempty"`
	Gateway  Gateway        `json:"gateway"`
	NATS     NATS           `json:"nats"`
	Tools    Tools          `json:"tools"`
	Agents   Agents         `json:"agents"`
	Sandbox  sandbox.Config `json:"sandbox"`
	Events   Events         `json:"events"`
}

// Events is `events`: the system-event queues.
type Events struct {
	// MaxQueued bounds each sessionKey's queue of unread events; what does
	// not fit is announced with an events.dropped event.
	MaxQueued int `json:"maxQueued"`
}

// Gateway holds the HTTP listener and its authentication.
type Gateway struct {
	Listen string `json:"listen"`
	Auth   Auth   `json:"auth"`
	// AllowedHosts are further names (host, or host:port) the HTTP API
	// answers to in the Host header, beside its listen address and the
	// loopback names: the name of a reverse proxy or a DNS name of the
	// gateway machine. A request for any other Host is refused (421), so
	// that a web page cannot reach the gateway by rebinding a name of its
	// own to the gateway's address.
	AllowedHosts []string `json:"allowedHosts,omitempty"`
	// DrainTimeoutMs is how long SIGTERM waits for active gateway-host
	// background sessions before ending them (0: end them at once).
	DrainTimeoutMs int `json:"drainTimeoutMs"`
}

// Auth holds the bearer tokens of the two roles (DESIGN.md §3.4).
type Auth struct {
	// Token is the agents' tool token: tool calls, events, sessions. An
	// empty token lets every local client call tools, which is only
	// allowed on loopback listeners.
	Token string `json:"token,omitempty"`
	// OperatorToken is the operator's token: approval decisions, node
	// pairing, node approvals files, configuration changes, and tool
	// calls too. Empty: the gateway generates one in
	// <stateDir>/operator.token (mode 0600).
	OperatorToken string `json:"operatorToken,omitempty"`
}

// NATS says where the bus is: an external cluster (URL) or the
// embedded server (Listen).
type NATS struct {
	URL          string `json:"url,omitempty"`    // comma-separated server URLs; empty = embedded server
	Listen       string `json:"listen,omitempty"` // embedded server client address
	Prefix       string `json:"prefix"`           // subject prefix
	CredsFile    string `json:"credsFile,omitempty"`
	NKeySeedFile string `json:"nkeySeedFile,omitempty"`
	TLSCAFile    string `json:"tlsCaFile,omitempty"`
	Replicas     int    `json:"replicas"` // JetStream stream/bucket replicas
}

// Tools is the `tools` section.
type Tools struct {
	Allow    []string `json:"allow,omitempty"`
	Deny     []string `json:"deny,omitempty"`
	Elevated Elevated `json:"elevated"`
	Exec     Exec     `json:"exec"`
}

// Elevated gates `elevated: true` runs.
type Elevated struct {
	Enabled bool `json:"enabled"`
	// AllowFrom lists the agent ids allowed to run elevated ("*" = all).
	// Empty means every agent, once Enabled.
	AllowFrom []string `json:"allowFrom,omitempty"`
}

// Exec is `tools.exec`.
type Exec struct {
	Host                     string     `json:"host"`
	Security                 string     `json:"security,omitempty"`
	Ask                      string     `json:"ask,omitempty"`
	Node                     string     `json:"node,omitempty"`
	BackgroundMs             int        `json:"backgroundMs,omitempty"` // 0: OPENCLAW_BASH_YIELD_MS or 10000
	TimeoutSec               int        `json:"timeoutSec"`
	CleanupMs                int        `json:"cleanupMs,omitempty"` // 0: OPENCLAW_BASH_JOB_TTL_MS or 30 min
	NotifyOnExit             bool       `json:"notifyOnExit"`
	NotifyOnExitEmptySuccess bool       `json:"notifyOnExitEmptySuccess"`
	ApprovalRunningNoticeMs  int        `json:"approvalRunningNoticeMs"`
	ApprovalTimeoutMs        int        `json:"approvalTimeoutMs"`
	KillGraceMs              int        `json:"killGraceMs"`
	PathPrepend              []string   `json:"pathPrepend,omitempty"`
	SafeBins                 []string   `json:"safeBins,omitempty"`
	SafeBinTrustedDirs       []string   `json:"safeBinTrustedDirs,omitempty"`
	ApplyPatch               ApplyPatch `json:"applyPatch"`
	// Limits are every session's resource limits (memoryMax, pidsMax,
	// cpuMax), applied where the cgroup controllers are delegated.
	Limits protocol.Limits `json:"limits,omitzero"`
	// Containment is how the session core holds process trees: auto
	// (cgroups where a writable cgroup v2 subtree exists), cgroup
	// (required) or process-group (forced fallback).
	Containment string `json:"containment,omitempty"`
	// AllowlistEnv are the request env keys a command under security
	// allowlist may set: names, or prefixes ending in "*" (LC_*). Default
	// protocol.DefaultAllowlistEnv; [] lets a request set none. The
	// blocklists apply on top (DESIGN.md §3.4).
	AllowlistEnv []string `json:"allowlistEnv"`
	// Confine is the kernel confinement of security allowlist runs:
	// "auto" (Landlock where the kernel has it; elsewhere allowlist mode
	// asks for every program that is not a safe bin) or "off" (always
	// ask). DESIGN.md §3.4.
	Confine string `json:"confine,omitempty"`
	// AllowlistWrites are absolute paths beneath which a confined
	// allowlist run may write, besides its workdir and its TMPDIR.
	AllowlistWrites []string `json:"allowlistWrites,omitempty"`
}

// ApplyPatch is `tools.exec.applyPatch`: the apply_patch sub-tool,
// off by default.
type ApplyPatch struct {
	Enabled bool `json:"enabled"`
	// AllowModels, when set, limits the tool to these models (the invoke
	// request's "model").
	AllowModels []string `json:"allowModels,omitempty"`
	// WorkspaceOnly (default true) confines patches to the agent's
	// workspace, <sandbox.workspace>/<agentId> on the gateway host and
	// the node's own workspace root on a node: a workdir outside it is a
	// security violation. False lets a patch write under any workdir, as
	// exec does. Paths inside a .git directory are refused either way.
	WorkspaceOnly bool `json:"workspaceOnly"`
}

// Agents is `agents`.
type Agents struct {
	List []Agent `json:"list,omitempty"`
}

// Agent is one `agents.list[]` entry.
type Agent struct {
	ID    string     `json:"id"`
	Tools AgentTools `json:"tools"`
}

// AgentTools holds the per-agent tool settings.
type AgentTools struct {
	Deny     []string       `json:"deny,omitempty"`
	Elevated *AgentElevated `json:"elevated,omitempty"`
	Exec     AgentExec      `json:"exec"`
}

// AgentElevated overrides tools.elevated for one agent.
type AgentElevated struct {
	Enabled *bool `json:"enabled,omitempty"`
}

// AgentExec overrides tools.exec for one agent.
type AgentExec struct {
	Node     string `json:"node,omitempty"`
	Host     string `json:"host,omitempty"`
	Security string `json:"security,omitempty"`
	Ask      string `json:"ask,omitempty"`
	// Limits replace tools.exec.limits field by field for this agent.
	Limits *protocol.Limits `json:"limits,omitempty"`
}

// Exec hosts as the configuration names them.
const (
	hostSandbox = "sandbox"
	hostGateway = "gateway"
	hostNode    = "node"
)

// ExecHost is the configured exec host of agentID: its
// agents.list[].tools.exec.host, else tools.exec.host, else "auto".
func (c *Config) ExecHost(agentID string) string {
	if a, ok := c.Agent(agentID); ok && a.Tools.Exec.Host != "" {
		return a.Tools.Exec.Host
	}
	if c.Tools.Exec.Host == "" {
		return "auto"
	}
	return c.Tools.Exec.Host
}

// Defaults and clamps, in one place.
const (
	DefaultListen      = "127.0.0.1:8420"
	DefaultNATSListen  = "127.0.0.1:4222"
	DefaultPrefix      = "execmesh"
	MinYieldMs         = 10
	MaxYieldMs         = 120000
	DefaultTimeoutSec  = 1800
	MinCleanupMs       = 60 * 1000
	MaxCleanupMs       = 3 * 60 * 60 * 1000
	DefaultNoticeMs    = 10000
	DefaultApprovalMs  = 30 * 60 * 1000
	DefaultKillGraceMs = 5000
	// DefaultMaxQueuedEvents bounds each sessionKey's event queue
	// (events.maxQueued), at most MaxMaxQueuedEvents.
	DefaultMaxQueuedEvents = 1000
	MaxMaxQueuedEvents     = 1000000
)

// Timeouts of the HTTP servers (the API and /metrics). A client has
// HTTPReadHeaderTimeout to send a request's headers once it began, and a
// kept-alive connection is closed after HTTPIdleTimeout without one:
// without that bound every idle connection a client opens holds a
// descriptor and a goroutine of the daemon until the client closes it.
const (
	HTTPReadHeaderTimeout = 10 * time.Second
	HTTPIdleTimeout       = 2 * time.Minute
)

// Default returns a fresh configuration with every default set.
func Default() Config {
	return Config{
		StateDir: DefaultStateDir(nil),
		Gateway:  Gateway{Listen: DefaultListen},
		NATS:     NATS{Listen: DefaultNATSListen, Prefix: DefaultPrefix, Replicas: 1},
		Tools: Tools{
			Exec: Exec{
				Host:                    "auto",
				TimeoutSec:              DefaultTimeoutSec,
				NotifyOnExit:            true,
				ApprovalRunningNoticeMs: DefaultNoticeMs,
				ApprovalTimeoutMs:       DefaultApprovalMs,
				KillGraceMs:             DefaultKillGraceMs,
				ApplyPatch:              ApplyPatch{WorkspaceOnly: true},
				AllowlistEnv:            protocol.DefaultAllowlistEnv(),
			},
		},
		Sandbox: sandbox.DefaultConfig(""), // workspace and hidden state dir follow stateDir in Validate/New
		Events:  Events{MaxQueued: DefaultMaxQueuedEvents},
	}
}

// StateDirName is the state directory's name in the home directory.
const StateDirName = ".execmesh"

// DefaultStateDir is the state directory when neither the configuration
// file nor EXECMESH_STATE_DIR names one: StateDirName in the home
// directory of the environment getenv reads ($HOME; a nil getenv reads
// the process's, through os.UserHomeDir), or StateDirName in the working
// directory when that environment has none. A caller with an environment
// of its own (the CLI's invocation, a test) passes its lookup, so that the
// process's home never leaks into it.
func DefaultStateDir(getenv func(string) string) string {
	var home string
	if getenv == nil {
		home, _ = os.UserHomeDir()
	} else {
		home = getenv("HOME")
	}
	if home == "" {
		return StateDirName
	}
	return filepath.Join(home, StateDirName)
}

// envOverrides are the EXECMESH_* variables. Pointers: an unset variable
// leaves the file's value alone. The key tag names the configuration key
// a variable sets (EnvVar).
type envOverrides struct {
	StateDir      *string `env:"STATE_DIR" key:"stateDir"`
	Listen        *string `env:"LISTEN" key:"gateway.listen"`
	Token         *string `env:"GATEWAY_TOKEN" key:"gateway.auth.token"`
	OperatorToken *string `env:"OPERATOR_TOKEN" key:"gateway.auth.operatorToken"`
	DrainTimeout  *int    `env:"DRAIN_TIMEOUT_MS" key:"gateway.drainTimeoutMs"`
	NATSURL       *string `env:"NATS_URL" key:"nats.url"`
	NATSListen    *string `env:"NATS_LISTEN" key:"nats.listen"`
	NATSPrefix    *string `env:"NATS_PREFIX" key:"nats.prefix"`
	NATSCreds     *string `env:"NATS_CREDS" key:"nats.credsFile"`
	NATSNKey      *string `env:"NATS_NKEY_SEED" key:"nats.nkeySeedFile"`
	NATSTLSCA     *string `env:"NATS_TLS_CA" key:"nats.tlsCaFile"`
	NATSReplicas  *int    `env:"NATS_REPLICAS" key:"nats.replicas"`
	ExecHost      *string `env:"EXEC_HOST" key:"tools.exec.host"`
	ExecSecurity  *string `env:"EXEC_SECURITY" key:"tools.exec.security"`
	ExecAsk       *string `env:"EXEC_ASK" key:"tools.exec.ask"`
	ExecNode      *string `env:"EXEC_NODE" key:"tools.exec.node"`
	BackgroundMs  *int    `env:"EXEC_BACKGROUND_MS" key:"tools.exec.backgroundMs"`
	TimeoutSec    *int    `env:"EXEC_TIMEOUT_SEC" key:"tools.exec.timeoutSec"`
	CleanupMs     *int    `env:"EXEC_CLEANUP_MS" key:"tools.exec.cleanupMs"`
	NotifyOnExit  *bool   `env:"EXEC_NOTIFY_ON_EXIT" key:"tools.exec.notifyOnExit"`
	KillGraceMs   *int    `env:"EXEC_KILL_GRACE_MS" key:"tools.exec.killGraceMs"`
	Containment   *string `env:"EXEC_CONTAINMENT" key:"tools.exec.containment"`
	ElevatedOn    *bool   `env:"ELEVATED_ENABLED" key:"tools.elevated.enabled"`
	SandboxMode   *string `env:"SANDBOX_MODE" key:"sandbox.mode"`
	SandboxNet    *bool   `env:"SANDBOX_NETWORK" key:"sandbox.network"`
	SandboxWSpace *string `env:"SANDBOX_WORKSPACE" key:"sandbox.workspace"`
}

// EnvVar returns the EXECMESH_* variable that overrides the key at
// keyPath ("tools.exec.security" → "EXECMESH_EXEC_SECURITY"), or "" when
// none does.
func EnvVar(keyPath string) string {
	t := reflect.TypeFor[envOverrides]()
	for i := range t.NumField() {
		if f := t.Field(i); f.Tag.Get("key") == keyPath {
			return "EXECMESH_" + f.Tag.Get("env")
		}
	}
	return ""
}

// Load builds the configuration: Default, then the JSON file at
// path (if path is not empty), then EXECMESH_* variables from environ (nil
// means os.Environ()). The default state dir comes from that
// environment's HOME too (DefaultStateDir). The result is validated;
// every bad key is reported.
func Load(path string, environ map[string]string) (Config, error) {
	cfg := Default()
	if environ != nil {
		cfg.StateDir = DefaultStateDir(func(k string) string { return environ[k] })
	}
	if path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return cfg, fmt.Errorf("config: %w", err)
		}
		if err := decodeInto(&cfg, data); err != nil {
			return cfg, fmt.Errorf("config %s: %w", path, err)
		}
	}
	if err := applyEnv(&cfg, environ); err != nil {
		return cfg, err
	}
	if err := cfg.Validate(); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// CheckFile reports what makes the configuration file at path unusable on
// its own, without the EXECMESH_* variables: it cannot be read, it is not
// JSON (the error gives line and column), or a key or value is bad. The
// commands that do not need the file use it to say that they ignore it.
func CheckFile(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if _, err := Decode(data); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	return nil
}

// Decode decodes a JSON config document onto the defaults and
// validates it (used by `execmesh config set` before it writes).
func Decode(data []byte) (Config, error) {
	cfg := Default()
	if err := decodeInto(&cfg, data); err != nil {
		return cfg, err
	}
	return cfg, cfg.Validate()
}

func decodeInto(cfg *Config, data []byte) error {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(cfg); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return fmt.Errorf("%s: invalid value for %s: expected %s, got JSON %s", position(data, te.Offset-1), te.Field, te.Type, te.Value)
		}
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return fmt.Errorf("%s: invalid JSON: %w%s", position(data, se.Offset-1), err, syntaxHint(data, se.Offset))
		}
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("%s: invalid JSON: the document ends early (an unclosed { or [?): %w", position(data, int64(len(data))), err)
		}
		if strings.HasPrefix(err.Error(), "json: unknown field ") {
			if path := unknownKeyPath(data); path != "" {
				return fmt.Errorf("unknown key %s", path)
			}
			return fmt.Errorf("unknown key %s", strings.TrimPrefix(err.Error(), "json: unknown field "))
		}
		return fmt.Errorf("invalid JSON: %w", err)
	}
	return nil
}

// position is "line L, column C" (both from 1, columns in bytes) of the
// byte at index i of data (len(data): just past the end), so that an
// editor finds the place: encoding/json reports only offsets.
func position(data []byte, i int64) string {
	i = min(max(i, 0), int64(len(data)))
	before := data[:i]
	line := bytes.Count(before, []byte("\n")) + 1
	col := len(before) - bytes.LastIndexByte(before, '\n')
	return fmt.Sprintf("line %d, column %d", line, col)
}

// syntaxHint names the usual cause of a syntax error at off: a comma
// after the last entry of an object or list, which JSON forbids.
func syntaxHint(data []byte, off int64) string {
	off = min(max(off, 0), int64(len(data)))
	if off == 0 || (data[off-1] != '}' && data[off-1] != ']') {
		return ""
	}
	prev := bytes.TrimRight(data[:off-1], " \t\r\n")
	if len(prev) > 0 && prev[len(prev)-1] == ',' {
		return " (a comma after the last entry: JSON allows none)"
	}
	return ""
}

// unknownKeyPath returns the full key path of the first key (in sorted
// order) of the JSON document that Config does not have, such as
// "tools.exec.sucurity" or "agents.list[1].tools.hots"; "" when there is
// none. encoding/json names only the key itself. Keys match fields
// case-insensitively, as encoding/json matches them.
func unknownKeyPath(data []byte) string {
	var doc any
	if json.Unmarshal(data, &doc) != nil {
		return ""
	}
	return unknownIn(doc, reflect.TypeFor[Config](), "")
}

func unknownIn(v any, t reflect.Type, at string) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		obj, ok := v.(map[string]any)
		if !ok {
			return ""
		}
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			here := k
			if at != "" {
				here = at + "." + k
			}
			ft, ok := jsonField(t, k)
			if !ok {
				return here
			}
			if p := unknownIn(obj[k], ft, here); p != "" {
				return p
			}
		}
	case reflect.Slice:
		list, _ := v.([]any)
		for i, e := range list {
			if p := unknownIn(e, t.Elem(), fmt.Sprintf("%s[%d]", at, i)); p != "" {
				return p
			}
		}
	case reflect.Map:
		obj, _ := v.(map[string]any)
		for k, e := range obj {
			if p := unknownIn(e, t.Elem(), at+"."+k); p != "" {
				return p
			}
		}
	}
	return ""
}

// jsonField finds the type of the field of struct t that JSON key name
// decodes into (embedded structs included), as encoding/json does.
func jsonField(t reflect.Type, name string) (reflect.Type, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		key, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && key == "" {
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				if sub, ok := jsonField(ft, name); ok {
					return sub, true
				}
			}
			continue
		}
		if !f.IsExported() {
			continue
		}
		if key == "" {
			key = f.Name
		}
		if strings.EqualFold(key, name) {
			return f.Type, true
		}
	}
	return nil, false
}

func applyEnv(cfg *Config, environ map[string]string) error {
	var o envOverrides
	opts := env.Options{Prefix: "EXECMESH_"}
	if environ != nil {
		opts.Environment = environ
	}
	if err := env.ParseWithOptions(&o, opts); err != nil {
		return envError(err)
	}
	set := func(dst *string, v *string) {
		if v != nil {
			*dst = *v
		}
	}
	setInt := func(dst *int, v *int) {
		if v != nil {
			*dst = *v
		}
	}
	setBool := func(dst *bool, v *bool) {
		if v != nil {
			*dst = *v
		}
	}
	set(&cfg.StateDir, o.StateDir)
	set(&cfg.Gateway.Listen, o.Listen)
	set(&cfg.Gateway.Auth.Token, o.Token)
	set(&cfg.Gateway.Auth.OperatorToken, o.OperatorToken)
	setInt(&cfg.Gateway.DrainTimeoutMs, o.DrainTimeout)
	set(&cfg.NATS.URL, o.NATSURL)
	set(&cfg.NATS.Listen, o.NATSListen)
	set(&cfg.NATS.Prefix, o.NATSPrefix)
	set(&cfg.NATS.CredsFile, o.NATSCreds)
	set(&cfg.NATS.NKeySeedFile, o.NATSNKey)
	set(&cfg.NATS.TLSCAFile, o.NATSTLSCA)
	setInt(&cfg.NATS.Replicas, o.NATSReplicas)
	set(&cfg.Tools.Exec.Host, o.ExecHost)
	set(&cfg.Tools.Exec.Security, o.ExecSecurity)
	set(&cfg.Tools.Exec.Ask, o.ExecAsk)
	set(&cfg.Tools.Exec.Node, o.ExecNode)
	setInt(&cfg.Tools.Exec.BackgroundMs, o.BackgroundMs)
	setInt(&cfg.Tools.Exec.TimeoutSec, o.TimeoutSec)
	setInt(&cfg.Tools.Exec.CleanupMs, o.CleanupMs)
	setBool(&cfg.Tools.Exec.NotifyOnExit, o.NotifyOnExit)
	setInt(&cfg.Tools.Exec.KillGraceMs, o.KillGraceMs)
	set(&cfg.Tools.Exec.Containment, o.Containment)
	setBool(&cfg.Tools.Elevated.Enabled, o.ElevatedOn)
	set(&cfg.Sandbox.Mode, o.SandboxMode)
	setBool(&cfg.Sandbox.Network, o.SandboxNet)
	set(&cfg.Sandbox.Workspace, o.SandboxWSpace)
	return nil
}

// Allowed values (functions, so that no caller can change them).
func hostValues() []string     { return []string{"auto", "sandbox", "gateway", "node"} }
func securityValues() []string { return []string{"deny", "allowlist", "full"} }
func askValues() []string      { return []string{"off", "on-miss", "always"} }
func sandboxModes() []string   { return []string{"off", "bwrap"} }
func containments() []string   { return []string{"auto", "cgroup", "process-group"} }
func toolNames() []string      { return []string{"exec", "process", "apply_patch"} }

// ValidHost reports whether h is an exec host value: auto, sandbox,
// gateway or node.
func ValidHost(h string) bool { return slices.Contains(hostValues(), h) }

// ValidSecurity and ValidAsk report whether s is a security (deny,
// allowlist, full) or an ask value (off, on-miss, always).
func ValidSecurity(s string) bool { return slices.Contains(securityValues(), s) }

// ValidAsk: see ValidSecurity.
func ValidAsk(s string) bool { return slices.Contains(askValues(), s) }

// Validate checks every key and clamps the numeric ones into range. Errors
// name the key; all of them are reported at once.
func (c *Config) Validate() error {
	var errs *multierror.Error
	bad := func(key, format string, args ...any) {
		errs = multierror.Append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
	}
	oneOf := func(key, v string, allowed []string, emptyOK bool) {
		if v == "" && emptyOK {
			return
		}
		if !slices.Contains(allowed, v) {
			bad(key, "invalid value %q (allowed: %s)", v, strings.Join(allowed, ", "))
		}
	}
	if strings.TrimSpace(c.StateDir) == "" {
		bad("stateDir", "must not be empty")
	}
	if _, _, err := net.SplitHostPort(c.Gateway.Listen); err != nil {
		bad("gateway.listen", "invalid address %q: %v", c.Gateway.Listen, err)
	}
	if c.Gateway.DrainTimeoutMs < 0 {
		bad("gateway.drainTimeoutMs", "must not be negative")
	}
	a := &c.Gateway.Auth
	a.Token, a.OperatorToken = strings.TrimSpace(a.Token), strings.TrimSpace(a.OperatorToken)
	if a.OperatorToken != "" && a.OperatorToken == a.Token {
		bad("gateway.auth.operatorToken", "must differ from gateway.auth.token: the operator's token would be the agents' too")
	}
	for i, h := range c.Gateway.AllowedHosts {
		norm, err := access.NormalizeAllowedHost(h)
		if err != nil {
			bad(fmt.Sprintf("gateway.allowedHosts[%d]", i), "%v", err)
			continue
		}
		c.Gateway.AllowedHosts[i] = norm
	}
	if c.NATS.URL == "" {
		if _, _, err := net.SplitHostPort(c.NATS.Listen); err != nil {
			bad("nats.listen", "invalid address %q: %v", c.NATS.Listen, err)
		}
	}
	if !validToken(c.NATS.Prefix) {
		bad("nats.prefix", "invalid subject prefix %q (letters, digits, '-' and '_' only)", c.NATS.Prefix)
	}
	if c.NATS.Replicas < 1 || c.NATS.Replicas > 5 {
		bad("nats.replicas", "must be between 1 and 5, got %d", c.NATS.Replicas)
	}
	for i, t := range c.Tools.Deny {
		oneOf(fmt.Sprintf("tools.deny[%d]", i), t, toolNames(), false)
	}
	for i, t := range c.Tools.Allow {
		oneOf(fmt.Sprintf("tools.allow[%d]", i), t, toolNames(), false)
	}
	e := &c.Tools.Exec
	oneOf("tools.exec.host", e.Host, hostValues(), false)
	oneOf("tools.exec.security", e.Security, securityValues(), true)
	oneOf("tools.exec.ask", e.Ask, askValues(), true)
	// backgroundMs and cleanupMs stay 0 when unset so that the
	// OPENCLAW_BASH_* environment overrides can apply (spec §3.2).
	if e.BackgroundMs < 0 {
		bad("tools.exec.backgroundMs", "must not be negative")
	} else if e.BackgroundMs > 0 {
		e.BackgroundMs = clamp(e.BackgroundMs, MinYieldMs, MaxYieldMs)
	}
	if e.TimeoutSec < 0 {
		bad("tools.exec.timeoutSec", "must not be negative")
	} else if e.TimeoutSec == 0 {
		e.TimeoutSec = DefaultTimeoutSec
	}
	if e.CleanupMs < 0 {
		bad("tools.exec.cleanupMs", "must not be negative")
	} else if e.CleanupMs > 0 {
		e.CleanupMs = clamp(e.CleanupMs, MinCleanupMs, MaxCleanupMs)
	}
	if e.ApprovalRunningNoticeMs < 0 {
		e.ApprovalRunningNoticeMs = 0
	}
	if e.ApprovalTimeoutMs <= 0 {
		e.ApprovalTimeoutMs = DefaultApprovalMs
	}
	if e.KillGraceMs < 0 {
		bad("tools.exec.killGraceMs", "must not be negative")
	}
	oneOf("tools.exec.containment", e.Containment, containments(), true)
	if err := e.Limits.Validate(func(k string) string { return "tools.exec.limits." + k }); err != nil {
		errs = multierror.Append(errs, err)
	}
	for i, p := range e.PathPrepend {
		if !filepath.IsAbs(strings.TrimSpace(p)) {
			bad(fmt.Sprintf("tools.exec.pathPrepend[%d]", i), "%q is not an absolute directory", p)
		}
	}
	oneOf("tools.exec.confine", e.Confine, []string{"auto", "off"}, true)
	for i, p := range e.AllowlistWrites {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p {
			bad(fmt.Sprintf("tools.exec.allowlistWrites[%d]", i), "%q is not an absolute, clean path", p)
		}
	}
	for i, p := range e.AllowlistEnv {
		if err := protocol.ValidateAllowlistEnvPattern(p); err != nil {
			bad(fmt.Sprintf("tools.exec.allowlistEnv[%d]", i), "%v", err)
		}
	}
	seen := map[string]bool{}
	for i, a := range c.Agents.List {
		key := fmt.Sprintf("agents.list[%d]", i)
		if !ValidAgentID(a.ID) {
			bad(key+".id", "invalid agent id %q (lower-case letters, digits, '-' and '_')", a.ID)
		} else if seen[a.ID] {
			bad(key+".id", "duplicate agent id %q", a.ID)
		}
		seen[a.ID] = true
		for j, t := range a.Tools.Deny {
			oneOf(fmt.Sprintf("%s.tools.deny[%d]", key, j), t, toolNames(), false)
		}
		oneOf(key+".tools.exec.host", a.Tools.Exec.Host, hostValues(), true)
		oneOf(key+".tools.exec.security", a.Tools.Exec.Security, securityValues(), true)
		oneOf(key+".tools.exec.ask", a.Tools.Exec.Ask, askValues(), true)
		if l := a.Tools.Exec.Limits; l != nil {
			if err := l.Validate(func(k string) string { return key + ".tools.exec.limits." + k }); err != nil {
				errs = multierror.Append(errs, err)
			}
		}
	}
	if c.Events.MaxQueued < 1 || c.Events.MaxQueued > MaxMaxQueuedEvents {
		bad("events.maxQueued", "must be between 1 and %d, got %d", MaxMaxQueuedEvents, c.Events.MaxQueued)
	}
	oneOf("sandbox.mode", c.Sandbox.Mode, sandboxModes(), false)
	// host=sandbox runs in a sandbox or not at all (DESIGN.md §3.3).
	if c.Sandbox.Mode == sandbox.ModeOff {
		if e.Host == hostSandbox {
			bad("tools.exec.host", "%q needs a sandbox runtime, but sandbox.mode is %q: set sandbox.mode to %q, or tools.exec.host to \"auto\" or \"gateway\" (which go through exec approvals)", hostSandbox, c.Sandbox.Mode, sandbox.ModeBwrap)
		}
		for i, a := range c.Agents.List {
			if a.Tools.Exec.Host == hostSandbox {
				bad(fmt.Sprintf("agents.list[%d].tools.exec.host", i), "%q needs a sandbox runtime, but sandbox.mode is %q: set sandbox.mode to %q, or this agent's host to \"auto\" or \"gateway\"", hostSandbox, c.Sandbox.Mode, sandbox.ModeBwrap)
			}
		}
	}
	if c.Sandbox.Workspace == "" {
		c.Sandbox.Workspace = filepath.Join(c.StateDir, "workspace")
	}
	if err := errs.ErrorOrNil(); err != nil {
		return fmt.Errorf("invalid configuration: %w", err)
	}
	return nil
}

// ExecPolicy returns the security and ask modes that apply to agentID's
// exec calls before any per-session or per-call tightening: the agent's
// tools.exec values, else the global ones, else the defaults of
// DESIGN.md §3.4 (security deny when the configured host is the sandbox,
// allowlist otherwise; ask on-miss).
func (c *Config) ExecPolicy(agentID string) (security, ask string) {
	security, ask = c.Tools.Exec.Security, c.Tools.Exec.Ask
	if a, ok := c.Agent(agentID); ok {
		if a.Tools.Exec.Security != "" {
			security = a.Tools.Exec.Security
		}
		if a.Tools.Exec.Ask != "" {
			ask = a.Tools.Exec.Ask
		}
	}
	if security == "" {
		configured := c.ExecHost(agentID)
		if configured == hostSandbox || (configured == "auto" && c.Sandbox.Mode != "off") {
			security = "deny"
		} else {
			security = "allowlist"
		}
	}
	if ask == "" {
		ask = "on-miss"
	}
	return security, ask
}

// Agent returns the agents.list entry for id, if any.
func (c *Config) Agent(id string) (Agent, bool) {
	for _, a := range c.Agents.List {
		if a.ID == id {
			return a, true
		}
	}
	return Agent{}, false
}

func clamp(v, lo, hi int) int {
	return max(lo, min(v, hi))
}

func validToken(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

// ValidAgentID reports whether s can be an agent id: 1 to 64 lower-case
// letters, digits, '-' and '_', not starting with '-' or '_'.
func ValidAgentID(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i, r := range s {
		ok := r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || (i > 0 && (r == '-' || r == '_'))
		if !ok {
			return false
		}
	}
	return true
}

// envError rewrites caarlos0/env's errors, which name Go fields, so that
// they name the EXECMESH_* variable instead.
func envError(err error) error {
	var agg env.AggregateError
	if !errors.As(err, &agg) {
		return fmt.Errorf("environment: %w", err)
	}
	var errs *multierror.Error
	t := reflect.TypeOf(envOverrides{})
	for _, e := range agg.Errors {
		var pe env.ParseError
		if errors.As(e, &pe) {
			if f, ok := t.FieldByName(pe.Name); ok {
				errs = multierror.Append(errs, fmt.Errorf("EXECMESH_%s: invalid value: %w", f.Tag.Get("env"), pe.Err))
				continue
			}
		}
		errs = multierror.Append(errs, e)
	}
	return fmt.Errorf("invalid environment: %w", errs.ErrorOrNil())
}
