package nodes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/protocol"
)

// The exit feed: node agents publish the exit event of every background
// session to the exit stream (JetStream, durable); the gateways share one
// durable consumer with explicit acks, so each event goes to one gateway,
// and one that is down gets what happened meanwhile when it comes back.
// An event is acknowledged only after OnExit stored what it must (a system
// event in the event queue); until then it is redelivered.

const (
	// exitAckWait is how long the stream waits for an ack before
	// redelivering an event.
	exitAckWait = 30 * time.Second
	// exitRetryDelay is the redelivery delay after OnExit failed.
	exitRetryDelay = 2 * time.Second
	// feedCheck is how often the feed checks that its consumer still
	// exists (a lost store is re-created when it comes back) while it
	// has reason to doubt it: for feedDoubt after the connection to NATS
	// came back (a server restarted on an empty store) or the consumer
	// reported an error (missed heartbeats: a server of a cluster lost
	// it). One JetStream API request per gateway each time.
	feedCheck = 3 * time.Second
	feedDoubt = 30 * time.Second
	// feedCheckIdle is how often it checks otherwise: an idle gateway
	// wakes for little, and a loss nothing reports is found this late.
	feedCheckIdle = 30 * time.Second
)

// exitConsumerName is the durable consumer of the exit stream:
// "<prefix>_gateway".
func exitConsumerName(prefix string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '-':
			return r
		}
		return '_'
	}, prefix) + "_gateway"
}

// runExitFeed ensures the exit stream and its consumer and consumes, until
// the registry closes. When the consumer disappears (the JetStream store
// was lost and came back empty) it is created again.
func (r *Registry) runExitFeed(ctx context.Context) {
	// Pairing decides which events count: consume only once the registry
	// bucket was read, or a gateway that just started would drop the
	// waiting events of paired nodes as the events of unpaired ones.
	select {
	case <-r.ready:
	case <-ctx.Done():
		return
	}
	stream := r.names.Exit
	for attempt := 1; ctx.Err() == nil; attempt++ {
		cons, err := r.ensureExitConsumer(ctx)
		var cc jetstream.ConsumeContext
		lost, doubt := make(chan struct{}, 1), make(chan struct{}, 1)
		if err == nil {
			cc, err = cons.Consume(r.onExitMsg, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
				ch := doubt
				if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) {
					ch = lost
				}
				select {
				case ch <- struct{}{}:
				default:
				}
				r.log.Debug("exit feed", "err", err)
			}))
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			r.log.Warn("exit feed not ready; retrying", "attempt", attempt, "err", err)
			if sleep(ctx, backoff(attempt)) != nil {
				return
			}
			continue
		}
		r.mu.Lock()
		if r.closing {
			r.mu.Unlock()
			cc.Stop()
			return
		}
		r.consumer = cc
		r.mu.Unlock()
		r.feedLost.Store(nil)
		if attempt > 1 {
			r.log.Info("consuming node exit events again", "stream", stream)
		} else {
			r.log.Info("consuming node exit events", "stream", stream, "consumer", exitConsumerName(r.opts.Prefix))
		}
		attempt = 0
		if !r.superviseFeed(ctx, cons, lost, doubt) {
			return
		}
		r.mu.Lock()
		if r.consumer == cc {
			r.consumer = nil
		}
		r.mu.Unlock()
		cc.Stop()
		lostErr := fmt.Errorf("node exit feed: the consumer of stream %s was lost (JetStream store lost?); creating it again", stream)
		r.feedLost.Store(&lostErr)
		r.log.Warn("exit feed consumer lost; creating it again", "stream", stream)
	}
}

// FeedHealthy returns nil, or why the exit feed, which consumed before,
// does not consume now.
func (r *Registry) FeedHealthy() error {
	if p := r.feedLost.Load(); p != nil {
		return *p
	}
	return nil
}

// superviseFeed waits until the consumer is lost (true) or ctx ends
// (false). It checks that the consumer exists every feedCheckIdle, and
// every feedCheck for feedDoubt after the connection came back or the
// consumer reported an error (doubt), the first time at once.
func (r *Registry) superviseFeed(ctx context.Context, cons jetstream.Consumer, lost, doubt <-chan struct{}) bool {
	nc := r.opts.JS.Conn()
	reconnected := nc.StatusChanged(nats.CONNECTED)
	defer nc.RemoveStatusListener(reconnected)
	var doubtUntil time.Time
	t := time.NewTimer(feedCheckIdle)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-lost:
			return true
		case <-reconnected:
			doubtUntil = time.Now().Add(feedDoubt)
			t.Reset(0)
			continue
		case <-doubt:
			doubtUntil = time.Now().Add(feedDoubt)
			t.Reset(0)
			continue
		case <-t.C:
		}
		cctx, cancel := context.WithTimeout(ctx, kvTimeout)
		_, err := cons.Info(cctx)
		cancel()
		if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
			return true
		}
		if time.Now().Before(doubtUntil) {
			t.Reset(feedCheck)
		} else {
			t.Reset(feedCheckIdle)
		}
	}
}

func (r *Registry) ensureExitConsumer(ctx context.Context) (jetstream.Consumer, error) {
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := bus.EnsureStream(actx, r.opts.JS, bus.ExitStreamConfig(r.opts.Prefix, r.opts.Replicas)); err != nil {
		return nil, err
	}
	return r.opts.JS.CreateOrUpdateConsumer(actx, r.names.Exit, jetstream.ConsumerConfig{
		Durable:       exitConsumerName(r.opts.Prefix),
		Description:   "execmesh gateways: exit events of node sessions",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       exitAckWait,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		FilterSubject: r.opts.Prefix + ".events.exit.>",
		MaxDeliver:    -1,
		MaxAckPending: 1000,
	})
}

// onExitMsg hands one exit event to OnExit: only events a paired node
// published on its own subject count (NATS permissions confine a node to
// its subject; the id in the event must agree). Malformed and foreign
// events are terminated; OnExit's failure has the event redelivered.
func (r *Registry) onExitMsg(m jetstream.Msg) {
	var ev protocol.ExitEvent
	if err := json.Unmarshal(m.Data(), &ev); err != nil {
		r.log.Warn("malformed exit event dropped", "subject", m.Subject(), "err", err)
		_ = m.Term()
		return
	}
	token := strings.TrimPrefix(m.Subject(), r.opts.Prefix+".events.exit.")
	if ev.NodeID != token || protocol.ValidateNodeID(token) != nil {
		r.log.Warn("exit event with a foreign node id dropped", "subject", m.Subject(), "nodeId", ev.NodeID)
		_ = m.Term()
		return
	}
	n, ok := r.Get(ev.NodeID)
	if !ok || n.Pairing != protocol.NodePairingPaired {
		r.log.Warn("exit event of a node that is not paired dropped", "nodeId", ev.NodeID, "sessionId", ev.SessionID)
		_ = m.Term()
		return
	}
	if r.opts.OnExit != nil {
		if err := r.opts.OnExit(r.ctx, n, ev); err != nil {
			r.log.Warn("exit event not stored yet; it will be redelivered", "nodeId", ev.NodeID, "sessionId", ev.SessionID, "err", err)
			_ = m.NakWithDelay(exitRetryDelay)
			return
		}
	}
	if err := m.Ack(); err != nil {
		r.log.Debug("exit event ack", "sessionId", ev.SessionID, "err", err)
	}
}
