package session

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-multierror"
	"golang.org/x/sys/unix"

	"github.com/execmesh/execmesh/protocol"
)

// ErrClosed is returned by Exec once Close has begun. Its protocol type is
// "unavailable" and it is retryable: another instance may take the call.
var ErrClosed error = &protocol.Error{Type: protocol.ErrUnavailable, Message: "the session manager is shutting down", Retryable: true}

// errEmptyCommand is exec's answer to an empty command.
var errEmptyCommand error = protocol.Errorf(protocol.ErrInvalidRequest, "Provide a command to start.")

// Manager runs commands and keeps them as sessions. It is safe for
// concurrent use. Create it with NewManager and release it with Close.
type Manager struct {
	// chunks holds MaxChunk buffers of attachments' output (attach.go).
	chunks sync.Pool

	cfg       Config
	log       *slog.Logger
	shell     string
	shellArgs []string
	instance  string // random id of this Manager: its cgroup is m-<instance>
	selfPID   int
	selfPGID  int

	workdirs workdirCache

	reaper    *Reaper
	ownReaper bool           // made by NewManager, closed by Close
	cg        *cgroupManager // nil in process-group containment
	contain   Containment

	root       context.Context // parent of every session context
	cancelRoot context.CancelCauseFunc
	hurry      chan struct{} // closed when Close's context ends: SIGKILL without grace
	resched    chan struct{} // wakes the janitor after retention changed
	closeDone  chan struct{}
	wg         sync.WaitGroup

	records      recordSlots  // the state dir's record files (records.go)
	usageRefresh atomic.Bool  // a refreshUsage pass runs
	usageFlushAt atomic.Int64 // when flushUsage last read the manager group's cpu.stat (Unix ns)
	usage        usageRounds  // list usage figures known exact without a read (rstat.go)
	nullFD       int          // /dev/null, every pipe session's stdin; -1 if it could not be opened
	batchBytes   atomic.Int64 // flood buffers held by the sessions' readers (readBuffer)

	snapMu      sync.Mutex // guards snap and snapReading (process-group containment)
	snap        *procSnapshot
	snapReading chan struct{} // closed when the /proc read in progress ends

	mu        sync.Mutex
	closed    bool
	seq       uint64
	sessions  map[string]*session // running (foreground too) and retained finished sessions
	removed   map[string]*session // removed while their process still runs
	reserved  map[string]bool     // ids of sessions being spawned
	leftovers map[string]tree     // trees of finished sessions whose processes still run, by tree name
	finished  []*session          // retained sessions in completion order
	finChars  int                 // output chars held by finished sessions
}

