package nodes

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/protocol"
)

// watchRegistry reads the registry bucket and follows its changes, so
// every gateway sees every pairing decision (its own and other
// gateways'), and keeps the embedded server's node identities in step. It
// retries while JetStream is not ready, and again when the bucket is lost
// and recreated.
func (r *Registry) watchRegistry(ctx context.Context) {
	bus.RetryForever(ctx, r.log, "node registry not available", func(ctx context.Context) error {
		kv, err := bus.OpenKeyValue(ctx, r.opts.JS, r.opts.Prefix, r.opts.Replicas, r.names.Nodes)
		if err != nil {
			return err
		}
		r.mu.Lock()
		r.kv = kv
		r.mu.Unlock()
		return bus.WatchKeyValue(ctx, kv, ">", r.markReady, r.applyRecord)
	})
}

// markReady records that the registry bucket was read once.
func (r *Registry) markReady() {
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-r.ready:
	default:
		close(r.ready)
	}
}

// applyRecord takes one registry change into the cache and the embedded
// server's identities.
func (r *Registry) applyRecord(kve jetstream.KeyValueEntry) {
	id := kve.Key()
	var rec record
	deleted := kve.Operation() != jetstream.KeyValuePut
	if !deleted {
		if err := json.Unmarshal(kve.Value(), &rec); err != nil || rec.ID != id {
			r.log.Warn("malformed registry entry ignored", "key", id, "err", err)
			return
		}
	}
	r.mu.Lock()
	e := r.nodes[id]
	if e == nil && deleted {
		r.mu.Unlock()
		return
	}
	if e == nil {
		e = &entry{interval: DefaultHeartbeatInterval}
		r.nodes[id] = e
	}
	old := e.rec
	if deleted {
		e.rec = record{ID: id, PublicKey: old.PublicKey, Name: old.Name, Pairing: protocol.NodePairingPending}
		e.stored, e.revision = false, kve.Revision()
	} else {
		if rec.PublicKey == "" {
			rec.PublicKey = old.PublicKey
		}
		e.rec, e.stored, e.revision = rec, true, kve.Revision()
	}
	if e.rec.Pairing == protocol.NodePairingRejected {
		r.goSilentLocked(e, "was rejected")
	}
	now := e.rec
	r.mu.Unlock()
	r.syncIdentity(old, now)
}

// Server returns the embedded NATS server the registry keeps identities
// on (nil with an external one).
func (r *Registry) Server() *bus.Server { return r.server.Load() }

// SetServer replaces the embedded server (one started again in the same
// process) and gives it what the registry admits: the keys of paired
// nodes that joined by code and the one-time users of open join codes.
func (r *Registry) SetServer(srv *bus.Server) {
	r.server.Store(srv)
	r.mu.Lock()
	recs := make([]record, 0, len(r.nodes))
	for _, e := range r.nodes {
		recs = append(recs, e.rec)
	}
	invs := make(map[string]invite, len(r.invites))
	for k, inv := range r.invites {
		invs[k] = *inv
	}
	r.mu.Unlock()
	for _, rec := range recs {
		r.syncIdentity(record{}, rec)
	}
	for k, inv := range invs {
		r.applyInvite(k, &inv)
	}
}

// syncIdentity admits to the embedded server the key of a paired node,
// confined to its own subjects (the server admits no client without an
// identity), and removes it when the node is rejected or forgotten.
func (r *Registry) syncIdentity(old, now record) {
	srv := r.server.Load()
	if srv == nil || !serverAuthOn(srv) {
		return
	}
	var err error
	switch {
	case now.Pairing == protocol.NodePairingPaired && now.PublicKey != "":
		var u bus.NKeyUser
		if u, err = bus.NodeUser(r.opts.Prefix, now.PublicKey); err == nil && !hasNKey(srv, now.PublicKey) {
			err = srv.AddNKeyUser(u)
		}
	case old.Pairing == protocol.NodePairingPaired && old.PublicKey != "" && hasNKey(srv, old.PublicKey):
		err = srv.RemoveNKeyUser(old.PublicKey)
	}
	if err != nil {
		r.log.Warn("updating the node's NATS identity", "node", now.ID, "err", err)
	}
}

func serverAuthOn(s *bus.Server) bool {
	users, nk := s.Users()
	return len(users)+len(nk) > 0
}

func hasNKey(s *bus.Server, pub string) bool {
	_, nk := s.Users()
	for _, u := range nk {
		if u.PublicKey == pub {
			return true
		}
	}
	return false
}

// awaitKV returns the registry bucket once it was read, waiting up to
// readyWait (JetStream starting).
func (r *Registry) awaitKV(ctx context.Context) (jetstream.KeyValue, error) {
	if err := r.awaitReady(ctx); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.kv == nil {
		return nil, errNotReady
	}
	return r.kv, nil
}

// readyWait bounds the wait for the registry bucket.
const readyWait = 30 * time.Second

// errNotReady: a decision before the registry bucket could be read.
var errNotReady = &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true, Message: "the node registry is not available yet (JetStream starting); retry"}

