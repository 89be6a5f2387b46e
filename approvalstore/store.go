// Package approvalstore keeps the exec approvals of a deployment in a
// JetStream KV bucket shared by its gateways (DESIGN.md §3.4): a host that
// needs an operator's decision answers with its plan, a gateway records
// the pending approval here, any gateway may record the decision, and one
// gateway, the record's owner, acts on it.
//
// Writes are compare-and-set: the first decision wins and a second gets
// 409; an owner that stops heart-beating (Options.Alive) is replaced by
// the first live gateway that claims its records, so a pending approval,
// a decision not yet acted on and a run's Exec finished event survive the
// gateway that recorded them. Every gateway follows the bucket into a
// cache, so listing and lookups read memory.
package approvalstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/protocol"
)

// States of a record.
const (
	StatePending  = "pending"  // waiting for a decision
	StateDecided  = "decided"  // decided, not acted on yet
	StateExpired  = "expired"  // nobody decided in time
	StateRunning  = "running"  // the approved run started
	StateFinished = "finished" // the approved run ended
	StateDenied   = "denied"   // nothing runs (DeniedReason says why)
)

// Keep is how long a settled approval stays in the bucket, so that a late
// second answer gets 409 rather than 404 and its outcome can be read.
const Keep = time.Hour

// opTimeout bounds one bucket operation.
const opTimeout = 5 * time.Second

// Approval is one exec waiting for a decision, as GET /v1/approvals lists
// it.
type Approval struct {
	ID          string `json:"id"`
	Slug        string `json:"slug"`
	Command     string `json:"command"`
	Host        string `json:"host"`
	NodeID      string `json:"nodeId,omitempty"`
	Cwd         string `json:"cwd"`
	AgentID     string `json:"agentId"`
	SessionKey  string `json:"sessionKey"`
	ExpiresAtMs int64  `json:"expiresAtMs"`
	// Decisions lists what may be answered (allow-always is not offered
	// when ask is always or nothing could be allowlisted).
	Decisions []string `json:"decisions"`
}

// Record is one approval in the bucket.
type Record struct {
	Approval
	State     string `json:"state"`
	Decision  string `json:"decision,omitempty"`
	DecidedAt int64  `json:"decidedAt,omitempty"`
	// Owner is the gateway that acts on the decision; HostGateway, for a
	// run on a gateway's own host, the gateway whose host runs it.
	Owner       string `json:"owner"`
	HostGateway string `json:"hostGateway,omitempty"`
	// Request is the exec to start once approved; Plan what the decision
	// is signed over.
	Request        protocol.ExecRequest `json:"request"`
	Plan           protocol.Plan        `json:"plan"`
	AskFallback    string               `json:"askFallback,omitempty"`
	FallbackAllows bool                 `json:"fallbackAllows,omitempty"`
	// SessionID is the approved run's session.
	SessionID string `json:"sessionId,omitempty"`
	// DeniedReason says why nothing runs (the reason of its Exec denied
	// event).
	DeniedReason string `json:"deniedReason,omitempty"`
	SettledAt    int64  `json:"settledAt,omitempty"`
}

