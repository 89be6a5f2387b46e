package bus

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// HeaderChunk marks one part of a chunked reply: "i/n", 1 ≤ i ≤ n, parts
// numbered from 1. Every part of a RespondChunked reply of several parts
// carries it; a reply that fits in one message goes out plain, without
// it (a header costs both ends a MIME parse per reply, and a requester
// takes a message without it as the whole reply). nats.Header does not
// canonicalise keys: use this exact spelling.
const HeaderChunk = "Execmesh-Chunk"

// Chunking limits.
const (
	// DefaultMaxPayload is what ChunkSize assumes before the connection
	// has learnt the server's limit: the NATS default.
	DefaultMaxPayload = 1 << 20
	// MinChunkSize is the smallest part ChunkSize returns.
	MinChunkSize = 1 << 10
	// maxChunkHeadroom is kept free in every message for headers.
	maxChunkHeadroom = 8 << 10
	// MaxChunks bounds the number of parts a requester accepts, so a
	// corrupt header cannot make it allocate without limit.
	MaxChunks = 1 << 16
	// FlowWindow is the amount of reply data RespondChunked sends between
	// flow-control acknowledgements (see RespondChunked).
	FlowWindow = 8 << 20
	// FlowAckTimeout is how long RespondChunked waits for an
	// acknowledgement before giving up on a requester.
	FlowAckTimeout = 30 * time.Second
)

// Errors of the request helpers.
var (
	// ErrUnreachable: nobody subscribes to the subject (NATS "no
	// responders"). From RequestChunked: the node is not connected;
	// nothing was delivered, so the call may be retried. From
	// RespondChunked: the requester has gone.
	ErrUnreachable = errors.New("bus: no responders, target unreachable")
	// ErrConnectionLost: from RequestChunked, the connection to NATS
	// dropped (or was not up) while the reply was awaited. The request may
	// have been delivered and acted upon; nats.go would otherwise hold the
	// caller until its deadline, since a reply cannot cross the outage.
	ErrConnectionLost = errors.New("bus: connection to NATS lost while waiting for the reply")
	// ErrBadChunk: a reply part carried a malformed or inconsistent
	// HeaderChunk.
	ErrBadChunk = errors.New("bus: bad chunk header")
	// ErrFlowStalled: the requester of a chunked reply stopped
	// acknowledging windows.
	ErrFlowStalled = errors.New("bus: chunked reply stalled: no acknowledgement from the requester")
)

// ChunkSize returns the largest payload to put in one message on nc: the
// server's max_payload minus headroom for headers (8 KiB, or a quarter of
// a small max_payload), at least MinChunkSize. Code that splits output
// itself before encoding it should stay below this too.
func ChunkSize(nc *nats.Conn) int {
	mp := DefaultMaxPayload
	if nc != nil {
		if v := nc.MaxPayload(); v > 0 {
			mp = int(v)
		}
	}
	headroom := min(maxChunkHeadroom, mp/4)
	return max(mp-headroom, MinChunkSize)
}

// RespondChunked sends payload to reply (msg.Reply, or micro's
// req.Reply()) in parts that fit under the server's max_payload, each
// marked with HeaderChunk. hdr goes on the first part only. A payload
// that fits in one message is sent as it is, with hdr alone.
//
// Flow control: parts go out in windows of about FlowWindow bytes. When a
// reply needs more than one window, the last part of each window carries a
// reply subject of the responder's and RequestChunked acknowledges it with
// an empty message; the responder keeps at most two windows
// unacknowledged. So however large the reply, neither side buffers more
// than two windows, and the server never sees the requester as a slow
// consumer (it would disconnect it past max_pending, 64 MB). The
// acknowledgement is a reply to a message the requester received, so a
// confined node's allow_responses covers it. A reply of one window (8 MB
// under the default max_payload) goes out without waiting.
//
// RespondChunked fails with ErrUnreachable when the requester has gone
// (the acknowledgement request finds no subscriber), and with
// ErrFlowStalled when no acknowledgement came for FlowAckTimeout. Large
// replies take a while: a micro handler should not call this itself but
// hand it to a goroutine (each endpoint runs one handler at a time).
func RespondChunked(nc *nats.Conn, reply string, payload []byte, hdr nats.Header) error {
	return respondChunked(nc, reply, payload, hdr, FlowWindow, FlowAckTimeout)
}

