package session

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Errors of attachments; callers branch on them with errors.Is.
var (
	// ErrSlowReader ends an attachment whose reader left its queue full
	// for longer than AttachOptions.Stall.
	ErrSlowReader = errors.New("the client did not read the session's output fast enough")
	// ErrWriterTaken refuses a writing attachment to a session that
	// already has a writer.
	ErrWriterTaken = errors.New("another client holds the session's input")
	// ErrNotWriter refuses input, resize and signals from a read-only
	// attachment.
	ErrNotWriter = errors.New("the attachment is read-only")
	// ErrNoStdin refuses input to a session started without stdin.
	ErrNoStdin = errors.New("the session has no stdin: start it attached with stdin, or with a PTY")
	// ErrDetached is what an attachment's calls return once it is closed.
	ErrDetached = errors.New("detached")
	// ErrNoSuchSession answers an attach to a session this Manager does
	// not hold for the scope.
	ErrNoSuchSession = errors.New("no such session")
)

// Attachment limits; AttachOptions' zero values take these.
const (
	// DefaultAttachQueue is how many bytes of raw output wait for one
	// attachment's reader before the session's output reader waits.
	DefaultAttachQueue = 1 << 20
	// DefaultAttachStall is how long the output reader waits for a full
	// queue before it detaches the reader (ErrSlowReader).
	DefaultAttachStall = 30 * time.Second
)

// Output streams of a Chunk.
const (
	StreamStdout = streamStdout
	StreamStderr = streamStderr
)

// AttachOptions shape an attachment.
type AttachOptions struct {
	// Write asks for the session's input: stdin, window size and
	// signals. One attachment of a session holds it at a time.
	Write bool
	// Stdin gives a pipe session started with the attachment
	// (ExecRequest.Attach) a stdin pipe instead of /dev/null.
	Stdin bool
	// KillOnDetach ends the session when the attachment is closed before
	// the session ended.
	KillOnDetach bool
	// Queue bounds the raw output waiting for the reader, in bytes;
	// 0 is DefaultAttachQueue.
	Queue int
	// Stall is how long a full queue may hold the session's output back
	// before the attachment is detached with ErrSlowReader; 0 is
	// DefaultAttachStall.
	Stall time.Duration
}

// Chunk is raw output of one stream, in order.
type Chunk struct {
	Stream int // StreamStdout or StreamStderr (a PTY's output is stdout)
	Data   []byte
}

// Exit is how an attached session ended.
type Exit struct {
	Status   string // completed or failed
	ExitCode *int
	Signal   string
	Reason   string // exit, signal, overall-timeout, manual-cancel
}

// Attachment is one client's view of a session's raw output, and with
// Write its input. Output is delivered in order per stream, as the
// process wrote it, from the moment the attachment was bound: an
// attachment made with NewAttachment and passed in ExecRequest.Attach sees
// all of it. The session's own (capped, sanitized) buffer is fed as
// before: an attachment never takes output from it.
//
// A reader that falls behind holds the session's output back (the
// process blocks on a full pipe) for at most Stall; then it is detached
// with ErrSlowReader. Memory per attachment is bounded by Queue plus one
// read of output.
type Attachment struct {
	opts AttachOptions

	mu      sync.Mutex
	s       *session // nil until bound
	queue   []Chunk
	queued  int
	ready   chan struct{} // closed when output, the exit or the end arrives
	space   chan struct{} // closed when the reader took output
	exit    *Exit
	err     error // why it ended: ErrDetached, ErrSlowReader
	closing chan struct{}
	writer  bool
	out     []byte // the Data Next returned last, recycled at the next call
}

// NewAttachment makes an attachment to pass in ExecRequest.Attach, bound
// to the session before its first output is read.
func NewAttachment(opts AttachOptions) *Attachment {
	if opts.Queue <= 0 {
		opts.Queue = DefaultAttachQueue
	}
	if opts.Stall <= 0 {
		opts.Stall = DefaultAttachStall
	}
	return &Attachment{opts: opts, ready: make(chan struct{}), space: make(chan struct{}), closing: make(chan struct{})}
}

