package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// ServerWatch defaults.
const (
	// DefaultServerPingInterval is how often a ServerWatch pings the
	// server while calls wait on it (or it is silent).
	DefaultServerPingInterval = time.Second
	// DefaultServerIdlePingInterval is how often it pings a server
	// nothing waits on: an idle daemon wakes only for that, and the
	// first call or health check after a longer pause pings at once.
	DefaultServerIdlePingInterval = 30 * time.Second
	// DefaultServerPingTimeout is how long a ping may wait for the
	// server's answer before the server counts as hung.
	DefaultServerPingTimeout = 2 * time.Second
)

// ErrServerSilent is the cause of a call given up because the NATS server
// stopped answering pings on a connection that still looks connected (a
// frozen server process, a link that silently drops everything): the
// client library would notice only after minutes of missed pings.
var ErrServerSilent = errors.New("the NATS server stopped answering")

// ServerSilentError is ErrServerSilent with how long the ping waited.
type ServerSilentError struct {
	// Timeout is how long the unanswered ping waited.
	Timeout time.Duration
}

func (e *ServerSilentError) Error() string {
	return fmt.Sprintf("the NATS server did not answer a ping within %s (frozen or cut off)", e.Timeout)
}

// Is makes a ServerSilentError match ErrServerSilent.
func (e *ServerSilentError) Is(target error) bool { return target == ErrServerSilent }

// ServerWatchOptions configure a ServerWatch; zero durations take the
// defaults.
type ServerWatchOptions struct {
	Logger *slog.Logger
	// Interval is the pause between pings while calls wait on the server
	// or it is silent.
	Interval time.Duration
	// IdleInterval is the pause between pings while nothing waits.
	IdleInterval time.Duration
	// Timeout is how long a ping may wait for its answer.
	Timeout time.Duration
}

// ServerWatch checks that the NATS server of one connection answers: it
// pings it (a PING/PONG round trip, nc.FlushTimeout) every Interval while
// calls wait on it, every IdleInterval while nothing does, and at once
// when a call (Watch) or a health check (Healthy) comes more than
// Interval after the last ping; a ping unanswered for Timeout marks the
// server silent until one is answered again. Calls that wait on the
// server derive their context from Watch, so they fail within seconds of
// the server going silent instead of at their own deadline. A connection
// that is not connected is left to the client library (its calls fail at
// once as not connected). Build it with NewServerWatch and run Run.
type ServerWatch struct {
	nc   *nats.Conn
	log  *slog.Logger
	opts ServerWatchOptions

	// kick asks Run to ping now when the last ping is older than
	// Interval (a call or a health check came).
	kick chan struct{}

	mu       sync.Mutex
	silent   error // non-nil while the server is silent
	since    time.Time
	lastPing time.Time // when the last ping was sent
	// due is when Run looks again (zero while it pings): a call that
	// needs an earlier look kicks it, others leave it asleep.
	due time.Time
	// dueIdle says due was worked out with no call waiting (IdleInterval
	// after the last ping): the first call to wait must kick Run.
	dueIdle bool
	asked   bool // a ping is wanted now (wake)
	waiters map[*serverWaiter]struct{}
	kicks   int // kicks sent to Run (tests)
}

type serverWaiter struct{ cancel context.CancelCauseFunc }

// NewServerWatch returns a watch of nc's server.
func NewServerWatch(nc *nats.Conn, opts ServerWatchOptions) *ServerWatch {
	if opts.Interval <= 0 {
		opts.Interval = DefaultServerPingInterval
	}
	if opts.IdleInterval <= 0 {
		opts.IdleInterval = DefaultServerIdlePingInterval
	}
	opts.IdleInterval = max(opts.IdleInterval, opts.Interval)
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultServerPingTimeout
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &ServerWatch{nc: nc, log: opts.Logger, opts: opts, kick: make(chan struct{}, 1), waiters: map[*serverWaiter]struct{}{}}
}