// NewManager returns a Manager for cfg. Zero values in cfg are replaced by
// the defaults and out-of-range values clamped (see DefaultConfig).
//
// NewManager decides the containment of process trees (Config.Containment,
// contain.go) and logs it: a cgroup of its own below the process's cgroup
// subtree (Reaper), or, in process-group containment, the process becomes
// a child subreaper (PR_SET_CHILD_SUBREAPER; process-wide, never
// reverted). With Config.StateDir it first ends what a previous run on
// that directory left and reports its lost sessions (Config.OnLost).
//
// Commands start with the default action of SIGINT and SIGHUP even when
// this process was started with them ignored (nohup, a background job of
// a script), which every child would inherit, Ctrl-C and hangups
// included: NewManager then gives them a handler of the process (they
// stay without effect on it), and a handled signal is default again in a
// child after exec.
func NewManager(cfg Config) (*Manager, error) {
	for _, sig := range []os.Signal{syscall.SIGINT, syscall.SIGHUP} {
		if signal.Ignored(sig) {
			signal.Notify(make(chan os.Signal, 1), sig)
		}
	}
	cfg = cfg.normalized()
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	shell := cfg.Shell
	if shell == "" {
		shell = ResolveShell(os.Getenv("SHELL"), os.Getenv("PATH"))
	}
	m := &Manager{
		cfg:       cfg,
		log:       log,
		shell:     shell,
		shellArgs: shellArgs(shell),
		instance:  randomTag(),
		selfPID:   os.Getpid(),
		selfPGID:  syscall.Getpgrp(),
		reaper:    cfg.Reaper,
		hurry:     make(chan struct{}),
		resched:   make(chan struct{}, 1),
		closeDone: make(chan struct{}),
		sessions:  map[string]*session{},
		removed:   map[string]*session{},
		reserved:  map[string]bool{},
		leftovers: map[string]tree{},
		nullFD:    -1,
	}
	if fd, err := unix.Open(os.DevNull, unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
		m.nullFD = fd
	}
	if m.reaper == nil {
		m.reaper = NewReaper(ReaperConfig{Logger: log})
		m.ownReaper = true
	}
	fail := func(err error) (*Manager, error) {
		if m.nullFD >= 0 {
			_ = unix.Close(m.nullFD)
		}
		if m.cg != nil {
			_ = m.cg.dir.Remove()
		}
		if m.ownReaper {
			_ = m.reaper.Close(context.Background())
		}
		return nil, err
	}
	var lost []LostSession
	if cfg.StateDir != "" {
		var err error
		if lost, err = m.recoverRecords(); err != nil {
			return fail(err)
		}
	}
	if err := m.setupContainment(); err != nil {
		return fail(err)
	}
	c := m.contain
	if c.Mode == ContainmentCgroup {
		log.Info("session containment", "mode", c.Mode, "cgroup", c.Cgroup, "controllers", strings.Join(c.Controllers, ","))
	} else {
		log.Info("session containment", "mode", c.Mode, "reason", c.Reason)
	}
	m.root, m.cancelRoot = context.WithCancelCause(context.Background())
	m.wg.Go(m.janitor)
	if cfg.OnLost != nil {
		for _, l := range lost {
			cfg.OnLost(l)
		}
	}
	return m, nil
}

// Exec runs one command (an exec tool call whose policy checks already
// passed). It returns when the command ends within the yield window (a
// completed or failed result), when the window passes or Background is set
// (a running result naming the session), or, for Synchronous requests,
// when the command ends. A non-zero exit, a timeout, an invalid workdir or
// a spawn error is a normal result with details.status "failed" or
// "completed"; the error is non-nil only for an empty command, after Close,
// and when ctx ends before a foreground command finished (the command is
// then stopped).
func (m *Manager) Exec(ctx context.Context, req ExecRequest) (protocol.Result, error) {
	if strings.TrimSpace(req.Command) == "" {
		return protocol.Result{}, errEmptyCommand
	}
	startedAt := time.Now()
	warningText := ""
	if w := strings.Join(req.Warnings, "\n"); strings.TrimSpace(w) != "" {
		warningText = w + "\n\n"
	}
	if err := m.CheckLimits(req.Limits); err != nil {
		return protocol.Result{}, err
	}
	if err := req.Limits.Validate(func(k string) string { return "limits." + k }); err != nil {
		return protocol.Result{}, err
	}
	cwd, ok := m.workdirs.resolve(req.Workdir)
	if !ok {
		return unavailableWorkdirResult(cwd, warningText, startedAt), nil
	}
	if err := m.recordsUsable(); err != nil {
		return protocol.Result{}, err
	}

	s, err := m.register(req, cwd, startedAt)
	if err != nil {
		return protocol.Result{}, err
	}
	env := m.sessionEnv(req.Env, s)
	argv := req.Argv
	if len(argv) == 0 {
		argv = append(append([]string{m.shell}, m.shellArgs...), execCommand(m.shell, req.Command, env, cwd))
	}
	x := spawnExtras{files: req.ExtraFiles, sys: req.SysProcAttr}
	if a := req.Attach; a != nil {
		// Bound before the process runs: the attachment sees all output.
		if err := s.attach(a); err != nil {
			m.unregister(s)
			s.cancel(errExited)
			return protocol.Result{}, err
		}
		x.stdin = a.opts.Stdin && !req.PTY
	}
	warning, err := s.spawn(argv, env, req.Limits, x)
	if warning != "" {
		req.Warnings = append(slices.Clip(req.Warnings), warning)
		warningText = strings.Join(req.Warnings, "\n") + "\n\n"
	}
	if err != nil {
		if req.Attach != nil {
			req.Attach.end(ErrDetached)
		}
		m.unregister(s)
		s.cancel(errExited)
		s.log.Info("spawn failed", "err", err)
		return runtimeErrorResult(warningText, "Error: "+err.Error(), cwd, startedAt), nil
	}
	if err := m.started(s); err != nil {
		return protocol.Result{}, err
	}

	// The settled outcome wins over a yield that fires at the same time.
	switch {
	case req.Synchronous:
		select {
		case <-s.done:
		case <-ctx.Done():
			return m.abort(ctx, s)
		}
	case req.Background:
		// Marked at registration, so even a command that is already done
		// is a background session: OpenClaw answers "running" here too.
		// Its output is not shown: OpenClaw cannot have read any yet.
		return s.runningResultWithTail(warningText, ""), nil
	default:
		t := time.NewTimer(yieldWindow(req.YieldMs, m.cfg.DefaultYieldMs))
		defer t.Stop()
		select {
		case <-s.done:
		case <-t.C:
			if s.markBackgrounded() {
				s.tree.backgrounded()
				m.releaseRecordFile(s.treeName)
				return s.runningResult(warningText), nil
			}
			<-s.done
		case <-ctx.Done():
			return m.abort(ctx, s)
		}
	}
	return s.foregroundResult(warningText), nil
}

