package hostbus

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/host"
	"github.com/execmesh/execmesh/protocol"
	"github.com/execmesh/execmesh/session"
)

// remoteStream is the gateway's side of a stream of a host's session
// (see stream.go for the wire): a host.Stream whose memory is bounded by
// the window it grants.
type remoteStream struct {
	r       *Remote
	id      string
	link    *link
	sub     atomic.Pointer[nats.Subscription]
	started protocol.Control
	timing  streamTiming
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup // keepAlive

	mu       sync.Mutex
	q        []protocol.Frame // output for Recv
	qCtl     int              // control frames in q
	ready    chan struct{}    // q grew
	out      inbound          // the node's output credit
	inCredit int64            // input cost that may still be sent
	creditCh chan struct{}    // inCredit grew
	err      error            // why it ended
	exited   bool             // Recv returned the exit
	closed   bool             // Close was called
	done     chan struct{}    // closed when it ended
	endOnce  sync.Once
}

func (r *Remote) streamWindow() int64 {
	if r.StreamWindow > 0 {
		return min(max(r.StreamWindow, minStreamWindow), maxStreamWindow)
	}
	return DefaultStreamWindow
}

// Attach opens a stream of one of the host's sessions (host.Streamer): a
// running one, or (req.StreamID) the one its Exec bound with
// ExecRequest.Stream. The stream's output, its exit and the host's
// errors come through Recv; an error of Recv wrapping ErrStreamLost says
// the stream broke (the host stopped answering, the connection dropped, a
// frame was lost), one wrapping session.ErrSlowReader that the host
// detached it because its output was not read in time.
func (r *Remote) Attach(ctx context.Context, req protocol.AttachRequest) (host.Stream, error) {
	sid := req.StreamID
	if sid == "" {
		var b [16]byte
		_, _ = rand.Read(b[:])
		sid = hex.EncodeToString(b[:])
	}
	if err := protocol.ValidateStreamID(sid); err != nil {
		return nil, err
	}
	if r.Conn.IsClosed() || !r.Conn.IsConnected() {
		return nil, &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true,
			Message: fmt.Sprintf("the gateway is not connected to NATS; %s cannot be reached. Retry later.", r.Label)}
	}
	in, out := streamSubjects(r.Group, sid)
	s := &remoteStream{
		r: r, id: sid, link: newLink(r.Conn, in), out: inbound{window: r.streamWindow()},
		timing: newStreamTiming(r.StreamPing, r.StreamTimeout),
		ready:  make(chan struct{}, 1), creditCh: make(chan struct{}, 1), done: make(chan struct{}),
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	// Subscribed before the request: the node's first frames find it.
	sub, err := r.Conn.Subscribe(out, s.onOutput)
	if err != nil {
		s.cancel()
		return nil, &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true, Message: fmt.Sprintf("attach to %s: subscribe: %v", r.Label, err)}
	}
	s.sub.Store(sub)
	body, err := json.Marshal(attachWire{AttachRequest: req, Stream: sid, Window: s.out.window})
	if err != nil {
		s.end(err)
		return nil, protocol.Errorf(protocol.ErrInternal, "attach: encode request: %v", err)
	}
	timeout := r.callTimeout()
	rr := *r
	rr.OnUnreachable = nil // a host of an older version has no attach endpoint: ask its ping first
	m, err := rr.call(ctx, protocol.NodeEndpointAttach, body, nil, timeout)
	var pe *protocol.Error
	if errors.As(err, &pe) && pe.Type == protocol.ErrUnavailable && !errors.Is(err, ErrNoAnswer) {
		if _, perr := r.call(ctx, protocol.NodeEndpointPing, []byte("{}"), nil, timeout); perr == nil {
			err = protocol.Errorf(protocol.ErrInvalidRequest, "%s does not serve streams (it runs an older execmesh); upgrade it to attach to its sessions", r.Label)
		}
	}
	if err != nil {
		if errors.Is(err, ErrNoAnswer) {
			// The host may have opened it: have it detach at once.
			_ = s.link.control(&protocol.Control{Type: protocol.ControlError, Error: "the attach request was given up", Reason: reasonDetached})
			err = &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true,
				Message: fmt.Sprintf("attach to %s: %s.", r.Label, noAnswer(err, timeout))}
		}
		s.end(err)
		return nil, err
	}
	c, err := protocol.ParseControl(m.Data)
	if err == nil && c.Type != protocol.ControlStarted {
		err = fmt.Errorf("a %q control", c.Type)
	}
	if err == nil && c.Credit <= 0 {
		err = errors.New("no input credit")
	}
	if err != nil {
		_ = s.Close()
		return nil, protocol.Errorf(protocol.ErrInternal, "attach to %s: malformed reply: %v", r.Label, err)
	}
	s.started = *c
	s.started.Credit = 0
	s.mu.Lock()
	s.inCredit += c.Credit
	s.mu.Unlock()
	signal(s.creditCh)
	var silent <-chan struct{}
	var wctx context.Context
	wcancel := context.CancelFunc(func() {})
	if r.Watch != nil {
		wctx, wcancel = r.Watch(s.ctx)
		silent = wctx.Done()
	}
	s.wg.Go(func() {
		defer wcancel()
		s.keepAlive(silent, wctx)
	})
	return s, nil
}

