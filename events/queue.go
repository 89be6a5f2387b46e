// Package events holds the system-event queues: one JetStream stream with
// a subject per sessionKey, so that every gateway of a deployment shares
// them and an event survives any one process. An event is removed only
// when its consumer confirmed it:
//
//   - a long poll (Take) confirms the previous answer when the same
//     sessionKey asks again, or exactly what its `ack` says;
//   - a live stream (Stream) carries event ids, and resumes after the id
//     a client gives (Last-Event-ID), which confirms what came before;
//   - Follow, for consumers that know each delivery succeeded (an MCP
//     session writing to an open stream), confirms each event once sent.
//
// Events are deduplicated by an id the producer derives from what happened
// (for an exit: sessionKey, session id and the run of the host), never by
// session id alone. A queue holds at most MaxPerKey events; what does not
// fit is counted, and the next reader gets an events.dropped event saying
// how many.
package events

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/internal/ratelog"
	"github.com/execmesh/execmesh/protocol"
)

// KindDropped is the kind of the event that announces an overflow.
const KindDropped = "events.dropped"

// Header names of stored events.
const (
	headerContext = "Execmesh-Context"
	opTimeout     = 5 * time.Second
)

// Options configure a Queue. Conn and JS are required.
type Options struct {
	Logger   *slog.Logger
	Conn     *nats.Conn
	JS       jetstream.JetStream
	Prefix   string
	Replicas int
	// MaxPerKey bounds each sessionKey's queue (events.maxQueued);
	// default bus.DefaultMaxEventsPerKey.
	MaxPerKey int
	// MaxAge is how long an unread event is kept; default
	// bus.DefaultEventMaxAge.
	MaxAge time.Duration
	Now    func() time.Time
}

// Queue is the set of event queues. Its methods are safe for concurrent
// use. Build it with New.
type Queue struct {
	opts  Options
	log   *slog.Logger
	subj  protocol.SubjectSet
	names bus.StreamNames

	mu      sync.Mutex
	stream  jetstream.Stream
	cursors jetstream.KeyValue

	// failure is the last storage error, nil once an operation succeeds:
	// /healthz reports it.
	failure atomic.Pointer[error]
	// rare logs what can repeat for every event (a full queue drops
	// each event pushed to it) once per interval per sessionKey.
	rare *ratelog.Limiter
}

// logEvery bounds the lines of a repeating condition: at most one per
// sessionKey and condition in this time, with the count it stands for.
const logEvery = 10 * time.Second

// New returns a Queue; the stream and the cursor bucket are created (or
// updated to the options) on first use, and again if they are lost.
func New(opts Options) (*Queue, error) {
	if opts.Conn == nil || opts.JS == nil {
		return nil, errors.New("events: Conn and JS are required")
	}
	if opts.Prefix == "" {
		opts.Prefix = protocol.DefaultSubjectPrefix
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.MaxPerKey <= 0 {
		opts.MaxPerKey = bus.DefaultMaxEventsPerKey
	}
	if opts.MaxAge <= 0 {
		opts.MaxAge = bus.DefaultEventMaxAge
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	log := opts.Logger.With("component", "events")
	return &Queue{opts: opts, log: log, rare: ratelog.New(log, logEvery), subj: protocol.Subjects(opts.Prefix), names: bus.StreamNamesFor(opts.Prefix)}, nil
}

// Healthy returns the last storage failure, or nil.
func (q *Queue) Healthy() error {
	if p := q.failure.Load(); p != nil {
		return *p
	}
	return nil
}

func (q *Queue) note(err error) error {
	if err == nil {
		q.failure.Store(nil)
		return nil
	}
	if errors.Is(err, context.Canceled) {
		return err
	}
	if isLost(err) {
		q.mu.Lock()
		q.stream, q.cursors = nil, nil // re-created on next use
		q.mu.Unlock()
	}
	e := fmt.Errorf("%w: %w", ErrStore, err)
	q.failure.Store(&e)
	return e
}

// ErrStore marks a failure of the event store (JetStream): the stream or
// the cursor bucket could not be read or written.
var ErrStore = errors.New("event store")

func isLost(err error) bool {
	return errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrBucketNotFound) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) || strings.Contains(err.Error(), "stream not found")
}