// abort stops a foreground command whose caller went away.
func (m *Manager) abort(ctx context.Context, s *session) (protocol.Result, error) {
	s.requestStop(errAborted)
	return protocol.Result{}, fmt.Errorf("exec %s aborted: %w", s.id, context.Cause(ctx))
}

// register creates a session with a fresh id and reserves the id. The
// session owns one count of m.wg from here on.
func (m *Manager) register(req ExecRequest, cwd string, startedAt time.Time) (*session, error) {
	sec, timeout, hasTimeout := resolveTimeout(req.TimeoutSec, m.cfg.DefaultTimeoutSec)
	if req.SessionID != "" && !ValidSessionID(req.SessionID) {
		return nil, protocol.Errorf(protocol.ErrInvalidRequest, "session id %q is invalid: use 1 to %d lower-case letters, digits and '-'", req.SessionID, MaxSessionIDLen)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	id := req.SessionID
	switch {
	case id == "":
		id = NewSessionID(m.takenLocked)
	case m.takenLocked(id):
		return nil, protocol.Errorf(protocol.ErrConflict, "session id %q is already in use on this host", id)
	}
	m.seq++
	s := &session{
		m:             m,
		id:            id,
		command:       req.Command,
		scopeKey:      req.ScopeKey,
		cwd:           cwd,
		startedAt:     startedAt,
		seq:           m.seq,
		pty:           req.PTY,
		continuation:  !req.Synchronous,
		notify:        m.cfg.NotifyOnExit && !req.NotifyOff,
		emptySuccess:  m.cfg.NotifyOnExitEmptySuccess,
		hook:          req.OnExitHook,
		termDone:      make(chan struct{}),
		done:          make(chan struct{}),
		eventDone:     make(chan struct{}),
		out:           newOutputBuffer(m.cfg.MaxOutputChars, m.cfg.PendingMaxOutputChars),
		lastOutput:    startedAt,
		noOutputPolls: -1,
		// Background requests are background sessions from the start, so
		// an instant exit is still retained and notified.
		backgrounded: req.Background && !req.Synchronous,
	}
	if hasTimeout {
		s.timeoutSec = sec
	}
	s.name, s.hasName = deriveSessionName(req.Command)
	s.treeName = strconv.FormatUint(s.seq, 10) + "-" + s.id
	s.log = m.log.With("session", s.id)
	if req.PTY {
		s.mode = cursorUnknown
	} else {
		s.mode = cursorNormal
	}
	// The session's context ends on kill, timeout, abort or Close; each
	// then ends the process tree.
	s.ctx, s.cancel = context.WithCancelCause(m.root)
	if hasTimeout {
		var cancelTimeout context.CancelFunc
		var ctx context.Context
		ctx, cancelTimeout = context.WithTimeoutCause(s.ctx, timeout, errTimedOut)
		parentCancel := s.cancel
		s.ctx = ctx
		s.cancel = func(cause error) { parentCancel(cause); cancelTimeout() }
	}
	// The id is reserved now; the session is published once its process
	// runs, so nobody sees it half-built.
	m.reserved[s.id] = true
	m.wg.Add(1)
	return s, nil
}

// unregister releases the id of a session whose spawn failed.
func (m *Manager) unregister(s *session) {
	m.mu.Lock()
	delete(m.reserved, s.id)
	m.mu.Unlock()
	close(s.termDone)
	m.wg.Done()
}

// started publishes a spawned session and starts its goroutines. A
// session whose record cannot be written to the state dir is not
// published: it is ended at once, untold, and the error (retryable) is
// the call's answer, since a session that a crash would leave untracked,
// and whose exit event a stop would lose, must not be accepted.
func (m *Manager) started(s *session) error {
	err := m.writeRecord(s, false)
	if err == nil {
		m.holdRecord(s.id, s.treeName)
	} else {
		s.refused = true
	}
	m.mu.Lock()
	delete(m.reserved, s.id)
	if err == nil {
		m.sessions[s.id] = s
	}
	m.mu.Unlock()
	if err == nil {
		s.log.Debug("started", "pid", s.pid, "pty", s.pty, "cwd", s.cwd)
	} else {
		s.log.Warn("session refused: its record cannot be written to the state dir; ending it", "pid", s.pid, "err", err)
	}
	s.stopTerm = context.AfterFunc(s.ctx, func() { m.terminate(s) })
	s.startReaders(&m.wg)
	go func() {
		defer m.wg.Done() // the count taken by register
		s.run()
	}()
	if err != nil {
		s.cancel(errUnrecorded)
		return recordsUnavailable(err)
	}
	return nil
}

// takenLocked reports whether an id is in use: running, retained,
// removed but still running, or ended with its record held for an exit
// event not confirmed yet. Caller holds m.mu.
func (m *Manager) takenLocked(id string) bool {
	_, a := m.sessions[id]
	_, b := m.removed[id]
	return a || b || m.reserved[id] || m.holdsRecordLocked(id)
}

// devNull returns a descriptor of /dev/null for a child's stdin, opened
// once per Manager, and what to call once the child has started.
func (m *Manager) devNull() (int, func(), error) {
	if m.nullFD >= 0 {
		return m.nullFD, func() {}, nil
	}
	fd, err := unix.Open(os.DevNull, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, nil, &os.PathError{Op: "open", Path: os.DevNull, Err: err}
	}
	return fd, func() { _ = unix.Close(fd) }, nil
}

// sessionEnv builds the command's environment.
func (m *Manager) sessionEnv(env []string, s *session) []string {
	requested := env != nil
	if env == nil {
		env = os.Environ()
	}
	out := make([]string, 0, len(env)+3)
	hasTERM := false
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case envShellMarker, envSessionMarker:
			continue // set below
		case envTERM:
			if s.pty && !requested {
				// The daemon's own terminal says nothing about the PTY;
				// only a TERM the request sets replaces the default.
				continue
			}
			hasTERM = true
		}
		out = append(out, kv)
	}
	out = append(out, envShellMarker+"="+envShellMarkerValue, envSessionMarker+"="+s.id)
	if s.pty && !hasTERM {
		out = append(out, envTERM+"="+defaultTERM)
	}
	return out
}

