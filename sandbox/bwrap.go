package sandbox

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// probeTimeout bounds the one probe sandbox run by Available.
const probeTimeout = 10 * time.Second

// bwrapRuntime is ModeBwrap. Its fields are set by New and never change
// afterwards, except the probe result, which probeOnce guards.
type bwrapRuntime struct {
	bwrap   string // absolute path of the bwrap binary
	root    string // workspace root, absolute, symlinks resolved
	network bool
	binds   []mount
	hide    []string
	env     map[string]string
	// keep lists files whose symlink targets stay visible when a mask
	// hides them (/etc/resolv.conf → /run/systemd/resolve/…).
	keep []string

	probeOnce sync.Once
	probeErr  error
}

// Mode returns ModeBwrap.
func (r *bwrapRuntime) Mode() string { return ModeBwrap }

// Available runs one throwaway sandbox with the same namespaces and mounts
// as a real command (minus the workspace) the first time it is called, so
// that a host without usable user namespaces, or a container that forbids
// mounting /proc, is reported before any command is accepted.
func (r *bwrapRuntime) Available() error {
	r.probeOnce.Do(func() { r.probeErr = r.probe() })
	return r.probeErr
}

func (r *bwrapRuntime) probe() error {
	if _, err := os.Stat(r.bwrap); err != nil {
		return fmt.Errorf("%w (%s: %v)", ErrNotInstalled, r.bwrap, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	args := []string{"--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
		"--tmpfs", "/tmp", "--remount-ro", "/tmp"}
	args = append(args, r.namespaceArgs(false)...)
	args = append(args, "--clearenv", "--setenv", "PATH", DefaultPath, "--", "/bin/sh", "-c", "exit 0")
	cmd := exec.CommandContext(ctx, r.bwrap, args...)
	cmd.Env = []string{"PATH=" + DefaultPath}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.WaitDelay = time.Second
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = err.Error()
		}
		if ctx.Err() != nil {
			msg = "probe timed out after " + probeTimeout.String()
		}
		return fmt.Errorf("%w: %s", ErrUnavailable, msg)
	}
	return nil
}

// Workspace returns <root>/<agentID>, creating the root and the agent's
// directory with mode 0700 when missing. A symlink in their place is
// refused: it could point the read-write bind anywhere.
func (r *bwrapRuntime) Workspace(agentID string) (string, error) {
	id, err := agentDir(agentID)
	if err != nil {
		return "", err
	}
	if err := ensureDir(r.root); err != nil {
		return "", fmt.Errorf("sandbox: workspace root: %w", err)
	}
	dir := filepath.Join(r.root, id)
	if err := ensureDir(dir); err != nil {
		return "", fmt.Errorf("sandbox: workspace of agent %s: %w", id, err)
	}
	return dir, nil
}

// ensureDir creates p (mode 0700) unless it exists, and checks that it is a
// directory and not a symlink. Concurrent callers may race on Mkdir; the
// loser sees ErrExist, which is fine.
func ensureDir(p string) error {
	if err := os.Mkdir(p, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	fi, err := os.Lstat(p)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", p)
	}
	return nil
}

// Prepare checks the request, then builds the bwrap command line for it.
func (r *bwrapRuntime) Prepare(req Request) (Prepared, error) {
	if strings.ContainsRune(req.Command, 0) {
		return Prepared{}, errors.New("sandbox: command contains a NUL byte")
	}
	for k, v := range req.Env {
		if err := checkEnv(k, v); err != nil {
			return Prepared{}, fmt.Errorf("sandbox: %w", err)
		}
	}
	if err := r.Available(); err != nil {
		return Prepared{}, err
	}
	ws, err := r.Workspace(req.AgentID)
	if err != nil {
		return Prepared{}, err
	}
	cwd, err := resolveWorkdir(ws, req.Workdir)
	if err != nil {
		return Prepared{}, err
	}
	env := r.environment(ws, req)
	command := req.Command
	if _, ok := env[PrependPathVar]; ok {
		// The value stays in the environment; the text only names it, so a
		// PATH such as "$(touch /tmp/x)" is never parsed by the shell.
		command = PathPrefix + command
	}
	return Prepared{
		Argv:       r.args(ws, cwd, env, req.PTY, command),
		Env:        []string{"PATH=" + DefaultPath},
		Workdir:    cwd,
		DisplayCwd: cwd,
	}, nil
}

// resolveWorkdir maps a requested workdir to a directory inside ws. Every
// failure is a *WorkdirError.
func resolveWorkdir(ws, requested string) (string, error) {
	w := strings.TrimSpace(requested)
	if w == "" {
		if requested != "" {
			return "", &WorkdirError{Workdir: requested, Err: errors.New("blank workdir")}
		}
		return ws, nil
	}
	// Any ".." is refused, even one that would stay inside: OpenClaw's
	// newest sandbox does the same, and it keeps the rule easy to state.
	for _, seg := range strings.Split(filepath.ToSlash(w), "/") {
		if seg == ".." {
			return "", &WorkdirError{Workdir: requested, Err: ErrOutsideWorkspace}
		}
	}
	p := filepath.Clean(w)
	if !filepath.IsAbs(p) {
		p = filepath.Join(ws, p)
	}
	if !within(ws, p) {
		return "", &WorkdirError{Workdir: requested, Err: ErrOutsideWorkspace}
	}
	// A symlink inside the workspace may point out of it.
	resolved, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", &WorkdirError{Workdir: requested, Err: err}
	}
	if !within(ws, resolved) {
		return "", &WorkdirError{Workdir: requested, Err: ErrOutsideWorkspace}
	}
	fi, err := os.Stat(resolved)
	if err != nil {
		return "", &WorkdirError{Workdir: requested, Err: err}
	}
	if !fi.IsDir() {
		return "", &WorkdirError{Workdir: requested, Err: fmt.Errorf("%s is not a directory", resolved)}
	}
	return resolved, nil
}

