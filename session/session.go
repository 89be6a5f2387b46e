package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/execmesh/execmesh/protocol"
)

// Why a session's context ended (context.Cause).
var (
	errKilled   = errors.New("stopped by request")            // process kill / remove
	errTimedOut = errors.New("timed out")                     // exec timeout
	errAborted  = errors.New("exec call aborted")             // foreground caller went away
	errShutdown = errors.New("session manager closed")        // Manager.Close
	errExited   = errors.New("process exited")                // normal end of the session
	errNotPTY   = errors.New("session has no writable stdin") // internal guard
)

// exitResult is how a session ended, in OpenClaw's terms (spec §12.1).
type exitResult struct {
	status      string // terminal status: completed or failed
	code        *int
	signal      string
	reason      string // exit, signal, overall-timeout, manual-cancel
	failureKind string // failed runs only
	text        string // foreground result text after warnings: output and reason
	aggregated  string // details.aggregated of the foreground result
	durationMs  int64
	timedOut    bool
	stopped     bool           // ended by a kill or remove the caller asked for
	usage       protocol.Usage // what the tree cost, at the exit
}

// session is one command run. Fields above mu are set before the session
// is published and never change afterwards.
type session struct {
	m            *Manager
	id           string
	command      string
	name         string // derived from command (deriveSessionName)
	hasName      bool
	scopeKey     string
	cwd          string
	startedAt    time.Time
	seq          uint64 // registration order, breaks startedAt ties in list
	pty          bool
	timeoutSec   float64
	continuation bool // the run could have been backgrounded (not Synchronous)
	notify       bool // exec.exit notifications wanted
	emptySuccess bool
	hook         func(protocol.ExitEvent)
	treeName     string // <seq>-<id>: the name of its cgroup and state dir record
	limits       protocol.Limits
	log          *slog.Logger

	// refused: its record could not be written, so it was ended at once
	// and never published (no exit event, not listed).
	refused bool

	cmd         *exec.Cmd // PTY sessions only: its process handle is released (see releaseProcess)
	pid         int
	leaderStart uint64
	tree        tree            // the containment of its processes
	exitCh      chan exitStatus // the leader's exit status, from the Reaper
	ptmx        *os.File        // PTY master; nil for pipe sessions
	pipes       [2]*os.File     // read ends of stdout and stderr; nil for PTY sessions
	stdout      *streamWriter   // stdout, or the PTY's merged output
	stderr      *streamWriter   // nil for PTY sessions
	readersDone chan struct{}   // closed when every output reader stopped
	readersLeft atomic.Int32

	ctx      context.Context
	cancel   context.CancelCauseFunc
	stopTerm func() bool   // unregisters the termination callback
	termDone chan struct{} // closed when a started termination finished
	done     chan struct{} // closed when the exit is recorded
	// eventDone is closed when emitExit has sent the exit event (and any
	// acknowledgement owed), for background sessions.
	eventDone chan struct{}

	writeMu sync.Mutex // serialises PTY and stdin writes; never held with mu

	attachState // raw output taps and the input's holder (attach.go)

	mu              sync.Mutex
	out             outputBuffer
	lastOutput      time.Time
	wake            chan struct{} // closed on new output or exit; created by waiters
	backgrounded    bool
	removed         bool
	stdinClosed     bool
	mode            cursorMode
	cancelRequested bool
	exited          bool
	endedAt         time.Time
	res             exitResult
	noOutputPolls   int  // polls without new output since the last with output (-1: none yet)
	terminalPolled  bool // a poll delivered the terminal status
	eventSent       bool // the exit event was delivered
	ackOwed         bool // a terminal poll came before the exit event
	retained        bool
	expiresAt       time.Time
	listUsage       protocol.Usage // the usage list entries show, read at listUsageAt
	listUsageAt     time.Time
	listUsageVer    uint64    // counts the changes of listUsage's value (the list cache's key)
	listUsageRound  uint64    // listUsage was exact at or after that usage round (rstat.go)
	listJSON        listCache // its encoded list entry (listjson.go)
}

// spawnExtras are what a request adds to a spawn (ExecRequest.ExtraFiles
// and SysProcAttr).
type spawnExtras struct {
	files []*os.File
	sys   func(*syscall.SysProcAttr)
	stdin bool // a stdin pipe for an attachment instead of /dev/null
}