// assets returns the stream and the cursor bucket, creating them when
// needed.
func (q *Queue) assets(ctx context.Context) (jetstream.Stream, jetstream.KeyValue, error) {
	q.mu.Lock()
	s, kv := q.stream, q.cursors
	q.mu.Unlock()
	if s != nil && kv != nil {
		return s, kv, nil
	}
	actx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	s, err := bus.EnsureStream(actx, q.opts.JS, bus.EventStreamConfig(q.opts.Prefix, q.opts.Replicas, int64(q.opts.MaxPerKey), q.opts.MaxAge))
	if err != nil {
		return nil, nil, err
	}
	var kcfg jetstream.KeyValueConfig
	for _, c := range bus.KeyValueConfigs(q.opts.Prefix, q.opts.Replicas) {
		if c.Bucket == q.names.Cursors {
			kcfg = c
		}
	}
	// The read position decides what the next long poll confirms: it
	// is read from the leader, never from a replica that lags.
	kv, err = bus.LeaderReadKeyValue(actx, q.opts.JS, kcfg)
	if err != nil {
		return nil, nil, err
	}
	q.mu.Lock()
	q.stream, q.cursors = s, kv
	q.mu.Unlock()
	return s, kv, nil
}

// Push stores ev in its sessionKey's queue. dedupe, when set, is the
// event's identity: the same one pushed again within the stream's
// duplicate window is stored once. A full queue refuses the event and
// counts it for the events.dropped announcement; that is not an error.
// An error means the event is not stored; the caller must keep it and try
// again (and /healthz reports the failure meanwhile).
func (q *Queue) Push(ctx context.Context, ev protocol.SystemEvent, dedupe string) error {
	if ev.SessionKey == "" {
		return errors.New("events: push without a sessionKey")
	}
	s, kv, err := q.assets(ctx)
	if err != nil {
		return q.note(err)
	}
	_ = s
	ev.ID = ""
	if ev.TS == 0 {
		ev.TS = q.opts.Now().UnixMilli()
	}
	data, err := json.Marshal(ev)
	if err != nil {
		return fmt.Errorf("events: encode: %w", err)
	}
	m := nats.NewMsg(q.subj.SystemEventsFor(ev.SessionKey))
	m.Data = data
	if ev.ContextKey != "" {
		m.Header.Set(headerContext, ev.ContextKey)
	}
	var opts []jetstream.PublishOpt
	if dedupe != "" {
		opts = append(opts, jetstream.WithMsgID(dedupe))
	}
	actx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	ack, err := q.opts.JS.PublishMsg(actx, m, opts...)
	if err == nil && !ack.Duplicate {
		// Mirrored on the sessionKey's core subject, with its id, for
		// NATS subscribers (they do not confirm anything).
		ev.ID = strconv.FormatUint(ack.Sequence, 10)
		if b, merr := json.Marshal(ev); merr == nil {
			_ = q.opts.Conn.Publish(q.subj.GatewayEventsFor(ev.SessionKey), b)
		}
	}
	if isFull(err) {
		// An agent that reads no events has every further event
		// dropped: one line per interval says how many.
		q.rare.Warn(ev.SessionKey, "event queue full; events dropped and announced", "dropped",
			"sessionKey", ev.SessionKey, "kind", ev.Kind, "max", q.opts.MaxPerKey)
		return q.note(q.countDropped(ctx, kv, ev.SessionKey))
	}
	return q.note(err)
}

// isFull reports a publish refused because the subject holds its maximum.
func isFull(err error) bool {
	var apiErr *jetstream.APIError
	return err != nil && errors.As(err, &apiErr) && strings.Contains(strings.ToLower(apiErr.Description), "maximum messages per subject")
}

// cursor is a queue's read position: the last event a long poll returned
// (confirmed by the next one), and the events dropped since the last
// announcement.
type cursor struct {
	Delivered uint64 `json:"delivered,omitempty"`
	Dropped   int    `json:"dropped,omitempty"`
}

