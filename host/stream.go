package host

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/execmesh/execmesh/protocol"
	"github.com/execmesh/execmesh/session"
)

// Stream is one client's connection to a session's raw streams
// (DESIGN.md §3.7): output in order, then the exit; input, window size
// and signals when it holds the session's input. Recv and Send may be
// called concurrently with each other, each from one goroutine.
type Stream interface {
	// Started describes the session: its id, whether it runs on a PTY
	// and whether this stream holds its input.
	Started() protocol.Control
	// Recv returns the next frame: stdout or stderr data, then one
	// ControlExit. An error ends the stream (the session is out of
	// reach, the client was too slow, ctx ended).
	Recv(ctx context.Context) (protocol.Frame, error)
	// Send delivers a client frame: stdin data, or a ControlEOF,
	// ControlResize or ControlSignal. Errors that refuse one frame
	// (ErrStreamRefused) leave the stream open.
	Send(ctx context.Context, f protocol.Frame) error
	// Close detaches; a session started to be killed on detach is.
	Close() error
}

// Streamer is a Host whose sessions can be attached.
type Streamer interface {
	// Attach opens a stream: to a running session of req.SessionKey, or
	// (req.StreamID) the one bound by an Exec with ExecRequest.Stream.
	Attach(ctx context.Context, req protocol.AttachRequest) (Stream, error)
}

// ErrStreamRefused wraps the refusal of one client frame.
var ErrStreamRefused = errors.New("refused")

// unclaimedStreamTTL is how long a stream bound at a start waits for its
// client's AttachRequest before it is dropped.
const unclaimedStreamTTL = 30 * time.Second

// pendingStreams holds the attachments of starts until they are claimed.
type pendingStreams struct {
	mu sync.Mutex
	m  map[string]*session.Attachment
}

// add binds a new attachment for spec; it is dropped (closed) if nobody
// claims it in time.
func (p *pendingStreams) add(spec *protocol.StreamSpec, pty bool) (*session.Attachment, error) {
	if spec.ID == "" || len(spec.ID) > 64 {
		return nil, protocol.Errorf(protocol.ErrInvalidRequest, "stream id must be 1 to 64 characters")
	}
	a := session.NewAttachment(session.AttachOptions{Write: true, Stdin: spec.Stdin && !pty, KillOnDetach: !spec.KeepOnDetach})
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = make(map[string]*session.Attachment)
	}
	if _, dup := p.m[spec.ID]; dup {
		return nil, protocol.Errorf(protocol.ErrConflict, "stream %s is already bound", spec.ID)
	}
	p.m[spec.ID] = a
	time.AfterFunc(unclaimedStreamTTL, func() {
		if a := p.take(spec.ID); a != nil {
			_ = a.Close()
		}
	})
	return a, nil
}

// take removes and returns the attachment of id, or nil.
func (p *pendingStreams) take(id string) *session.Attachment {
	p.mu.Lock()
	defer p.mu.Unlock()
	a := p.m[id]
	delete(p.m, id)
	return a
}

// Attach opens a stream of one of the host's sessions.
func (l *Local) Attach(ctx context.Context, req protocol.AttachRequest) (Stream, error) {
	if req.StreamID != "" {
		a := l.streams.take(req.StreamID)
		if a == nil {
			return nil, protocol.Errorf(protocol.ErrNotFound, "stream %s is not bound here (its start failed, or it waited too long)", req.StreamID)
		}
		if a.SessionID() == "" {
			_ = a.Close()
			return nil, protocol.Errorf(protocol.ErrNotFound, "stream %s has no session (its start failed)", req.StreamID)
		}
		return &localStream{a: a}, nil
	}
	if req.SessionKey == "" || req.SessionID == "" {
		return nil, protocol.Errorf(protocol.ErrInvalidRequest, "attach: sessionKey and sessionId are required")
	}
	a, err := l.mgr.Attach(req.SessionKey, req.SessionID, session.AttachOptions{Write: req.Write})
	switch {
	case errors.Is(err, session.ErrNoSuchSession):
		return nil, protocol.Errorf(protocol.ErrNotFound, "No session found for %s", req.SessionID)
	case errors.Is(err, session.ErrWriterTaken):
		return nil, protocol.Errorf(protocol.ErrConflict, "session %s: %v; attach read-only, or detach the other client", req.SessionID, session.ErrWriterTaken)
	case err != nil:
		return nil, err
	}
	return &localStream{a: a}, nil
}

// localStream is a Stream of the host's own session core.
type localStream struct {
	a *session.Attachment
}

func (s *localStream) Started() protocol.Control {
	return protocol.Control{Type: protocol.ControlStarted, SessionID: s.a.SessionID(), PTY: s.a.PTY(), Writer: s.a.Writer()}
}

func (s *localStream) Recv(ctx context.Context) (protocol.Frame, error) {
	c, e, err := s.a.Next(ctx)
	switch {
	case err != nil:
		return protocol.Frame{}, err
	case e != nil:
		return protocol.Frame{Kind: protocol.FrameControl, Control: exitControl(e)}, nil
	case c.Stream == session.StreamStderr:
		return protocol.Frame{Kind: protocol.FrameStderr, Data: c.Data}, nil
	}
	return protocol.Frame{Kind: protocol.FrameStdout, Data: c.Data}, nil
}

func (s *localStream) Send(ctx context.Context, f protocol.Frame) error {
	var err error
	switch {
	case f.Kind == protocol.FrameStdin:
		err = s.a.Write(ctx, f.Data)
	case f.Kind == protocol.FrameControl && f.Control != nil:
		switch c := f.Control; c.Type {
		case protocol.ControlEOF:
			err = s.a.CloseWrite()
		case protocol.ControlResize:
			err = s.a.Resize(c.Cols, c.Rows)
		case protocol.ControlSignal:
			sig := unix.SignalNum(c.Signal)
			if sig == 0 {
				sig = unix.SignalNum("SIG" + c.Signal)
			}
			if sig == 0 {
				return fmt.Errorf("%w: unknown signal %q", ErrStreamRefused, c.Signal)
			}
			err = s.a.Signal(sig)
		default:
			return fmt.Errorf("%w: a client does not send %q", ErrStreamRefused, c.Type)
		}
	default:
		return fmt.Errorf("%w: a client sends stdin or control frames", ErrStreamRefused)
	}
	if errors.Is(err, session.ErrNotWriter) || errors.Is(err, session.ErrNoStdin) {
		return fmt.Errorf("%w: %v", ErrStreamRefused, err)
	}
	return err
}

func (s *localStream) Close() error { return s.a.Close() }

// exitControl is the ControlExit of a session's exit.
func exitControl(e *session.Exit) *protocol.Control {
	return &protocol.Control{Type: protocol.ControlExit, Status: e.Status, ExitCode: e.ExitCode, Signal: e.Signal, Reason: e.Reason}
}