// spawn starts the process in a tree of its own. On success the output
// readers run.
func (s *session) spawn(argv, env []string, limits protocol.Limits, x spawnExtras) (warning string, err error) {
	t, err := s.m.newTree(s, limits)
	if err != nil {
		return "", err
	}
	s.tree = t
	s.limits = limits
	defer func() {
		if err != nil {
			t.release()
		}
	}()
	if s.pty {
		err := s.startPTY(argv, env, x)
		if err == nil {
			return "", nil
		}
		// As OpenClaw: fall back to pipes, and say so.
		warning = fmt.Sprintf("Warning: PTY spawn failed (%v); retrying without PTY for `%s`.", err, s.command)
		s.log.Warn("PTY spawn failed, retrying without PTY", "err", err)
		s.pty = false
	}
	return warning, s.startPipes(argv, env, x)
}

// startPipes starts the command on two pipes, stdin from /dev/null, with
// the fewest system calls Go allows: syscall.ForkExec on raw descriptors
// (os/exec would open /dev/null, register the child's ends with the poller
// only to unregister them, and keep a pidfd the Reaper does not need).
func (s *session) startPipes(argv, env []string, x spawnExtras) (err error) {
	path, err := lookPath(argv[0])
	if err != nil {
		return err
	}
	env, err = dedupEnv(env)
	if err != nil {
		return err
	}
	// The pipes are the session's own rather than os/exec's: after the
	// exit the session decides how long to wait for the rest of the
	// output (drainOutput).
	var p [2][2]int
	closeRaw := func() {
		for i := range p {
			for _, fd := range p[i] {
				if fd > 0 {
					_ = unix.Close(fd)
				}
			}
		}
	}
	for i := range p {
		if err := unix.Pipe2(p[i][:], unix.O_CLOEXEC); err != nil {
			closeRaw()
			return os.NewSyscallError("pipe2", err)
		}
	}
	// Its own process group, so the tree can be signalled as one.
	attr := &syscall.SysProcAttr{Setpgid: true}
	started, err := s.tree.prepare(attr)
	if err != nil {
		closeRaw()
		return err
	}
	if x.sys != nil {
		x.sys(attr)
	}
	// stdin is /dev/null: anything waiting for input sees EOF instead of
	// hanging; an attached start that asked for stdin gets a pipe.
	stdin, release, err := s.m.devNull()
	if err != nil {
		started(0)
		closeRaw()
		return err
	}
	var stdinW *os.File
	if x.stdin {
		var in [2]int
		if err := unix.Pipe2(in[:], unix.O_CLOEXEC); err != nil {
			release()
			started(0)
			closeRaw()
			return os.NewSyscallError("pipe2", err)
		}
		release()
		stdin, release = in[0], func() { _ = unix.Close(in[0]) }
		_ = unix.SetNonblock(in[1], true)
		stdinW = os.NewFile(uintptr(in[1]), "|0")
	}
	register := s.m.reaper.spawn()
	var forked [2]uint64
	forked[0] = bootTicks()
	pid, err := syscall.ForkExec(path, argv, &syscall.ProcAttr{
		Dir:   s.cwd,
		Env:   env,
		Files: append([]uintptr{uintptr(stdin), uintptr(p[0][1]), uintptr(p[1][1])}, x.fds()...),
		Sys:   attr,
	})
	forked[1] = bootTicks()
	release()
	// The child has its copies; ours would keep the pipes open for ever.
	_ = unix.Close(p[0][1])
	_ = unix.Close(p[1][1])
	p[0][1], p[1][1] = -1, -1
	if err != nil {
		register(0, nil)
		started(0)
		closeRaw()
		closeFiles(stdinW)
		return &os.PathError{Op: "fork/exec", Path: path, Err: err}
	}
	s.pid = pid
	s.stdinPipe = stdinW
	s.releaseProcess(register, forked)
	started(s.pid)
	for i := range p {
		// Non-blocking, so reads wait in the poller and drainOutput's
		// close interrupts them.
		if err := unix.SetNonblock(p[i][0], true); err != nil {
			s.log.Warn("output pipe stays in blocking mode", "err", err)
		}
		s.pipes[i] = os.NewFile(uintptr(p[i][0]), "|"+strconv.Itoa(i+1))
	}
	s.stdout = newStreamWriter(s, streamStdout)
	s.stderr = newStreamWriter(s, streamStderr)
	s.readersDone = make(chan struct{})
	return nil
}