// finishSession records the exit of a session, retains it when it was
// backgrounded, and emits its exit event.
func (m *Manager) finishSession(s *session, st exitStatus, cause error) {
	m.flushUsage() // the exit's usage read below walks no siblings (rstat.go)
	now := time.Now()
	s.mu.Lock()
	s.res = s.classifyLocked(st, cause, now)
	s.exited = true
	s.endedAt = now
	s.out.frozen = true
	s.stdinClosed = true
	backgrounded, removed := s.backgrounded, s.removed
	// Decided with the exit, so a poll never sees an ended background
	// session as gone while the bookkeeping below runs.
	s.retained = backgrounded && !removed
	res := s.res
	s.mu.Unlock()
	s.tapExit()
	s.log.Debug("exited", "status", res.status, "reason", res.reason, "signal", res.signal)
	if m.cfg.OnUsage != nil {
		m.cfg.OnUsage(res.usage)
	}

	// Bookkeeping first, so that whoever waits on done sees the final
	// state: a foreground session is gone, a background one retained.
	m.mu.Lock()
	if removed {
		delete(m.removed, s.id)
	} else if m.sessions[s.id] == s {
		if backgrounded {
			m.retainLocked(s, now)
		} else {
			delete(m.sessions, s.id) // foreground sessions are not kept
		}
	}
	m.mu.Unlock()
	event := backgrounded && !s.refused
	if !event {
		// No exit event: the hold ends before done is closed. Once a
		// foreground call answers, its caller may hand the id to the
		// next call (the gateway's reservation pool does), and that
		// session's hold must not be the one this ends. (The tree is
		// not released yet, so this costs no write.)
		m.settleExit(s.id, s.treeName)
	}

	s.mu.Lock()
	if s.wake != nil {
		close(s.wake)
		s.wake = nil
	}
	close(s.done)
	s.mu.Unlock()
	if !backgrounded {
		// The caller waiting on done (a foreground call) is next on this
		// P: let it answer before the tree's release, which would
		// otherwise hold it back by its whole length. (A background
		// session's exit event is computed first, as a poll expects.)
		runtime.Gosched()
	}
	if event {
		m.markExitPending(s)
		m.emitExit(s)
		if m.cfg.OnExit == nil && s.hook == nil {
			// Nobody takes the exit event, so nobody confirms it: the
			// request's hook (host.Local's) is a taker as much as
			// OnExit, and its record waits for ExitStored.
			m.settleExit(s.id, s.treeName)
		}
	}
}

