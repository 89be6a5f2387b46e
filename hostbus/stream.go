package hostbus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/execmesh/execmesh/host"
	"github.com/execmesh/execmesh/protocol"
	"github.com/execmesh/execmesh/session"
)

// Streams of a host's sessions over NATS (DESIGN.md §3.7): a Remote's
// Attach asks the host's attach endpoint for a stream, and the frames then
// flow on two subjects of their own, numbered by their sender
// (protocol.AppendSeqFrame, from 1):
//
//	gateway → node  <prefix>.node.<id>.stream.<sid>   stdin, eof, resize, signal, credit, ping, error (detach)
//	node → gateway  <prefix>.nstream.<id>.<sid>       stdout, stderr, exit, credit, ping, error
//
// (the host of another gateway, <group> not a node's: <group>.stream.<sid>
// and <group>.ostream.<sid>). The gateway subscribes to the output before
// it sends the attach request; the node opens the host's stream and
// subscribes to the input before it answers with the started Control,
// whose Credit is the gateway's first input credit.
//
// Flow control: each side may have at most the window its peer granted
// in flight (output: the window of the attach request; input: the
// started Control's Credit), counted as each data frame's bytes plus
// frameCost; the receiver grants more (ControlCredit) as its reader
// takes the data, a quarter of the window at a time. Control frames
// are not counted. A node out of credit stops reading the host's stream,
// so the session's attachment queue fills and the process blocks (and a
// reader stalled for too long is detached: session.ErrSlowReader).
//
// Loss and liveness: a frame whose number is not the next, a frame that
// does not parse, or data beyond the credit ends the stream with an
// error. A side that sent nothing for the ping interval sends a ping; a
// side that heard nothing for the timeout, or whose NATS connection
// drops, ends the stream. The node ends a stream with an error frame
// (Reason reasonRefused marks instead the refusal of one input frame,
// which leaves the stream open); the gateway detaches with an error
// frame.

// Stream defaults.
const (
	// DefaultStreamWindow is the output a node may have in flight to a
	// gateway, and the input a gateway may have in flight to a node.
	DefaultStreamWindow = 1 << 20
	// DefaultStreamPing is how long a side of a stream stays silent
	// before it pings.
	DefaultStreamPing = 5 * time.Second
	// DefaultStreamTimeout is how long a side hears nothing from its
	// peer before it ends the stream.
	DefaultStreamTimeout = 20 * time.Second
)

const (
	// frameCost is what one data frame costs in credit beyond its bytes:
	// a stream of one-byte frames is bounded by the window too.
	frameCost = 128
	// minStreamWindow and maxStreamWindow bound an attach request's
	// window.
	minStreamWindow = 64 << 10
	maxStreamWindow = 64 << 20
	// maxQueuedControls bounds the control frames waiting for a reader
	// (node: input waiting behind a write the program does not read;
	// gateway: refusals waiting for Recv).
	maxQueuedControls = 256
	// Reasons of error frames.
	reasonRefused    = "refused"     // node: one input frame was refused; the stream stays open
	reasonSlowReader = "slow-reader" // node: the output was not taken in time (session.ErrSlowReader)
	reasonDetached   = "detached"    // gateway: it detaches
)

// ErrStreamLost is wrapped by the errors that end a stream of a Remote
// before its exit: the host stopped answering, the connection dropped, a
// frame was lost or forged, the host ended it.
var ErrStreamLost = errors.New("stream lost")

// attachWire is the attach endpoint's request: the host's AttachRequest,
// the stream id that names the stream's subjects (StreamID for a claim,
// a fresh one otherwise) and the output window.
type attachWire struct {
	protocol.AttachRequest
	Stream string `json:"stream"`
	Window int64  `json:"window"`
}

// streamSubjects returns the input and output subjects of stream sid of
// the host served in group.
func streamSubjects(group, sid string) (in, out string) {
	if prefix, nodeID, err := protocol.ParseNodeGroup(group); err == nil {
		s := protocol.Subjects(prefix)
		return s.NodeStreamIn(nodeID, sid), s.NodeStreamOut(nodeID, sid)
	}
	// Another gateway's host: gateways may use every subject of the
	// prefix.
	return group + ".stream." + sid, group + ".ostream." + sid
}

// streamTiming is a stream's ping interval and timeout.
type streamTiming struct{ ping, timeout time.Duration }