// respondChunked is RespondChunked with the flow-control window (bytes)
// and acknowledgement timeout as parameters, for tests.
func respondChunked(nc *nats.Conn, reply string, payload []byte, hdr nats.Header, windowBytes int, ackTimeout time.Duration) error {
	if reply == "" {
		return errors.New("bus: respond: request has no reply subject")
	}
	size := ChunkSize(nc) - headerSize(hdr)
	if size < MinChunkSize {
		return fmt.Errorf("bus: respond: headers of %d bytes leave no room for data", headerSize(hdr))
	}
	n := max((len(payload)+size-1)/size, 1)
	if n > MaxChunks {
		return fmt.Errorf("bus: respond: payload of %d bytes needs %d parts, more than %d", len(payload), n, MaxChunks)
	}
	if n == 1 {
		// One message: plain, as a nats.go Respond (a nil Header sends
		// no header block at all).
		m := &nats.Msg{Subject: reply, Data: payload}
		if len(hdr) > 0 {
			m.Header = hdr
		}
		if err := nc.PublishMsg(m); err != nil {
			return fmt.Errorf("bus: respond: %w", err)
		}
		return nil
	}
	window := max(windowBytes/size, 1)

	var acks *nats.Subscription
	if n > window {
		var err error
		acks, err = nc.SubscribeSync(nc.NewInbox())
		if err != nil {
			return fmt.Errorf("bus: respond: %w", err)
		}
		defer acks.Unsubscribe() //nolint:errcheck // best effort; the inbox is unique
	}
	outstanding := 0 // windows sent but not acknowledged
	for i := 1; i <= n; i++ {
		lo, hi := (i-1)*size, min(i*size, len(payload))
		m := &nats.Msg{Subject: reply, Data: payload[lo:hi], Header: nats.Header{}}
		if i == 1 {
			for k, v := range hdr {
				m.Header[k] = append([]string(nil), v...)
			}
		}
		m.Header.Set(HeaderChunk, strconv.Itoa(i)+"/"+strconv.Itoa(n))
		closesWindow := acks != nil && i%window == 0 && i < n
		if closesWindow {
			m.Reply = acks.Subject
		}
		if err := nc.PublishMsg(m); err != nil {
			return fmt.Errorf("bus: respond part %d/%d: %w", i, n, err)
		}
		if !closesWindow {
			continue
		}
		for outstanding++; outstanding >= 2; outstanding-- {
			if err := waitAck(acks, ackTimeout); err != nil {
				return fmt.Errorf("bus: respond part %d/%d: %w", i, n, err)
			}
		}
	}
	return nil
}

// waitAck waits for one flow-control acknowledgement.
func waitAck(acks *nats.Subscription, timeout time.Duration) error {
	m, err := acks.NextMsg(timeout)
	switch {
	case errors.Is(err, nats.ErrTimeout):
		return ErrFlowStalled
	case errors.Is(err, nats.ErrNoResponders):
		return ErrUnreachable
	case err != nil:
		return err
	case len(m.Data) == 0 && m.Header.Get("Status") == "503":
		return ErrUnreachable
	}
	return nil
}