// retainLocked keeps a finished background session and evicts the oldest
// ones beyond the limits. Caller holds m.mu.
func (m *Manager) retainLocked(s *session, now time.Time) {
	s.mu.Lock()
	s.retained = true
	s.expiresAt = now.Add(m.cfg.JobTTL)
	chars := s.out.retainedUnits()
	s.mu.Unlock()
	m.finished = append(m.finished, s)
	m.finChars += chars
	for len(m.finished) > m.cfg.MaxFinished || (len(m.finished) > 1 && m.finChars > m.cfg.MaxFinishedChars) {
		m.dropFinishedLocked(m.finished[0])
	}
	m.kickJanitor()
}

// dropFinishedLocked forgets a retained session. Caller holds m.mu.
func (m *Manager) dropFinishedLocked(s *session) {
	i := slices.Index(m.finished, s)
	if i < 0 {
		return
	}
	m.finished = slices.Delete(m.finished, i, i+1)
	s.mu.Lock()
	s.retained = false
	m.finChars -= s.out.retainedUnits()
	s.mu.Unlock()
	if m.sessions[s.id] == s {
		delete(m.sessions, s.id)
	}
}

func (m *Manager) kickJanitor() {
	select {
	case m.resched <- struct{}{}:
	default:
	}
}

// janitor expires retained sessions with one timer set to the next expiry.
func (m *Manager) janitor() {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-m.root.Done():
			return
		case <-m.resched:
		case <-timer.C:
		}
		if next, ok := m.sweep(time.Now()); ok {
			timer.Reset(time.Until(next))
		} else {
			timer.Stop()
		}
	}
}

