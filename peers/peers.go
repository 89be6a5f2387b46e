// Package peers tracks the gateways of a deployment: each gateway keeps
// a key of its own in the gateways KV bucket, written again every
// Interval; the bucket's TTL removes the key of a gateway that stops
// writing (a crash, a cut link), and a gateway that shuts down deletes
// its own at once. Every gateway follows the bucket, so it knows which
// peers are alive — what the approvals store needs to take over a dead
// owner's approvals and the gateway to tell the agents of a dead peer's
// local sessions that they are lost.
//
// A peer counts as gone only when its key is removed, never because the
// bucket cannot be read: a JetStream hiccup does not make the whole fleet
// look dead.
package peers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/execmesh/execmesh/bus"
)

// Defaults.
const (
	// DefaultInterval is how often a gateway writes its key: three
	// times within the key's lifetime (bus.GatewayPresenceTTL, 15 s, a
	// node's presence TTL too), so two writes may be late or lost before
	// a live gateway counts as gone. Each write is a JetStream file write
	// and wakes every gateway's watch: at 3 s (TTL 10 s) it was two
	// thirds of an idle `execmesh up`'s CPU.
	DefaultInterval = 5 * time.Second
	// opTimeout bounds one bucket operation.
	opTimeout = 5 * time.Second
)

// Gateway is one gateway as its key tells it.
type Gateway struct {
	ID        string `json:"id"`
	Name      string `json:"name,omitempty"` // host name
	Version   string `json:"version,omitempty"`
	Listen    string `json:"listen,omitempty"` // its HTTP listen address
	StartedAt int64  `json:"startedAt"`        // unix ms
	// SeenAt is when the gateway last wrote its key (unix ms).
	SeenAt int64 `json:"seenAt"`
	// Self marks this gateway in List.
	Self bool `json:"self,omitempty"`
}