// Attach attaches to a running or retained session of scopeKey. A
// session that already ended gives an attachment that returns its exit
// at once.
func (m *Manager) Attach(scopeKey, id string, opts AttachOptions) (*Attachment, error) {
	s := m.lookup(scopeKey, id)
	if s == nil {
		return nil, fmt.Errorf("session %s: %w", id, ErrNoSuchSession)
	}
	opts.Stdin = false // a running session's stdin is what it was started with
	a := NewAttachment(opts)
	if err := s.attach(a); err != nil {
		return nil, err
	}
	return a, nil
}

// attach binds a to s: it gets output from now on.
func (s *session) attach(a *Attachment) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if a.opts.Write {
		if s.writer != nil {
			return fmt.Errorf("session %s: %w", s.id, ErrWriterTaken)
		}
		s.writer = a
		a.writer = true
	}
	a.mu.Lock()
	a.s = s
	a.mu.Unlock()
	if s.exited {
		a.finish(s.exitLocked())
		return nil
	}
	old, _ := s.taps.Load().([]*Attachment)
	s.taps.Store(append(slices.Clip(old), a))
	return nil
}

// detach unbinds a from s.
func (s *session) detach(a *Attachment) {
	s.mu.Lock()
	if s.writer == a {
		s.writer = nil
	}
	old, _ := s.taps.Load().([]*Attachment)
	if i := slices.Index(old, a); i >= 0 {
		s.taps.Store(slices.Delete(slices.Clone(old), i, i+1))
	}
	s.mu.Unlock()
}

// maxChunk bounds the bytes of one Chunk: a flood read in one large
// batch is handed out in pieces.
const maxChunk = 256 << 10

// pooledChunk is the output size from which a chunk's buffer is a
// maxChunk buffer of the Manager's pool: a flood reuses a few buffers
// instead of allocating (and clearing) a fresh one per chunk, while a
// trickle of small output allocates just what it holds.
const pooledChunk = 16 << 10

// chunkBuffer returns an empty buffer for at least n bytes of output.
func (m *Manager) chunkBuffer(n int) []byte {
	if n < pooledChunk {
		return make([]byte, 0, n)
	}
	if b, ok := m.chunks.Get().(*[]byte); ok {
		return (*b)[:0]
	}
	return make([]byte, 0, maxChunk)
}

// recycleChunk gives a chunk's buffer back to the pool, if it is one of
// the pool's.
func (m *Manager) recycleChunk(b []byte) {
	if cap(b) == maxChunk {
		b = b[:0]
		m.chunks.Put(&b)
	}
}

// tapOutput hands raw output to every attachment, waiting while one's
// queue is full (at most its Stall).
func (s *session) tapOutput(stream int, p []byte) {
	taps, _ := s.taps.Load().([]*Attachment)
	for _, a := range taps {
		for q := p; len(q) > 0; {
			n := min(len(q), maxChunk)
			if err := a.push(stream, q[:n]); err != nil {
				s.detach(a)
				break
			}
			q = q[n:]
		}
	}
}

// tapExit ends every attachment with the session's exit, after its last
// output.
func (s *session) tapExit() {
	s.mu.Lock()
	taps, _ := s.taps.Load().([]*Attachment)
	s.taps.Store([]*Attachment(nil))
	e := s.exitLocked()
	s.writer = nil
	s.mu.Unlock()
	for _, a := range taps {
		a.finish(e)
	}
}

// exitLocked is the session's Exit. Caller holds s.mu; the session
// exited.
func (s *session) exitLocked() *Exit {
	return &Exit{Status: s.res.status, ExitCode: s.res.code, Signal: s.res.signal, Reason: s.res.reason}
}