// sweep drops expired sessions and returns the next expiry. Sessions expire
// in completion order, because the TTL is the same for all.
func (m *Manager) sweep(now time.Time) (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for len(m.finished) > 0 {
		s := m.finished[0]
		s.mu.Lock()
		exp := s.expiresAt
		s.mu.Unlock()
		if exp.After(now) {
			return exp, true
		}
		m.dropFinishedLocked(s)
	}
	return time.Time{}, false
}

// terminate ends a session's process tree: SIGTERM (and SIGCONT, so that
// stopped processes act on it) to every process of the tree, then SIGKILL
// to whatever is left after KillGrace, or at once when Close's context
// ended. It runs once per session, when the session context ends.
func (m *Manager) terminate(s *session) {
	defer close(s.termDone)
	deadline := time.Now().Add(m.cfg.KillGrace)
	if err := s.tree.term(); err != nil {
		s.log.Warn("SIGTERM failed", "err", err)
	}
	s.log.Debug("SIGTERM sent", "cause", context.Cause(s.ctx))
	if s.tree.waitGone(deadline, m.hurry) {
		return
	}
	if err := s.tree.kill(); err != nil {
		s.log.Warn("SIGKILL failed", "err", err)
	}
	s.log.Debug("SIGKILL sent")
	if !s.tree.waitGone(time.Now().Add(killWait), nil) {
		s.log.Warn("processes of the session survived SIGKILL", "waited", killWait)
	}
}

// killWait bounds the wait for a tree to be gone after SIGKILL (processes
// in uninterruptible sleep take their time).
const killWait = 10 * time.Second

// addLeftover keeps the tree of a finished session whose processes still
// run, to end them at Close; its record now says the session exited, so
// a crash does not report it lost.
func (m *Manager) addLeftover(t tree, name string, s *session) {
	m.mu.Lock()
	_, known := m.leftovers[name]
	m.leftovers[name] = t
	m.mu.Unlock()
	if !known && s != nil && s.pid != 0 {
		m.writeRecord(s, true)
	}
}

// treeGone forgets a tree whose last process is gone.
func (m *Manager) treeGone(name string) {
	m.mu.Lock()
	delete(m.leftovers, name)
	m.mu.Unlock()
	m.treeRecordGone(name)
}

// Has reports whether the process tool of scopeKey can see sessionID
// (running or retained).
func (m *Manager) Has(scopeKey, sessionID string) bool {
	return m.lookup(scopeKey, sessionID) != nil
}

// lookup returns a session visible to scopeKey, or nil.
func (m *Manager) lookup(scopeKey, id string) *session {
	m.mu.Lock()
	s := m.sessions[id]
	m.mu.Unlock()
	if s == nil || s.scopeKey != scopeKey {
		return nil
	}
	return s
}

// Blockers lists the processes that block a safe restart: every running
// session, and removed sessions whose process is still alive.
func (m *Manager) Blockers() []Blocker {
	m.mu.Lock()
	candidates := make([]*session, 0, len(m.sessions)+len(m.removed))
	for _, s := range m.sessions {
		candidates = append(candidates, s)
	}
	for _, s := range m.removed {
		candidates = append(candidates, s)
	}
	m.mu.Unlock()
	var out []Blocker
	for _, s := range candidates {
		s.mu.Lock()
		exited, removed := s.exited, s.removed
		s.mu.Unlock()
		if exited || s.pid == 0 {
			continue
		}
		out = append(out, Blocker{
			SessionID: s.id,
			ScopeKey:  s.scopeKey,
			PID:       s.pid,
			Command:   s.command,
			Removed:   removed,
			StartedAt: s.startedAt.UnixMilli(),
		})
	}
	slices.SortFunc(out, func(a, b Blocker) int { return strings.Compare(a.SessionID, b.SessionID) })
	return out
}