// store writes the record of node id with update, settled by
// compare-and-set against the bucket: a concurrent writer (another
// gateway) makes it read the entry again and re-apply update. update
// returns false when there is nothing to write.
func (r *Registry) store(ctx context.Context, id string, update func(rec *record) bool) (record, error) {
	kv, err := r.awaitKV(ctx)
	if err != nil {
		return record{}, err
	}
	rec, rev, changed, err := bus.UpdateKey(ctx, kv, id, func(rec *record, exists bool) bool {
		if !exists || rec.ID == "" {
			// Not stored yet: what the registry knows of it (a pending
			// node's key and name).
			r.mu.Lock()
			if e := r.nodes[id]; e != nil {
				*rec = e.rec
			}
			r.mu.Unlock()
			rec.ID = id
		}
		return update(rec)
	})
	if err != nil {
		return record{}, protocol.Errorf(protocol.ErrUnavailable, "node registry: %v", err)
	}
	if changed || rev != 0 {
		// Written, or what the bucket holds is in force: the cache may
		// not have it from the watch yet (another gateway wrote it a
		// moment ago), and the caller reads the cache.
		r.applyLocal(rec, rev)
	}
	return rec, nil
}

// applyLocal puts a record just written (or read) at revision rev into
// the cache at once (the watch confirms it shortly), unless the watch
// brought that revision or a newer one already: a write's answer can come
// after the watch delivered another gateway's later write.
func (r *Registry) applyLocal(rec record, rev uint64) {
	r.mu.Lock()
	e := r.nodes[rec.ID]
	if e == nil {
		e = &entry{interval: DefaultHeartbeatInterval, firstSeen: r.opts.Now()}
		r.nodes[rec.ID] = e
	}
	if rev <= e.revision {
		r.mu.Unlock()
		return
	}
	old := e.rec
	e.rec, e.stored, e.revision = rec, true, rev
	if rec.Pairing == protocol.NodePairingRejected {
		r.goSilentLocked(e, "was rejected")
	}
	r.mu.Unlock()
	r.syncIdentity(old, rec)
}

// Decide approves (protocol.NodePairingPaired) or rejects
// (protocol.NodePairingRejected) a node, named by id or name, and tells
// the node at once when it is connected, so its own gate agrees. Two
// gateways deciding together: one write wins, the other re-reads and
// answers with the decision in force.
func (r *Registry) Decide(ctx context.Context, target, pairing string) (Node, error) {
	n, err := r.Resolve(target)
	if pe := protocol.AsError(err); pe != nil && pe.Type == protocol.ErrNotFound {
		return Node{}, protocol.Errorf(protocol.ErrNotFound, "unknown node %q: no node with that id or name", target)
	}
	if err != nil {
		return Node{}, err
	}
	return r.decide(ctx, n.ID, pairing)
}

// Imported is a pairing decision carried over from an earlier store (the
// nodes.json of gateways before the registry moved into JetStream).
type Imported struct {
	ID        string `json:"id"`
	PublicKey string `json:"publicKey,omitempty"`
	Name      string `json:"name,omitempty"`
	Pairing   string `json:"pairing"` // paired or rejected
	Joined    bool   `json:"joined,omitempty"`
	DecidedAt int64  `json:"decidedAt"`
}

// Import records n unless the registry already has a decision on its id
// (the registry wins: it may be newer). It reports whether n was
// recorded.
func (r *Registry) Import(ctx context.Context, n Imported) (bool, error) {
	if err := protocol.ValidateNodeID(n.ID); err != nil {
		return false, err
	}
	if n.Pairing != protocol.NodePairingPaired && n.Pairing != protocol.NodePairingRejected {
		return false, fmt.Errorf("nodes: import %s: pairing %q", n.ID, n.Pairing)
	}
	if n.PublicKey != "" {
		if id, err := bus.NodeIDFromPublicKey(n.PublicKey); err != nil || id != n.ID {
			return false, fmt.Errorf("nodes: import %s: the public key does not give this id", n.ID)
		}
	}
	done := false
	_, err := r.store(ctx, n.ID, func(rec *record) bool {
		if rec.Pairing == protocol.NodePairingPaired || rec.Pairing == protocol.NodePairingRejected {
			return false
		}
		*rec = record{ID: n.ID, PublicKey: n.PublicKey, Name: n.Name, Pairing: n.Pairing, Joined: n.Joined, DecidedAt: n.DecidedAt}
		done = true
		return true
	})
	return done, err
}

// Approve pairs the node with this id, which need not have been seen yet
// (`execmesh up` approves its own local node before its first heartbeat).
func (r *Registry) Approve(ctx context.Context, id string) (Node, error) {
	if err := protocol.ValidateNodeID(id); err != nil {
		return Node{}, err
	}
	return r.decide(ctx, id, protocol.NodePairingPaired)
}

