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
	// EventDuplicateWindow is how long the event stream remembers message
	// ids: an event pushed again (a redelivered exit, a retried publish)
	// within it is stored once.
	EventDuplicateWindow = time.Hour
	// DefaultMaxEventsPerKey bounds each sessionKey's event queue
	// (events.maxQueued).
	DefaultMaxEventsPerKey = 1000
	// DefaultEventMaxAge is how long an unread event is kept.
	DefaultEventMaxAge = 30 * 24 * time.Hour
	// limitMarkerTTL enables per-key TTLs (jetstream.KeyTTL) on the
	// buckets and keeps the delete markers that expiries leave, so KV
	// watchers learn that a presence key ran out.
	limitMarkerTTL = time.Minute
	// jsAttemptTimeout bounds one JetStream API call inside the retry
	// loops.
	jsAttemptTimeout = 5 * time.Second
)

// StreamNames are the JetStream stream and KV bucket names for a subject
// prefix. For DefaultPrefix they are EXECMESH_EXIT, EXECMESH_EVENTS,
// execmesh_nodes, execmesh_presence, execmesh_idem, …; another prefix
// replaces "execmesh" (upper-cased in the stream names).
type StreamNames struct {
	// Exit is the exit-event stream, subjects <prefix>.events.exit.*.
	Exit string
	// Events is the system-event stream, subjects <prefix>.sysev.*: one
	// subject per sessionKey, the queue its agent reads.
	Events string
	// Nodes is the KV bucket of the node registry and pairing.
	Nodes string
	// Sessions is the KV bucket of the session index: session id → the
	// host that holds it.
	Sessions string
	// Approvals is the KV bucket of exec approvals.
	Approvals string
	// Joins is the KV bucket of join codes.
	Joins string
	// Cursors is the KV bucket of the event queues' read positions.
	Cursors string
	// Gateways is the KV bucket of the gateways' presence and identity.
	Gateways string
	// Control holds the fleet's shared control-plane values (the approval
	// signing key, the per-sessionKey exec defaults).
	Control string
	// Idem is the KV bucket of exec idempotency keys (TTL IdemTTL): an
	// exec start retried with the same Idempotency-Key, through any
	// gateway, gets the first start's answer.
	Idem string
}

// Buckets returns the names of every KV bucket.
func (n StreamNames) Buckets() []string {
	return []string{n.Nodes, n.Sessions, n.Approvals, n.Joins, n.Cursors, n.Gateways, n.Control, n.Idem}
}

// StreamNamesFor returns the names for prefix.
func StreamNamesFor(prefix string) StreamNames {
	base := sanitizeName(prefix)
	return StreamNames{
		Exit:      strings.ToUpper(base) + "_EXIT",
		Events:    strings.ToUpper(base) + "_EVENTS",
		Nodes:     base + "_nodes",
		Sessions:  base + "_sessions",
		Approvals: base + "_approvals",
		Joins:     base + "_joins",
		Cursors:   base + "_evcursor",
		Gateways:  base + "_gateways",
		Idem:      base + "_idem",
		Control:   base + "_control",
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

// EventStreamConfig is the configuration EnsureStreams applies to the
// system-event stream: one subject per sessionKey, at most maxPerKey
// events each (a publish beyond is refused, so the overflow can be
// announced), kept maxAge.
func EventStreamConfig(prefix string, replicas int, maxPerKey int64, maxAge time.Duration) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:                 StreamNamesFor(prefix).Events,
		Description:          "execmesh system events, one subject per sessionKey",
		Subjects:             []string{protocol.Subjects(prefix).SystemEvents},
		Storage:              jetstream.FileStorage,
		Retention:            jetstream.LimitsPolicy,
		Discard:              jetstream.DiscardNew,
		DiscardNewPerSubject: true,
		MaxMsgsPerSubject:    maxPerKey,
		MaxAge:               maxAge,
		Duplicates:           EventDuplicateWindow,
		Replicas:             max(replicas, 1),
		// Reads go to the stream leader: a direct get may be answered
		// by a replica that has not stored the newest event yet (or by
		// nobody, just after the stream was created).
		AllowDirect: false,
	}
}

// IdemTTL is how long an exec idempotency key is remembered.
const IdemTTL = 24 * time.Hour

// GatewayPresenceTTL is how long a gateway's key in the gateways bucket
// lives without being written again (package peers writes it every 5 s):
// past it the gateway counts as gone, as a node does after its presence
// TTL.
const GatewayPresenceTTL = 15 * time.Second

func ttl(c jetstream.KeyValueConfig, d time.Duration) jetstream.KeyValueConfig {
	c.TTL = d
	return c
}