// Close stops taking work and ends every process tree: SIGTERM, then
// SIGKILL after KillGrace or as soon as ctx ends. Processes that outlived
// sessions which already finished are ended the same way, and the
// Manager's cgroup is removed. Close waits for every goroutine of the
// Manager; exit events of background sessions are still delivered. It is
// idempotent; later calls wait for the first.
func (m *Manager) Close(ctx context.Context) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		select {
		case <-m.closeDone:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	m.closed = true
	m.mu.Unlock()

	stopHurry := context.AfterFunc(ctx, func() { close(m.hurry) })
	defer stopHurry()
	m.log.Debug("closing")

	m.cancelRoot(errShutdown) // every session context ends: trees are terminated
	var result *multierror.Error
	leftovers := make(chan error, 1)
	go func() { leftovers <- m.endLeftovers() }()
	m.wg.Wait()
	if err := <-leftovers; err != nil {
		result = multierror.Append(result, err)
	}
	// Sessions that finished while the first pass ran.
	if err := m.endLeftovers(); err != nil {
		result = multierror.Append(result, err)
	}
	if m.cg != nil {
		if err := m.removeCgroup(); err != nil {
			result = multierror.Append(result, err)
		}
	}
	m.removeFreeSlots()
	if m.nullFD >= 0 {
		_ = unix.Close(m.nullFD) // no spawn runs after m.wg.Wait
		m.nullFD = -1
	}
	if m.ownReaper {
		if err := m.reaper.Close(ctx); err != nil {
			result = multierror.Append(result, err)
		}
	}
	close(m.closeDone)
	if err := result.ErrorOrNil(); err != nil {
		return fmt.Errorf("session: close: %w", err)
	}
	return nil
}

// endLeftovers ends the processes that outlived their finished sessions (a
// `setsid daemon &` left behind by a command): SIGTERM, then SIGKILL
// after the grace, or at once when Close's context ended.
func (m *Manager) endLeftovers() error {
	m.mu.Lock()
	trees := make([]tree, 0, len(m.leftovers))
	for _, t := range m.leftovers {
		trees = append(trees, t)
	}
	m.mu.Unlock()
	if len(trees) == 0 {
		return nil
	}
	m.log.Debug("ending processes left by finished sessions", "sessions", len(trees))
	var errs []error
	deadline := time.Now().Add(m.cfg.KillGrace)
	for _, t := range trees {
		errs = append(errs, t.term())
	}
	for _, t := range trees {
		if !t.waitGone(deadline, m.hurry) {
			errs = append(errs, t.kill())
			t.waitGone(time.Now().Add(killWait), nil)
		}
		t.release()
	}
	return errors.Join(errs...)
}