func newStreamTiming(ping, timeout time.Duration) streamTiming {
	if ping <= 0 {
		ping = DefaultStreamPing
	}
	if timeout <= 0 {
		timeout = DefaultStreamTimeout
	}
	return streamTiming{ping: ping, timeout: timeout}
}

// dataCost is what frame f costs in credit (0 for a control frame).
func dataCost(f protocol.Frame) int64 {
	if f.Kind == protocol.FrameControl {
		return 0
	}
	return int64(len(f.Data)) + frameCost
}

// Errors of link.keepAlive.
var (
	errPeerSilent = errors.New("peer silent")
	errConnLost   = errors.New("NATS connection lost")
)

// link is one side's half of a stream's wire: its numbered frames to
// out, the check of the peer's numbers, and liveness.
type link struct {
	nc      *nats.Conn
	out     string
	maxData int // bytes of one data frame

	pubMu sync.Mutex
	seq   uint64
	buf   []byte

	lastSent  atomic.Int64 // unix nanoseconds
	lastHeard atomic.Int64
	inSeq     uint64 // the subscription's goroutine only
}

func newLink(nc *nats.Conn, out string) *link {
	l := &link{nc: nc, out: out, maxData: protocol.MaxFrameData}
	if mp := int(nc.MaxPayload()); mp > 0 && mp-64 < l.maxData {
		l.maxData = max(mp-64, 1)
	}
	now := time.Now().UnixNano()
	l.lastSent.Store(now)
	l.lastHeard.Store(now)
	return l
}

// publish sends f with the next number.
func (l *link) publish(f protocol.Frame) error {
	l.pubMu.Lock()
	defer l.pubMu.Unlock()
	b, err := protocol.AppendSeqFrame(l.buf[:0], l.seq+1, f)
	if err != nil {
		return err
	}
	l.buf = b
	l.seq++
	if err := l.nc.Publish(l.out, b); err != nil {
		return err
	}
	l.lastSent.Store(time.Now().UnixNano())
	return nil
}

// control sends a control frame.
func (l *link) control(c *protocol.Control) error {
	return l.publish(protocol.Frame{Kind: protocol.FrameControl, Control: c})
}

// receive decodes a message of the peer and checks its number. Called
// from the subscription's goroutine only.
func (l *link) receive(m *nats.Msg) (protocol.Frame, error) {
	f, seq, err := protocol.ParseSeqFrame(m.Data)
	if err != nil {
		return protocol.Frame{}, err
	}
	l.inSeq++
	if seq != l.inSeq {
		return protocol.Frame{}, fmt.Errorf("frame %d arrived where %d was due: a message was lost (or forged) on the way", seq, l.inSeq)
	}
	l.lastHeard.Store(time.Now().UnixNano())
	return f, nil
}

// keepAlive pings the peer whenever this side sent nothing for t.ping,
// until ctx ends (nil), the peer was silent for t.timeout
// (errPeerSilent), the connection dropped (errConnLost), a ping could not
// be sent, or gone is closed (nil; the caller looks at why).
func (l *link) keepAlive(ctx context.Context, t streamTiming, gone <-chan struct{}) error {
	status := l.nc.StatusChanged(nats.RECONNECTING, nats.DISCONNECTED, nats.CLOSED)
	defer l.nc.RemoveStatusListener(status)
	if !l.nc.IsConnected() {
		return errConnLost
	}
	timer := time.NewTimer(t.ping)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-gone:
			return nil
		case _, ok := <-status:
			if ok {
				return errConnLost
			}
			return nil
		case <-timer.C:
		}
		now := time.Now()
		heard := time.Unix(0, l.lastHeard.Load())
		if now.Sub(heard) >= t.timeout {
			return errPeerSilent
		}
		sent := time.Unix(0, l.lastSent.Load())
		if now.Sub(sent) >= t.ping {
			if err := l.control(&protocol.Control{Type: protocol.ControlPing}); err != nil {
				return fmt.Errorf("ping: %w", err)
			}
			sent = now
		}
		next := sent.Add(t.ping)
		if d := heard.Add(t.timeout); d.Before(next) {
			next = d
		}
		timer.Reset(max(time.Until(next), time.Millisecond))
	}
}

