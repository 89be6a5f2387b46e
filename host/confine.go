package host

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/execmesh/execmesh/approvals"
	"github.com/execmesh/execmesh/confine"
	"github.com/execmesh/execmesh/protocol"
	"github.com/execmesh/execmesh/session"
)

// ConfineConfig configures the kernel confinement of security allowlist
// runs (DESIGN.md §3.4). The zero value confines where the kernel can,
// with this binary as the helper.
type ConfineConfig struct {
	// Off turns the confinement off (tools.exec.confine "off"): allowlist
	// mode then asks for every program that is not a safe bin, as where
	// the kernel cannot confine.
	Off bool
	// Helper is the binary started as the confinement helper; its main
	// must call confine.RunHelperIfRequested first (/proc/self/exe for
	// the execmesh binary). Empty means no helper: the host then cannot
	// confine, and says so (ModeAsk).
	Helper string
	// Hide are the paths a confined command cannot see: the daemon's
	// state dir, config file, credentials and keys.
	Hide []string
	// TempRoot holds the per-session temporary directories; empty means
	// os.TempDir().
	TempRoot string
}

// Confinement modes, as /healthz, `execmesh up` and node views name them.
const (
	// ModeLandlock: allowlist runs are confined by the kernel.
	ModeLandlock = "landlock"
	// ModeAsk: the kernel cannot confine (or confinement is off), and
	// allowlist mode asks for every program that is not a safe bin.
	ModeAsk = "ask"
)

// Confinement is the mode in force on a host and, for ModeAsk, why.
type Confinement struct {
	Mode   string `json:"mode"`
	Reason string `json:"reason,omitempty"`
}

// devices a confined command may write: the sinks and its terminal.
// Its own terminal is /dev/tty; another's (/dev/pts/N) is neither
// writable nor open to ioctl (TIOCSTI).
var confineDevices = []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/tty"}

