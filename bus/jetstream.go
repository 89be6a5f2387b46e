package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/execmesh/execmesh/protocol"
)

// JetStream settings of the execmesh assets.
const (
	// ExitDuplicateWindow is how long the exit stream remembers message
	// ids: a node that republishes an exit event (because an ack timed
	// out) within it is stored once.
	ExitDuplicateWindow = 2 * time.Minute
	// ExitMaxAge is how long exit events are kept for a gateway that is
	// down.
	ExitMaxAge = 7 * 24 * time.Hour
	// PresenceTTL is how long a node's presence key lives without a new
	// heartbeat.
	PresenceTTL = 15 * time.Second
	// IdemTTL is how long idempotency keys are kept.
	IdemTTL = 24 * time.Hour
	// limitMarkerTTL enables per-key TTLs (jetstream.KeyTTL) on the
	// buckets and keeps the delete markers that expiries leave, so KV
	// watchers learn that a presence key ran out.
	limitMarkerTTL = time.Minute
	// jsAttemptTimeout bounds one JetStream API call inside the retry
	// loops.
	jsAttemptTimeout = 5 * time.Second
)

// StreamNames are the JetStream stream and KV bucket names for a subject
// prefix. For DefaultPrefix they are EXECMESH_EXIT, execmesh_nodes,
// execmesh_presence and execmesh_idem; another prefix replaces "execmesh"
// (upper-cased in the stream name).
type StreamNames struct {
	// Exit is the exit-event stream, subjects <prefix>.events.exit.*.
	Exit string
	// Nodes is the KV bucket of the node registry and pairing.
	Nodes string
	// Presence is the KV bucket of node heartbeats (TTL PresenceTTL).
	Presence string
	// Idem is the KV bucket of exec idempotency keys (TTL IdemTTL).
	Idem string
}

// StreamNamesFor returns the names for prefix.
func StreamNamesFor(prefix string) StreamNames {
	base := sanitizeName(prefix)
	return StreamNames{
		Exit:     strings.ToUpper(base) + "_EXIT",
		Nodes:    base + "_nodes",
		Presence: base + "_presence",
		Idem:     base + "_idem",
	}
}

// sanitizeName maps a subject prefix to the characters JetStream allows in
// stream and bucket names. A valid prefix has only those already; this
// keeps an unvalidated one from producing an invalid name.
func sanitizeName(prefix string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '-':
			return r
		default:
			return '_'
		}
	}, prefix)
}

// ExitStreamConfig is the configuration EnsureStreams applies to the
// exit-event stream.
func ExitStreamConfig(prefix string, replicas int) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        StreamNamesFor(prefix).Exit,
		Description: "execmesh exit events from node agents",
		Subjects:    []string{protocol.Subjects(prefix).ExitEvents},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxAge:      ExitMaxAge,
		Duplicates:  ExitDuplicateWindow,
		Replicas:    max(replicas, 1),
	}
}

// KeyValueConfigs are the configurations EnsureStreams applies to the
// buckets: nodes (file, history 5), presence (memory, TTL PresenceTTL:
// heartbeats are cheap to lose and frequent to write) and idem (file, TTL
// IdemTTL). All allow per-key TTLs.
func KeyValueConfigs(prefix string, replicas int) []jetstream.KeyValueConfig {
	n := StreamNamesFor(prefix)
	r := max(replicas, 1)
	return []jetstream.KeyValueConfig{
		{
			Bucket:         n.Nodes,
			Description:    "execmesh node registry and pairing",
			History:        5,
			Storage:        jetstream.FileStorage,
			Replicas:       r,
			LimitMarkerTTL: limitMarkerTTL,
		},
		{
			Bucket:         n.Presence,
			Description:    "execmesh node presence (heartbeats)",
			History:        1,
			TTL:            PresenceTTL,
			Storage:        jetstream.MemoryStorage,
			Replicas:       r,
			LimitMarkerTTL: limitMarkerTTL,
		},
		{
			Bucket:         n.Idem,
			Description:    "execmesh exec idempotency keys",
			History:        1,
			TTL:            IdemTTL,
			Storage:        jetstream.FileStorage,
			Replicas:       r,
			LimitMarkerTTL: limitMarkerTTL,
		},
	}
}