// push queues a copy of p, waiting while the queue is full.
func (a *Attachment) push(stream int, p []byte) error {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		a.mu.Lock()
		if a.err != nil {
			a.mu.Unlock()
			return a.err
		}
		if a.queued == 0 || a.queued+len(p) <= a.opts.Queue {
			if n := len(a.queue); n > 0 && a.queue[n-1].Stream == stream && len(a.queue[n-1].Data)+len(p) <= cap(a.queue[n-1].Data) {
				a.queue[n-1].Data = append(a.queue[n-1].Data, p...)
			} else {
				a.queue = append(a.queue, Chunk{Stream: stream, Data: append(a.s.m.chunkBuffer(len(p)), p...)})
			}
			a.queued += len(p)
			a.wakeLocked()
			a.mu.Unlock()
			return nil
		}
		space := a.space
		a.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(a.opts.Stall)
		}
		select {
		case <-space:
		case <-a.closing:
		case <-timer.C:
			a.end(ErrSlowReader)
			return ErrSlowReader
		}
	}
}

// wakeLocked wakes a waiting reader. Caller holds a.mu.
func (a *Attachment) wakeLocked() {
	close(a.ready)
	a.ready = make(chan struct{})
}

// finish delivers the exit after the output.
func (a *Attachment) finish(e *Exit) {
	a.mu.Lock()
	if a.exit == nil && a.err == nil {
		a.exit = e
		a.wakeLocked()
	}
	a.mu.Unlock()
}

// end stops the attachment with err; output not read yet is dropped.
func (a *Attachment) end(err error) {
	a.mu.Lock()
	if a.err == nil {
		a.err = err
		close(a.closing)
		a.queue, a.queued = nil, 0
		a.wakeLocked()
	}
	a.mu.Unlock()
}

// Next returns the next output, or, once all output was returned, the
// session's exit (with a nil Chunk.Data). The Chunk's Data is valid until
// the next call of Next. It fails with ErrSlowReader or
// ErrDetached when the attachment ended without an exit, and with ctx's
// error.
func (a *Attachment) Next(ctx context.Context) (Chunk, *Exit, error) {
	for {
		a.mu.Lock()
		if a.err != nil {
			err := a.err
			a.mu.Unlock()
			return Chunk{}, nil, err
		}
		if a.out != nil {
			a.s.m.recycleChunk(a.out) // the caller is done with it
			a.out = nil
		}
		if len(a.queue) > 0 {
			c := a.queue[0]
			a.out = c.Data
			a.queue[0] = Chunk{}
			a.queue = a.queue[1:]
			if len(a.queue) == 0 {
				a.queue = nil
			}
			a.queued -= len(c.Data)
			close(a.space)
			a.space = make(chan struct{})
			a.mu.Unlock()
			return c, nil, nil
		}
		if a.exit != nil {
			e := a.exit
			a.mu.Unlock()
			return Chunk{}, e, nil
		}
		ready := a.ready
		a.mu.Unlock()
		select {
		case <-ready:
		case <-ctx.Done():
			return Chunk{}, nil, context.Cause(ctx)
		}
	}
}

// SessionID is the id of the session the attachment is bound to, or ""
// before it is.
func (a *Attachment) SessionID() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.s == nil {
		return ""
	}
	return a.s.id
}

// PTY reports whether the bound session runs on a terminal.
func (a *Attachment) PTY() bool {
	s := a.session()
	return s != nil && s.ptmx != nil
}

// Writer reports whether the attachment holds the session's input.
func (a *Attachment) Writer() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.writer
}

// session returns the bound session while the attachment is open.
func (a *Attachment) session() *session {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.err != nil {
		return nil
	}
	return a.s
}

// input returns the session for an input call, or why not.
func (a *Attachment) input() (*session, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.err != nil:
		return nil, a.err
	case !a.writer || a.s == nil:
		return nil, ErrNotWriter
	}
	return a.s, nil
}

