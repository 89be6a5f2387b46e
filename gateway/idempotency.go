package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/index"
	"github.com/execmesh/execmesh/protocol"
)

// Exec starts are idempotent by the caller's Idempotency-Key (HTTP
// header, or NATS header of <prefix>.gw.invoke): the first call with a key
// creates its record in the idempotency bucket, shared by the gateways,
// and runs; a retry with the same key — through any gateway, after a 503
// or a lost connection — waits for the first call's answer and gets it,
// or, when the first gateway died meanwhile, the state of the session it
// started. A start never runs twice.

const (
	// idemWait bounds how long a retry waits for the first call's answer
	// (longer than the longest yield window).
	idemWait = 130 * time.Second
	// maxIdemKey bounds the length of an Idempotency-Key.
	maxIdemKey = 255
	// maxIdemResult bounds the encoded result kept for retries.
	maxIdemResult = 256 << 10
)

type idemCtxKey struct{}

// idemRecord is what the bucket keeps of one keyed exec start.
type idemRecord struct {
	State     string           `json:"state"`   // started or done
	Gateway   string           `json:"gateway"` // the gateway of the first call
	SessionID string           `json:"sessionId,omitempty"`
	Result    *protocol.Result `json:"result,omitempty"`
}

// idemBucket returns the idempotency bucket.
func (g *Gateway) idemBucket(ctx context.Context) (jetstream.KeyValue, error) {
	return bus.OpenKeyValue(ctx, g.js, g.prefix, g.replicas, bus.StreamNamesFor(g.prefix).Idem)
}

// execOnce runs an exec call under the caller's idempotency key.
func (c *call) execOnce(ctx context.Context, key string, args protocol.ExecArgs) (protocol.Result, error) {
	if len(key) > maxIdemKey {
		return protocol.Result{}, protocol.Errorf(protocol.ErrInvalidRequest, "Idempotency-Key is longer than %d bytes", maxIdemKey)
	}
	g := c.g
	kv, err := g.idemBucket(ctx)
	if err != nil {
		return protocol.Result{}, &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true,
			Message: fmt.Sprintf("exec idempotency keys are not available (JetStream: %v); nothing was started. Retry.", err)}
	}
	sum := sha256.Sum256([]byte(c.sessionKey + "\x00" + key))
	k := hex.EncodeToString(sum[:20])
	st, err := c.claim(ctx, kv, k, 0, "", "")
	if err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return protocol.Result{}, &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true,
				Message: fmt.Sprintf("exec idempotency key not recorded (JetStream: %v); nothing was started. Retry.", err)}
		}
		return c.execRetried(ctx, kv, k, args)
	}
	return c.execKeyed(ctx, st, args)
}

// claim makes the key's record this gateway's start: created when rev is
// 0, else replaced by compare-and-set at rev (a takeover; reuseID and
// node name the session a dead gateway had started). It fails when
// another writer got there first.
func (c *call) claim(ctx context.Context, kv jetstream.KeyValue, k string, rev uint64, reuseID, node string) (*idemStarter, error) {
	b, _ := json.Marshal(idemRecord{State: "started", Gateway: c.g.id, SessionID: reuseID})
	var err error
	if rev == 0 {
		rev, err = kv.Create(ctx, k, b)
	} else {
		rev, err = kv.Update(ctx, k, b, rev)
	}
	if err != nil {
		return nil, err
	}
	return &idemStarter{kv: kv, key: k, gateway: c.g.id, rev: rev, reuseID: reuseID, node: node}, nil
}

// execKeyed runs the start st holds the key's record of, and keeps its
// answer for retries.
func (c *call) execKeyed(ctx context.Context, st *idemStarter, args protocol.ExecArgs) (protocol.Result, error) {
	g := c.g
	res, err := c.exec(context.WithValue(ctx, idemCtxKey{}, st), args)
	if err != nil {
		if !isOutcomeUnknown(err) {
			// Nothing ran: a retry may start it. Only while the record is
			// this call's (another gateway may have taken it over).
			_ = st.kv.Delete(context.WithoutCancel(ctx), st.key, jetstream.LastRevision(st.rev))
		}
		return res, err
	}
	done := idemRecord{State: "done", Gateway: g.id, SessionID: res.SessionID(), Result: &res}
	b, _ := json.Marshal(done)
	if len(b) > maxIdemResult {
		done.Result = nil
		b, _ = json.Marshal(done)
	}
	if _, err := st.kv.Put(context.WithoutCancel(ctx), st.key, b); err != nil {
		g.log.Warn("exec answer not kept for its idempotency key", "err", err)
	}
	return res, nil
}

