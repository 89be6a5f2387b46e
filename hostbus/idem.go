package hostbus

import (
	"container/list"
	"context"
	"sync"
	"time"

	"github.com/execmesh/execmesh/protocol"
)

// maxIdempotencyKeyLen bounds a key; gateways send UUIDs (36 characters).
const maxIdempotencyKeyLen = 128

// idemCache remembers the answers of exec starts by idempotency key, so a
// start that arrives twice (a retry after an ambiguous timeout, a
// duplicate after a reconnect) runs once: the second request waits for
// the first and gets the same answer. Entries expire after ttl and at
// most max completed ones are kept, oldest dropped first; an entry still
// running is never dropped.
type idemCache struct {
	ttl      time.Duration
	max      int
	maxBytes int // bound on the replies kept; a foreground result can be large
	now      func() time.Time

	mu      sync.Mutex // guards entries, order, bytes
	entries map[string]*idemEntry
	order   *list.List // of *idemEntry, oldest first
	bytes   int        // sum of the replies kept
}

// idemMaxBytes bounds the replies an idempotency cache keeps (the oldest
// finished ones go first); a start whose reply was dropped runs again if
// retried after that, as after the TTL.
const idemMaxBytes = 64 << 20

type idemEntry struct {
	key        string
	sessionKey string
	done       chan struct{} // closed when reply/err are set
	reply      []byte
	err        *protocol.Error
	finished   time.Time
	elem       *list.Element
}

func newIdemCache(ttl time.Duration, max int) *idemCache {
	return &idemCache{ttl: ttl, max: max, maxBytes: idemMaxBytes, now: time.Now, entries: map[string]*idemEntry{}, order: list.New()}
}

// validIdempotencyKey reports whether key is usable: 1..128 printable
// ASCII characters.
func validIdempotencyKey(key string) bool {
	if key == "" || len(key) > maxIdempotencyKeyLen {
		return false
	}
	for i := 0; i < len(key); i++ {
		if key[i] <= ' ' || key[i] > '~' {
			return false
		}
	}
	return true
}

// do runs run once per key. replayed is true when the answer is that of an
// earlier request with the same key. A key reused under another
// sessionKey is refused: keys are per call, so that is a client bug, and
// answering would leak another scope's result.
func (c *idemCache) do(ctx context.Context, key, sessionKey string, run func() ([]byte, error)) (reply []byte, err error, replayed bool) {
	c.mu.Lock()
	c.expireLocked()
	if e, ok := c.entries[key]; ok {
		c.mu.Unlock()
		if e.sessionKey != sessionKey {
			return nil, protocol.Errorf(protocol.ErrConflict, "idempotency key %s was already used by another sessionKey", key), true
		}
		select {
		case <-e.done:
		case <-ctx.Done():
			return nil, &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true,
				Message: "exec with idempotency key " + key + " is still starting on this node; retry with the same key"}, true
		}
		if e.err != nil {
			return nil, e.err, true
		}
		return e.reply, nil, true
	}
	e := &idemEntry{key: key, sessionKey: sessionKey, done: make(chan struct{})}
	c.entries[key] = e
	e.elem = c.order.PushBack(e)
	c.mu.Unlock()

	reply, err = run()
	c.mu.Lock()
	e.reply = reply
	c.bytes += len(reply)
	if err != nil {
		e.err = protocol.AsError(err)
	}
	e.finished = c.now()
	close(e.done)
	c.expireLocked()
	c.mu.Unlock()
	return reply, err, false
}

// expireLocked drops expired entries and, above max, the oldest finished
// ones. c.mu is held.
func (c *idemCache) expireLocked() {
	now := c.now()
	over := len(c.entries) - c.max
	for el := c.order.Front(); el != nil; {
		next := el.Next()
		e := el.Value.(*idemEntry)
		select {
		case <-e.done:
			if over > 0 || c.bytes > c.maxBytes || now.Sub(e.finished) > c.ttl {
				c.order.Remove(el)
				delete(c.entries, e.key)
				c.bytes -= len(e.reply)
				over--
				el = next
				continue
			}
		default: // still running: keep
		}
		if over <= 0 && c.bytes <= c.maxBytes {
			// Entries are in start order, so the rest finished about as
			// late or later: stop here rather than walk the whole list
			// on every start.
			return
		}
		el = next
	}
}

// len returns the number of keys kept.
func (c *idemCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}