// fds are the descriptors of the extra files, in order.
func (x spawnExtras) fds() []uintptr {
	out := make([]uintptr, len(x.files))
	for i, f := range x.files {
		out[i] = f.Fd()
	}
	return out
}

// lookPath resolves a program name as exec.Command does: a name with a
// slash is used as it is, others are looked up on the daemon's PATH.
func lookPath(name string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	return exec.LookPath(name)
}

// dedupEnv drops earlier duplicates of each variable, keeping the order,
// and refuses NUL bytes, as os/exec does with Cmd.Env.
func dedupEnv(env []string) ([]string, error) {
	var err error
	out := make([]string, 0, len(env))
	saw := make(map[string]bool, len(env))
	for n := len(env); n > 0; n-- {
		kv := env[n-1]
		if strings.IndexByte(kv, 0) >= 0 {
			err = errors.New("exec: environment variable contains NUL")
			continue
		}
		i := strings.IndexByte(kv, '=')
		if i == 0 {
			i = strings.IndexByte(kv[1:], '=') + 1
		}
		if i < 0 {
			if kv != "" {
				out = append(out, kv)
			}
			continue
		}
		if saw[kv[:i]] {
			continue
		}
		saw[kv[:i]] = true
		out = append(out, kv)
	}
	slices.Reverse(out)
	return out, err
}

// releaseProcess hands the leader to the Reaper. Nothing waits for it with
// a blocked thread: os/exec's Wait would block an OS thread in waitid for
// as long as the command runs, and ten thousand sleeping background
// commands would hold ten thousand threads (the runtime's limit). PTY
// sessions let go of os/exec's process handle (and the pidfd it keeps);
// they never call exec.Cmd.Wait.
//
// forked is the fork's bracket of boot-clock ticks (bootTicks before and
// after it): when both fall in one tick, that tick is the leader's start
// time and /proc is not read, which on a short command's path costs tens
// of µs (the read competes with the new program's loader).
func (s *session) releaseProcess(register func(int, chan<- exitStatus), forked [2]uint64) {
	s.exitCh = make(chan exitStatus, 1)
	register(s.pid, s.exitCh)
	if forked[0] != 0 && forked[0] == forked[1] {
		s.leaderStart = forked[0]
	} else {
		// Read after the registration, which the start time must not
		// delay; the pid stays the leader's until the session takes its
		// status.
		var buf [512]byte
		if p, ok := readProcStat(s.pid, buf[:]); ok {
			s.leaderStart = p.start
		}
	}
	if s.cmd != nil {
		_ = s.cmd.Process.Release()
	}
}

// closeFiles closes every non-nil file, ignoring errors (double closes
// included).
func closeFiles(fs ...*os.File) {
	for _, f := range fs {
		if f != nil {
			_ = f.Close()
		}
	}
}

func (s *session) startPTY(argv, env []string, x spawnExtras) error {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = s.cwd
	cmd.Env = env
	cmd.ExtraFiles = x.files
	// pty.StartWithSize sets Setsid and Setctty: the command leads its own
	// session and process group. Setpgid must not be added (fork fails).
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	started, err := s.tree.prepare(cmd.SysProcAttr)
	if err != nil {
		return err
	}
	if x.sys != nil {
		x.sys(cmd.SysProcAttr)
	}
	register := s.m.reaper.spawn()
	ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Cols: ptyCols, Rows: ptyRows})
	if err != nil {
		register(0, nil)
		started(0)
		return err
	}
	s.pid = cmd.Process.Pid
	s.cmd = cmd
	s.releaseProcess(register, [2]uint64{}) // Release sets cmd.Process.Pid to -1
	started(s.pid)
	// creack/pty used Fd(), which switched the master to blocking mode;
	// switch it back once, so reads wait in the poller and Close
	// interrupts them. Fd is never called again.
	if err := syscall.SetNonblock(int(ptmx.Fd()), true); err != nil {
		s.log.Warn("PTY master stays in blocking mode", "err", err)
	}
	s.ptmx = ptmx
	s.stdout = newStreamWriter(s, streamStdout)
	s.readersDone = make(chan struct{})
	return nil
}

// startReaders starts the goroutines that read the output, counted in wg.
func (s *session) startReaders(wg *sync.WaitGroup) {
	if s.ptmx != nil {
		wg.Go(s.readPTY)
		return
	}
	s.readersLeft.Store(int32(len(s.pipes)))
	for i, w := range []*streamWriter{s.stdout, s.stderr} {
		wg.Go(func() { s.readPipe(s.pipes[i], w) })
	}
}

