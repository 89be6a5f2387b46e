package bus

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/nats-io/nats.go"
)

// errReplyOverflow: more reply parts arrived for one request than flow
// control lets be in flight (a responder that ignores the acknowledgements).
var errReplyOverflow = errors.New("bus: too many reply parts in flight")

// Requester sends requests on one connection and reads their replies
// (single messages or RespondChunked parts) through one subscription to a
// wildcard inbox and one status listener, shared by every request, as
// nats.go's own Request does: RequestChunked's subscription, status
// listener and goroutine per request cost a SUB and an UNSUB on the
// server and the connection's lock several times per call, which a busy
// gateway pays on every call to a node. Its replies and errors are
// RequestChunked's. The zero value is not usable; make one with
// NewRequester and Close it when the connection is no longer used.
type Requester struct {
	nc *nats.Conn

	mu      sync.Mutex
	prefix  string // the wildcard inbox without its last token, ending in "."
	sub     *nats.Subscription
	status  chan nats.Status
	pending map[string]*pendingReply
	next    uint64
	closed  bool
}

// pendingReply is one request waiting for its reply parts.
type pendingReply struct {
	ch   chan *nats.Msg
	fail chan struct{} // closed with err set: the wait is over
	err  error
	once sync.Once
}

func (p *pendingReply) abort(err error) {
	p.once.Do(func() {
		p.err = err
		close(p.fail)
	})
}

// NewRequester returns a Requester for nc. Its subscription is made on
// the first request (and again after a failed attempt).
func NewRequester(nc *nats.Conn) *Requester {
	return &Requester{nc: nc, pending: map[string]*pendingReply{}}
}

// Close ends the shared subscription and fails the requests still waiting
// with ErrConnectionLost. Later requests fail at once.
func (q *Requester) Close() {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return
	}
	q.closed = true
	sub, status := q.sub, q.status
	q.sub, q.status = nil, nil
	pending := q.pending
	q.pending = map[string]*pendingReply{}
	q.mu.Unlock()
	for _, p := range pending {
		p.abort(ErrConnectionLost)
	}
	if status != nil {
		q.nc.RemoveStatusListener(status)
	}
	if sub != nil {
		_ = sub.Unsubscribe() // best effort: the connection may be gone
	}
}

// start makes the shared subscription and status listener. q.mu is held.
func (q *Requester) start() error {
	// Registered before the subscription, so that a drop after it is seen.
	status := q.nc.StatusChanged(nats.DISCONNECTED, nats.RECONNECTING, nats.CLOSED)
	prefix := q.nc.NewInbox() + "."
	sub, err := q.nc.Subscribe(prefix+"*", q.deliver)
	if err != nil {
		q.nc.RemoveStatusListener(status)
		return err
	}
	if err := SetPendingLimits(sub); err != nil {
		_ = sub.Unsubscribe()
		q.nc.RemoveStatusListener(status)
		return err
	}
	q.prefix, q.sub, q.status = prefix, sub, status
	go q.watch(status)
	return nil
}

// watch fails every waiting request when the connection drops: a reply
// cannot cross the outage, and the request may have been acted upon.
// It ends when the listener is removed (Close) or the connection closed.
func (q *Requester) watch(status chan nats.Status) {
	for st := range status {
		q.mu.Lock()
		pending := q.pending
		q.pending = map[string]*pendingReply{}
		q.mu.Unlock()
		for _, p := range pending {
			p.abort(ErrConnectionLost)
		}
		if st == nats.CLOSED {
			return
		}
	}
}

// deliver hands one reply part to its request. It never blocks: a
// request's channel holds what flow control lets be in flight.
func (q *Requester) deliver(m *nats.Msg) {
	q.mu.Lock()
	if len(m.Subject) <= len(q.prefix) {
		q.mu.Unlock()
		return
	}
	p := q.pending[m.Subject[len(q.prefix):]]
	q.mu.Unlock()
	if p == nil {
		return // a late part of a request that ended
	}
	select {
	case p.ch <- m:
	default:
		p.abort(errReplyOverflow)
	}
}

// register adds a waiting request and returns its inbox and token.
func (q *Requester) register() (*pendingReply, string, string, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil, "", "", ErrConnectionLost
	}
	if q.sub == nil || !q.sub.IsValid() {
		if q.sub != nil {
			q.nc.RemoveStatusListener(q.status)
			q.sub, q.status = nil, nil
		}
		if err := q.start(); err != nil {
			return nil, "", "", err
		}
	}
	q.next++
	token := strconv.FormatUint(q.next, 36)
	p := &pendingReply{ch: make(chan *nats.Msg, replyBuffer(q.nc)), fail: make(chan struct{})}
	q.pending[token] = p
	return p, q.prefix + token, token, nil
}

func (q *Requester) unregister(token string, p *pendingReply) {
	q.mu.Lock()
	if q.pending[token] == p {
		delete(q.pending, token)
	}
	q.mu.Unlock()
}

// Request sends data (with hdr) to subject and returns the reply,
// reassembled when it came in parts, as RequestChunked does.
func (q *Requester) Request(ctx context.Context, subject string, data []byte, hdr nats.Header) (*nats.Msg, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("bus: request %s: %w", subject, err)
	}
	p, inbox, token, err := q.register()
	if err != nil {
		return nil, fmt.Errorf("bus: request %s: %w", subject, err)
	}
	defer q.unregister(token, p)
	// Checked after the request is registered: a drop after the check
	// reaches it through watch.
	if !q.nc.IsConnected() {
		return nil, fmt.Errorf("bus: request %s: %w", subject, ErrConnectionLost)
	}
	if err := q.nc.PublishMsg(&nats.Msg{Subject: subject, Reply: inbox, Data: data, Header: hdr}); err != nil {
		return nil, fmt.Errorf("bus: request %s: %w", subject, err)
	}
	return receive(ctx, q.nc, subject, inbox, p.ch, p.fail, func() error { return p.err })
}