// signal wakes the one waiter of ch (a channel of capacity 1).
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// nodeStream is the host's side of a stream: it relays a host.Stream's
// output within the gateway's credit, and the gateway's input to it.
type nodeStream struct {
	srv    *Server
	id     string
	st     host.Stream
	link   *link
	sub    atomic.Pointer[nats.Subscription]
	window int64 // output credit at most
	timing streamTiming
	ctx    context.Context
	cancel context.CancelCauseFunc

	mu       sync.Mutex
	credit   int64         // output cost that may still be sent
	creditCh chan struct{} // credit grew
	in       []protocol.Frame
	inCtl    int           // control frames in in
	inCh     chan struct{} // in grew
	inCredit inbound       // the gateway's input credit

	endOnce     sync.Once
	sent        atomic.Int64 // output data bytes sent
	maxInflight atomic.Int64 // the most output cost in flight at any time
}

// inputWindow is the input a node lets a gateway have in flight.
const inputWindow = DefaultStreamWindow

// inbound is the receiving side of one direction's credit: the peer may
// have at most window (in frame costs) arrived and not yet used, and is
// granted more each time a quarter of the window was used. The gateway
// keeps one for a node's output, the node one for the gateway's input.
// Its owner's lock guards it.
type inbound struct {
	window   int64
	received int64 // cost of the frames that arrived
	used     int64 // cost of the frames handed on
	granted  int64 // cost granted back (the initial window aside)
}

// arrive counts a frame of cost and reports whether it was within the
// credit.
func (w *inbound) arrive(cost int64) bool {
	w.received += cost
	return w.received-w.granted <= w.window
}

// use counts a frame of cost handed on and returns the credit to grant
// the peer now (0: none yet).
func (w *inbound) use(cost int64) int64 {
	w.used += cost
	g := w.used - w.granted
	if g < w.window/4 {
		return 0
	}
	w.granted = w.used
	return g
}

// handleAttach opens a stream of a session of the host (host.Streamer)
// and answers with its started Control, whose Credit is the gateway's
// input credit.
func (s *Server) handleAttach(ctx context.Context, req micro.Request) ([]byte, error) {
	var w attachWire
	if err := DecodeStrict("attach", req.Data(), &w); err != nil {
		return nil, err
	}
	streamer, ok := s.cfg.Host.(host.Streamer)
	if !ok {
		return nil, protocol.Errorf(protocol.ErrInvalidRequest, "%s does not serve streams", s.cfg.Name)
	}
	if err := protocol.ValidateStreamID(w.Stream); err != nil {
		return nil, err
	}
	if w.StreamID != "" && w.StreamID != w.Stream {
		return nil, protocol.Errorf(protocol.ErrInvalidRequest, "attach: stream %q claims stream id %q: they must be the same", w.Stream, w.StreamID)
	}
	if w.Window < minStreamWindow || w.Window > maxStreamWindow {
		return nil, protocol.Errorf(protocol.ErrInvalidRequest, "attach: window must be %d to %d bytes", minStreamWindow, maxStreamWindow)
	}
	group, ok := strings.CutSuffix(req.Subject(), "."+protocol.NodeEndpointAttach)
	if !ok {
		return nil, protocol.Errorf(protocol.ErrInternal, "attach: request on unexpected subject %q", req.Subject())
	}
	s.mu.Lock()
	nc, dup := s.nc, s.streams[w.Stream] != nil
	s.mu.Unlock()
	if dup {
		return nil, protocol.Errorf(protocol.ErrConflict, "stream %s is already open", w.Stream)
	}
	st, err := streamer.Attach(ctx, w.AttachRequest)
	if err != nil {
		return nil, err
	}
	in, out := streamSubjects(group, w.Stream)
	n := &nodeStream{
		srv: s, id: w.Stream, st: st, link: newLink(nc, out), window: w.Window, inCredit: inbound{window: inputWindow},
		timing: s.timing, credit: w.Window, creditCh: make(chan struct{}, 1), inCh: make(chan struct{}, 1),
	}
	n.ctx, n.cancel = context.WithCancelCause(context.Background())
	sub, err := nc.Subscribe(in, n.onInput)
	if err != nil {
		n.cancel(err)
		_ = st.Close()
		return nil, protocol.Errorf(protocol.ErrInternal, "attach: subscribe to the stream's input: %v", err)
	}
	n.sub.Store(sub)
	s.mu.Lock()
	switch {
	case s.closing:
		err = &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true, Message: s.cfg.Name + " is shutting down"}
	case s.streams[w.Stream] != nil:
		err = protocol.Errorf(protocol.ErrConflict, "stream %s is already open", w.Stream)
	default:
		if s.streams == nil {
			s.streams = make(map[string]*nodeStream)
		}
		s.streams[w.Stream] = n
		s.wg.Add(3)
	}
	s.mu.Unlock()
	if err != nil {
		n.cancel(err)
		_ = sub.Unsubscribe()
		_ = st.Close()
		return nil, err
	}
	go func() {
		defer s.wg.Done()
		n.pump()
	}()
	go func() {
		defer s.wg.Done()
		n.input()
	}()
	go func() {
		defer s.wg.Done()
		n.keepAlive()
	}()
	started := st.Started()
	started.Credit = n.inCredit.window
	s.log.Debug("stream opened", "stream", n.id, "session", started.SessionID, "writer", started.Writer)
	return json.Marshal(&started)
}