// EnsureStreams creates the exit-event stream and the KV buckets, or
// updates them to the current configuration; running it again changes
// nothing. replicas is 1 on a single server, 3 on a 3-server cluster. It
// retries while JetStream is not ready yet (a cluster electing its meta
// leader) until ctx ends.
func EnsureStreams(ctx context.Context, js jetstream.JetStream, prefix string, replicas int) error {
	if err := validPrefix(prefix); err != nil {
		return err
	}
	sc := ExitStreamConfig(prefix, replicas)
	if err := retryJS(ctx, func(ctx context.Context) error {
		_, err := js.CreateOrUpdateStream(ctx, sc)
		return err
	}); err != nil {
		return fmt.Errorf("bus: ensure stream %s: %w", sc.Name, err)
	}
	for _, kc := range KeyValueConfigs(prefix, replicas) {
		if err := retryJS(ctx, func(ctx context.Context) error {
			_, err := js.CreateOrUpdateKeyValue(ctx, kc)
			return err
		}); err != nil {
			return fmt.Errorf("bus: ensure bucket %s: %w", kc.Bucket, err)
		}
	}
	return nil
}

// ExitMsgID is the JetStream message id of an exit event:
// "<nodeId>:<sessionId>:<startedAt>:exit". The node id keeps equal session
// slugs of different nodes apart, and the start time a slug reused on one
// node within the duplicate window.
func ExitMsgID(ev protocol.ExitEvent) string {
	return ev.NodeID + ":" + ev.SessionID + ":" + strconv.FormatInt(ev.StartedAt, 10) + ":exit"
}

// PublishExitEvent publishes ev to <prefix>.events.exit.<ev.NodeID> with
// ExitMsgID as message id, retrying until the stream acknowledges it or
// ctx ends. Retries are safe: the stream stores an id once within
// ExitDuplicateWindow (the ack then has Duplicate set).
func PublishExitEvent(ctx context.Context, js jetstream.JetStream, prefix string, ev protocol.ExitEvent) (*jetstream.PubAck, error) {
	if err := validPrefix(prefix); err != nil {
		return nil, err
	}
	if err := validID(ev.NodeID); err != nil {
		return nil, err
	}
	data, err := json.Marshal(ev)
	if err != nil {
		return nil, fmt.Errorf("bus: encode exit event: %w", err)
	}
	subject, id := protocol.Subjects(prefix).ExitEventsOf(ev.NodeID), ExitMsgID(ev)
	var ack *jetstream.PubAck
	err = retryJS(ctx, func(ctx context.Context) error {
		a, err := js.Publish(ctx, subject, data, jetstream.WithMsgID(id))
		ack = a
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("bus: publish exit event %s: %w", id, err)
	}
	return ack, nil
}

// retryJS runs op with a per-attempt timeout until it succeeds, fails
// with a lasting error, or ctx ends.
func retryJS(ctx context.Context, op func(context.Context) error) error {
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, jsAttemptTimeout)
		err := op(actx)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%w (last error: %w)", ctx.Err(), err)
		}
		if !transientJS(err) {
			return err
		}
		t := time.NewTimer(reconnectDelay(attempt) / 2)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (last error: %w)", ctx.Err(), err)
		case <-t.C:
		}
	}
}

// transientJS reports whether a JetStream error may go away by itself:
// no responders or no answer (JetStream starting, a leader election, a
// reconnect), or a 503 from the API.
func transientJS(err error) bool {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, nats.ErrNoResponders),
		errors.Is(err, jetstream.ErrNoStreamResponse),
		errors.Is(err, nats.ErrTimeout),
		errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, nats.ErrDisconnected),
		errors.Is(err, nats.ErrConnectionReconnecting):
		return true
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled),
		errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		return false // a configuration error, not a passing state
	case errors.As(err, &apiErr):
		return apiErr.Code == 503
	}
	return false
}
