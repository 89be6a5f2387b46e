package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/execmesh/execmesh/protocol"
)

// Sandbox modes, the values of Config.Mode (config key sandbox.mode).
const (
	// ModeOff is no sandbox runtime: the gateway refuses host=sandbox
	// (DESIGN.md §3.3).
	ModeOff = "off"
	// ModeBwrap runs host=sandbox commands inside a bubblewrap sandbox.
	ModeBwrap = "bwrap"
)

// DefaultPath is the PATH a sandboxed shell starts with, before its login
// profile runs. It is also the whole environment of the bwrap process itself.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// DefaultAgentID is the agent a Request without an AgentID belongs to: the
// agent of the default session key agent:main:main.
const DefaultAgentID = "main"

// PrependPathVar is the internal variable that carries a requested PATH and
// the PathPrepend entries into the sandbox. The command text only ever names
// the variable (see PathPrefix), never its value.
const PrependPathVar = "OPENCLAW_PREPEND_PATH"

// PathPrefix is put in front of the command text when PrependPathVar is set,
// so the entries go first in PATH after /etc/profile has set its own.
const PathPrefix = `export PATH="${OPENCLAW_PREPEND_PATH}:$PATH"; unset OPENCLAW_PREPEND_PATH; `

// ErrNotInstalled is returned by New, and by Runtime.Available, when mode
// bwrap is configured and the bwrap binary cannot be found. The gateway can
// return it as the error of a host=sandbox call.
var ErrNotInstalled = errors.New(`bubblewrap (bwrap) is not installed; install the Debian/Ubuntu package "bubblewrap" or set sandbox.mode=off`)

// ErrUnavailable is returned by Runtime.Available when bwrap is installed but
// cannot build a sandbox on this host, most often because unprivileged user
// namespaces are disabled. The returned error wraps it and carries bwrap's
// own message.
var ErrUnavailable = errors.New("bubblewrap (bwrap) is installed but cannot create a sandbox on this host (are user namespaces disabled? check kernel.unprivileged_userns_clone and AppArmor's restrict_unprivileged_userns) or set sandbox.mode=off")

// ErrInvalidAgentID is wrapped by the errors for an agent id that cannot name
// a workspace directory.
var ErrInvalidAgentID = errors.New("invalid agent id")

// ErrOutsideWorkspace is the cause (see WorkdirError.Err) of a workdir that
// names a place outside the agent's workspace, or uses a ".." segment.
var ErrOutsideWorkspace = errors.New("workdir is outside the sandbox workspace")

// WorkdirError reports a requested workdir that is not an existing directory
// inside the agent's workspace. Nothing was run. Its text is OpenClaw's, so
// the caller can return it as a failed exec result (DESIGN §7).
type WorkdirError struct {
	Workdir string // the workdir as requested
	Err     error  // why: ErrOutsideWorkspace, or the file system error
}

// Error returns OpenClaw's failed-workdir text for e.Workdir.
func (e *WorkdirError) Error() string {
	return protocol.WorkdirUnavailableText(e.Workdir)
}

// Unwrap returns the cause.
func (e *WorkdirError) Unwrap() error { return e.Err }

// Runtime prepares host=sandbox commands. A Runtime is safe for concurrent
// use.
type Runtime interface {
	// Mode is ModeOff or ModeBwrap.
	Mode() string
	// Available reports whether the runtime can run commands now: nil for
	// ModeOff; for ModeBwrap the result of one probe sandbox, run on the
	// first call and remembered. The error wraps ErrNotInstalled or
	// ErrUnavailable.
	Available() error
	// Prepare turns a request into what the session core spawns. A workdir
	// that is not allowed gives a *WorkdirError; any other error means the
	// request or the runtime is at fault.
	Prepare(req Request) (Prepared, error)
	// Workspace returns the host directory of an agent's workspace,
	// creating it (mode 0700) when missing. ModeOff has no workspace and
	// returns "".
	Workspace(agentID string) (string, error)
}

// Request is one host=sandbox exec call, after the gateway has parsed it.
type Request struct {
	AgentID string // "" means DefaultAgentID
	Command string // the shell command text
	// Workdir is the workdir as requested: "" for the workspace root, a
	// path relative to the workspace, or an absolute path inside it.
	Workdir string
	// Env is the request env. A PATH entry is not set as PATH: it goes in
	// front of the profile's PATH (see PrependPathVar).
	Env map[string]string
	// PathPrepend lists directories (tools.exec.pathPrepend) that go first
	// in PATH, ahead of a requested PATH.
	PathPrepend []string
	PTY         bool
}