// probeConfinement learns whether this host can confine, by running the
// helper once with every part of the confinement.
func probeConfinement(cfg ConfineConfig) (Confinement, string) {
	helper := cfg.Helper
	if helper != "" {
		// By its real path: a non-dumpable daemon's child in a new user
		// namespace may not follow /proc/self/exe.
		if real, err := filepath.EvalSymlinks(helper); err == nil {
			helper = real
		}
	}
	switch {
	case cfg.Off:
		return Confinement{Mode: ModeAsk, Reason: "kernel confinement turned off (tools.exec.confine)"}, helper
	case helper == "":
		return Confinement{Mode: ModeAsk, Reason: "no confinement helper configured"}, helper
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := confine.Probe(ctx, helper); err != nil {
		return Confinement{Mode: ModeAsk, Reason: err.Error()}, helper
	}
	return Confinement{Mode: ModeLandlock}, helper
}

// Confinement reports the mode in force for security allowlist runs.
func (l *Local) Confinement() Confinement { return l.confinement }

// confined is a run prepared for the helper: the spec's argv and what the
// session core needs beside it.
type confined struct {
	argv []string
	sup  *confine.Supervisor
	tmp  string
}

// systemDirs are where the system keeps what it runs or reads as
// configuration later, outside any run's confinement: programs and
// libraries, cron and unit files, profiles, the loader's preload list,
// sudoers, package state. The directory tree is the filesystem
// hierarchy's, the same on every Linux system.
func systemDirs() []string {
	return []string{"/etc", "/boot", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/run", "/var/lib", "/var/spool"}
}

// userHomes returns the home directories /etc/passwd names, the
// system's accounts included.
func userHomes() []string {
	b, err := os.ReadFile("/etc/passwd")
	if err != nil {
		return nil
	}
	var homes []string
	for line := range strings.Lines(string(b)) {
		f := strings.Split(strings.TrimSpace(line), ":")
		if len(f) >= 6 && filepath.IsAbs(f[5]) && f[5] != "/" {
			homes = append(homes, filepath.Clean(f[5]))
		}
	}
	return homes
}

// laterRead returns the directory that makes workdir no place for a
// confined command to write in, or "": one of systemDirs with workdir
// beneath it or above it, the user's home with workdir above it, or a
// dot-directory of the home (.ssh, .config, .local …) with workdir
// beneath it. A confined command may write beneath its workdir, and what
// it leaves there would run later with someone else's authority (a cron
// job, a unit file, a shell profile, an authorized key).
//
// Every home directory of the system's accounts (others) counts as the
// user's own does, and more: workdir may not be another account's home
// itself either (its dotfiles run as that account).
func laterRead(workdir, home string, others []string) string {
	for _, d := range systemDirs() {
		if confine.Within(workdir, d) || confine.Within(d, workdir) {
			return d
		}
	}
	if home != "" && home != "/" {
		home = filepath.Clean(home)
	} else {
		home = ""
	}
	for _, h := range append([]string{home}, others...) {
		if h == "" {
			continue
		}
		if confine.Within(h, workdir) && (h != workdir || h != home) {
			return h
		}
		if rel, ok := strings.CutPrefix(workdir, h+"/"); ok && strings.HasPrefix(rel, ".") {
			return filepath.Join(h, strings.SplitN(rel, "/", 2)[0])
		}
	}
	return ""
}

// confineRun builds the helper's run of one allowlist command: the plan
// (or, for an approved command, the shell with the command as written)
// in a confinement that executes only what the allowlist, the safe bins
// and the approval allow, writes only beneath the workdir, the session's
// TMPDIR and tools.exec.allowlistWrites, and cannot see the daemon's
// state. Without kernel confinement (enforce false) only a pipeline of
// several segments goes through the helper, so that it runs as judged.
func (l *Local) confineRun(r run, workdir string, env map[string]string, s *Settings, enforce bool) (*confined, error) {
	pipeline := r.plan
	if len(pipeline) == 0 {
		pipeline = [][]string{{l.shellPath, "-c", r.command}}
	}
	if !enforce {
		// Without a helper (an embedder's choice) the plan runs as
		// approvals rendered it, every word quoted, through /bin/sh.
		if len(pipeline) < 2 || l.helper == "" {
			return nil, nil
		}
		spec := confine.Spec{Pipeline: pipeline}
		args, err := spec.Args()
		if err != nil {
			return nil, protocol.Errorf(protocol.ErrInvalidRequest, "exec: %v", err)
		}
		return &confined{argv: append([]string{l.helper}, args...)}, nil
	}
	// Judged by where it leads: a link in the workdir's path must not
	// lead into the daemon's state.
	if real, err := filepath.EvalSymlinks(workdir); err == nil {
		workdir = real
	}
	if workdir == "/" {
		return nil, protocol.Errorf(protocol.ErrSecurityViolation,
			"Security Violation: workdir / under security allowlist: a command may write beneath its workdir, and this one would write anywhere; choose a project directory")
	}
	if d := laterRead(workdir, env["HOME"], userHomes()); d != "" {
		return nil, protocol.Errorf(protocol.ErrSecurityViolation,
			"Security Violation: workdir %s under security allowlist: a command may write beneath its workdir, and %s holds what the system or its users run or read later, outside any policy; choose a project directory", workdir, d)
	}
	for _, h := range l.cfg.Confine.Hide {
		if confine.Within(workdir, h) {
			return nil, protocol.Errorf(protocol.ErrSecurityViolation,
				"Security Violation: workdir %s is inside the daemon's own state (%s), which commands under security allowlist cannot see", workdir, h)
		}
	}
	home := env["HOME"]
	set := approvals.NewExecSet(r.allowlist, home, s.SafeBins, s.SafeBinTrustedDirs)
	spec := confine.Spec{
		Confine:  true,
		Pipeline: pipeline,
		ExecAll:  set.All,
		ExecDirs: set.Dirs,
		Hide:     l.cfg.Confine.Hide,
		Workdir:  workdir,
	}
	tmpRoot := l.cfg.Confine.TempRoot
	if tmpRoot == "" {
		tmpRoot = os.TempDir()
	}
	tmp, err := os.MkdirTemp(tmpRoot, "execmesh-")
	if err != nil {
		return nil, fmt.Errorf("exec: session TMPDIR: %w", err)
	}
	// Write roots by their real paths: the helper grants a directory
	// only at the path checked here (Spec.Write).
	realPath := func(p string) string {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			return r
		}
		return filepath.Clean(p)
	}
	spec.Write = append(spec.Write, workdir, realPath(tmp))
	for _, w := range s.AllowlistWrites {
		if filepath.IsAbs(w) {
			spec.Write = append(spec.Write, realPath(w))
		}
	}
	// What other confined commands could write is no code to this one:
	// the temporary root (every session's TMPDIR) and the write roots of
	// earlier runs (another session's planted library, loaded by this
	// one's allowlisted program).
	spec.NoExec = l.wrote(spec.Write, tmpRoot)
	// What a confined command may write (now, or in an earlier run) is
	// no code: an allowlist pattern does not allow a file or directory
	// there (a command could have put it there, or will), nor a plan's
	// program there; only a file an approval fixed by its hash does.
	writable := func(p string) bool {
		for _, w := range append(slices.Clone(spec.Write), spec.NoExec...) {
			if confine.Within(p, w) {
				return true
			}
		}
		return false
	}
	spec.ExecDirs = slices.DeleteFunc(spec.ExecDirs, writable)
	seen := map[string]bool{}
	add := func(f confine.File) {
		if f.Path != "" && !seen[f.Path] {
			seen[f.Path] = true
			spec.Exec = append(spec.Exec, f)
		}
	}
	for _, p := range r.approved {
		// Bound to the inode that approvals just checked: a file renamed
		// over it later is not the approved file.
		add(boundFile(p))
	}
	for _, p := range append(slices.Clone(set.Files), r.execs...) {
		if !writable(p) {
			add(confine.File{Path: p})
		}
	}
	if len(r.plan) == 0 {
		// An approved command runs as written: the shell is one of the
		// executables the approval fixed.
		add(confine.File{Path: l.shellPath})
	}
	interps := slices.Clone(l.baseInterps)
	for _, p := range pipelinePrograms(pipeline) {
		if ip := confine.Interpreter(p); ip != "" && !slices.Contains(interps, ip) {
			interps = append(interps, ip)
		}
	}
	for _, ip := range interps {
		spec.Interpreters = append(spec.Interpreters, confine.File{Path: ip})
	}
	spec.Write = append(spec.Write, confineDevices...)
	// Checked before the supervisor's socket exists, so that a refusal
	// leaves nothing open.
	if err := spec.Validate(); err != nil {
		os.RemoveAll(tmp)
		return nil, protocol.Errorf(protocol.ErrInvalidRequest, "exec: %v", err)
	}
	sup, err := confine.NewSupervisor(&spec, confine.SupervisorOptions{Logger: l.log, Match: set.Match})
	if err != nil {
		os.RemoveAll(tmp)
		return nil, fmt.Errorf("exec: %w", err)
	}
	args, err := spec.Args() // validated above: only encoding is left
	if err != nil {
		sup.ReleaseChild()
		sup.Start() // takes the end of the handover that never comes, and closes
		os.RemoveAll(tmp)
		return nil, protocol.Errorf(protocol.ErrInvalidRequest, "exec: %v", err)
	}
	return &confined{argv: append([]string{l.helper}, args...), sup: sup, tmp: tmp}, nil
}

// apply puts the confined run into the session request.
func (c *confined) apply(sreq *session.ExecRequest) {
	sreq.Argv = c.argv
	if c.sup == nil {
		return
	}
	sreq.Env = append(slices.Clone(sreq.Env), "TMPDIR="+c.tmp)
	sreq.ExtraFiles = []*os.File{c.sup.ChildFile()}
	sreq.SysProcAttr = func(a *syscall.SysProcAttr) { confine.SetSysProcAttr(a) }
}

// start begins supervising before the spawn; the returned function ends
// the daemon's part of the handover after it, and removes the session's
// TMPDIR once the tree is gone.
func (c *confined) start() (spawned func()) {
	if c.sup == nil {
		return func() {}
	}
	c.sup.Start()
	return func() {
		c.sup.ReleaseChild()
		go func() {
			<-c.sup.Done()
			os.RemoveAll(c.tmp)
		}()
	}
}

// boundFile binds a path to the inode it names now.
func boundFile(p string) confine.File {
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		return confine.File{Path: p}
	}
	return confine.File{Path: p, Dev: uint64(st.Dev), Ino: st.Ino}
}