// headerSize estimates the encoded size of hdr ("Key: value\r\n" lines plus
// the version line and the HeaderChunk line RespondChunked adds).
func headerSize(hdr nats.Header) int {
	n := len("NATS/1.0\r\n\r\n") + len(HeaderChunk) + len(": 65536/65536\r\n")
	for k, vs := range hdr {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}

// RequestChunked sends data (with hdr) to subject and returns the reply,
// reassembled when the responder used RespondChunked; a plain one-message
// reply is returned as is. It subscribes to its own inbox with the bus
// pending limits, acknowledges flow-control windows, tolerates parts
// arriving out of order and waits until ctx ends. The result's Header is the first part's, without HeaderChunk.
//
// Errors: ErrUnreachable when no one subscribes to subject; an error
// wrapping ctx.Err() when the reply did not complete in time, or
// ErrConnectionLost when the connection dropped before it did (either
// way the request may have been delivered: do not retry blindly);
// nats.ErrMaxPayload when the request itself is too large.
func RequestChunked(ctx context.Context, nc *nats.Conn, subject string, data []byte, hdr nats.Header) (*nats.Msg, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("bus: request %s: %w", subject, err)
	}
	// Registered before the connection is checked, so that a drop after
	// the check is seen.
	status := nc.StatusChanged(nats.DISCONNECTED, nats.RECONNECTING, nats.CLOSED)
	defer nc.RemoveStatusListener(status)
	if !nc.IsConnected() {
		return nil, fmt.Errorf("bus: request %s: %w", subject, ErrConnectionLost)
	}
	lost, done := make(chan struct{}), make(chan struct{})
	defer close(done)
	go func() {
		select {
		case _, ok := <-status:
			if ok {
				close(lost)
			}
		case <-done:
		}
	}()

	// A channel subscription sized for what flow control lets be in
	// flight: SubscribeSync would allocate a channel of the connection's
	// SubChanLen (64 Ki messages, 512 KiB) per request, which cost more
	// than the rest of a request.
	inbox := nc.NewInbox()
	ch := make(chan *nats.Msg, replyBuffer(nc))
	sub, err := nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return nil, fmt.Errorf("bus: request %s: %w", subject, err)
	}
	defer sub.Unsubscribe() //nolint:errcheck // best effort; the inbox is unique
	req := &nats.Msg{Subject: subject, Reply: inbox, Data: data, Header: hdr}
	if err := nc.PublishMsg(req); err != nil {
		return nil, fmt.Errorf("bus: request %s: %w", subject, err)
	}
	return receive(ctx, nc, subject, inbox, ch, lost, func() error { return ErrConnectionLost })
}

// receive reads the reply parts of a request sent with reply subject
// inbox from ch until the reply is complete, acknowledging parts for
// RespondChunked's flow control. It gives up when ctx ends or fail is
// closed, with why() as the cause.
func receive(ctx context.Context, nc *nats.Conn, subject, inbox string, ch <-chan *nats.Msg, fail <-chan struct{}, why func() error) (*nats.Msg, error) {
	var asm assembler
	for {
		var m *nats.Msg
		select {
		case m = <-ch:
		case <-fail:
			return nil, fmt.Errorf("bus: request %s: %w (%d of %d parts)", subject, why(), asm.got, asm.n)
		case <-ctx.Done():
			return nil, fmt.Errorf("bus: request %s: %w (%d of %d parts)", subject, ctx.Err(), asm.got, asm.n)
		}
		if m == nil {
			return nil, fmt.Errorf("bus: request %s: %w", subject, ErrConnectionLost)
		}
		if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
			// No responders: the server's status message.
			return nil, fmt.Errorf("bus: request %s: %w: %w", subject, ErrUnreachable, nats.ErrNoResponders)
		}
		done, err := asm.add(m)
		if err != nil {
			return nil, fmt.Errorf("bus: request %s: %w", subject, err)
		}
		if m.Reply != "" && m.Header.Get(HeaderChunk) != "" {
			// The responder waits for this before sending more than
			// two windows (flow control, see RespondChunked).
			if err := nc.Publish(m.Reply, nil); err != nil {
				return nil, fmt.Errorf("bus: request %s: acknowledge part: %w", subject, err)
			}
		}
		if done {
			return asm.msg(inbox), nil
		}
	}
}