// Options configure a Store. JS, Prefix and Owner are required.
type Options struct {
	Logger   *slog.Logger
	JS       jetstream.JetStream
	Prefix   string
	Replicas int
	// Owner is this gateway's id: records it creates are its own, and it
	// acts on the decisions of the records it owns.
	Owner string
	// Alive reports whether a gateway is heart-beating; nil counts every
	// gateway alive (a single gateway never claims).
	Alive func(gatewayID string) bool
	// AliveKnown, when set, is closed once Alive answers from what is
	// known (the gateways bucket was read): the store claims the records
	// of owners that are gone then. Later it claims when a record of a
	// gone owner arrives, when ClaimOrphans is called (a peer went) and
	// once a minute.
	AliveKnown <-chan struct{}
	// OnOwned is called, in a goroutine of its own, once per record this
	// gateway owns that was decided or expired: the owner's work (start
	// the approved run, or send Exec denied). It is not called again for
	// the same record in this process.
	OnOwned func(ctx context.Context, rec Record)
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

type entry struct {
	rec      Record
	revision uint64
}

// Store is the approvals bucket and its cache. Its methods are safe for
// concurrent use.
type Store struct {
	opts Options
	log  *slog.Logger
	kv   atomic.Pointer[jetstream.KeyValue]

	ctx    context.Context // ends when Stop begins
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	cache   map[string]entry
	timers  map[string]*time.Timer // expiry of owned pending approvals
	handled map[string]bool        // owned records handed to OnOwned
	stopped bool

	// claim asks chores for a ClaimOrphans pass (a record of a gone
	// owner arrived).
	claim chan struct{}
}

// New returns a Store; Run follows the bucket.
func New(opts Options) *Store {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Alive == nil {
		opts.Alive = func(string) bool { return true }
	}
	s := &Store{opts: opts, log: opts.Logger.With("component", "approvals"),
		cache: map[string]entry{}, timers: map[string]*time.Timer{}, handled: map[string]bool{}, claim: make(chan struct{}, 1)}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s
}

func (s *Store) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	if p := s.kv.Load(); p != nil {
		return *p, nil
	}
	kv, err := bus.OpenKeyValue(ctx, s.opts.JS, s.opts.Prefix, s.opts.Replicas, bus.StreamNamesFor(s.opts.Prefix).Approvals)
	if err != nil {
		return nil, err
	}
	s.kv.Store(&kv)
	return kv, nil
}

func unavailable(err error) error {
	return &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true, Message: fmt.Sprintf("exec approvals are not available (JetStream: %v); retry", err)}
}

// Stop ends the store's timers and waits for OnOwned calls to return.
func (s *Store) Stop() {
	s.mu.Lock()
	s.stopped = true
	for _, t := range s.timers {
		t.Stop()
	}
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
}

// Run follows the bucket into the cache and acts for the records this
// gateway owns until ctx ends, again after a failure (the store lost and
// back). Once a minute it forgets settled records older than Keep; it
// claims the records of owners that are gone when it learns of them
// (see Options.AliveKnown), and once a minute.
func (s *Store) Run(ctx context.Context) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.chores(ctx)
	}()
	bus.RetryForever(ctx, s.log, "approvals not followed", func(ctx context.Context) error {
		kv, err := s.bucket(ctx)
		if err != nil {
			return err
		}
		err = bus.WatchKeyValue(ctx, kv, ">", nil, s.apply)
		s.kv.Store(nil)
		return err
	})
}

const (
	// choreEvery is how often settled records are swept and, besides
	// the events that call for it, owners checked for liveness.
	choreEvery = time.Minute
	// claimRetry is the pause before claiming again after a claim
	// failed (a contended record, a JetStream hiccup).
	claimRetry = 3 * time.Second
)

// chores sweeps settled records and claims orphaned ones once a minute,
// claims when the peers are known and when asked (s.claim), until ctx
// ends.
func (s *Store) chores(ctx context.Context) {
	t := time.NewTicker(choreEvery)
	defer t.Stop()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	known := s.opts.AliveKnown
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.ctx.Done(): // Stop
			return
		case <-known:
			known = nil
		case <-s.claim:
		case <-retry.C:
		case <-t.C:
			if kv, err := s.bucket(ctx); err == nil {
				s.sweep(ctx, kv)
			}
		}
		if !s.claimOrphans(ctx) {
			retry.Reset(claimRetry)
		}
	}
}

// orphan reports whether rec is owned by another gateway that is gone
// and still needs its owner.
func (s *Store) orphan(rec Record) bool {
	switch rec.State {
	case StatePending, StateDecided, StateExpired, StateRunning:
		return rec.Owner != s.opts.Owner && !s.opts.Alive(rec.Owner)
	}
	return false
}

// apply takes one bucket change into the cache and reacts to what this
// gateway owns.
func (s *Store) apply(e jetstream.KeyValueEntry) {
	s.mu.Lock()
	cur, ok := s.cache[e.Key()]
	if ok && cur.revision >= e.Revision() {
		s.mu.Unlock()
		return
	}
	if e.Operation() != jetstream.KeyValuePut {
		delete(s.cache, e.Key())
		s.mu.Unlock()
		return
	}
	var rec Record
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		s.mu.Unlock()
		s.log.Warn("malformed approval record ignored", "id", e.Key(), "err", err)
		return
	}
	s.cache[e.Key()] = entry{rec: rec, revision: e.Revision()}
	s.mu.Unlock()
	if s.orphan(rec) {
		select {
		case s.claim <- struct{}{}:
		default:
		}
	}
	s.react(rec)
}