// readPipe copies one output pipe until end-of-file or until drainOutput
// closed it.
func (s *session) readPipe(r *os.File, w *streamWriter) {
	if _, err := w.ReadFrom(r); err != nil && !errors.Is(err, os.ErrClosed) {
		s.log.Debug("output read ended", "err", err)
	}
	if s.readersLeft.Add(-1) == 0 {
		close(s.readersDone)
		s.m.reaper.awaitExit(s.pid)
	}
}

// readPTY copies the PTY's output until the terminal hangs up (EIO once
// the session leader exited) or the master is closed.
func (s *session) readPTY() {
	var rb readBuffer
	for {
		n, err := s.ptmx.Read(rb.next())
		if rb.fill += n; n > 0 {
			_ = s.stdout.consume(rb.take(time.Now()))
		}
		if err != nil {
			// EIO is the normal end of a PTY; os.ErrClosed follows our
			// own Close after the drain wait.
			if !errors.Is(err, syscall.EIO) && !errors.Is(err, os.ErrClosed) && !errors.Is(err, io.EOF) {
				s.log.Debug("PTY read ended", "err", err)
			}
			break
		}
	}
	s.stdout.finish()
	close(s.readersDone)
	s.m.reaper.awaitExit(s.pid)
}

// run owns the session after spawn: it waits for the exit, records it and
// finishes a termination that is in progress.
func (s *session) run() {
	m := s.m
	st := <-s.exitCh
	if s.ptmx != nil {
		s.drainOutput(func() []string { return []string{ptyLink(s.ptmx)} }, func() {
			s.writeMu.Lock() // no write is in progress on a closed file
			_ = s.ptmx.Close()
			s.writeMu.Unlock()
		})
		s.writeMu.Lock()
		_ = s.ptmx.Close()
		s.writeMu.Unlock()
	} else {
		s.drainOutput(func() []string { return []string{pipeLink(s.pipes[0]), pipeLink(s.pipes[1])} },
			func() { closeFiles(s.pipes[:]...) })
		s.stdout.finish()
		s.stderr.finish()
	}
	if st.err != nil {
		s.log.Warn("wait failed", "err", st.err)
	}
	var cause error
	if s.ctx.Err() != nil {
		cause = context.Cause(s.ctx)
	}
	m.finishSession(s, st, cause)
	// The readers are done: the pipes are closed after the caller was
	// answered, not before (two system calls off a short command's path).
	closeFiles(s.pipes[:]...)
	if s.stdinPipe != nil {
		s.writeMu.Lock()
		_ = s.stdinPipe.Close()
		s.writeMu.Unlock()
	}
	// A termination that started must finish before the session is
	// released: escapees may still need their SIGKILL.
	if !s.stopTerm() {
		<-s.termDone
	}
	s.tree.release()
	s.cancel(errExited)
}

// requestStop ends the session's process tree (see Manager.terminate).
func (s *session) requestStop(cause error) { s.cancel(cause) }

// appendOutput stores sanitized output and answers cursor-position
// requests on PTYs. Called by one reader per stream.
func (s *session) appendOutput(stream int, clean []byte, z *sanitizer) {
	now := time.Now()
	s.mu.Lock()
	s.lastOutput = now
	if len(clean) > 0 {
		s.out.append(stream, clean, z.units, !z.nonASCII)
		if s.wake != nil {
			close(s.wake)
			s.wake = nil
		}
	}
	if z.mode != cursorUnknown && stream == streamStdout {
		s.mode = z.mode
	}
	s.mu.Unlock()
	for i := 0; i < z.dsr && s.ptmx != nil; i++ {
		// The program asked where the cursor is; answer "top left".
		if err := s.writePTY([]byte(esc+"[1;1R"), time.Now().Add(dsrReplyTimeout)); err != nil {
			s.log.Debug("cursor position reply failed", "err", err)
			break
		}
	}
}

