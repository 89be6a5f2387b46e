package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/execmesh/execmesh/internal/atomicfile"
	"github.com/execmesh/execmesh/protocol"
)

// maxQueuedEvents bounds each sessionKey's queue; the oldest events go first.
const maxQueuedEvents = 1000

// eventQueue holds system events per sessionKey until a reader takes them.
// A read returns and acknowledges everything queued for that key.
type eventQueue struct {
	mu      sync.Mutex
	queues  map[string][]protocol.SystemEvent
	waiters map[string][]chan struct{} // woken when the key's queue grows
	subs    map[string]map[*eventSub]struct{}
	// acked holds the context keys whose terminal status a poll already
	// delivered, so a late (node) exit event for them is dropped.
	acked map[string]time.Time
	// seen holds the ids of events pushed with an id of their own (node
	// exit events), so a redelivered copy is dropped.
	seen map[string]time.Time
	now  func() time.Time
	// path, when set, is where the queue survives a restart (and a kill -9):
	// it is rewritten, synced, on every change, before the caller acks the
	// event's source.
	path string
	log  *slog.Logger
}

// eventState is the persisted form of the queue.
type eventState struct {
	Queues map[string][]protocol.SystemEvent `json:"queues"`
	Acked  map[string]int64                  `json:"acked,omitempty"`
	Seen   map[string]int64                  `json:"seen,omitempty"`
}

// eventRetention bounds how long acknowledgements and seen ids are kept;
// JetStream redelivers within minutes, and session ids are not reused
// within a day.
const eventRetention = 24 * time.Hour

type eventSub struct {
	ch chan protocol.SystemEvent
}

func newEventQueue() *eventQueue {
	return &eventQueue{
		queues:  map[string][]protocol.SystemEvent{},
		waiters: map[string][]chan struct{}{},
		subs:    map[string]map[*eventSub]struct{}{},
		acked:   map[string]time.Time{},
		seen:    map[string]time.Time{},
		now:     time.Now,
		log:     slog.New(slog.DiscardHandler),
	}
}

// openEventQueue returns a queue persisted at path, loading what an
// earlier run left there. A corrupt file is set aside, not trusted.
func openEventQueue(path string, log *slog.Logger) *eventQueue {
	q := newEventQueue()
	q.path, q.log = path, log
	b, err := os.ReadFile(path)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			log.Warn("reading queued events", "path", path, "err", err)
		}
		return q
	}
	var st eventState
	if err := json.Unmarshal(b, &st); err != nil {
		log.Error("queued events file is corrupt; moved aside", "path", path, "err", err)
		_ = os.Rename(path, path+".corrupt")
		return q
	}
	for k, l := range st.Queues {
		q.queues[k] = l
	}
	for k, ms := range st.Acked {
		q.acked[k] = time.UnixMilli(ms)
	}
	for k, ms := range st.Seen {
		q.seen[k] = time.UnixMilli(ms)
	}
	return q
}

// saveLocked writes the queue to q.path. q.mu must be held.
func (q *eventQueue) saveLocked() {
	if q.path == "" {
		return
	}
	now := q.now()
	st := eventState{Queues: q.queues, Acked: map[string]int64{}, Seen: map[string]int64{}}
	for k, at := range q.acked {
		if now.Sub(at) > eventRetention {
			delete(q.acked, k)
			continue
		}
		st.Acked[k] = at.UnixMilli()
	}
	for k, at := range q.seen {
		if now.Sub(at) > eventRetention {
			delete(q.seen, k)
			continue
		}
		st.Seen[k] = at.UnixMilli()
	}
	b, err := json.Marshal(st)
	if err == nil {
		err = atomicfile.Write(q.path, b, 0o600)
	}
	if err != nil {
		q.log.Error("persisting queued events", "path", q.path, "err", err)
	}
}

