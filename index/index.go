// Package index holds the session index: every session id the gateways
// handed out, and the host that holds it, in a JetStream KV bucket shared
// by the gateways of a deployment. A session id is allocated by creating
// its key, which fails when the id is taken, so ids are unique across the
// fleet and the id an agent sees is the one the host runs the command
// under (EXECMESH_SESSION): nothing is renamed or rewritten. Every gateway
// follows the bucket into a cache, so routing a call reads memory; a miss
// (an entry written an instant ago by another gateway) reads the bucket.
// Records are changed by compare-and-set, so gateways that race settle on
// one outcome.
//
// A gateway keeps a pool of reservations (reserve.go): keys it created
// ahead of the calls, each holding a record that says so and nothing
// else. A call takes one, and its id becomes a session's only when the
// call backgrounds a session (Commit, before its answer); a foreground run
// that ended gives it back to the pool, so an exec that finishes in its
// yield window writes nothing to the bucket. Reservations are no sessions:
// Lookup, Read, Scope, OfHost and Update do not see them.
package index

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-multierror"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/protocol"
)

// Host kinds in the index.
const (
	HostGateway = "gateway" // a gateway's local host (gateway and sandbox targets)
	HostNode    = "node"
)

// Session states in the index.
const (
	StateRunning  = "running"
	StateFinished = "finished"
	StateLost     = "lost"
	// StateReserved: an id a gateway holds for a call to come (see
	// Reserve), not a session.
	StateReserved = "reserved"
)

// Exit notice states (Record.Notice).
const (
	NoticePending = "pending"
	NoticeStored  = "stored"
)

// Timeout bounds one index operation.
const Timeout = 5 * time.Second

// Record is one session of the index.
type Record struct {
	SessionKey string `json:"sessionKey"`
	Host       string `json:"host"`   // HostGateway or HostNode
	HostID     string `json:"hostId"` // the gateway id or the node id
	// Instance is the run of the host that holds the session (a node
	// agent that restarts has a new one, and lost the session).
	Instance  string `json:"instance,omitempty"`
	Command   string `json:"command,omitempty"`
	Cwd       string `json:"cwd,omitempty"`
	StartedAt int64  `json:"startedAt,omitempty"`
	State     string `json:"state"`
	// Polled: a poll delivered the session's end, so its exit notice is
	// redundant.
	Polled bool `json:"polled,omitempty"`
	// Notice is where the exit notice stands: NoticePending while it is
	// being stored, NoticeStored once it is; a poll and the exit feed
	// settle through it which of them removes it.
	Notice string `json:"notice,omitempty"`
	// LostReason says why a lost session is lost; LostTold that its
	// agent was sent the exec.lost event.
	LostReason string `json:"lostReason,omitempty"`
	LostTold   bool   `json:"lostTold,omitempty"`
	// RunID is the approval of an approval-gated run.
	RunID string `json:"runId,omitempty"`
	// EndedAt is when the session became finished or lost (unix ms):
	// Sweep forgets the record once its host has forgotten the session.
	EndedAt int64 `json:"endedAt,omitempty"`
}

// Ended marks r finished or lost (state) now, keeping an earlier end
// time. It reports whether r changed.
func (r *Record) Ended(state string, now time.Time) bool {
	changed := r.State != state
	r.State = state
	if r.EndedAt == 0 {
		r.EndedAt, changed = now.UnixMilli(), true
	}
	return changed
}

type entry struct {
	rec      Record
	revision uint64
	// added is the cache's count of added records when this one came:
	// the records a ScopeHosts call saw are those added up to its Added.
	added uint64
}