// Prepared is what the session core spawns for a Request (session.ExecRequest
// Argv, Env and Workdir).
type Prepared struct {
	// Argv is the program and its arguments; nil means "run the command with
	// the caller's shell as for host=gateway" (ModeOff).
	Argv []string
	// Env is the complete environment of Argv[0]. For ModeBwrap it is only
	// PATH=DefaultPath: bwrap clears it and passes the command's
	// environment as arguments.
	Env []string
	// Workdir is the host directory to start in.
	Workdir string
	// DisplayCwd is the working directory as the command sees it, for
	// results (details.cwd).
	DisplayCwd string
}

// Config configures a Runtime. Build it with DefaultConfig and adjust. The
// JSON names are the keys below "sandbox" in the configuration file.
type Config struct {
	// Mode is ModeOff (also when empty) or ModeBwrap.
	Mode string `json:"mode"`
	// Workspace is the root of the agents' workspaces; agent A works in
	// <Workspace>/A. The root must be a directory or be creatable (its
	// parent exists). Only ModeBwrap uses it.
	Workspace string `json:"workspace"`
	// Network keeps the host's network inside the sandbox; by default the
	// sandbox has its own network namespace with only a loopback device.
	Network bool `json:"network"`
	// ReadOnlyBinds and ReadWriteBinds are extra host paths made visible in
	// the sandbox, as "path" (same path inside) or "src:dest". The source
	// must exist; the destination must exist in the sandbox or lie in a
	// writable or hidden place (the workspace, /tmp, a Hide path).
	ReadOnlyBinds  []string `json:"readOnlyBinds,omitempty"`
	ReadWriteBinds []string `json:"readWriteBinds,omitempty"`
	// Hide lists host directories replaced by an empty read-only directory
	// inside the sandbox: the state dir that holds tokens and keys, /run
	// with its sockets. Entries that do not exist when a command is
	// prepared are skipped. When /etc/resolv.conf leads into a hidden
	// directory, its target file stays visible (read-only) so name
	// resolution keeps working.
	Hide []string `json:"hide,omitempty"`
	// Env is added to every sandboxed command's environment; the request
	// env wins over it.
	Env map[string]string `json:"env,omitempty"`
	// BwrapPath is the bwrap binary; empty means "bwrap" looked up in PATH.
	BwrapPath string `json:"bwrapPath,omitempty"`
}

// DefaultConfig returns the defaults for a gateway whose state lives in
// stateDir: mode off, workspaces under <stateDir>/workspace, no network, and
// /run and the state dir hidden from sandboxed commands.
//
// /run is hidden because a read-only mount does not stop connect(2) on a
// Unix socket: /run/docker.sock, the D-Bus and systemd sockets or a local
// database's socket would otherwise be reachable from the sandbox, network
// namespace or not.
func DefaultConfig(stateDir string) Config {
	c := Config{Mode: ModeOff, Hide: []string{"/run"}}
	if stateDir != "" {
		c.Workspace = filepath.Join(stateDir, "workspace")
		c.Hide = append(c.Hide, stateDir)
	}
	return c
}

// New validates cfg and returns its Runtime. Every problem is reported, each
// naming its configuration key.
func New(cfg Config) (Runtime, error) {
	switch cfg.Mode {
	case ModeOff, "":
		return offRuntime{}, nil
	case ModeBwrap:
	default:
		return nil, fmt.Errorf("sandbox.mode %q is not supported (allowed: %s, %s)", cfg.Mode, ModeOff, ModeBwrap)
	}

	r := &bwrapRuntime{network: cfg.Network, keep: []string{"/etc/resolv.conf"}}
	var errs []error
	var err error
	if r.root, err = workspaceRoot(cfg.Workspace); err != nil {
		errs = append(errs, err)
	}
	for i, b := range cfg.ReadOnlyBinds {
		m, err := parseBind(fmt.Sprintf("sandbox.readOnlyBinds[%d]", i), b)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		r.binds = append(r.binds, m)
	}
	for i, b := range cfg.ReadWriteBinds {
		m, err := parseBind(fmt.Sprintf("sandbox.readWriteBinds[%d]", i), b)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		m.rw = true
		r.binds = append(r.binds, m)
	}
	for i, h := range cfg.Hide {
		if !filepath.IsAbs(h) || filepath.Clean(h) == "/" {
			errs = append(errs, fmt.Errorf("sandbox.hide[%d] %q: must be an absolute path other than /", i, h))
			continue
		}
		r.hide = append(r.hide, filepath.Clean(h))
	}
	r.env = make(map[string]string, len(cfg.Env))
	for k, v := range cfg.Env {
		if err := checkEnv(k, v); err != nil {
			errs = append(errs, fmt.Errorf("sandbox.env: %w", err))
			continue
		}
		r.env[k] = v
	}
	if r.bwrap, err = findBwrap(cfg.BwrapPath); err != nil {
		errs = append(errs, err)
	}
	switch len(errs) {
	case 0:
		return r, nil
	case 1:
		return nil, errs[0] // unjoined, so ErrNotInstalled comes back as itself
	}
	return nil, errors.Join(errs...)
}