// closeStreams ends every open stream (Close).
func (s *Server) closeStreams() {
	s.mu.Lock()
	streams := make([]*nodeStream, 0, len(s.streams))
	for _, n := range s.streams {
		streams = append(streams, n)
	}
	s.mu.Unlock()
	for _, n := range streams {
		n.end(fmt.Errorf("%s is shutting down", s.cfg.Name), true)
	}
}

// streamStats reports, for tests, a stream's output data bytes sent and
// the most output cost it had in flight.
func (s *Server) streamStats(id string) (sent, maxInflight int64, ok bool) {
	s.mu.Lock()
	n := s.streams[id]
	s.mu.Unlock()
	if n == nil {
		return 0, 0, false
	}
	return n.sent.Load(), n.maxInflight.Load(), true
}

// end ends the stream once: the host's stream is closed (a session
// started to be killed on detach is killed) and, with tell and a cause,
// the gateway hears why.
func (n *nodeStream) end(cause error, tell bool) {
	n.endOnce.Do(func() {
		n.cancel(cause)
		if sub := n.sub.Load(); sub != nil {
			_ = sub.Unsubscribe()
		}
		if tell && cause != nil {
			c := &protocol.Control{Type: protocol.ControlError, Error: cause.Error()}
			if errors.Is(cause, session.ErrSlowReader) {
				c.Reason = reasonSlowReader
			}
			_ = n.link.control(c)
		}
		_ = n.st.Close()
		n.srv.mu.Lock()
		if n.srv.streams[n.id] == n {
			delete(n.srv.streams, n.id)
		}
		n.srv.mu.Unlock()
		switch {
		case tell && cause != nil:
			n.srv.log.Info("stream ended", "stream", n.id, "session", n.st.Started().SessionID, "reason", cause)
		case cause != nil:
			n.srv.log.Debug("stream ended", "stream", n.id, "session", n.st.Started().SessionID, "reason", cause)
		}
	})
}

// pump relays the host stream's output within the credit, then its exit.
func (n *nodeStream) pump() {
	for {
		f, err := n.st.Recv(n.ctx)
		if n.ctx.Err() != nil {
			return
		}
		if err != nil {
			n.end(err, true)
			return
		}
		if f.Kind != protocol.FrameControl {
			for d := f.Data; len(d) > 0; {
				k, err := n.takeCredit(min(len(d), n.link.maxData))
				if err != nil {
					return // ended
				}
				if err := n.link.publish(protocol.Frame{Kind: f.Kind, Data: d[:k]}); err != nil {
					n.end(fmt.Errorf("send output: %w", err), false)
					return
				}
				n.sent.Add(int64(k))
				d = d[k:]
			}
			continue
		}
		if err := n.link.publish(f); err != nil {
			n.end(fmt.Errorf("send %s: %w", f.Control.Type, err), false)
			return
		}
		if f.Control.Type == protocol.ControlExit {
			n.end(nil, false)
			return
		}
	}
}

// takeCredit waits for credit and takes it for up to want bytes of one
// frame; it says how many.
func (n *nodeStream) takeCredit(want int) (int, error) {
	for {
		n.mu.Lock()
		if avail := n.credit - frameCost; avail > 0 {
			k := min(int64(want), avail)
			n.credit -= k + frameCost
			inflight := n.window - n.credit
			n.mu.Unlock()
			if inflight > n.maxInflight.Load() {
				n.maxInflight.Store(inflight) // pump goroutine only
			}
			return int(k), nil
		}
		n.mu.Unlock()
		select {
		case <-n.creditCh:
		case <-n.ctx.Done():
			return 0, context.Cause(n.ctx)
		}
	}
}