// Index is the session index and its cache. Its methods are safe for
// concurrent use.
type Index struct {
	js       jetstream.JetStream
	prefix   string
	replicas int
	log      *slog.Logger
	watch    *bus.ServerWatch

	kv      atomic.Pointer[jetstream.KeyValue]
	failure atomic.Pointer[error]
	// created is when the bucket's stream was created (unix ns), 0 until
	// known: a bucket created anew after the store was lost numbers its
	// revisions from 1 again (forgetBucket).
	created atomic.Int64

	loaded     chan struct{} // closed once the cache holds the bucket
	loadedOnce sync.Once

	mu    sync.RWMutex
	cache map[string]entry // session id → record
	added uint64           // records ever added to cache (entry.added)
	// reserved holds the reservations in the bucket, of every gateway
	// (id → the reservation record).
	reserved map[string]entry

	pool pool // this gateway's reservations
}

// New returns the index of the deployment with subject prefix prefix,
// its bucket kept with replicas replicas. Run follows the bucket into the
// cache; the other methods open (or create) the bucket on first use.
// watch, when not nil, makes an operation fail within seconds of the NATS
// server going silent (at once while it is), not at Timeout.
func New(js jetstream.JetStream, prefix string, replicas int, log *slog.Logger, watch *bus.ServerWatch) *Index {
	return &Index{js: js, prefix: prefix, replicas: replicas, log: log.With("component", "index"), watch: watch, cache: map[string]entry{}, reserved: map[string]entry{}, loaded: make(chan struct{}),
		pool: pool{kick: make(chan struct{}, 1)}}
}

// watched derives the context of one operation that reaches the bucket;
// cause replaces an error of it by the server's silence, when that is
// what ended it.
func (ix *Index) watched(ctx context.Context) (context.Context, context.CancelFunc) {
	return ix.watch.Watch(ctx)
}

func cause(ctx context.Context, err error) error {
	if c := context.Cause(ctx); err != nil && errors.Is(c, bus.ErrServerSilent) {
		return c
	}
	return err
}

// errIndexUnavailable: the bucket could not be reached.
func errIndexUnavailable(err error) error {
	return &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true,
		Message: fmt.Sprintf("the session index is not available (JetStream: %v); nothing was started. Retry.", err)}
}

// bucket returns the index bucket, opening (or creating) it when needed.
func (ix *Index) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	if p := ix.kv.Load(); p != nil {
		return *p, nil
	}
	kv, err := bus.OpenKeyValue(ctx, ix.js, ix.prefix, ix.replicas, bus.StreamNamesFor(ix.prefix).Sessions)
	if err != nil {
		ix.fail(err)
		return nil, err
	}
	if st, err := kv.Status(ctx); err == nil {
		if bs, ok := st.(*jetstream.KeyValueBucketStatus); ok {
			c := bs.StreamInfo().Created.UnixNano()
			if old := ix.created.Swap(c); old != 0 && old != c {
				ix.forgetBucket()
			}
		}
	}
	ix.kv.Store(&kv)
	return kv, nil
}

// forgetBucket drops what the cache knows of a bucket that is gone, now
// that it was created anew: the revisions of its records (the new
// bucket's start from 1 again, and a cached higher one would make the
// cache ignore every later write of the same key), the reservations of
// every gateway and the pool's own (their keys are gone, so they no
// longer keep their ids from other gateways). The records themselves stay
// cached: they still route calls to the sessions their hosts run.
func (ix *Index) forgetBucket() {
	ix.log.Warn("session index bucket created anew; cached revisions and reservations dropped")
	ix.mu.Lock()
	for k, e := range ix.cache {
		e.revision = 0
		ix.cache[k] = e
	}
	clear(ix.reserved)
	ix.mu.Unlock()
	p := &ix.pool
	p.mu.Lock()
	p.free = nil
	p.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

func (ix *Index) fail(err error) {
	if err == nil {
		ix.failure.Store(nil)
		return
	}
	if errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) {
		// The bucket's stream is gone (a wiped store answers its
		// requests with no responders): open, and so create, it again
		// on next use.
		if ix.kv.Swap(nil) != nil {
			ix.log.Warn("session index bucket lost; creating it again on next use", "err", err)
		}
	}
	e := fmt.Errorf("session index: %w", err)
	ix.failure.Store(&e)
}

// Healthy returns the last failure to reach the bucket, or nil.
func (ix *Index) Healthy() error {
	if p := ix.failure.Load(); p != nil {
		return *p
	}
	return nil
}