// Options configure a Registry. JS, Prefix and Self.ID are required.
type Options struct {
	Logger   *slog.Logger
	JS       jetstream.JetStream
	Prefix   string
	Replicas int
	// Self is this gateway; StartedAt is set by Start when zero.
	Self Gateway
	// Interval is how often Self is written; 0 means DefaultInterval.
	Interval time.Duration
	// OnGone is called, in its own goroutine, when a peer's key is
	// removed (it stopped or stopped writing).
	OnGone func(ctx context.Context, id string)
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Registry is this gateway's view of its peers. Its methods are safe for
// concurrent use.
type Registry struct {
	opts Options
	log  *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	kv     jetstream.KeyValue
	peers  map[string]Gateway
	gone   map[string]chan struct{} // closed when the peer is removed
	loaded chan struct{}            // closed once the bucket was read
	loadOn sync.Once
}

// Start builds the registry and starts writing this gateway's key and
// following the bucket (retrying in the background while JetStream is
// not ready). Call Close.
func Start(opts Options) (*Registry, error) {
	if opts.JS == nil || opts.Prefix == "" || opts.Self.ID == "" {
		return nil, errors.New("peers: JS, Prefix and Self.ID are required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	// A few writes within the key's lifetime, so that a gateway slowed
	// down for a moment is not taken for gone.
	opts.Interval = min(opts.Interval, bus.GatewayPresenceTTL/3)
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Self.StartedAt == 0 {
		opts.Self.StartedAt = opts.Now().UnixMilli()
	}
	r := &Registry{opts: opts, log: opts.Logger.With("component", "peers"), peers: map[string]Gateway{},
		gone: map[string]chan struct{}{}, loaded: make(chan struct{})}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.wg.Add(2)
	go func() {
		defer r.wg.Done()
		r.beat(r.ctx)
	}()
	go func() {
		defer r.wg.Done()
		r.follow(r.ctx)
	}()
	return r, nil
}

func (r *Registry) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	r.mu.Lock()
	kv := r.kv
	r.mu.Unlock()
	if kv != nil {
		return kv, nil
	}
	kv, err := bus.OpenKeyValue(ctx, r.opts.JS, r.opts.Prefix, r.opts.Replicas, bus.StreamNamesFor(r.opts.Prefix).Gateways)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.kv = kv
	r.mu.Unlock()
	return kv, nil
}

func (r *Registry) forget() {
	r.mu.Lock()
	r.kv = nil
	r.mu.Unlock()
}

// beat writes this gateway's key every Interval.
func (r *Registry) beat(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := r.write(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn("gateway presence not written", "err", err)
			r.forget()
		}
		t.Reset(r.opts.Interval)
	}
}

func (r *Registry) write(ctx context.Context) error {
	kv, err := r.bucket(ctx)
	if err != nil {
		return err
	}
	self := r.opts.Self
	self.SeenAt = r.opts.Now().UnixMilli()
	self.Self = false
	b, _ := json.Marshal(self)
	actx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	_, err = kv.Put(actx, key(self.ID), b)
	return err
}

// key is the bucket key of a gateway id (ids are nkeys: letters and
// digits).
func key(id string) string { return strings.ToLower(id) }

// follow watches the bucket until ctx ends.
func (r *Registry) follow(ctx context.Context) {
	bus.RetryForever(ctx, r.log, "gateway presence not followed", func(ctx context.Context) error {
		kv, err := r.bucket(ctx)
		if err != nil {
			return err
		}
		err = bus.WatchKeyValue(ctx, kv, ">", func() { r.loadOn.Do(func() { close(r.loaded) }) }, r.apply)
		r.forget()
		return err
	})
}

func (r *Registry) apply(e jetstream.KeyValueEntry) {
	if e.Operation() != jetstream.KeyValuePut {
		r.remove(e.Key())
		return
	}
	var g Gateway
	if err := json.Unmarshal(e.Value(), &g); err != nil || g.ID == "" || key(g.ID) != e.Key() {
		r.log.Warn("malformed gateway presence ignored", "key", e.Key())
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, known := r.peers[g.ID]; !known && g.ID != r.opts.Self.ID {
		r.log.Info("gateway joined", "gateway", g.ID, "name", g.Name)
	}
	r.peers[g.ID] = g
}

func (r *Registry) remove(k string) {
	r.mu.Lock()
	var id string
	for pid := range r.peers {
		if key(pid) == k {
			id = pid
		}
	}
	if id == "" || id == r.opts.Self.ID {
		r.mu.Unlock()
		return
	}
	delete(r.peers, id)
	if ch := r.gone[id]; ch != nil {
		close(ch)
		delete(r.gone, id)
	}
	r.mu.Unlock()
	r.log.Warn("gateway gone", "gateway", id)
	if cb := r.opts.OnGone; cb != nil {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			cb(r.ctx, id)
		}()
	}
}

// Alive reports whether gateway id is this one or a peer whose key
// exists. Until the bucket was read once every gateway counts alive.
func (r *Registry) Alive(id string) bool {
	if id == r.opts.Self.ID {
		return true
	}
	select {
	case <-r.loaded:
	default:
		return true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.peers[id]
	return ok
}

// Loaded is closed once the bucket was read: from then on Alive answers
// from the keys, not "alive" for every gateway.
func (r *Registry) Loaded() <-chan struct{} { return r.loaded }

// Watch derives from ctx a context that ends when peer id is gone (at
// once when it is not alive now).
func (r *Registry) Watch(ctx context.Context, id string) (context.Context, context.CancelFunc) {
	wctx, cancel := context.WithCancelCause(ctx)
	if !r.Alive(id) {
		cancel(fmt.Errorf("gateway %s is gone", id))
		return wctx, func() { cancel(nil) }
	}
	r.mu.Lock()
	ch := r.gone[id]
	if ch == nil {
		ch = make(chan struct{})
		r.gone[id] = ch
	}
	r.mu.Unlock()
	stop := make(chan struct{})
	go func() {
		select {
		case <-ch:
			cancel(fmt.Errorf("gateway %s is gone", id))
		case <-stop:
		case <-wctx.Done():
		}
	}()
	return wctx, func() {
		close(stop)
		cancel(nil)
	}
}

// List returns the gateways whose keys exist, this one included (marked
// Self), by id.
func (r *Registry) List() []Gateway {
	r.mu.Lock()
	out := make([]Gateway, 0, len(r.peers)+1)
	selfSeen := false
	for _, g := range r.peers {
		if g.ID == r.opts.Self.ID {
			g.Self, selfSeen = true, true
		}
		out = append(out, g)
	}
	r.mu.Unlock()
	if !selfSeen {
		self := r.opts.Self
		self.Self, self.SeenAt = true, r.opts.Now().UnixMilli()
		out = append(out, self)
	}
	slices.SortFunc(out, func(a, b Gateway) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Close stops writing this gateway's key and deletes it, so that peers
// take over at once, and waits for OnGone calls to return.
func (r *Registry) Close(ctx context.Context) error {
	r.cancel()
	var err error
	if kv, berr := r.bucket(ctx); berr == nil {
		actx, cancel := context.WithTimeout(ctx, opTimeout)
		err = kv.Delete(actx, key(r.opts.Self.ID))
		cancel()
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			err = nil
		}
	}
	r.wg.Wait()
	if err != nil {
		return fmt.Errorf("peers: removing this gateway's presence: %w", err)
	}
	return nil
}