// idemStarter is the record of a keyed start this call holds: the
// revision it wrote last.
type idemStarter struct {
	kv      jetstream.KeyValue
	key     string
	gateway string
	rev     uint64
	// reuseID and node are set when the start is taken over from a dead
	// gateway that had named session reuseID on node.
	reuseID, node string
}

// starterOf returns the keyed start of ctx, nil for an unkeyed call.
func starterOf(ctx context.Context) *idemStarter {
	st, _ := ctx.Value(idemCtxKey{}).(*idemStarter)
	return st
}

// nodeKey is the node-level idempotency key of a keyed start: the same
// for every gateway that sends it.
func (st *idemStarter) nodeKey() string { return "idem-" + st.key }

// startedSession records the session id of the keyed start of ctx, if
// any, as soon as it is allocated and before anything is sent to a host,
// so that a retry after this gateway died finds the session. It is a
// compare-and-set on the call's own record: when it fails, another
// gateway took the start over (this one was taken for dead) or the record
// cannot be kept, and the call must not run.
func startedSession(ctx context.Context, id string) error {
	st := starterOf(ctx)
	if st == nil {
		return nil
	}
	b, _ := json.Marshal(idemRecord{State: "started", Gateway: st.gateway, SessionID: id})
	rev, err := st.kv.Update(ctx, st.key, b, st.rev)
	if err != nil {
		return &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true,
			Message: fmt.Sprintf("exec not started: its Idempotency-Key record could not be updated (%v); nothing ran. Retry with the same key.", err)}
	}
	st.rev = rev
	return nil
}

// execRetried answers a start whose key was used before: the first call's
// answer once it is there; the state of its session when that call's
// gateway is gone; the start itself when that gateway died before it
// named a session (nothing was sent to a host then; the takeover is a
// compare-and-set that also stops the first gateway, were it only cut
// off); a retryable conflict while it is still starting.
func (c *call) execRetried(ctx context.Context, kv jetstream.KeyValue, k string, args protocol.ExecArgs) (protocol.Result, error) {
	deadline := time.Now().Add(idemWait)
	for {
		var rec idemRecord
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			// The first call failed before it ran anything: start it.
			if st, err := c.claim(ctx, kv, k, 0, "", ""); err == nil {
				return c.execKeyed(ctx, st, args)
			}
		}
		if err == nil && json.Unmarshal(e.Value(), &rec) == nil {
			switch {
			case rec.State == "done" && rec.Result != nil:
				return *rec.Result, nil
			case rec.SessionID != "" && rec.State == "started" && rec.Gateway != c.g.id && !c.g.peers.Alive(rec.Gateway):
				// Its gateway died after it named the session, maybe
				// before the node had the start, maybe after: the start
				// goes to that node again, under the same session id and
				// node-level key, so the node answers the first start if
				// it had it and runs it now if not.
				ir, ok := c.g.index.Lookup(ctx, rec.SessionID)
				if !ok || ir.Host != index.HostNode || ir.SessionKey != c.sessionKey || ir.State == index.StateLost {
					return c.process(ctx, protocol.ProcessArgs{Action: "poll", SessionID: rec.SessionID})
				}
				if st, err := c.claim(ctx, kv, k, e.Revision(), rec.SessionID, ir.HostID); err == nil {
					c.g.log.Info("taking over an exec start whose gateway is gone", "gateway", rec.Gateway, "sessionId", rec.SessionID, "node", ir.HostID)
					return c.execKeyed(ctx, st, args)
				}
				continue
			case rec.SessionID != "" && (rec.State == "done" || !c.g.peers.Alive(rec.Gateway)):
				// The first call's gateway cannot answer: the session's
				// state is the answer.
				return c.process(ctx, protocol.ProcessArgs{Action: "poll", SessionID: rec.SessionID})
			case rec.SessionID == "" && rec.State == "started" && rec.Gateway != c.g.id && !c.g.peers.Alive(rec.Gateway):
				if st, err := c.claim(ctx, kv, k, e.Revision(), "", ""); err == nil {
					c.g.log.Info("taking over an exec start whose gateway is gone", "gateway", rec.Gateway)
					return c.execKeyed(ctx, st, args)
				}
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return protocol.Result{}, &protocol.Error{Type: protocol.ErrConflict, Retryable: true,
				Message: "an exec with this Idempotency-Key is still starting; retry later (it will not run twice)"}
		}
		t := time.NewTimer(200 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
}
