package gateway

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/protocol"
)

// exitAckWait is how long the stream waits for the gateway's ack of an
// exit event before redelivering it.
const exitAckWait = 30 * time.Second

// exitConsumerName is the durable consumer of the exit-event stream:
// "<prefix>_gateway" ('.' and other characters not allowed in names
// become '_'). Its acknowledged position survives gateway restarts, so
// exits that happened while the gateway was down are delivered when it
// comes back.
func exitConsumerName(prefix string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '-':
			return r
		}
		return '_'
	}, prefix) + "_gateway"
}

// runExitConsumer ensures the JetStream assets (exit stream, buckets) and
// consumes exit events with a durable consumer and explicit acks, until
// the backend closes. Setting up is retried while JetStream is not ready.
func (r *nodeRouter) runExitConsumer(ctx context.Context) {
	replicas := r.g.Config().NATS.Replicas
	stream := bus.StreamNamesFor(r.prefix).Exit
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := bus.EnsureStreams(actx, r.js, r.prefix, replicas)
		var cons jetstream.Consumer
		if err == nil {
			cons, err = r.js.CreateOrUpdateConsumer(actx, stream, jetstream.ConsumerConfig{
				Durable:       exitConsumerName(r.prefix),
				Description:   "execmesh gateway: exit events of node sessions",
				AckPolicy:     jetstream.AckExplicitPolicy,
				AckWait:       exitAckWait,
				DeliverPolicy: jetstream.DeliverAllPolicy,
				FilterSubject: r.prefix + ".events.exit.>",
				MaxDeliver:    -1,
				MaxAckPending: 1000,
			})
		}
		cancel()
		if err == nil {
			var cc jetstream.ConsumeContext
			cc, err = cons.Consume(r.onExitMsg, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
				r.log.Debug("exit consumer", "err", err)
			}))
			if err == nil {
				r.mu.Lock()
				if r.closing {
					r.mu.Unlock()
					cc.Stop()
					return
				}
				r.consumer = cc
				r.mu.Unlock()
				r.log.Info("consuming node exit events", "stream", stream, "consumer", exitConsumerName(r.prefix))
				return
			}
		}
		if ctx.Err() != nil {
			return
		}
		r.log.Warn("exit-event consumer not ready; retrying", "attempt", attempt, "err", err)
		t := time.NewTimer(min(time.Duration(attempt)*time.Second, 10*time.Second))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// onExitMsg turns one exit event into the same system event a local
// session's exit gives (ev.Text is computed by the node's session core),
// queued once: ids already delivered in this gateway's life are dropped,
// as are events of nodes that are not paired or that claim another
// node's subject. The ack comes last, so an event whose gateway dies
// before queueing it is redelivered to the next one.
func (r *nodeRouter) onExitMsg(m jetstream.Msg) {
	var ev protocol.ExitEvent
	if err := json.Unmarshal(m.Data(), &ev); err != nil {
		r.log.Warn("malformed exit event dropped", "subject", m.Subject(), "err", err)
		_ = m.Term()
		return
	}
	token := strings.TrimPrefix(m.Subject(), r.prefix+".events.exit.")
	if ev.NodeID != token || protocol.ValidateNodeID(token) != nil {
		r.log.Warn("exit event with a foreign node id dropped", "subject", m.Subject(), "nodeId", ev.NodeID)
		_ = m.Term()
		return
	}
	// The id is derived from the event itself, not from the message
	// header: a copy stored twice (republished after the stream's
	// duplicate window, or under another id) is still one exit.
	id := bus.ExitMsgID(ev)
	r.mu.Lock()
	_, dup := r.delivered[id]
	n := r.nodes[ev.NodeID]
	paired := n != nil && n.pairing == protocol.NodePairingPaired
	notify := ev.Notify && ev.Text != "" && ev.SessionKey != ""
	owned := r.ownsLocked(ev.SessionKey, ev.NodeID, ev.SessionID)
	r.mu.Unlock()
	if !dup && paired && notify && !owned {
		// Not in the index: the gateway restarted, or the exit overtook
		// the exec answer. Ask the node itself, on its own subject.
		pctx, cancel := context.WithTimeout(r.ctx, exitProbeTimeout)
		r.probe(pctx, ev.NodeID)
		cancel()
		r.mu.Lock()
		owned = r.ownsLocked(ev.SessionKey, ev.NodeID, ev.SessionID)
		r.mu.Unlock()
	}
	r.mu.Lock()
	visible := r.visibleIDLocked(ev.SessionKey, ev.NodeID, ev.SessionID)
	if !dup {
		r.delivered[id] = r.now()
		if len(r.delivered) > maxDelivered {
			r.pruneDeliveredLocked()
		}
	}
	r.mu.Unlock()
	if !dup && ev.RunID != "" && paired {
		// The exit of an approval-gated run: its Exec finished event.
		r.finishRun(ev, visible)
	}
	switch {
	case dup:
		r.log.Debug("duplicate exit event dropped", "id", id)
	case !paired:
		r.log.Warn("exit event of a node that is not paired dropped", "nodeId", ev.NodeID, "sessionId", ev.SessionID)
	case !notify:
		// A killed or removed session, a polled end, a silent success.
	case !owned:
		// An exit event counts only for a session the sending node runs
		// for that sessionKey; anything else would let one node notify
		// any agent about any session.
		r.log.Warn("exit event for a session the node does not run dropped", "nodeId", ev.NodeID, "sessionId", ev.SessionID, "sessionKey", ev.SessionKey)
	default:
		// The event id is the exit's own id: the gateway's persisted queue
		// drops a copy JetStream redelivers after a crash before the ack.
		r.g.emit(protocol.SystemEvent{
			ID:         id,
			SessionKey: ev.SessionKey,
			ContextKey: "exec:" + visible,
			Kind:       protocol.EventExecExit,
			Text:       strings.ReplaceAll(ev.Text, ev.SessionID, visible),
		})
	}
	if err := m.Ack(); err != nil {
		r.log.Debug("exit event ack", "id", id, "err", err)
	}
}

// exitProbeTimeout bounds asking a node about a session its exit event
// names, when the index does not know it.
const exitProbeTimeout = 5 * time.Second

// ownsLocked reports whether the index holds node nodeID's session
// nodeSession under sessionKey (a lost one too: its exit may still be on
// its way). r.mu is held.
func (r *nodeRouter) ownsLocked(sessionKey, nodeID, nodeSession string) bool {
	return len(r.indexedLocked(sessionKey, nodeID, nodeSession)) > 0
}

// pruneDeliveredLocked halves the set of delivered ids, oldest first.
// r.mu is held.
func (r *nodeRouter) pruneDeliveredLocked() {
	times := make([]time.Time, 0, len(r.delivered))
	for _, t := range r.delivered {
		times = append(times, t)
	}
	slices.SortFunc(times, time.Time.Compare)
	cutoff := times[len(times)/2]
	for k, t := range r.delivered {
		if !t.After(cutoff) {
			delete(r.delivered, k)
		}
	}
}