// within reports whether p is dir or below it; both are clean and absolute.
func within(dir, p string) bool {
	return p == dir || strings.HasPrefix(p, dir+string(filepath.Separator))
}

// environment builds the command's environment (spec §7.3): the defaults,
// then the sandbox config env, then the request env, which wins. A
// requested PATH and PathPrepend go to PrependPathVar instead, because
// /etc/profile (sh -l) resets PATH.
func (r *bwrapRuntime) environment(ws string, req Request) map[string]string {
	env := map[string]string{"PATH": DefaultPath, "HOME": ws}
	for k, v := range r.env {
		env[k] = v
	}
	for k, v := range req.Env {
		if k != "PATH" {
			env[k] = v
		}
	}
	// The variable is internal: a value from the request or config must
	// not reach PATH through the prefix.
	delete(env, PrependPathVar)
	env["OPENCLAW_SHELL"] = "exec"
	if _, ok := env["TERM"]; req.PTY && !ok {
		env["TERM"] = "xterm-256color"
	}
	if p := mergePath(req.PathPrepend, req.Env["PATH"]); p != "" {
		env[PrependPathVar] = p
	}
	return env
}

// mergePath returns the PathPrepend entries followed by the requested PATH's
// entries, trimmed, without empty or repeated entries (spec §7.5).
func mergePath(prepend []string, path string) string {
	var out []string
	seen := map[string]bool{}
	add := func(e string) {
		e = strings.TrimSpace(e)
		if e != "" && !seen[e] {
			seen[e] = true
			out = append(out, e)
		}
	}
	for _, e := range prepend {
		add(e)
	}
	for _, e := range strings.Split(path, ":") {
		add(e)
	}
	return strings.Join(out, ":")
}

// namespaceArgs are the namespace and lifetime flags shared by commands and
// the probe.
func (r *bwrapRuntime) namespaceArgs(pty bool) []string {
	a := []string{"--unshare-pid", "--unshare-ipc", "--unshare-uts"}
	if !r.network {
		a = append(a, "--unshare-net")
	}
	// bwrap runs the command in a pid namespace under its own init; when
	// the outer bwrap dies (the session kills its process group) that init
	// gets SIGKILL, and the kernel kills everything else in the namespace.
	a = append(a, "--die-with-parent")
	if !pty {
		// Without a PTY the command must not share the gateway's
		// controlling terminal, where it could inject input (TIOCSTI).
		// With a PTY the terminal is the session's own, and a new session
		// would cut the command off from it.
		a = append(a, "--new-session")
	}
	return a
}

// masks returns the directories replaced by an empty read-only tmpfs: the
// workspace root (other agents' workspaces) and the existing Hide
// directories, parents first so that nested ones are created inside.
func (r *bwrapRuntime) masks() []string {
	out := []string{r.root}
	for _, h := range r.hide {
		resolved, err := filepath.EvalSymlinks(h)
		if err != nil {
			continue // missing: nothing to hide
		}
		if fi, err := os.Stat(resolved); err != nil || !fi.IsDir() {
			continue
		}
		// Below the root the root's mask already hides it; a separate
		// mount there would end up on top of the workspace bind.
		if within(r.root, resolved) || resolved == "/" {
			continue
		}
		out = append(out, resolved)
	}
	slices.SortFunc(out, func(a, b string) int {
		return cmp.Or(cmp.Compare(len(a), len(b)), strings.Compare(a, b))
	})
	return slices.Compact(out)
}

// args builds the bwrap command line. Mount order matters: bwrap applies
// the operations in order, so /tmp and the masks come before the workspace
// bind (a workspace under /tmp stays visible) and the masks are made
// read-only only after every mount point inside them has been created.
func (r *bwrapRuntime) args(ws, cwd string, env map[string]string, pty bool, command string) []string {
	a := []string{r.bwrap,
		"--ro-bind", "/", "/",
		"--dev", "/dev",
		"--proc", "/proc",
		"--tmpfs", "/tmp",
	}
	masks := r.masks()
	for _, m := range masks {
		a = append(a, "--tmpfs", m)
	}
	for _, k := range r.keep {
		resolved, err := filepath.EvalSymlinks(k)
		if err != nil || resolved == k {
			continue
		}
		for _, m := range masks {
			if within(m, resolved) {
				a = append(a, "--ro-bind", resolved, resolved)
				break
			}
		}
	}
	a = append(a, "--bind", ws, ws)
	for _, b := range r.binds {
		if b.rw {
			a = append(a, "--bind", b.src, b.dest)
		} else {
			a = append(a, "--ro-bind", b.src, b.dest)
		}
	}
	for _, m := range masks {
		a = append(a, "--remount-ro", m)
	}
	a = append(a, r.namespaceArgs(pty)...)
	// The environment travels as arguments because --clearenv drops
	// bwrap's own; they are visible in /proc/<pid>/cmdline of bwrap.
	a = append(a, "--clearenv")
	for _, k := range slices.Sorted(maps.Keys(env)) {
		a = append(a, "--setenv", k, env[k])
	}
	a = append(a, "--chdir", cwd, "--")
	return append(a, "/bin/sh", "-lc", command)
}
