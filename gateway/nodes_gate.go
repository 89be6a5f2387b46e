package gateway

import (
	"context"
	"sync"
	"time"
)

// reloadWait bounds how long a configuration reload of the embedded
// server waits for node requests in flight.
const reloadWait = 15 * time.Second

// reloadGate keeps node requests and reloads of the embedded server's
// users apart.
//
// Why: a node answers the gateway under NATS "allow_responses"
// permissions, which the server tracks per request it delivered. Every
// authorization reload re-registers each connected client's permissions
// and starts that tracking afresh (nats-server client.setPermissions), so
// the answer to a request that was in flight during a reload is refused as
// a permissions violation and the gateway waits for nothing until its
// deadline. Join codes, joins, admissions and rejections reload; the gate
// makes a reload wait (up to reloadWait) until no request is in flight, and
// makes new requests wait while it runs. A request still in flight after
// reloadWait may lose its answer; exec starts then retry with the same
// idempotency key (see nodeRouter.Exec).
type reloadGate struct {
	// ready, when set, is closed once the gateway's JetStream assets are
	// set up: nats-server reads its options without a lock while it
	// creates streams, so a user reload must not overlap that (a data
	// race inside the server).
	ready     chan struct{}
	readyOnce sync.Once
	mu        sync.Mutex
	inflight  int
	reloading bool
	epoch     uint64        // reloads done
	changed   chan struct{} // closed and replaced on every state change
}

func newReloadGate() *reloadGate {
	return &reloadGate{changed: make(chan struct{}), ready: make(chan struct{})}
}

// markReady lets reloads run; it may be called more than once.
func (g *reloadGate) markReady() { g.readyOnce.Do(func() { close(g.ready) }) }

// reloadReadyWait bounds how long a reload waits for the JetStream setup.
const reloadReadyWait = 30 * time.Second

// notifyLocked wakes every waiter. g.mu is held.
func (g *reloadGate) notifyLocked() {
	close(g.changed)
	g.changed = make(chan struct{})
}

// enter registers a request, waiting while a reload runs. It returns the
// reload epoch at entry, or ctx's error.
func (g *reloadGate) enter(ctx context.Context) (uint64, error) {
	if err := g.lockIdle(ctx); err != nil {
		return 0, err
	}
	g.inflight++
	epoch := g.epoch
	g.mu.Unlock()
	return epoch, nil
}

// lockIdle locks g.mu once no reload runs; on ctx's end it returns ctx's
// error with g.mu unlocked.
func (g *reloadGate) lockIdle(ctx context.Context) error {
	g.mu.Lock()
	for g.reloading {
		ch := g.changed
		g.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		g.mu.Lock()
	}
	return nil
}

// exit ends a request registered by enter.
func (g *reloadGate) exit() {
	g.mu.Lock()
	g.inflight--
	if g.inflight == 0 && g.reloading {
		g.notifyLocked()
	}
	g.mu.Unlock()
}

// current returns the reload epoch.
func (g *reloadGate) current() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.epoch
}

// reloaded reports whether a reload happened since epoch.
func (g *reloadGate) reloaded(epoch uint64) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.epoch != epoch
}

// reload runs f (a reload of the server's users) once no request is in
// flight, or after reloadWait (or when ctx ends) regardless. Reloads are
// serialised; requests wait while f runs.
func (g *reloadGate) reload(ctx context.Context, f func() error) error {
	if g.ready != nil {
		t := time.NewTimer(reloadReadyWait)
		select {
		case <-g.ready:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
		t.Stop()
	}
	if err := g.lockIdle(ctx); err != nil {
		return err
	}
	g.reloading = true
	deadline := time.NewTimer(reloadWait)
	defer deadline.Stop()
wait:
	for g.inflight > 0 {
		ch := g.changed
		g.mu.Unlock()
		select {
		case <-ch:
		case <-deadline.C:
			g.mu.Lock()
			break wait
		case <-ctx.Done():
			g.mu.Lock()
			break wait
		}
		g.mu.Lock()
	}
	g.mu.Unlock()
	err := f()
	g.mu.Lock()
	g.reloading = false
	g.epoch++
	g.notifyLocked()
	g.mu.Unlock()
	return err
}