// Started describes the session the stream is attached to.
func (s *remoteStream) Started() protocol.Control { return s.started }

// end ends the stream once with err (frames already received are still
// returned by Recv, before err).
func (s *remoteStream) end(err error) {
	s.endOnce.Do(func() {
		s.mu.Lock()
		s.err = err
		s.mu.Unlock()
		s.cancel()
		if sub := s.sub.Load(); sub != nil {
			_ = sub.Unsubscribe()
		}
		close(s.done)
	})
}

// lost is an error that ends the stream before its exit.
func (s *remoteStream) lost(cause error) error {
	return fmt.Errorf("%w: %s, stream %s: %w", ErrStreamLost, s.r.Label, s.id, cause)
}

// lostf is lost of a new error.
func (s *remoteStream) lostf(format string, args ...any) error {
	return s.lost(fmt.Errorf(format, args...))
}

// onOutput takes a frame of the host (the subscription's goroutine).
func (s *remoteStream) onOutput(m *nats.Msg) {
	select {
	case <-s.done:
		return
	default:
	}
	f, err := s.link.receive(m)
	if err != nil {
		s.end(s.lost(err))
		return
	}
	switch f.Kind {
	case protocol.FrameStdout, protocol.FrameStderr:
		cost := dataCost(f)
		s.mu.Lock()
		over := !s.out.arrive(cost)
		if !over {
			s.q = append(s.q, f)
		}
		s.mu.Unlock()
		if over {
			s.end(s.lostf("the host sent more output than its credit"))
			return
		}
		signal(s.ready)
		return
	case protocol.FrameControl:
	default:
		s.end(s.lostf("a host does not send frames of kind %d", f.Kind))
		return
	}
	switch c := f.Control; c.Type {
	case protocol.ControlPing:
	case protocol.ControlCredit:
		s.mu.Lock()
		s.inCredit += c.Credit
		s.mu.Unlock()
		if c.Credit <= 0 {
			s.end(s.lostf("a credit of %d", c.Credit))
			return
		}
		signal(s.creditCh)
	case protocol.ControlExit, protocol.ControlError:
		if c.Type == protocol.ControlError && c.Reason != reasonRefused {
			if c.Reason == reasonSlowReader {
				s.end(fmt.Errorf("%s, stream %s: %w", s.r.Label, s.id, session.ErrSlowReader))
			} else {
				s.end(s.lostf("%s", c.Error))
			}
			return
		}
		if c.Type == protocol.ControlError {
			c.Reason = "" // the wire's mark of a refusal, not the client's business
		}
		s.mu.Lock()
		over := s.qCtl >= maxQueuedControls
		if !over {
			s.q = append(s.q, f)
			s.qCtl++
		}
		s.mu.Unlock()
		if over {
			s.end(s.lostf("more than %d control frames were not read", maxQueuedControls))
			return
		}
		signal(s.ready)
	default:
		s.end(s.lostf("a host does not send %q frames", c.Type))
	}
}

// Recv returns the next frame: output, refusals of input frames
// (ControlError), then the exit; then io.EOF.
func (s *remoteStream) Recv(ctx context.Context) (protocol.Frame, error) {
	for {
		s.mu.Lock()
		switch {
		case s.closed:
			s.mu.Unlock()
			return protocol.Frame{}, session.ErrDetached
		case len(s.q) > 0:
			f := s.q[0]
			s.q[0] = protocol.Frame{}
			s.q = s.q[1:]
			var grant int64
			if f.Kind == protocol.FrameControl {
				s.qCtl--
				s.exited = f.Control.Type == protocol.ControlExit
			} else {
				if grant = s.out.use(dataCost(f)); s.err != nil {
					grant = 0 // ending: nobody sends more
				}
			}
			s.mu.Unlock()
			if grant > 0 {
				if err := s.link.control(&protocol.Control{Type: protocol.ControlCredit, Credit: grant}); err != nil {
					s.end(s.lostf("send credit: %v", err))
				}
			}
			if s.exited {
				s.end(io.EOF)
			}
			return f, nil
		case s.exited:
			s.mu.Unlock()
			return protocol.Frame{}, io.EOF
		case s.err != nil:
			err := s.err
			s.mu.Unlock()
			return protocol.Frame{}, err
		}
		s.mu.Unlock()
		select {
		case <-s.ready:
		case <-s.done:
		case <-ctx.Done():
			return protocol.Frame{}, context.Cause(ctx)
		}
	}
}

