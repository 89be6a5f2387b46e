package index

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/session"
)

// leaderlessWait bounds how long a write is tried again while the
// bucket's stream answers "no responders": a clustered stream does while
// it elects a leader (a server restarted), for a moment; a stream that
// is gone keeps answering so and is then reported lost (Index.fail).
const leaderlessWait = 5 * time.Second

// errTaken: a reserved id that another session holds now.
var errTaken = errors.New("session index: reserved id taken")

// whileLeaderless runs write, again while its stream has no leader,
// for leaderlessWait at most. Nothing was stored by a write that got no
// responders, so it is safe to repeat. gone, when set, is asked after
// each such answer whether the stream no longer exists at all (deleted,
// a wiped store): then no leader will come, and the write's error is
// returned at once so that the bucket is created anew without the wait.
func whileLeaderless(ctx context.Context, gone func(context.Context) bool, write func() error) error {
	deadline := time.Now().Add(leaderlessWait)
	for pause := 50 * time.Millisecond; ; pause = min(2*pause, 500*time.Millisecond) {
		err := write()
		if !errors.Is(err, jetstream.ErrNoStreamResponse) && !errors.Is(err, nats.ErrNoResponders) || time.Now().Add(pause).After(deadline) {
			return err
		}
		if gone != nil && gone(ctx) {
			return err
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// streamGone returns whileLeaderless's check for kv's stream: true only
// when JetStream answers that the stream does not exist. A leaderless
// clustered stream is still known to the meta leader, and an unreachable
// JetStream gives another error: both are waited for.
func (ix *Index) streamGone(kv jetstream.KeyValue) func(context.Context) bool {
	return func(ctx context.Context) bool {
		actx, cancel := context.WithTimeout(ctx, Timeout)
		defer cancel()
		_, err := ix.js.Stream(actx, bus.KeyValueStream(kv.Bucket()))
		return errors.Is(err, jetstream.ErrStreamNotFound)
	}
}

// Pool sizes: the pool is topped up to poolFill in the background; ids
// given back by foreground runs are kept up to poolKeep (so a burst of
// concurrent calls finds one each), and deleted beyond.
const (
	poolFill = 16
	poolKeep = 256
)

// Reservation is a session id whose key a gateway created ahead of a
// call, holding a record of StateReserved: the id is the fleet's, but no
// session's yet. Take hands one out; Commit makes it a session's, Release
// gives it back.
type Reservation struct {
	ID  string
	rev uint64 // the revision of the reservation record
}

// pool is this gateway's reservations not handed out.
type pool struct {
	mu       sync.Mutex
	owner    string // the gateway id; "" until Reserve runs
	instance string
	free     []Reservation // oldest first: an id given back waits its turn
	closed   bool
	kick     chan struct{} // top up
}

// record is the record of a reservation of the pool's gateway.
func (p *pool) record() Record {
	return Record{Host: HostGateway, HostID: p.owner, Instance: p.instance, State: StateReserved,
		StartedAt: time.Now().UnixMilli()}
}

// Reserver makes the index hand out reservations of gateway owner (its
// id; instance is its run) and returns the loop that keeps its pool
// until ctx ends, then deletes the reservations not handed out. The loop
// first deletes what an earlier run of the same gateway left (a crash),
// once the cache holds the bucket.
func (ix *Index) Reserver(owner, instance string) func(ctx context.Context) {
	p := &ix.pool
	p.mu.Lock()
	p.owner, p.instance = owner, instance
	p.mu.Unlock()
	return ix.reserve
}

func (ix *Index) reserve(ctx context.Context) {
	p := &ix.pool
	p.mu.Lock()
	owner, instance := p.owner, p.instance
	p.mu.Unlock()
	defer ix.closePool(ctx)
	select {
	case <-ix.loaded:
	case <-ctx.Done():
		return
	}
	ix.DropReservations(ctx, owner, instance)
	for {
		ix.topUp(ctx)
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		}
	}
}

// topUp creates reservations until the pool holds poolFill.
func (ix *Index) topUp(ctx context.Context) {
	p := &ix.pool
	for ctx.Err() == nil {
		p.mu.Lock()
		n, closed := len(p.free), p.closed
		p.mu.Unlock()
		if n >= poolFill || closed {
			return
		}
		r, err := ix.create(ctx)
		if err != nil {
			ix.log.Debug("session id reservation", "err", err)
			return // the next Take tries again
		}
		if !ix.keep(r) {
			ix.drop(ctx, r)
		}
	}
}

// keep puts r back into the pool; false when the pool is full or closed.
func (ix *Index) keep(r Reservation) bool {
	p := &ix.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.free) >= poolKeep {
		return false
	}
	p.free = append(p.free, r)
	return true
}

// closePool deletes the reservations not handed out; those handed out
// are deleted when given back.
func (ix *Index) closePool(ctx context.Context) {
	p := &ix.pool
	p.mu.Lock()
	free := p.free
	p.free, p.closed = nil, true
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), Timeout)
	defer cancel()
	for _, r := range free {
		ix.drop(ctx, r)
	}
}