// pipelinePrograms are the programs of a pipeline's segments.
func pipelinePrograms(p [][]string) []string {
	out := make([]string, 0, len(p))
	for _, seg := range p {
		out = append(out, seg[0])
	}
	return out
}

// maxWritten bounds the write roots of earlier confined runs a host
// remembers (wrote).
const maxWritten = 256

// wrote records the directories a confined run may write and returns
// the ones to make noexec for it: the temporary root and the write roots
// of earlier runs (most recent first), none of them hidden, none of them
// its own.
func (l *Local) wrote(roots []string, tmpRoot string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	add := func(d string) {
		if d != "/" && filepath.IsAbs(d) && !slices.Contains(roots, d) && !slices.Contains(out, d) && !l.hidden(d) {
			out = append(out, d)
		}
	}
	if real, err := filepath.EvalSymlinks(tmpRoot); err == nil {
		add(real)
	}
	for _, d := range l.written {
		add(d)
	}
	for _, r := range roots {
		if fi, err := os.Stat(r); err == nil && fi.IsDir() && !strings.HasPrefix(r, "/dev/") {
			l.written = slices.DeleteFunc(l.written, func(d string) bool { return d == r })
			l.written = append([]string{r}, l.written...)
		}
	}
	if len(l.written) > maxWritten {
		l.written = l.written[:maxWritten]
	}
	return out
}

// hidden reports whether d is a hidden path or beneath one.
func (l *Local) hidden(d string) bool {
	for _, h := range l.cfg.Confine.Hide {
		if confine.Within(d, h) {
			return true
		}
	}
	return false
}