// Run follows the bucket into the cache until ctx ends, again after a
// failure (the store lost and back).
func (ix *Index) Run(ctx context.Context) {
	bus.RetryForever(ctx, ix.log, "session index watch stopped", func(ctx context.Context) error {
		kv, err := ix.bucket(ctx)
		if err != nil {
			return err
		}
		err = bus.WatchKeyValue(ctx, kv, ">", func() {
			ix.fail(nil)
			ix.loadedOnce.Do(func() { close(ix.loaded) })
		}, ix.apply)
		ix.kv.Store(nil)
		return err
	})
}

// apply takes one bucket change into the cache (newer revisions only).
func (ix *Index) apply(e jetstream.KeyValueEntry) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.applyLocked(e.Key(), e.Revision(), e.Operation() != jetstream.KeyValuePut, e.Value(), nil)
}

// applyLocked takes revision rev of key into the cache or the
// reservations: a delete when deleted, else the record rec (decoded
// from value when nil). Caller holds ix.mu.
func (ix *Index) applyLocked(key string, rev uint64, deleted bool, value []byte, rec *Record) {
	cur, had := ix.cache[key]
	if had && cur.revision >= rev {
		return
	}
	if cur, ok := ix.reserved[key]; ok && cur.revision >= rev {
		return
	}
	delete(ix.cache, key)
	delete(ix.reserved, key)
	if deleted {
		return
	}
	if rec == nil {
		rec = new(Record)
		if err := json.Unmarshal(value, rec); err != nil {
			ix.log.Warn("malformed index entry ignored", "sessionId", key, "err", err)
			return
		}
	}
	if rec.State == StateReserved {
		ix.reserved[key] = entry{rec: *rec, revision: rev}
		return
	}
	added := cur.added
	if !had {
		ix.added++
		added = ix.added
	}
	ix.cache[key] = entry{rec: *rec, revision: rev, added: added}
}

// Allocate picks a fresh session id for rec, unique across the fleet: the
// first readable slug whose key can be created.
func (ix *Index) Allocate(ctx context.Context, rec Record) (string, error) {
	id, _, err := ix.createRecord(ctx, rec)
	if err != nil {
		return "", errIndexUnavailable(err)
	}
	return id, nil
}

// Await waits until the cache was loaded from the bucket once (bounded
// by Timeout), so that a gateway that just started lists the
// sessions it has not seen being started.
func (ix *Index) Await(ctx context.Context) {
	t := time.NewTimer(Timeout)
	defer t.Stop()
	select {
	case <-ix.loaded:
	case <-ctx.Done():
	case <-t.C:
	}
}

// cached reports whether id is known to be taken: a session or a
// reservation.
func (ix *Index) cached(id string) bool {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	_, ok := ix.cache[id]
	_, r := ix.reserved[id]
	return ok || r
}

// Lookup returns the record of id: from the cache, else (an entry another
// gateway wrote an instant ago) from the bucket.
func (ix *Index) Lookup(ctx context.Context, id string) (Record, bool) {
	ix.mu.RLock()
	e, ok := ix.cache[id]
	ix.mu.RUnlock()
	if ok {
		return e.rec, true
	}
	kve, ok := ix.get(ctx, id)
	if !ok {
		return Record{}, false
	}
	ix.apply(kve)
	ix.mu.RLock()
	e, ok = ix.cache[id]
	ix.mu.RUnlock()
	return e.rec, ok
}

// get reads the entry of id from the bucket.
func (ix *Index) get(ctx context.Context, id string) (jetstream.KeyValueEntry, bool) {
	ctx, release := ix.watched(ctx)
	defer release()
	kv, err := ix.bucket(ctx)
	if err != nil {
		return nil, false
	}
	actx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	e, err := kv.Get(actx, id)
	return e, err == nil
}