// sendErr is why the stream takes no more input, or nil.
func (s *remoteStream) sendErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return session.ErrDetached
	case s.exited, errors.Is(s.err, io.EOF):
		return fmt.Errorf("%w: the session ended", host.ErrStreamRefused)
	}
	return s.err
}

// Send delivers stdin (within the host's credit, waiting for more), or an
// eof, resize or signal. A frame the host refuses comes back through
// Recv as a ControlError.
func (s *remoteStream) Send(ctx context.Context, f protocol.Frame) error {
	if err := s.sendErr(); err != nil {
		return err
	}
	if !s.started.Writer {
		return fmt.Errorf("%w: %v", host.ErrStreamRefused, session.ErrNotWriter)
	}
	switch {
	case f.Kind == protocol.FrameStdin:
		for d := f.Data; len(d) > 0; {
			k, err := s.takeCredit(ctx, min(len(d), s.link.maxData))
			if err != nil {
				return err
			}
			if err := s.link.publish(protocol.Frame{Kind: protocol.FrameStdin, Data: d[:k]}); err != nil {
				err = s.lostf("send input: %v", err)
				s.end(err)
				return err
			}
			d = d[k:]
		}
		return nil
	case f.Kind == protocol.FrameControl && f.Control != nil:
		c := &protocol.Control{Type: f.Control.Type}
		switch c.Type {
		case protocol.ControlEOF:
		case protocol.ControlResize:
			c.Cols, c.Rows = f.Control.Cols, f.Control.Rows
		case protocol.ControlSignal:
			c.Signal = f.Control.Signal
		default:
			return fmt.Errorf("%w: a client does not send %q", host.ErrStreamRefused, c.Type)
		}
		// The host refuses what does not parse by ending the stream:
		// check here.
		b, err := json.Marshal(c)
		if err == nil {
			_, err = protocol.ParseControl(b)
		}
		if err != nil {
			return fmt.Errorf("%w: %v", host.ErrStreamRefused, err)
		}
		if err := s.link.control(c); err != nil {
			err = s.lostf("send %s: %v", c.Type, err)
			s.end(err)
			return err
		}
		return nil
	}
	return fmt.Errorf("%w: a client sends stdin or control frames", host.ErrStreamRefused)
}

// takeCredit waits for input credit and takes it for up to want bytes of
// one frame; it says how many.
func (s *remoteStream) takeCredit(ctx context.Context, want int) (int, error) {
	for {
		s.mu.Lock()
		if avail := s.inCredit - frameCost; avail > 0 {
			k := min(int64(want), avail)
			s.inCredit -= k + frameCost
			s.mu.Unlock()
			return int(k), nil
		}
		s.mu.Unlock()
		select {
		case <-s.creditCh:
		case <-s.done:
			if err := s.sendErr(); err != nil {
				return 0, err
			}
			return 0, session.ErrDetached
		case <-ctx.Done():
			return 0, context.Cause(ctx)
		}
	}
}

// Close detaches: the host hears it at once (a session started to be
// killed on detach is killed).
func (s *remoteStream) Close() error {
	s.mu.Lock()
	s.closed = true
	s.q, s.qCtl = nil, 0
	s.mu.Unlock()
	select {
	case <-s.done:
	default:
		_ = s.link.control(&protocol.Control{Type: protocol.ControlError, Error: "the client detached", Reason: reasonDetached})
	}
	s.end(session.ErrDetached)
	s.wg.Wait()
	return nil
}

// keepAlive pings the host and ends the stream when the host goes silent
// (or, through Remote.Watch, is known to have), or the connection drops.
func (s *remoteStream) keepAlive(silent <-chan struct{}, wctx context.Context) {
	err := s.link.keepAlive(s.ctx, s.timing, silent)
	switch {
	case errors.Is(err, errPeerSilent):
		s.end(s.lost(&SilentError{Reason: fmt.Sprintf("stopped answering (nothing heard for %s)", s.timing.timeout)}))
	case errors.Is(err, errConnLost):
		s.end(s.lost(fmt.Errorf("the gateway's NATS connection dropped: %w", bus.ErrConnectionLost)))
	case err != nil:
		s.end(s.lost(err))
	case wctx != nil && s.ctx.Err() == nil && wctx.Err() != nil:
		s.end(s.lost(context.Cause(wctx)))
	}
}

var _ host.Streamer = (*Remote)(nil)