// writePTY writes to the PTY master, giving up at deadline.
func (s *session) writePTY(p []byte, deadline time.Time) error {
	if s.ptmx == nil {
		return errNotPTY
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	// Without a poller registration SetWriteDeadline fails; the write is
	// then unbounded, which only happens if SetNonblock failed above.
	_ = s.ptmx.SetWriteDeadline(deadline)
	_, err := s.ptmx.Write(p)
	return err
}

// waitChange returns a channel closed at the next output or exit. Caller
// holds s.mu.
func (s *session) waitChangeLocked() <-chan struct{} {
	if s.wake == nil {
		s.wake = make(chan struct{})
	}
	return s.wake
}

// markBackgrounded makes a running session a background session; false if
// it already exited (the settled outcome wins).
func (s *session) markBackgrounded() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.exited {
		return false
	}
	s.backgrounded = true
	return true
}

// classify turns a wait status and the context cause into the outcome of
// the run. Caller holds s.mu (it reads the output).
func (s *session) classifyLocked(st exitStatus, cause error, now time.Time) exitResult {
	r := exitResult{durationMs: now.Sub(s.startedAt).Milliseconds(), usage: s.tree.usage(&st)}
	agg := jsTrim(s.out.aggregated())
	if st.err != nil {
		// The process could not be waited for: a runtime error.
		r.status = protocol.StatusFailed
		r.failureKind = failureRuntimeError
		r.aggregated = agg
		r.text = joinFailure(agg, "Error: "+errorText(st.err))
		return r
	}
	if ws := st.ws; ws.Signaled() {
		r.signal = unix.SignalName(ws.Signal())
		if r.signal == "" {
			r.signal = "SIG" + strconv.Itoa(int(ws.Signal()))
		}
	} else {
		c := ws.ExitStatus()
		r.code = &c
	}
	switch {
	case errors.Is(cause, errTimedOut):
		r.reason = reasonTimeout
	case errors.Is(cause, errKilled), errors.Is(cause, errAborted):
		r.reason = reasonManualCancel
	case (r.signal != "" || (r.code != nil && *r.code != 0)) && s.tree.oomKilled():
		r.reason = reasonOOM
	case r.signal != "":
		// Shutdown kills land here too: the agent did not ask for them,
		// so they are reported (and notified) like any other signal.
		r.reason = reasonSignal
	default:
		r.reason = reasonExit
	}
	code := 0
	if r.code != nil {
		code = *r.code
	}
	shellFailure := code == 126 || code == 127
	if r.reason == reasonExit && !shellFailure {
		r.status = protocol.StatusCompleted
		r.aggregated = agg
		if code != 0 {
			out := agg
			if out == "" {
				out = noOutputPlaceholder
			}
			r.aggregated = out + "\n\n(Command exited with code " + strconv.Itoa(code) + ")"
		}
		r.text = r.aggregated
		if r.text == "" {
			r.text = noOutputPlaceholder
		}
		return r
	}
	r.status = protocol.StatusFailed
	r.aggregated = agg
	r.timedOut = isTimeoutReason(r.reason)
	var reasonText string
	switch {
	case shellFailure && code == 127:
		r.failureKind, reasonText = failureNotFound, "Command not found"
	case shellFailure:
		r.failureKind, reasonText = failureNotExec, "Command not executable (permission denied)"
	case r.reason == reasonTimeout:
		r.failureKind = reasonTimeout
		reasonText = "Command timed out."
		if s.timeoutSec > 0 {
			reasonText = "Command timed out after " + formatSeconds(s.timeoutSec) + " seconds."
		}
		reasonText = appendTimeoutGuidance(reasonText, r.reason)
		if s.continuation {
			reasonText += "\n\n" + backgroundHint
		}
	case r.reason == reasonOOM:
		r.failureKind = reasonOOM
		reasonText = "Command killed: out of memory (the session's memory limit memoryMax=" + protocol.FormatBytes(s.limits.MemoryMax) + " was reached)"
		if s.limits.MemoryMax == 0 {
			reasonText = "Command killed: out of memory (the kernel's OOM killer ended a process of the session)"
		}
	case r.signal != "":
		r.failureKind, reasonText = failureSignal, "Command aborted by signal "+r.signal
	default:
		r.failureKind, reasonText = failureAborted, "Command aborted before exit code was captured"
	}
	r.text = joinFailure(agg, reasonText)
	// A stop the caller asked for is a success of the request (DESIGN.md §7).
	if r.reason == reasonManualCancel && s.cancelRequested {
		r.stopped = true
		r.status = protocol.StatusCompleted
	}
	return r
}

func joinFailure(aggregated, reason string) string {
	if aggregated == "" {
		return reason
	}
	return aggregated + "\n\n" + reason
}