// Admit pairs the node holding publicKey as if it had joined by code: the
// embedded server admits its key with permissions confined to its own
// subjects. `execmesh up` admits its local node this way.
func (r *Registry) Admit(ctx context.Context, publicKey, name string) (Node, error) {
	id, err := bus.NodeIDFromPublicKey(publicKey)
	if err != nil {
		return Node{}, protocol.Errorf(protocol.ErrInvalidRequest, "%v", err)
	}
	_, err = r.store(ctx, id, func(rec *record) bool {
		if rec.Pairing == protocol.NodePairingPaired && rec.Joined && rec.PublicKey == publicKey {
			return false
		}
		rec.PublicKey, rec.Joined, rec.Pairing, rec.DecidedAt = publicKey, true, protocol.NodePairingPaired, r.opts.Now().UnixMilli()
		if rec.Name == "" {
			rec.Name = name
		}
		return true
	})
	if err != nil {
		return Node{}, err
	}
	n, _ := r.Get(id)
	return n, nil
}

func (r *Registry) decide(ctx context.Context, id, pairing string) (Node, error) {
	rec, err := r.store(ctx, id, func(rec *record) bool {
		if rec.Pairing == pairing && rec.DecidedAt != 0 {
			return false // decided so already (maybe by another gateway)
		}
		rec.Pairing, rec.DecidedAt = pairing, r.opts.Now().UnixMilli()
		if rec.Name == "" {
			r.mu.Lock()
			if e := r.nodes[id]; e != nil {
				rec.Name = e.hb.Name
			}
			r.mu.Unlock()
		}
		return true
	})
	if err != nil {
		return Node{}, err
	}
	r.log.Info("node pairing decided", "node", id, "pairing", rec.Pairing)
	n, _ := r.Get(id)
	if pairing == protocol.NodePairingRejected && r.opts.OnRejected != nil {
		r.opts.OnRejected(n)
	}
	r.notify(ctx, id, rec.Pairing)
	n, _ = r.Get(id)
	return n, nil
}

// notify tells node id its pairing (best effort: a node that misses it
// asks again while it is not paired).
func (r *Registry) notify(ctx context.Context, id, pairing string) {
	b, _ := json.Marshal(protocol.NodePairingNotice{Status: pairing, GatewayKeys: r.opts.GatewayKeys()})
	nctx, cancel := context.WithTimeout(ctx, notifyTimeout)
	defer cancel()
	if _, err := bus.RequestChunked(nctx, r.opts.Conn, r.subj.Node(id, protocol.NodeEndpointPairing), b, nil); err != nil {
		r.log.Debug("pairing notice not delivered", "node", id, "err", err)
	}
}

// onPairRequest answers pairing requests: announcements get the node's
// status; join requests redeem a join code. The work runs in a tracked
// goroutine (a join writes the registry).
func (r *Registry) onPairRequest(m *nats.Msg) {
	if m.Reply == "" {
		return
	}
	r.spawn(func(ctx context.Context) {
		var req protocol.NodePairRequest
		if err := json.Unmarshal(m.Data, &req); err != nil {
			reply(m, protocol.NodePairResponse{Error: protocol.Errorf(protocol.ErrInvalidRequest, "pairing request: malformed JSON: %v", err)}, r.log)
			return
		}
		switch req.Type {
		case protocol.NodePairAnnounce:
			reply(m, r.announce(ctx, req), r.log)
		case protocol.NodePairJoin:
			reply(m, r.redeem(ctx, req), r.log)
		default:
			reply(m, protocol.NodePairResponse{Error: protocol.Errorf(protocol.ErrInvalidRequest, "pairing request: unknown type %q", req.Type)}, r.log)
		}
	})
}

func reply(m *nats.Msg, resp protocol.NodePairResponse, log interface{ Debug(string, ...any) }) {
	b, err := json.Marshal(resp)
	if err != nil {
		return
	}
	if err := m.Respond(b); err != nil {
		log.Debug("pairing reply not sent", "err", err)
	}
}

// announce records a node that presents itself and answers its status.
// Any client allowed on the pairing subject can claim any key here, so an
// announcement only registers an unknown node as pending; the liveness
// and details of a known node come from its heartbeats, which NATS
// permissions tie to the node's own subject.
func (r *Registry) announce(ctx context.Context, req protocol.NodePairRequest) protocol.NodePairResponse {
	id, err := bus.NodeIDFromPublicKey(req.PublicKey)
	if err != nil || id != req.NodeID {
		return protocol.NodePairResponse{Error: protocol.Errorf(protocol.ErrInvalidRequest, "pairing request: node id %q does not match public key", req.NodeID)}
	}
	if err := r.Ready(ctx); err != nil {
		return protocol.NodePairResponse{Error: errNotReady}
	}
	if n, ok := r.Get(id); ok {
		resp := protocol.NodePairResponse{Status: n.Pairing, NodeID: id}
		if n.Pairing == protocol.NodePairingPaired {
			resp.GatewayKeys = r.opts.GatewayKeys()
		}
		return resp
	}
	r.seen(protocol.NodeHeartbeat{NodeID: id, PublicKey: req.PublicKey, Name: req.Name, Platform: req.Platform, Version: req.Version, Instance: req.Instance})
	return protocol.NodePairResponse{Status: protocol.NodePairingPending, NodeID: id}
}

func backoff(attempt int) time.Duration {
	return min(time.Duration(attempt)*500*time.Millisecond, 10*time.Second)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