// Read returns the record of id as the bucket has it now (not the cache).
func (ix *Index) Read(ctx context.Context, id string) (Record, bool) {
	e, ok := ix.get(ctx, id)
	if !ok {
		return Record{}, false
	}
	var rec Record
	if json.Unmarshal(e.Value(), &rec) != nil {
		return Record{}, false
	}
	ix.apply(e)
	if rec.State == StateReserved {
		return Record{}, false // no session (yet)
	}
	return rec, true
}

// Update changes the record of id by compare-and-set; fn returns false
// for no change. A missing record is left missing. The first attempt
// starts from the cached record and its revision (no read of the key);
// fn may be called more than once, each time on the record as then known.
func (ix *Index) Update(ctx context.Context, id string, fn func(*Record) bool) error {
	ctx, release := ix.watched(ctx)
	defer release()
	kv, err := ix.bucket(ctx)
	if err != nil {
		return cause(ctx, err)
	}
	done, err := ix.updateCached(ctx, kv, id, fn)
	if done {
		return nil
	}
	var rec Record
	var rev uint64
	var changed bool
	if err == nil {
		rec, rev, changed, err = bus.UpdateKey(ctx, kv, id, func(r *Record, exists bool) bool {
			return exists && r.State != StateReserved && fn(r)
		})
	}
	if err != nil {
		err = cause(ctx, err)
		if !errors.Is(err, bus.ErrContended) {
			ix.fail(err)
		}
		return fmt.Errorf("session index: %w", err)
	}
	if changed {
		ix.mu.Lock()
		ix.applyLocked(id, rev, false, nil, &rec)
		ix.mu.Unlock()
	}
	return nil
}

// updateCached tries Update's change on the cached record of id, written
// by compare-and-set at the cached revision: when the cache is current,
// as it is for the exit of a session this gateway started, that saves
// reading the key first. done reports whether the change was written;
// when it was not and err is nil (no entry, no change to the cached
// record, a newer revision in the bucket) Update reads the key and tries
// again, so fn may be called twice (as on any contended write).
func (ix *Index) updateCached(ctx context.Context, kv jetstream.KeyValue, id string, fn func(*Record) bool) (done bool, err error) {
	ix.mu.RLock()
	e, ok := ix.cache[id]
	ix.mu.RUnlock()
	if !ok || e.revision == 0 {
		return false, nil
	}
	rec := e.rec
	if !fn(&rec) {
		return false, nil // the bucket may hold a newer record that fn would change
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return false, err
	}
	actx, cancel := context.WithTimeout(ctx, Timeout)
	rev, err := kv.Update(actx, id, b, e.revision)
	cancel()
	switch {
	case bus.IsWrongLastSequence(err) || errors.Is(err, jetstream.ErrKeyExists):
		return false, nil
	case err != nil:
		return false, err
	}
	ix.mu.Lock()
	ix.applyLocked(id, rev, false, nil, &rec)
	ix.mu.Unlock()
	return true, nil
}

// Remove forgets id.
func (ix *Index) Remove(ctx context.Context, id string) {
	if err := ix.deleteKey(ctx, id); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		ix.log.Debug("index delete", "sessionId", id, "err", err)
	}
	ix.mu.Lock()
	delete(ix.cache, id)
	delete(ix.reserved, id)
	ix.mu.Unlock()
}

// sweepParallel bounds the deletes a Sweep has in flight.
const sweepParallel = 16

// Retention is how long hosts keep the sessions that ended: a finished
// session for TTL and only the MaxFinished newest of a host (the session
// core's job TTL and finished-session cap).
type Retention struct {
	TTL         time.Duration
	MaxFinished int
}