// Run pings the server until ctx ends.
func (w *ServerWatch) Run(ctx context.Context) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		if d, idle := w.untilDue(); d > 0 {
			w.mu.Lock()
			w.due, w.dueIdle = time.Now().Add(d), idle
			w.mu.Unlock()
			t.Reset(d)
			select {
			case <-ctx.Done():
				return
			case <-w.kick:
				t.Stop()
				continue // due sooner now, or not yet
			case <-t.C:
			}
		}
		w.mu.Lock()
		w.lastPing, w.asked, w.due = time.Now(), false, time.Time{}
		w.mu.Unlock()
		if !w.nc.IsConnected() {
			// Not connected: calls fail at once as such; a new
			// connection starts with a clean record.
			w.set(nil)
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, w.opts.Timeout)
		err := w.nc.FlushWithContext(pctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err == nil:
			w.set(nil)
		case errors.Is(err, context.DeadlineExceeded) && w.nc.IsConnected():
			w.set(&ServerSilentError{Timeout: w.opts.Timeout})
		}
	}
}

// untilDue is how long until the next ping: Interval after the last one
// while calls wait or the server is silent, IdleInterval otherwise
// (idle).
func (w *ServerWatch) untilDue() (d time.Duration, idle bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.asked {
		return 0, false
	}
	if len(w.waiters) > 0 || w.silent != nil {
		return w.opts.Interval - time.Since(w.lastPing), false
	}
	return w.opts.IdleInterval - time.Since(w.lastPing), w.opts.IdleInterval > w.opts.Interval
}

// wake asks Run for a ping when the last one is older than Interval;
// w.mu is held.
func (w *ServerWatch) wake() {
	if w.asked || time.Since(w.lastPing) < w.opts.Interval {
		return
	}
	w.asked = true
	w.resched()
}

// resched has Run work out when the next ping is due again (the first
// call began to wait: Interval, no longer IdleInterval); w.mu is held.
func (w *ServerWatch) resched() {
	select {
	case w.kick <- struct{}{}:
		w.kicks++
	default:
	}
}

// set records the server's state and, when it went silent, ends the
// waiting calls.
func (w *ServerWatch) set(silent error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case silent == nil && w.silent != nil:
		w.log.Warn("the NATS server answers again", "silentFor", time.Since(w.since).Round(time.Millisecond))
		w.silent = nil
	case silent != nil && w.silent == nil:
		w.log.Error("the NATS server stopped answering; calls that wait on it fail", "server", ConnectedServer(w.nc), "err", silent)
		w.silent, w.since = silent, time.Now()
		for wt := range w.waiters {
			wt.cancel(silent)
		}
		clear(w.waiters)
	}
}

// Healthy returns nil, or why the server counts as silent now. Asked
// more than Interval after the last ping, it has one sent (the answer
// counts from the next question on).
func (w *ServerWatch) Healthy() error {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.wake()
	return w.silent
}

// Watch derives from ctx a context that ends with a cause matching
// ErrServerSilent when the server goes silent (at once when it is silent
// now). The second result must be called to release it. A nil watch
// returns ctx as it is.
func (w *ServerWatch) Watch(ctx context.Context) (context.Context, context.CancelFunc) {
	if w == nil {
		return ctx, func() {}
	}
	cctx, cancel := context.WithCancelCause(ctx)
	wt := &serverWaiter{cancel: cancel}
	w.mu.Lock()
	if w.silent != nil {
		cancel(w.silent)
	} else {
		w.waiters[wt] = struct{}{}
		if len(w.waiters) == 1 && w.dueIdle {
			// The first call after a pause: pings are due every
			// Interval now, not IdleInterval. Calls one after another
			// find Run already set for that and do not wake it.
			w.resched()
		}
		w.wake()
	}
	w.mu.Unlock()
	return cctx, func() {
		w.mu.Lock()
		delete(w.waiters, wt)
		w.mu.Unlock()
		cancel(context.Canceled)
	}
}