// removeCgroup kills whatever is left in the Manager's cgroup subtree and
// removes it.
func (m *Manager) removeCgroup() error {
	m.cg.close()
	d := m.cg.dir
	if p, err := d.Populated(); err == nil && p {
		m.log.Warn("processes left in the Manager's cgroup at close; killing them", "cgroup", d.Path)
		_ = d.Kill()
		deadline := time.Now().Add(killWait)
		for time.Now().Before(deadline) {
			if p, err := d.Populated(); err != nil || !p {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	m.mu.Lock()
	trees := make([]tree, 0, len(m.leftovers))
	for _, t := range m.leftovers {
		trees = append(trees, t)
	}
	m.mu.Unlock()
	for _, t := range trees {
		t.release()
	}
	return d.RemoveSubtree()
}

// emitExit delivers the exit event of a background session to OnExit and
// the request's hook, in the session's own goroutine and under no lock. A
// poll that delivered the terminal status before the event went out only
// records that it owes an acknowledgement; it is sent here, after the
// event, so a gateway always sees the event before its acknowledgement.
func (m *Manager) emitExit(s *session) {
	s.mu.Lock()
	r := s.res
	u := r.usage
	ev := protocol.ExitEvent{
		SessionID:  s.id,
		SessionKey: s.scopeKey,
		Command:    s.command,
		Status:     r.status,
		ExitCode:   r.code,
		ExitSignal: r.signal,
		ExitReason: r.reason,
		Tail:       s.out.tail(),
		StartedAt:  s.startedAt.UnixMilli(),
		EndedAt:    s.endedAt.UnixMilli(),
		Usage:      &u,
	}
	// No notification for removed sessions, for sessions whose terminal
	// status a poll already delivered, and without a scope to notify.
	if s.notify && !s.removed && !s.terminalPolled && jsTrim(s.scopeKey) != "" {
		ev.Text = notifyText(s.id, r.status, r.code, r.signal, r.reason, s.out.aggregated(), s.emptySuccess)
		ev.Notify = ev.Text != ""
	}
	s.mu.Unlock()
	if m.cfg.OnExit != nil {
		m.cfg.OnExit(ev)
	}
	if s.hook != nil {
		s.hook(ev)
	}
	s.mu.Lock()
	s.eventSent = true
	ack := s.ackOwed
	s.ackOwed = false
	s.mu.Unlock()
	if ack {
		m.acknowledge(s)
	}
	close(s.eventDone)
}

// acknowledge tells OnAcknowledged that a poll delivered the terminal
// status of s.
func (m *Manager) acknowledge(s *session) {
	if m.cfg.OnAcknowledged != nil {
		m.cfg.OnAcknowledged(s.scopeKey, s.id)
	}
}

// workdirCache remembers where working directories resolved to, by the
// directory a path names (device and inode): a call then costs one stat
// instead of a stat per path component. A path that names another
// directory since (a symlink retargeted, a directory replaced) misses.
type workdirCache struct {
	mu      sync.Mutex
	entries map[string]workdirEntry
}

type workdirEntry struct {
	dev, ino uint64
	resolved string
}

// maxWorkdirs bounds the cache; it starts over when full.
const maxWorkdirs = 256

// resolve is resolveWorkdir, cached for non-empty paths.
func (c *workdirCache) resolve(workdir string) (string, bool) {
	path := jsTrim(workdir)
	if path == "" || workdir == "" {
		return resolveWorkdir(workdir)
	}
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return path, false
	}
	c.mu.Lock()
	e, ok := c.entries[path]
	c.mu.Unlock()
	if ok && e.dev == uint64(st.Dev) && e.ino == st.Ino {
		return e.resolved, true
	}
	resolved, ok := resolveWorkdir(workdir)
	if ok {
		c.mu.Lock()
		if c.entries == nil || len(c.entries) >= maxWorkdirs {
			c.entries = map[string]workdirEntry{}
		}
		c.entries[path] = workdirEntry{dev: uint64(st.Dev), ino: st.Ino, resolved: resolved}
		c.mu.Unlock()
	}
	return resolved, ok
}

// resolveWorkdir validates the working directory: it must exist and be a
// directory. The returned path is the real path (or, when invalid, the
// requested one for the error text).
func resolveWorkdir(workdir string) (string, bool) {
	if workdir == "" {
		cwd, err := os.Getwd()
		if err != nil {
			return "current working directory", false
		}
		workdir = cwd
	} else if t := jsTrim(workdir); t != "" {
		workdir = t
	} else {
		return workdir, false
	}
	fi, err := os.Stat(workdir)
	if err != nil || !fi.IsDir() {
		return workdir, false
	}
	if real, err := filepath.EvalSymlinks(workdir); err == nil {
		if abs, err := filepath.Abs(real); err == nil {
			return abs, true
		}
	}
	if abs, err := filepath.Abs(workdir); err == nil {
		return abs, true
	}
	return workdir, true
}