// Sweep forgets the sessions their hosts have forgotten: a host keeps a
// finished session for the job TTL and no more than its newest
// MaxFinished, and a record no agent ever polls or removes would
// otherwise stay in the bucket and in every gateway's cache for good. A
// lost session's record (its host never had it) goes TTL after it was
// marked lost. A record changed since it was read is left for the next
// sweep (each delete is at the revision read), so gateways that sweep at
// once delete each record once. Ended records without an end time
// (written before there was one) are given now, and go a TTL later. It
// returns how many records it removed.
func (ix *Index) Sweep(ctx context.Context, now time.Time, r Retention) (int, error) {
	type ended struct {
		id      string
		rev     uint64
		endedAt int64
	}
	type hostKey struct{ kind, id string }
	cutoff := now.Add(-r.TTL).UnixMilli()
	var gone []ended
	var undated []string
	finished := map[hostKey][]ended{}
	ix.mu.RLock()
	for id, e := range ix.cache {
		rec := &e.rec
		switch {
		case rec.State != StateFinished && rec.State != StateLost:
		case rec.EndedAt == 0:
			undated = append(undated, id)
		case rec.EndedAt < cutoff:
			gone = append(gone, ended{id, e.revision, rec.EndedAt})
		case rec.State == StateFinished && r.MaxFinished > 0:
			k := hostKey{rec.Host, rec.HostID}
			finished[k] = append(finished[k], ended{id, e.revision, rec.EndedAt})
		}
	}
	ix.mu.RUnlock()
	for _, f := range finished {
		if len(f) > r.MaxFinished {
			slices.SortFunc(f, func(a, b ended) int { return cmp.Compare(b.endedAt, a.endedAt) })
			gone = append(gone, f[r.MaxFinished:]...)
		}
	}
	// The deletes go sweepParallel at a time: one after another, each a
	// JetStream round trip, fell behind the sessions a loaded gateway
	// ends.
	var (
		mu      sync.Mutex
		errs    *multierror.Error
		removed int
		g       errgroup.Group
	)
	g.SetLimit(sweepParallel)
	for _, o := range gone {
		if ctx.Err() != nil {
			break
		}
		g.Go(func() error {
			err := ix.deleteKey(ctx, o.id, jetstream.LastRevision(o.rev))
			if err == nil {
				ix.mu.Lock()
				if e, ok := ix.cache[o.id]; ok && e.revision == o.rev {
					delete(ix.cache, o.id)
				}
				ix.mu.Unlock()
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				removed++
			case bus.IsWrongLastSequence(err) || errors.Is(err, jetstream.ErrKeyNotFound):
				// Changed or gone meanwhile: the next sweep sees it as it is.
			default:
				errs = multierror.Append(errs, fmt.Errorf("index: forget %s: %w", o.id, err))
			}
			return nil
		})
	}
	_ = g.Wait()
	if ctx.Err() != nil {
		return removed, multierror.Append(errs, ctx.Err()).ErrorOrNil()
	}
	for _, id := range undated {
		if ctx.Err() != nil {
			return removed, multierror.Append(errs, ctx.Err()).ErrorOrNil()
		}
		if err := ix.Update(ctx, id, func(rec *Record) bool {
			if rec.State != StateFinished && rec.State != StateLost {
				return false
			}
			return rec.Ended(rec.State, now)
		}); err != nil {
			errs = multierror.Append(errs, err)
		}
	}
	return removed, errs.ErrorOrNil()
}

// markerTTL is how long the marker of a deleted record stays in the
// bucket: long enough for every gateway's watch to take the deletion,
// after which the stream keeps nothing of the session (a plain delete
// marker would stay for good, one per session ever removed).
const markerTTL = time.Hour

// deleteKey deletes key id from the bucket, under opts (a revision it
// must be at), leaving a marker that expires after markerTTL.
func (ix *Index) deleteKey(ctx context.Context, id string, opts ...jetstream.KVDeleteOpt) error {
	ctx, release := ix.watched(ctx)
	defer release()
	kv, err := ix.bucket(ctx)
	if err != nil {
		return err
	}
	actx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	return kv.Purge(actx, id, append(opts, jetstream.PurgeTTL(markerTTL))...)
}

// Scope returns the records of sessionKey whose host is matched by want.
func (ix *Index) Scope(sessionKey string, want func(Record) bool) map[string]Record {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	out := map[string]Record{}
	for id, e := range ix.cache {
		if e.rec.SessionKey == sessionKey && want(e.rec) {
			out[id] = e.rec
		}
	}
	return out
}