// updateCursor applies fn to the cursor of sessionKey by compare-and-set.
func (q *Queue) updateCursor(ctx context.Context, kv jetstream.KeyValue, sessionKey string, fn func(c *cursor) bool) (cursor, error) {
	key := protocol.EncodeSessionKeyToken(sessionKey)
	for attempt := 0; attempt < 20; attempt++ {
		actx, cancel := context.WithTimeout(ctx, opTimeout)
		e, err := kv.Get(actx, key)
		cancel()
		var c cursor
		var rev uint64
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return cursor{}, err
		default:
			_ = json.Unmarshal(e.Value(), &c)
			rev = e.Revision()
		}
		if !fn(&c) {
			return c, nil
		}
		b, _ := json.Marshal(c)
		actx, cancel = context.WithTimeout(ctx, opTimeout)
		if rev == 0 {
			_, err = kv.Create(actx, key, b)
		} else {
			_, err = kv.Update(actx, key, b, rev)
		}
		cancel()
		if err == nil {
			return c, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !bus.IsWrongLastSequence(err) {
			// A write that timed out may still have been applied (a
			// leader elected meanwhile). Reporting a failure then would
			// let the next poll confirm what this one never returned, so
			// only a write known not to have happened is a failure; an
			// unknown outcome counts as written (the events may come
			// twice, never not at all).
			actx, cancel = context.WithTimeout(ctx, opTimeout)
			now, gerr := kv.Get(actx, key)
			cancel()
			switch {
			case gerr != nil && !errors.Is(gerr, jetstream.ErrKeyNotFound):
				q.rare.Warn(sessionKey, "event queue position: write outcome unknown; events may be delivered again", "occurrences",
					"sessionKey", sessionKey, "err", err)
				return c, nil
			case gerr == nil && now.Revision() > rev && bytes.Equal(now.Value(), b):
				return c, nil
			}
			return cursor{}, err
		}
	}
	return cursor{}, errors.New("events: cursor contended")
}

func (q *Queue) countDropped(ctx context.Context, kv jetstream.KeyValue, sessionKey string) error {
	_, err := q.updateCursor(ctx, kv, sessionKey, func(c *cursor) bool { c.Dropped++; return true })
	return err
}

// confirm removes the events of sessionKey up to and including seq.
func (q *Queue) confirm(ctx context.Context, s jetstream.Stream, sessionKey string, seq uint64) error {
	if seq == 0 {
		return nil
	}
	actx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	return s.Purge(actx, jetstream.WithPurgeSubject(q.subj.SystemEventsFor(sessionKey)), jetstream.WithPurgeSequence(seq+1))
}

// Ack confirms the events of sessionKey up to and including the event id
// upTo (a decimal stream sequence, as events carry).
func (q *Queue) Ack(ctx context.Context, sessionKey, upTo string) error {
	seq, err := ParseID(upTo)
	if err != nil {
		return err
	}
	s, kv, err := q.assets(ctx)
	if err != nil {
		return q.note(err)
	}
	if err := q.confirm(ctx, s, sessionKey, seq); err != nil {
		return q.note(err)
	}
	_, err = q.updateCursor(ctx, kv, sessionKey, func(c *cursor) bool {
		if c.Delivered > seq {
			return false
		}
		c.Delivered = 0
		return true
	})
	return q.note(err)
}

// ParseID reads an event id; ids are decimal stream sequences.
func ParseID(id string) (uint64, error) {
	n, err := strconv.ParseUint(strings.TrimSpace(id), 10, 64)
	if err != nil {
		return 0, protocol.Errorf(protocol.ErrInvalidRequest, "invalid event id %q: event ids are numbers", id)
	}
	return n, nil
}

// read returns the events of sessionKey after seq, in order, at most max.
func (q *Queue) read(ctx context.Context, s jetstream.Stream, sessionKey string, after uint64, max int) ([]protocol.SystemEvent, error) {
	subject := q.subj.SystemEventsFor(sessionKey)
	var out []protocol.SystemEvent
	for seq := after + 1; len(out) < max; {
		actx, cancel := context.WithTimeout(ctx, opTimeout)
		m, err := s.GetMsg(actx, seq, jetstream.WithGetMsgSubject(subject))
		cancel()
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		var ev protocol.SystemEvent
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			q.log.Warn("malformed stored event skipped", "seq", m.Sequence, "err", err)
		} else {
			ev.ID = strconv.FormatUint(m.Sequence, 10)
			ev.SessionKey = sessionKey
			out = append(out, ev)
		}
		seq = m.Sequence + 1
	}
	return out, nil
}