func newEventID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// push queues ev for its sessionKey, unless its context key was already
// acknowledged, and reports whether it was queued. Streams see it at once.
func (q *eventQueue) push(ev protocol.SystemEvent) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if ev.ContextKey != "" {
		if _, done := q.acked[ev.ContextKey]; done {
			return false
		}
	}
	if ev.ID == "" {
		ev.ID = newEventID()
	} else if _, dup := q.seen[ev.ID]; dup {
		return false
	} else {
		q.seen[ev.ID] = q.now()
	}
	if ev.TS == 0 {
		ev.TS = q.now().UnixMilli()
	}
	// A live stream consumes the event: it is delivered there and not queued.
	if subs := q.subs[ev.SessionKey]; len(subs) > 0 {
		for s := range subs {
			select {
			case s.ch <- ev:
			default: // a stuck stream reader must not block the gateway
			}
		}
		q.saveLocked()
		return true
	}
	l := append(q.queues[ev.SessionKey], ev)
	if len(l) > maxQueuedEvents {
		l = l[len(l)-maxQueuedEvents:]
	}
	q.queues[ev.SessionKey] = l
	q.saveLocked()
	for _, w := range q.waiters[ev.SessionKey] {
		close(w)
	}
	delete(q.waiters, ev.SessionKey)
	return true
}

// acknowledge drops a still-queued event with this context key and
// remembers the key so that a later copy is not queued either.
func (q *eventQueue) acknowledge(sessionKey, contextKey string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.acked[contextKey] = q.now()
	for k, at := range q.acked {
		if q.now().Sub(at) > eventRetention {
			delete(q.acked, k)
		}
	}
	l := q.queues[sessionKey]
	out := l[:0]
	for _, ev := range l {
		if ev.ContextKey != contextKey {
			out = append(out, ev)
		}
	}
	q.queues[sessionKey] = out
	q.saveLocked()
}

// take returns and removes every queued event for sessionKey, waiting up to
// wait for the first one.
func (q *eventQueue) take(ctx context.Context, sessionKey string, wait time.Duration) []protocol.SystemEvent {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		q.mu.Lock()
		if l := q.queues[sessionKey]; len(l) > 0 {
			delete(q.queues, sessionKey)
			q.saveLocked()
			q.mu.Unlock()
			return l
		}
		if wait <= 0 {
			q.mu.Unlock()
			return []protocol.SystemEvent{}
		}
		w := make(chan struct{})
		q.waiters[sessionKey] = append(q.waiters[sessionKey], w)
		q.mu.Unlock()
		select {
		case <-w:
		case <-deadline.C:
			q.removeWaiter(sessionKey, w)
			wait = 0
		case <-ctx.Done():
			q.removeWaiter(sessionKey, w)
			return []protocol.SystemEvent{}
		}
	}
}

func (q *eventQueue) removeWaiter(sessionKey string, w chan struct{}) {
	q.mu.Lock()
	defer q.mu.Unlock()
	l := q.waiters[sessionKey]
	for i, c := range l {
		if c == w {
			q.waiters[sessionKey] = append(l[:i], l[i+1:]...)
			break
		}
	}
	if len(q.waiters[sessionKey]) == 0 {
		delete(q.waiters, sessionKey)
	}
}

// subscribe opens a live stream for sessionKey. Events already queued are
// delivered first. The returned cancel function must be called.
func (q *eventQueue) subscribe(sessionKey string) (<-chan protocol.SystemEvent, []protocol.SystemEvent, func()) {
	s := &eventSub{ch: make(chan protocol.SystemEvent, 256)}
	q.mu.Lock()
	backlog := q.queues[sessionKey]
	delete(q.queues, sessionKey)
	if len(backlog) > 0 {
		q.saveLocked()
	}
	if q.subs[sessionKey] == nil {
		q.subs[sessionKey] = map[*eventSub]struct{}{}
	}
	q.subs[sessionKey][s] = struct{}{}
	q.mu.Unlock()
	return s.ch, backlog, func() {
		q.mu.Lock()
		delete(q.subs[sessionKey], s)
		if len(q.subs[sessionKey]) == 0 {
			delete(q.subs, sessionKey)
		}
		q.mu.Unlock()
	}
}