// replyBuffer is the number of reply parts RequestChunked buffers: what
// RespondChunked's flow control keeps unacknowledged (two windows) and
// the parts after the last acknowledgement, with room to spare.
func replyBuffer(nc *nats.Conn) int {
	window := max(FlowWindow/ChunkSize(nc), 1)
	return 2*window + 8
}

// assembler collects the parts of one chunked reply.
type assembler struct {
	n     int
	got   int
	size  int
	parts [][]byte
	hdr   nats.Header
	plain *nats.Msg // a reply without HeaderChunk
}

// add records m and reports whether the reply is complete.
func (a *assembler) add(m *nats.Msg) (bool, error) {
	v := m.Header.Get(HeaderChunk)
	if v == "" {
		if a.n != 0 {
			return false, fmt.Errorf("%w: part without header after %d parts", ErrBadChunk, a.got)
		}
		a.plain = m
		return true, nil
	}
	i, n, err := parseChunk(v)
	if err != nil {
		return false, err
	}
	if a.n == 0 {
		a.n = n
		a.parts = make([][]byte, n)
	} else if n != a.n {
		return false, fmt.Errorf("%w: %q after parts of %d", ErrBadChunk, v, a.n)
	}
	if a.parts[i-1] != nil {
		return false, nil // a repeat; keep the first copy
	}
	if m.Data == nil {
		m.Data = []byte{} // mark empty parts as present
	}
	a.parts[i-1] = m.Data
	a.got++
	a.size += len(m.Data)
	if i == 1 {
		a.hdr = m.Header
	}
	return a.got == a.n, nil
}

func (a *assembler) msg(inbox string) *nats.Msg {
	if a.plain != nil {
		return a.plain
	}
	out := &nats.Msg{Subject: inbox, Header: nats.Header{}}
	for k, v := range a.hdr {
		if k != HeaderChunk {
			out.Header[k] = v
		}
	}
	if a.n == 1 {
		out.Data = a.parts[0]
		return out
	}
	out.Data = joinParts(a.parts, a.size)
	return out
}

// joinParts returns the parts, of size bytes in all, as one slice in
// memory that is not cleared first (a list's reply is megabytes, every
// byte of which is then written): strings.Builder allocates so.
func joinParts(parts [][]byte, size int) []byte {
	if size == 0 {
		return []byte{}
	}
	var b strings.Builder
	b.Grow(size)
	for _, p := range parts {
		b.Write(p)
	}
	s := b.String() // not used as a string: its bytes are the slice's alone
	return unsafe.Slice(unsafe.StringData(s), len(s))
}

func parseChunk(v string) (i, n int, err error) {
	is, ns, ok := strings.Cut(v, "/")
	if ok {
		i, err = strconv.Atoi(is)
		if err == nil {
			n, err = strconv.Atoi(ns)
		}
	}
	if !ok || err != nil || n < 1 || n > MaxChunks || i < 1 || i > n {
		return 0, 0, fmt.Errorf("%w: %q", ErrBadChunk, v)
	}
	return i, n, nil
}

// ServiceError is a micro error reply (req.Error): the
// Nats-Service-Error-Code and Nats-Service-Error headers.
type ServiceError struct {
	Code        string
	Description string
	Data        []byte
}

// Error reports the code and description.
func (e *ServiceError) Error() string {
	return "bus: service error " + e.Code + ": " + e.Description
}

// ReplyError returns a *ServiceError when m is a micro error reply, and nil
// otherwise.
func ReplyError(m *nats.Msg) error {
	if m == nil || m.Header == nil {
		return nil
	}
	code, desc := m.Header.Get(micro.ErrorCodeHeader), m.Header.Get(micro.ErrorHeader)
	if code == "" && desc == "" {
		return nil
	}
	return &ServiceError{Code: code, Description: desc, Data: m.Data}
}