// droppedEvent announces n events that did not fit.
func (q *Queue) droppedEvent(sessionKey string, n int, after uint64) protocol.SystemEvent {
	return protocol.SystemEvent{
		ID:         strconv.FormatUint(after, 10) + "-dropped",
		TS:         q.opts.Now().UnixMilli(),
		SessionKey: sessionKey,
		ContextKey: KindDropped,
		Kind:       KindDropped,
		Text:       fmt.Sprintf("%d system event(s) for %s were dropped: the queue holds at most %d unread events (events.maxQueued). Use process list to see what ran.", n, sessionKey, q.opts.MaxPerKey),
	}
}

// Take returns the unconfirmed events of sessionKey, waiting up to wait
// for the first one. It first confirms what the previous Take of the key
// returned, or, when ack is set, exactly the events up to that id.
//
// A store failure within the wait (a stream leader being elected after a
// server of the cluster died) is retried until the wait ends: a long poll
// answers with events or nothing, and with the error only when the store
// stayed unavailable for the whole wait.
func (q *Queue) Take(ctx context.Context, sessionKey string, wait time.Duration, ack string) ([]protocol.SystemEvent, error) {
	deadline := time.Now().Add(wait)
	backoff := 100 * time.Millisecond
	for {
		evs, err := q.take(ctx, sessionKey, time.Until(deadline), ack)
		if err == nil || !errors.Is(err, ErrStore) || ctx.Err() != nil {
			return evs, err
		}
		left := time.Until(deadline)
		if left < backoff {
			return nil, err
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

func (q *Queue) take(ctx context.Context, sessionKey string, wait time.Duration, ack string) ([]protocol.SystemEvent, error) {
	s, kv, err := q.assets(ctx)
	if err != nil {
		return nil, q.note(err)
	}
	var confirmUpTo uint64
	if ack != "" {
		if confirmUpTo, err = ParseID(strings.TrimSuffix(ack, "-dropped")); err != nil {
			return nil, err
		}
	} else {
		actx, cancel := context.WithTimeout(ctx, opTimeout)
		e, err := kv.Get(actx, protocol.EncodeSessionKeyToken(sessionKey))
		cancel()
		if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, q.note(err)
		}
		if err == nil {
			var c cursor
			_ = json.Unmarshal(e.Value(), &c)
			confirmUpTo = c.Delivered
		}
	}
	if err := q.confirm(ctx, s, sessionKey, confirmUpTo); err != nil {
		return nil, q.note(err)
	}
	// Subscribe before reading, so an event pushed in between wakes us.
	var wake chan *nats.Msg
	if wait > 0 {
		var stop func()
		if wake, stop, err = q.waker(sessionKey); err != nil {
			return nil, err
		}
		defer stop()
	}
	deadline := time.Now().Add(wait)
	for {
		evs, err := q.read(ctx, s, sessionKey, confirmUpTo, q.opts.MaxPerKey)
		if err != nil {
			return nil, q.note(err)
		}
		var last uint64
		if len(evs) > 0 {
			last, _ = ParseID(evs[len(evs)-1].ID)
		}
		var announce int
		c, err := q.updateCursor(ctx, kv, sessionKey, func(c *cursor) bool {
			announce = c.Dropped
			if len(evs) == 0 && announce == 0 && c.Delivered == 0 {
				return false
			}
			c.Delivered, c.Dropped = last, 0
			return true
		})
		if err != nil {
			return nil, q.note(err)
		}
		_ = c
		if announce > 0 {
			evs = append(evs, q.droppedEvent(sessionKey, announce, last))
		}
		if len(evs) > 0 || wake == nil {
			q.note(nil)
			if evs == nil {
				evs = []protocol.SystemEvent{}
			}
			return evs, nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			q.note(nil)
			return []protocol.SystemEvent{}, nil
		}
		t := time.NewTimer(left)
		select {
		case <-wake:
			t.Stop()
			settle(wake)
		case <-t.C:
			q.note(nil)
			return []protocol.SystemEvent{}, nil
		case <-ctx.Done():
			t.Stop()
			q.note(nil)
			return []protocol.SystemEvent{}, nil
		}
	}
}

// waker subscribes to what announces a new event of sessionKey: its
// mirror, published once the store acknowledged it (the event is readable
// then), and the stored subject itself.
func (q *Queue) waker(sessionKey string) (chan *nats.Msg, func(), error) {
	wake := make(chan *nats.Msg, 64)
	var subs []*nats.Subscription
	stop := func() {
		for _, sub := range subs {
			_ = sub.Unsubscribe()
		}
	}
	for _, subject := range []string{q.subj.GatewayEventsFor(sessionKey), q.subj.SystemEventsFor(sessionKey)} {
		sub, err := q.opts.Conn.ChanSubscribe(subject, wake)
		if err != nil {
			stop()
			return nil, nil, err
		}
		subs = append(subs, sub)
	}
	return wake, stop, nil
}

// settle lets the other wakes of one event, and a burst of events, come
// before a read, so that they make one read.
func settle(wake chan *nats.Msg) {
	time.Sleep(wakeSettle)
	for len(wake) > 0 {
		<-wake
	}
}

const (
	// wakeSettle is how long a woken reader waits before it reads.
	wakeSettle = 5 * time.Millisecond
	// followRecheck is how often a follower reads without a wake (one
	// lost with a NATS reconnection).
	followRecheck = 5 * time.Second
)

// Stream delivers the unconfirmed events of sessionKey after the event id
// after ("" for all), then every new one, to send, until ctx ends or send
// fails. Giving after confirms the events up to it: a client resumes with
// the id of the last event it handled. Nothing else is confirmed.
func (q *Queue) Stream(ctx context.Context, sessionKey, after string, send func(protocol.SystemEvent) error) error {
	return q.follow(ctx, sessionKey, after, false, send)
}

// Follow is Stream for a consumer that knows each delivery succeeded:
// every event send accepts is confirmed.
func (q *Queue) Follow(ctx context.Context, sessionKey string, send func(protocol.SystemEvent) error) error {
	return q.follow(ctx, sessionKey, "", true, send)
}

func (q *Queue) follow(ctx context.Context, sessionKey, after string, confirmSent bool, send func(protocol.SystemEvent) error) error {
	s, kv, err := q.assets(ctx)
	if err != nil {
		return q.note(err)
	}
	var pos uint64
	if after != "" {
		if pos, err = ParseID(strings.TrimSuffix(after, "-dropped")); err != nil {
			return err
		}
		if err := q.confirm(ctx, s, sessionKey, pos); err != nil {
			return q.note(err)
		}
	}
	wake, stop, err := q.waker(sessionKey)
	if err != nil {
		return err
	}
	defer stop()
	recheck := time.NewTicker(followRecheck)
	defer recheck.Stop()
	for {
		evs, err := q.read(ctx, s, sessionKey, pos, q.opts.MaxPerKey)
		if err != nil {
			return q.note(err)
		}
		var announce int
		if _, err := q.updateCursor(ctx, kv, sessionKey, func(c *cursor) bool {
			announce = c.Dropped
			if announce == 0 {
				return false
			}
			c.Dropped = 0
			return true
		}); err == nil && announce > 0 {
			evs = append(evs, q.droppedEvent(sessionKey, announce, pos))
		}
		for _, ev := range evs {
			if err := send(ev); err != nil {
				return err
			}
			if seq, err := ParseID(ev.ID); err == nil {
				pos = seq
				if confirmSent {
					if err := q.confirm(ctx, s, sessionKey, seq); err != nil {
						return q.note(err)
					}
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
			settle(wake)
		case <-recheck.C:
		}
	}
}

// Drop removes the unconfirmed events of sessionKey with this context key
// (a poll delivered the session's end: its exit notice is redundant).
func (q *Queue) Drop(ctx context.Context, sessionKey, contextKey string) error {
	s, _, err := q.assets(ctx)
	if err != nil {
		return q.note(err)
	}
	evs, err := q.read(ctx, s, sessionKey, 0, q.opts.MaxPerKey)
	if err != nil {
		return q.note(err)
	}
	for _, ev := range evs {
		if ev.ContextKey != contextKey {
			continue
		}
		seq, _ := ParseID(ev.ID)
		actx, cancel := context.WithTimeout(ctx, opTimeout)
		err := s.DeleteMsg(actx, seq)
		cancel()
		if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) && !strings.Contains(err.Error(), "no message found") {
			return q.note(err)
		}
	}
	return q.note(nil)
}