// create creates a reservation under a fresh id, unique across the fleet.
func (ix *Index) create(ctx context.Context) (Reservation, error) {
	p := &ix.pool
	p.mu.Lock()
	rec := p.record()
	p.mu.Unlock()
	if rec.HostID == "" {
		return Reservation{}, errors.New("session index: no reservations before Reserver")
	}
	id, rev, err := ix.createRecord(ctx, rec)
	if err != nil {
		return Reservation{}, err
	}
	return Reservation{ID: id, rev: rev}, nil
}

// Take hands out a reservation: from the pool, else (the pool is empty or
// not running) one created now.
func (ix *Index) Take(ctx context.Context) (Reservation, error) {
	p := &ix.pool
	p.mu.Lock()
	var r Reservation
	ok := len(p.free) > 0
	if ok {
		r = p.free[0]
		p.free[0] = Reservation{}
		p.free = p.free[1:]
	}
	low := len(p.free) < poolFill/2
	p.mu.Unlock()
	if low {
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}
	if ok {
		return r, nil
	}
	r, err := ix.create(ctx)
	if err != nil {
		return Reservation{}, errIndexUnavailable(err)
	}
	return r, nil
}

// Commit makes reservation r the session of rec: its record replaces the
// reservation's by compare-and-set, or is created when the reservation
// was deleted meanwhile (a gateway that took this one for dead). The id
// is then a session's as if Allocate had created it.
func (ix *Index) Commit(ctx context.Context, r Reservation, rec Record) error {
	ctx, release := ix.watched(ctx)
	defer release()
	kv, err := ix.bucket(ctx)
	if err != nil {
		return errIndexUnavailable(cause(ctx, err))
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("session index: %w", err)
	}
	var rev uint64
	err = whileLeaderless(ctx, ix.streamGone(kv), func() error {
		actx, cancel := context.WithTimeout(ctx, Timeout)
		defer cancel()
		var err error
		rev, err = kv.Update(actx, r.ID, b, r.rev)
		if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyNotFound) {
			rev, err = kv.Create(actx, r.ID, b)
			if errors.Is(err, jetstream.ErrKeyExists) {
				return errTaken
			}
		}
		return err
	})
	if errors.Is(err, errTaken) {
		return fmt.Errorf("session index: id %s was reserved and is taken by another session", r.ID)
	}
	if err != nil {
		err = cause(ctx, err)
		ix.fail(err)
		return errIndexUnavailable(err)
	}
	ix.fail(nil)
	ix.mu.Lock()
	ix.applyLocked(r.ID, rev, false, nil, &rec)
	ix.mu.Unlock()
	return nil
}

// Release gives reservation r back: to the pool, for a later call (no
// session ever had its id, or the session of a foreground run is gone
// from its host), or deleted when the pool is full or stopped.
func (ix *Index) Release(ctx context.Context, r Reservation) {
	if !ix.keep(r) {
		// Also when ctx ended (a gateway shutting down gives back what
		// its last calls held).
		ix.drop(context.WithoutCancel(ctx), r)
	}
}