func errorText(err error) string {
	if err == nil {
		return "unknown error"
	}
	return err.Error()
}

// streamWriter receives one output stream of a pipe session, or the
// output of a PTY. os/exec calls ReadFrom with the pipe (through io.Copy),
// so reads use our buffer size and no intermediate copy.
type streamWriter struct {
	s      *session
	stream int
	z      sanitizer
	out    []byte // sanitized output of the current read, reused
}

func newStreamWriter(s *session, stream int) *streamWriter {
	w := &streamWriter{s: s, stream: stream}
	w.z.keep = s.m.cfg.MaxOutputChars
	return w
}

// Write implements io.Writer for callers that push bytes.
func (w *streamWriter) Write(p []byte) (int, error) {
	w.consume(p)
	return len(p), nil
}

// ReadFrom implements io.ReaderFrom: it reads until EOF or until the pipe
// is closed (drainOutput).
//
// A flooding pipe (readBuffer.flood) is read in batches: reads go on into
// the batch while it has room, for at most floodBatchWait, and the batch
// is consumed as one piece. The reader keeps up with a fast writer in
// small reads (a writer's 8 KiB at a time), and each piece costs its
// sanitizing, the copy into the buffers and the cut to their caps; one
// piece per batch pays that once, and only for the newest output the
// retention cap keeps.
func (w *streamWriter) ReadFrom(r io.Reader) (int64, error) {
	rb := readBuffer{pipe: r, held: &w.s.m.batchBytes}
	defer rb.endFlood()
	dl, _ := r.(interface{ SetReadDeadline(time.Time) error })
	var total int64
	deadline := false // a batch deadline is set on r
	for {
		n, err := r.Read(rb.next())
		total += int64(n)
		rb.fill += n
		if errors.Is(err, os.ErrDeadlineExceeded) {
			err = nil // the batch waited long enough
		} else if err == nil && rb.batching() && dl != nil {
			if !deadline {
				deadline = dl.SetReadDeadline(time.Now().Add(floodBatchWait)) == nil
			}
			if deadline {
				continue
			}
		}
		if deadline {
			_ = dl.SetReadDeadline(time.Time{})
			deadline = false
		}
		if p := rb.take(time.Now()); len(p) > 0 && w.consume(p) {
			rb.widen()
		}
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

// consume sanitizes p into the session's output. It reports whether the
// sanitizer cut its output to the retained window (keep: units counts
// what was cut, and no written output has more units than bytes): its
// work was then bounded by that window, not by p, and a wider batch pays
// it less often (readBuffer.widen).
func (w *streamWriter) consume(p []byte) (windowed bool) {
	if f := w.s.m.cfg.OnOutput; f != nil {
		f(len(p))
	}
	w.s.tapOutput(w.stream, p)
	if w.z.passThrough(p) {
		w.s.appendOutput(w.stream, p, &w.z) // common case: no copy
		return false
	}
	w.out = w.z.write(w.out[:0], p)
	w.s.appendOutput(w.stream, w.out, &w.z)
	windowed = w.z.units > len(w.out)
	if cap(w.out) > 4*floodReadBuffer {
		w.out = nil // a burst of escapes grew it; do not keep it
	}
	return windowed
}

// finish flushes an incomplete UTF-8 sequence left at the end of the
// stream. The readers have stopped when it is called.
func (w *streamWriter) finish() {
	w.out = w.z.flush(w.out[:0])
	if len(w.out) > 0 {
		w.s.appendOutput(w.stream, w.out, &w.z)
	}
	w.out = nil
}

// readBuffer grows with the output rate: it starts small, so that idle
// sessions hold little memory while blocked in a read, and doubles up to
// readBufferSize while reads fill it. A pipe that delivers floodBytes
// within floodWindow is a flood: it gets a larger kernel buffer, and its
// reads are gathered into batches of up to floodReadBuffer (ReadFrom), so
// that the per-piece work (the sanitizer's cut to the retained window,
// the copy of that window) is paid per batch, not per read. A batch that
// comes back nearly empty ends the flood and the large buffer goes. A
// flood whose batches the sanitizer cuts to the retained window (NUL
// bytes: only the window's worth of \x00 is written) gets a wider batch
// (widen), as its per-batch work is that window; output that passes
// through unchanged is faster read into a batch that stays in the CPU's
// cache, and output written whole gains nothing from fewer batches.
//
// The flood is told by its rate, not by reads that fill the buffer: a
// reader that keeps up with a fast writer sees each of its writes (8 KiB
// for head or cat) on its own, and would never batch the very floods that
// need it most.
//
// Flood buffers are large, so their sum across a Manager is bounded
// (held, floodBuffersMax): a flood beyond it goes on in ordinary reads,
// slower but with the same output.
type readBuffer struct {
	buf      []byte
	fill     int           // bytes of buf read and not taken yet
	pipe     io.Reader     // the pipe being read, for F_SETPIPE_SZ; nil for PTYs
	held     *atomic.Int64 // flood buffer bytes the Manager's readers hold (a flood's: len(buf)); nil: no bound
	winStart time.Time     // start of the current rate window
	winBytes int           // bytes taken since winStart
	flood    bool
}

const initialReadBuffer = 1 << 10

// floodBatchWait bounds how long a flood's output waits in its batch: a
// poll sees it at most this late.
const floodBatchWait = 2 * time.Millisecond

// next returns the free part of the buffer, for one read.
func (rb *readBuffer) next() []byte {
	if rb.buf == nil {
		rb.buf = make([]byte, initialReadBuffer)
	}
	return rb.buf[rb.fill:]
}

// batching reports whether the next read should go on into the batch
// rather than hand it over: a flood with room for another read's worth.
// Reads keep up with the writer in the pipe's 64 KiB or less; the room
// asked for is readBufferSize, not the widened pipe, which may be as large
// as the whole batch.
func (rb *readBuffer) batching() bool {
	return rb.flood && rb.fill <= len(rb.buf)-readBufferSize
}

// take hands over what was read (at now) and sizes the buffer for the
// next reads. The bytes stay valid until the next read: a grown buffer is
// a new one.
func (rb *readBuffer) take(now time.Time) []byte {
	p := rb.buf[:rb.fill]
	n := rb.fill
	rb.fill = 0
	if rb.flood {
		if n <= floodReadBuffer/64 {
			// The flood is over: do not hold its buffer while blocked.
			rb.endFlood()
			rb.buf = make([]byte, readBufferSize)
		}
		return p
	}
	if n == len(rb.buf) && len(rb.buf) < readBufferSize {
		rb.buf = make([]byte, len(rb.buf)*2)
	}
	if now.Sub(rb.winStart) > floodWindow {
		rb.winStart, rb.winBytes = now, 0
	}
	if rb.winBytes += n; rb.winBytes >= floodBytes && rb.pipe != nil {
		if !rb.reserve(floodReadBuffer) {
			// Over the budget: try again in the next window.
			rb.winStart, rb.winBytes = now, 0
			return p
		}
		rb.flood = true
		widenPipe(rb.pipe)
		rb.buf = make([]byte, floodReadBuffer)
	}
	return p
}

// widen gives a flood the wider batch, once, if the budget has room. It
// is called after take, whose bytes were consumed: nothing is read into
// the buffer it replaces.
func (rb *readBuffer) widen() {
	if !rb.flood || len(rb.buf) >= floodWideBuffer || !rb.reserve(floodWideBuffer-len(rb.buf)) {
		return
	}
	rb.buf = make([]byte, floodWideBuffer)
}

// reserve counts n more bytes of flood buffer against the Manager's
// budget, and reports whether they fit.
func (rb *readBuffer) reserve(n int) bool {
	if rb.held != nil && rb.held.Add(int64(n)) > floodBuffersMax {
		rb.held.Add(-int64(n))
		return false
	}
	return true
}

// endFlood ends a flood and gives its buffer's share of the budget back;
// the caller then replaces or drops the buffer. Without a flood it does
// nothing.
func (rb *readBuffer) endFlood() {
	if !rb.flood {
		return
	}
	rb.flood, rb.winBytes = false, 0
	if rb.held != nil {
		rb.held.Add(-int64(len(rb.buf)))
	}
}

// widenPipe asks for a larger pipe buffer, best effort. The pipe is reached
// through syscall.Conn so that its file never leaves non-blocking mode
// (File.Fd would switch it to blocking and defeat drainOutput's close).
func widenPipe(r io.Reader) {
	sc, ok := r.(syscall.Conn)
	if !ok {
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		_, _ = unix.FcntlInt(fd, unix.F_SETPIPE_SZ, pipeBufferSize)
	})
}