// Write writes p to the session's stdin (the terminal's input for a
// PTY), waiting while the program does not read, until ctx ends.
func (a *Attachment) Write(ctx context.Context, p []byte) error {
	s, err := a.input()
	if err != nil {
		return err
	}
	if s.ptmx == nil && s.stdinPipe == nil {
		return ErrNoStdin
	}
	for len(p) > 0 {
		if err := ctx.Err(); err != nil {
			return context.Cause(ctx)
		}
		var n int
		if s.ptmx != nil {
			n, err = s.writePTYPart(p, time.Now().Add(time.Second))
		} else {
			n, err = s.writeStdin(p, time.Now().Add(time.Second))
		}
		p = p[n:]
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			return err
		}
	}
	return nil
}

// CloseWrite ends the session's input: the stdin pipe is closed, a
// terminal gets Ctrl-D.
func (a *Attachment) CloseWrite() error {
	s, err := a.input()
	if err != nil {
		return err
	}
	if s.ptmx != nil {
		return s.writePTY([]byte{0x04}, time.Now().Add(ptyWriteTimeout))
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if s.stdinPipe == nil {
		return ErrNoStdin
	}
	s.mu.Lock()
	s.stdinClosed = true
	s.mu.Unlock()
	return s.stdinPipe.Close()
}

// Resize sets the terminal's window size; sessions without a PTY ignore
// it.
func (a *Attachment) Resize(cols, rows int) error {
	s, err := a.input()
	if err != nil {
		return err
	}
	if cols < 1 || rows < 1 || cols > 0xffff || rows > 0xffff {
		return fmt.Errorf("window size %dx%d is out of range", cols, rows)
	}
	if s.ptmx == nil {
		return nil
	}
	rc, err := s.ptmx.SyscallConn()
	if err != nil {
		return err
	}
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: uint16(rows), Col: uint16(cols)})
	}); err != nil {
		return err
	}
	return ierr
}

// Signal sends sig to the session's foreground process group: the
// terminal's for a PTY (what Ctrl-C reaches), the command's own group
// otherwise.
func (a *Attachment) Signal(sig syscall.Signal) error {
	s, err := a.input()
	if err != nil {
		return err
	}
	s.mu.Lock()
	exited := s.exited
	s.mu.Unlock()
	if exited {
		return nil
	}
	pgid := s.pid
	if s.ptmx != nil {
		if rc, err := s.ptmx.SyscallConn(); err == nil {
			_ = rc.Control(func(fd uintptr) {
				if g, err := unix.IoctlGetInt(int(fd), unix.TIOCGPGRP); err == nil && g > 0 {
					pgid = g
				}
			})
		}
	}
	if err := unix.Kill(-pgid, sig); err != nil && !errors.Is(err, unix.ESRCH) {
		return os.NewSyscallError("kill", err)
	}
	return nil
}

// Close detaches. With KillOnDetach a session that still runs is ended
// as a process kill would.
func (a *Attachment) Close() error {
	a.end(ErrDetached)
	a.mu.Lock()
	s, exited := a.s, a.exit != nil
	a.mu.Unlock()
	if s == nil {
		return nil
	}
	s.detach(a)
	if a.opts.KillOnDetach && !exited {
		s.mu.Lock()
		stop := !s.exited
		s.cancelRequested = stop
		s.mu.Unlock()
		if stop {
			s.requestStop(errKilled)
		}
	}
	return nil
}

// attachState is what a session holds of its attachments.
type attachState struct {
	taps      atomic.Value // []*Attachment: the output path reads it without a lock
	writer    *Attachment  // under session.mu
	stdinPipe *os.File     // write end of a stdin pipe; under writeMu once running
}

// writePTYPart writes to the PTY master until deadline and says how much
// it wrote.
func (s *session) writePTYPart(p []byte, deadline time.Time) (int, error) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	_ = s.ptmx.SetWriteDeadline(deadline)
	return s.ptmx.Write(p)
}

// writeStdin writes to the stdin pipe until deadline and says how much it
// wrote.
func (s *session) writeStdin(p []byte, deadline time.Time) (int, error) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if s.stdinPipe == nil {
		return 0, ErrNoStdin
	}
	_ = s.stdinPipe.SetWriteDeadline(deadline)
	return s.stdinPipe.Write(p)
}