// store puts rec (at revision rev) into the cache and reacts.
func (s *Store) store(rec Record, rev uint64) {
	s.mu.Lock()
	if cur, ok := s.cache[rec.ID]; !ok || cur.revision < rev {
		s.cache[rec.ID] = entry{rec: rec, revision: rev}
	}
	s.mu.Unlock()
	s.react(rec)
}

// react does the owner's part for one record: arm the expiry of a pending
// approval, hand a decided or expired one to OnOwned once.
func (s *Store) react(rec Record) {
	if rec.Owner != s.opts.Owner {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return
	}
	switch rec.State {
	case StatePending:
		if _, armed := s.timers[rec.ID]; !armed {
			id := rec.ID
			s.timers[id] = time.AfterFunc(max(time.UnixMilli(rec.ExpiresAtMs).Sub(s.opts.Now()), 0), func() { s.expire(id) })
		}
	case StateDecided, StateExpired:
		if t := s.timers[rec.ID]; t != nil {
			t.Stop()
			delete(s.timers, rec.ID)
		}
		if s.handled[rec.ID] || s.opts.OnOwned == nil {
			return
		}
		s.handled[rec.ID] = true
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.opts.OnOwned(s.ctx, rec)
		}()
	}
}

// Create records a new pending approval owned by this gateway.
func (s *Store) Create(ctx context.Context, rec Record) error {
	kv, err := s.bucket(ctx)
	if err != nil {
		return unavailable(err)
	}
	rec.State, rec.Owner = StatePending, s.opts.Owner
	b, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("approvals: encode: %w", err)
	}
	actx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	rev, err := kv.Create(actx, rec.ID, b)
	if err != nil {
		return unavailable(err)
	}
	s.store(rec, rev)
	return nil
}

// Lookup finds an approval by id or slug in the cache, else (recorded an
// instant ago through another gateway) by id in the bucket. An ambiguous
// slug matches none.
func (s *Store) Lookup(ctx context.Context, idOrSlug string) (Record, bool) {
	if e, ok := s.lookupCached(idOrSlug); ok {
		return e.rec, true
	}
	kv, err := s.bucket(ctx)
	if err != nil {
		return Record{}, false
	}
	actx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if kve, err := kv.Get(actx, idOrSlug); err == nil {
		s.apply(kve)
	}
	e, ok := s.lookupCached(idOrSlug)
	return e.rec, ok
}

func (s *Store) lookupCached(idOrSlug string) (entry, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.cache[idOrSlug]; ok {
		return e, true
	}
	var found *entry
	for _, e := range s.cache {
		if e.rec.Slug == idOrSlug {
			if found != nil {
				return entry{}, false
			}
			found = &e
		}
	}
	if found == nil {
		return entry{}, false
	}
	return *found, true
}

// Decide records an operator's decision (allow-once, allow-always or
// deny): 404 for an unknown or expired approval, 409 once decided, 400
// for a decision that is not offered. Of two gateways deciding at once,
// one wins and the other answers 409.
func (s *Store) Decide(ctx context.Context, idOrSlug, decision string) (Approval, error) {
	switch decision {
	case protocol.DecisionAllowOnce, protocol.DecisionAllowAlways, protocol.DecisionDeny:
	default:
		return Approval{}, protocol.Errorf(protocol.ErrInvalidRequest, "invalid decision %q (expected allow-once, allow-always or deny)", decision)
	}
	notFound := protocol.Errorf(protocol.ErrNotFound, "no pending approval %s (unknown or expired)", idOrSlug)
	rec, ok := s.Lookup(ctx, idOrSlug)
	if !ok {
		return Approval{}, notFound
	}
	var out Approval
	var refusal error
	err := s.Update(ctx, rec.ID, func(r *Record) bool {
		switch {
		case r.State == StateExpired || (r.State == StatePending && s.opts.Now().UnixMilli() > r.ExpiresAtMs):
			refusal = notFound
			return false
		case r.State != StatePending:
			refusal = protocol.Errorf(protocol.ErrConflict, "approval %s was already decided (%s)", r.Slug, r.Decision)
			return false
		case !slices.Contains(r.Decisions, decision):
			refusal = protocol.Errorf(protocol.ErrInvalidRequest, "decision %s is not available for approval %s (allowed: %s)", decision, r.Slug, strings.Join(r.Decisions, ", "))
			return false
		}
		r.State, r.Decision, r.DecidedAt = StateDecided, decision, s.opts.Now().UnixMilli()
		out = r.Approval
		return true
	})
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return Approval{}, notFound
	case err != nil:
		return Approval{}, unavailable(err)
	case refusal != nil:
		return Approval{}, refusal
	}
	return out, nil
}