// Drop deletes reservation r (its id was used in a way that makes it
// unfit for another call).
func (ix *Index) Drop(ctx context.Context, r Reservation) { ix.drop(ctx, r) }

// drop deletes reservation r, only while it is one (at its revision).
func (ix *Index) drop(ctx context.Context, r Reservation) {
	if err := ix.deleteKey(ctx, r.ID, jetstream.LastRevision(r.rev)); err != nil {
		ix.log.Debug("reservation delete", "sessionId", r.ID, "err", err)
		return
	}
	ix.mu.Lock()
	if cur, ok := ix.reserved[r.ID]; ok && cur.revision <= r.rev {
		delete(ix.reserved, r.ID)
	}
	ix.mu.Unlock()
}

// Reserved reports whether id is a reservation (of any gateway): a call
// may be about to make it a session, so an event about it is early, not
// wrong. It reads the bucket when the cache does not know the id.
func (ix *Index) Reserved(ctx context.Context, id string) bool {
	ix.mu.RLock()
	_, r := ix.reserved[id]
	_, s := ix.cache[id]
	ix.mu.RUnlock()
	if r || s {
		return r
	}
	e, ok := ix.get(ctx, id)
	if !ok {
		return false
	}
	ix.apply(e)
	ix.mu.RLock()
	_, r = ix.reserved[id]
	ix.mu.RUnlock()
	return r
}

// DropReservations deletes the reservations of gateway owner, except
// those of its run keep ("" for none): what a gateway that is gone, or
// an earlier run of this one, left.
func (ix *Index) DropReservations(ctx context.Context, owner, keep string) {
	ix.mu.RLock()
	var drop []Reservation
	for id, e := range ix.reserved {
		if e.rec.HostID == owner && (keep == "" || e.rec.Instance != keep) {
			drop = append(drop, Reservation{ID: id, rev: e.revision})
		}
	}
	ix.mu.RUnlock()
	for _, r := range drop {
		ix.drop(ctx, r)
	}
	if len(drop) > 0 {
		ix.log.Debug("reservations of a gone gateway run deleted", "gateway", owner, "count", len(drop))
	}
}

// createRecord creates rec under a fresh id, the first readable slug
// whose key can be created, and returns the id and revision.
func (ix *Index) createRecord(ctx context.Context, rec Record) (string, uint64, error) {
	ctx, release := ix.watched(ctx)
	defer release()
	kv, err := ix.bucket(ctx)
	if err != nil {
		return "", 0, cause(ctx, err)
	}
	b, _ := json.Marshal(rec)
	var lastErr error
	var rev uint64
	gone := ix.streamGone(kv)
	id := session.NewSessionID(func(candidate string) bool {
		if lastErr != nil {
			return false // stop trying; the error is reported below
		}
		if ix.cached(candidate) {
			return true
		}
		var r uint64
		err := whileLeaderless(ctx, gone, func() error {
			actx, cancel := context.WithTimeout(ctx, Timeout)
			defer cancel()
			var err error
			r, err = kv.Create(actx, candidate, b)
			return err
		})
		switch {
		case err == nil:
			rev = r
			return false
		case errors.Is(err, jetstream.ErrKeyExists):
			return true
		default:
			lastErr = err
			return false
		}
	})
	if lastErr == nil && rev == 0 {
		// The fallback id of NewSessionID was never tried against the
		// bucket (every candidate was taken): create it now.
		actx, cancel := context.WithTimeout(ctx, Timeout)
		rev, lastErr = kv.Create(actx, id, b)
		cancel()
	}
	if lastErr != nil {
		lastErr = cause(ctx, lastErr)
		ix.fail(lastErr)
		return "", 0, lastErr
	}
	ix.fail(nil)
	ix.mu.Lock()
	ix.applyLocked(id, rev, false, nil, &rec)
	ix.mu.Unlock()
	return id, rev, nil
}