// KeyValueConfigs are the configurations EnsureStreams applies to the
// buckets: nodes (file, history 5) and the control plane's sessions,
// approvals, joins, event cursors, gateways and control values (file).
// All allow per-key TTLs.
func KeyValueConfigs(prefix string, replicas int) []jetstream.KeyValueConfig {
	n := StreamNamesFor(prefix)
	r := max(replicas, 1)
	file := func(bucket, desc string) jetstream.KeyValueConfig {
		return jetstream.KeyValueConfig{Bucket: bucket, Description: desc, History: 1, Storage: jetstream.FileStorage, Replicas: r, LimitMarkerTTL: limitMarkerTTL}
	}
	return []jetstream.KeyValueConfig{
		file(n.Sessions, "execmesh session index: session id → host"),
		file(n.Approvals, "execmesh exec approvals"),
		file(n.Joins, "execmesh join codes"),
		file(n.Cursors, "execmesh event queue read positions"),
		ttl(file(n.Gateways, "execmesh gateways: each one's presence"), GatewayPresenceTTL),
		file(n.Control, "execmesh shared control-plane values"),
		ttl(file(n.Idem, "execmesh exec idempotency keys"), IdemTTL),
		{
			Bucket:         n.Nodes,
			Description:    "execmesh node registry and pairing",
			History:        5,
			Storage:        jetstream.FileStorage,
			Replicas:       r,
			LimitMarkerTTL: limitMarkerTTL,
		},
	}
}

// KeyValueConfigFor returns the configuration of one bucket of
// KeyValueConfigs by name.
func KeyValueConfigFor(prefix string, replicas int, bucket string) (jetstream.KeyValueConfig, bool) {
	for _, c := range KeyValueConfigs(prefix, replicas) {
		if c.Bucket == bucket {
			return c, true
		}
	}
	return jetstream.KeyValueConfig{}, false
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
	for _, sc := range []jetstream.StreamConfig{ExitStreamConfig(prefix, replicas), EventStreamConfig(prefix, replicas, DefaultMaxEventsPerKey, DefaultEventMaxAge)} {
		if err := retryJS(ctx, func(ctx context.Context) error {
			_, err := EnsureStream(ctx, js, sc)
			return err
		}); err != nil {
			return fmt.Errorf("bus: ensure stream %s: %w", sc.Name, err)
		}
	}
	for _, kc := range KeyValueConfigs(prefix, replicas) {
		if err := retryJS(ctx, func(ctx context.Context) error {
			_, err := EnsureKeyValue(ctx, js, kc)
			return err
		}); err != nil {
			return fmt.Errorf("bus: ensure bucket %s: %w", kc.Bucket, err)
		}
	}
	return nil
}

// IsWrongLastSequence reports a compare-and-set write refused because
// the key (or subject) changed since it was read: the caller reads again
// and re-applies its change.
func IsWrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// KeyValueStream names the stream that holds a key-value bucket.
func KeyValueStream(bucket string) string { return "KV_" + bucket }

// LeaderReadKeyValue creates (or updates) the bucket of cfg and returns a
// handle whose reads go to the stream leader. A KV bucket allows direct
// gets, which any replica answers, possibly one that has not applied the
// latest write yet; a value read to decide what to do next (an event
// queue's read position) must be the last one written. The bucket's
// stream is set to refuse direct gets, and the handle is bound after
// that, so it uses the leader's message API whatever another client
// later sets.
func LeaderReadKeyValue(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	if _, err := EnsureKeyValue(ctx, js, cfg); err != nil {
		return nil, err
	}
	st, err := js.Stream(ctx, KeyValueStream(cfg.Bucket))
	if err != nil {
		return nil, err
	}
	if sc := st.CachedInfo().Config; sc.AllowDirect {
		sc.AllowDirect = false
		if _, err := js.UpdateStream(ctx, sc); err != nil {
			return nil, fmt.Errorf("bucket %s: leader reads: %w", cfg.Bucket, err)
		}
	}
	return js.KeyValue(ctx, cfg.Bucket)
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
	return PublishExitEventNotify(ctx, js, prefix, ev, nil)
}

// PublishExitEventNotify is PublishExitEvent that calls onRetry (when not
// nil) with each failed attempt that will be retried, so that a publisher
// can say it is still trying (the stream lost, JetStream down).
func PublishExitEventNotify(ctx context.Context, js jetstream.JetStream, prefix string, ev protocol.ExitEvent, onRetry func(attempt int, err error)) (*jetstream.PubAck, error) {
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
	err = retryJSNotify(ctx, func(ctx context.Context) error {
		a, err := js.Publish(ctx, subject, data, jetstream.WithMsgID(id))
		ack = a
		return err
	}, onRetry)
	if err != nil {
		return nil, fmt.Errorf("bus: publish exit event %s: %w", id, err)
	}
	return ack, nil
}

// retryJS runs op with a per-attempt timeout until it succeeds, fails
// with a lasting error, or ctx ends.
func retryJS(ctx context.Context, op func(context.Context) error) error {
	return retryJSNotify(ctx, op, nil)
}

// retryJSNotify is retryJS calling onRetry (when not nil) before each
// retry.
func retryJSNotify(ctx context.Context, op func(context.Context) error, onRetry func(attempt int, err error)) error {
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
		if onRetry != nil {
			onRetry(attempt, err)
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