// expire settles an owned approval nobody answered in time.
func (s *Store) expire(id string) {
	s.mu.Lock()
	delete(s.timers, id)
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(s.ctx, opTimeout)
	defer cancel()
	_ = s.Update(ctx, id, func(r *Record) bool {
		if r.State != StatePending {
			return false
		}
		r.State = StateExpired
		return true
	})
}

// Update changes a record by compare-and-set, reading it again when
// another gateway wrote it meanwhile; fn returns false for no change.
func (s *Store) Update(ctx context.Context, id string, fn func(*Record) bool) error {
	kv, err := s.bucket(ctx)
	if err != nil {
		return err
	}
	missing := false
	rec, rev, changed, err := bus.UpdateKey(ctx, kv, id, func(r *Record, exists bool) bool {
		missing = !exists
		return exists && fn(r)
	})
	switch {
	case err != nil:
		return err
	case missing:
		return jetstream.ErrKeyNotFound
	case changed:
		s.store(rec, rev)
	}
	return nil
}

// ClaimOrphans makes this gateway the owner of the unsettled records
// whose owner is gone (Options.Alive): a pending approval's expiry, a
// decision not acted on yet, and a running approved run's Exec finished
// event are then this gateway's to handle. Run calls it when it learns
// of such records and once a minute (again after a few seconds when a
// claim failed); a gateway that learns of a peer's departure calls it at
// once.
func (s *Store) ClaimOrphans(ctx context.Context) {
	s.claimOrphans(ctx)
}

// claimOrphans is ClaimOrphans; false when a claim failed.
func (s *Store) claimOrphans(ctx context.Context) bool {
	s.mu.Lock()
	var orphans []string
	for id, e := range s.cache {
		if s.orphan(e.rec) {
			orphans = append(orphans, id)
		}
	}
	s.mu.Unlock()
	ok := true
	for _, id := range orphans {
		var from string
		err := s.Update(ctx, id, func(r *Record) bool {
			if !s.orphan(*r) {
				return false
			}
			from, r.Owner = r.Owner, s.opts.Owner
			return true
		})
		switch {
		case err == nil && from != "":
			s.log.Info("took over an approval whose gateway is gone", "approval", id, "from", from)
		case err != nil && ctx.Err() == nil && !errors.Is(err, jetstream.ErrKeyNotFound):
			s.log.Warn("approval of a gone gateway not taken over yet", "approval", id, "err", err)
			ok = false
		}
	}
	return ok
}

// sweep forgets settled approvals after Keep (any gateway may).
func (s *Store) sweep(ctx context.Context, kv jetstream.KeyValue) {
	cutoff := s.opts.Now().Add(-Keep).UnixMilli()
	s.mu.Lock()
	var old []entry
	for _, e := range s.cache {
		settled := e.rec.SettledAt
		if settled == 0 && e.rec.State == StateExpired {
			settled = e.rec.ExpiresAtMs
		}
		if settled != 0 && settled < cutoff {
			old = append(old, e)
		}
	}
	s.mu.Unlock()
	for _, e := range old {
		actx, cancel := context.WithTimeout(ctx, opTimeout)
		_ = kv.Delete(actx, e.rec.ID, jetstream.LastRevision(e.revision))
		cancel()
	}
}

// List returns the approvals waiting for a decision, the soonest to
// expire first.
func (s *Store) List() []Approval {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.opts.Now().UnixMilli()
	out := []Approval{}
	for _, e := range s.cache {
		if e.rec.State == StatePending && e.rec.ExpiresAtMs >= now {
			out = append(out, e.rec.Approval)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ExpiresAtMs < out[j].ExpiresAtMs })
	return out
}