// workspaceRoot checks the configured workspace root and returns it
// absolute, with the symlinks of its existing part resolved, so that workdir
// checks compare resolved paths.
func workspaceRoot(p string) (string, error) {
	if p == "" {
		return "", errors.New("sandbox.workspace: a workspace root is required for mode bwrap")
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", fmt.Errorf("sandbox.workspace %q: %w", p, err)
	}
	if abs == "/" {
		return "", fmt.Errorf("sandbox.workspace %q: the workspace root cannot be /", p)
	}
	fi, err := os.Stat(abs)
	switch {
	case err == nil && !fi.IsDir():
		return "", fmt.Errorf("sandbox.workspace %q: exists and is not a directory", p)
	case err == nil:
		resolved, err := filepath.EvalSymlinks(abs)
		if err != nil {
			return "", fmt.Errorf("sandbox.workspace %q: %w", p, err)
		}
		return resolved, nil
	case !errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("sandbox.workspace %q: %w", p, err)
	}
	// Missing: it is created on first use, so its parent must exist.
	parent, err := filepath.EvalSymlinks(filepath.Dir(abs))
	if err == nil {
		fi, err = os.Stat(parent)
	}
	if err != nil || !fi.IsDir() {
		return "", fmt.Errorf("sandbox.workspace %q: parent directory %q does not exist", p, filepath.Dir(abs))
	}
	return filepath.Join(parent, filepath.Base(abs)), nil
}

// mount is one extra bind of Config.ReadOnlyBinds or ReadWriteBinds.
type mount struct {
	src, dest string
	rw        bool
}

// parseBind parses "path" or "src:dest" (split at the first colon).
func parseBind(key, spec string) (mount, error) {
	src, dest, ok := strings.Cut(spec, ":")
	if !ok {
		dest = src
	}
	if !filepath.IsAbs(src) || !filepath.IsAbs(dest) {
		return mount{}, fmt.Errorf("%s %q: paths must be absolute", key, spec)
	}
	src, dest = filepath.Clean(src), filepath.Clean(dest)
	if dest == "/" {
		return mount{}, fmt.Errorf("%s %q: cannot bind over /", key, spec)
	}
	if _, err := os.Stat(src); err != nil {
		return mount{}, fmt.Errorf("%s %q: source %q does not exist: %w", key, spec, src, err)
	}
	return mount{src: src, dest: dest}, nil
}

// findBwrap returns the bwrap binary to use.
func findBwrap(p string) (string, error) {
	if p == "" {
		found, err := exec.LookPath("bwrap")
		if err != nil {
			return "", ErrNotInstalled
		}
		return filepath.Abs(found)
	}
	fi, err := os.Stat(p)
	if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		return "", fmt.Errorf("sandbox.bwrapPath %q: %w", p, ErrNotInstalled)
	}
	return filepath.Abs(p)
}

// checkEnv refuses what a process environment cannot hold.
func checkEnv(k, v string) error {
	if k == "" || strings.ContainsAny(k, "=\x00") {
		return fmt.Errorf("invalid environment variable name %q", k)
	}
	if strings.ContainsRune(v, 0) {
		return fmt.Errorf("environment variable %s: value contains a NUL byte", k)
	}
	return nil
}

// agentDir checks that id can name a directory below the workspace root.
func agentDir(id string) (string, error) {
	if id == "" {
		return DefaultAgentID, nil
	}
	if len(id) > 128 || id[0] == '.' || id[0] == '-' {
		return "", fmt.Errorf("sandbox: %w %q", ErrInvalidAgentID, id)
	}
	for _, c := range id {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.'
		if !ok {
			return "", fmt.Errorf("sandbox: %w %q", ErrInvalidAgentID, id)
		}
	}
	return id, nil
}

// offRuntime is ModeOff: the caller runs the command itself.
type offRuntime struct{}

func (offRuntime) Mode() string                     { return ModeOff }
func (offRuntime) Available() error                 { return nil }
func (offRuntime) Workspace(string) (string, error) { return "", nil }

// Prepare returns the request's workdir unchanged and no Argv: the command
// runs as it would with host=gateway.
func (offRuntime) Prepare(req Request) (Prepared, error) {
	return Prepared{Workdir: req.Workdir, DisplayCwd: req.Workdir}, nil
}