// onInput takes a frame of the gateway (the subscription's goroutine):
// credit and pings at once, input for the input goroutine.
func (n *nodeStream) onInput(m *nats.Msg) {
	if n.ctx.Err() != nil {
		return
	}
	f, err := n.link.receive(m)
	if err != nil {
		n.end(fmt.Errorf("stream %s: bad input from the gateway: %w", n.id, err), true)
		return
	}
	if f.Kind == protocol.FrameStdin {
		cost := dataCost(f)
		n.mu.Lock()
		over := !n.inCredit.arrive(cost)
		if !over {
			n.in = append(n.in, f)
		}
		n.mu.Unlock()
		if over {
			n.end(fmt.Errorf("stream %s: the gateway sent more input than its credit", n.id), true)
			return
		}
		signal(n.inCh)
		return
	}
	if f.Kind != protocol.FrameControl {
		n.end(fmt.Errorf("stream %s: a gateway does not send frames of kind %d", n.id, f.Kind), true)
		return
	}
	switch c := f.Control; c.Type {
	case protocol.ControlPing:
	case protocol.ControlCredit:
		n.mu.Lock()
		n.credit += c.Credit
		over := c.Credit <= 0 || n.credit > n.window
		n.mu.Unlock()
		if over {
			n.end(fmt.Errorf("stream %s: the gateway granted credit beyond the window", n.id), true)
			return
		}
		signal(n.creditCh)
	case protocol.ControlError:
		n.end(fmt.Errorf("the gateway detached: %s", c.Error), false)
	case protocol.ControlEOF, protocol.ControlResize, protocol.ControlSignal:
		n.mu.Lock()
		over := n.inCtl >= maxQueuedControls
		if !over {
			n.in = append(n.in, f)
			n.inCtl++
		}
		n.mu.Unlock()
		if over {
			n.end(fmt.Errorf("stream %s: more than %d control frames wait behind input the program does not read", n.id, maxQueuedControls), true)
			return
		}
		signal(n.inCh)
	default:
		n.end(fmt.Errorf("stream %s: a gateway does not send %q frames", n.id, c.Type), true)
	}
}

// input hands the gateway's input to the host's stream in order, grants
// input credit as it goes and reports refused frames.
func (n *nodeStream) input() {
	for {
		n.mu.Lock()
		if len(n.in) == 0 {
			n.mu.Unlock()
			select {
			case <-n.inCh:
				continue
			case <-n.ctx.Done():
				return
			}
		}
		f := n.in[0]
		n.in[0] = protocol.Frame{}
		n.in = n.in[1:]
		if f.Kind == protocol.FrameControl {
			n.inCtl--
		}
		n.mu.Unlock()
		err := n.st.Send(n.ctx, f)
		if n.ctx.Err() != nil {
			return
		}
		if err != nil {
			if perr := n.link.control(&protocol.Control{Type: protocol.ControlError, Error: err.Error(), Reason: reasonRefused}); perr != nil {
				n.end(fmt.Errorf("send refusal: %w", perr), false)
				return
			}
		}
		if c := dataCost(f); c > 0 {
			n.mu.Lock()
			g := n.inCredit.use(c)
			n.mu.Unlock()
			if g > 0 {
				if err := n.link.control(&protocol.Control{Type: protocol.ControlCredit, Credit: g}); err != nil {
					n.end(fmt.Errorf("send credit: %w", err), false)
					return
				}
			}
		}
	}
}

// keepAlive pings the gateway and ends the stream when it goes silent or
// the connection drops.
func (n *nodeStream) keepAlive() {
	switch err := n.link.keepAlive(n.ctx, n.timing, nil); {
	case err == nil:
	case errors.Is(err, errPeerSilent):
		n.end(fmt.Errorf("the gateway stopped answering (nothing heard for %s)", n.timing.timeout), true)
	case errors.Is(err, errConnLost):
		n.end(fmt.Errorf("%s lost its NATS connection", n.srv.cfg.Name), true)
	default:
		n.end(err, false)
	}
}