// ScopeHost is one host's share of the records of a sessionKey, as
// ScopeHosts saw them.
type ScopeHost struct {
	Kind   string // HostGateway or HostNode
	HostID string
	// Any is one of its records.
	Any Record
	// Count is the number of its records.
	Count int
	// Added is the cache's count of added records at the time: the
	// records seen are those of the host added up to it (Held, Records).
	Added uint64
}

// ScopeHosts returns the hosts of the records of sessionKey that want
// accepts, with how many each holds: what Scope tells, without a copy of
// every record or a set of their ids (a process list of ten thousand
// sessions paid that on every call). Held and Records tell the records
// apart later.
func (ix *Index) ScopeHosts(sessionKey string, want func(Record) bool) []ScopeHost {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	var out []ScopeHost
	last := -1 // out's index of the host of the record before
	for _, e := range ix.cache {
		r := &e.rec
		if r.SessionKey != sessionKey || !want(e.rec) {
			continue
		}
		if last < 0 || out[last].Kind != r.Host || out[last].HostID != r.HostID {
			last = slices.IndexFunc(out, func(h ScopeHost) bool { return h.Kind == r.Host && h.HostID == r.HostID })
			if last < 0 {
				last = len(out)
				out = append(out, ScopeHost{Kind: r.Host, HostID: r.HostID, Any: e.rec, Added: ix.added})
			}
		}
		out[last].Count++
	}
	return out
}

// holdsLocked reports whether e is one of the records h saw. Caller
// holds ix.mu.
func (h *ScopeHost) holdsLocked(e *entry) bool {
	return e.added <= h.Added && e.rec.SessionKey == h.Any.SessionKey && e.rec.Host == h.Kind && e.rec.HostID == h.HostID
}

// Held returns how many of ids are records h saw that the cache still
// holds.
func (ix *Index) Held(h ScopeHost, ids iter.Seq[string]) int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	n := 0
	for id := range ids {
		if e, ok := ix.cache[id]; ok && h.holdsLocked(&e) {
			n++
		}
	}
	return n
}

// Records returns the records h saw that the cache still holds, as they
// are now, that want accepts (nil: all). want is called with the index
// locked: it must not call the Index.
func (ix *Index) Records(h ScopeHost, want func(id string, r *Record) bool) map[string]Record {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	out := map[string]Record{}
	for id, e := range ix.cache {
		if h.holdsLocked(&e) && (want == nil || want(id, &e.rec)) {
			out[id] = e.rec
		}
	}
	return out
}

// OfHost returns the ids of the records held by host hostID.
func (ix *Index) OfHost(kind, hostID string) []string {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	var out []string
	for id, e := range ix.cache {
		if e.rec.Host == kind && e.rec.HostID == hostID {
			out = append(out, id)
		}
	}
	return out
}

// KeyCount is how many records of the index one sessionKey holds.
type KeyCount struct {
	SessionKey string `json:"sessionKey"`
	Sessions   int    `json:"sessions"`
	Running    int    `json:"running"`
}

// Keys returns the sessionKeys of the records, with their counts, the
// ones with the most records first (then by name).
func (ix *Index) Keys() []KeyCount {
	ix.mu.RLock()
	counts := map[string]*KeyCount{}
	for _, e := range ix.cache {
		c := counts[e.rec.SessionKey]
		if c == nil {
			c = &KeyCount{SessionKey: e.rec.SessionKey}
			counts[e.rec.SessionKey] = c
		}
		c.Sessions++
		if e.rec.State == StateRunning {
			c.Running++
		}
	}
	ix.mu.RUnlock()
	out := make([]KeyCount, 0, len(counts))
	for _, c := range counts {
		out = append(out, *c)
	}
	slices.SortFunc(out, func(a, b KeyCount) int {
		if a.Sessions != b.Sessions {
			return b.Sessions - a.Sessions
		}
		return strings.Compare(a.SessionKey, b.SessionKey)
	})
	return out
}
