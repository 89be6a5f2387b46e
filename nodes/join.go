package nodes

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/protocol"
)

// Join codes. A code is created once in the join-code bucket under the
// hash of its secret (nothing in the bucket lets anyone join), redeemed at
// most once by compare-and-set, and forgotten an hour after it expires.
// With the embedded server, every gateway admits the code's one-time user
// (its password stored only as a hash) until the code expires, so a node
// may redeem a code through any gateway of a cluster.

// invite is one join code as the bucket holds it.
type invite struct {
	User         string `json:"user,omitempty"` // one-time NATS user, "" when the server needs none
	SecretSHA256 string `json:"secretSha256"`
	Name         string `json:"name,omitempty"`
	CreatedAt    int64  `json:"createdAt"`
	ExpiresAt    int64  `json:"expiresAt"`
	UsedBy       string `json:"usedBy,omitempty"`

	timer *time.Timer // this gateway's expiry of the one-time user
}

// Invite is a join code issued by Invite.
type Invite struct {
	Code        string `json:"code"`
	Command     string `json:"command"`
	ExpiresAtMs int64  `json:"expiresAtMs"`
}

func secretKey(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Invite issues a join code valid for ttl (0: the default): the NATS URLs
// to connect to, a one-time secret and the keys the gateways sign approval
// decisions with.
func (r *Registry) Invite(ctx context.Context, name string, ttl time.Duration) (Invite, error) {
	urls := r.opts.JoinURLs()
	if len(urls) == 0 {
		return Invite{}, protocol.Errorf(protocol.ErrConflict,
			"join codes need the gateway's embedded NATS server; with an external NATS cluster give nodes credentials with NATS's account tooling (deploy/) and pair them with `execmesh nodes approve`")
	}
	kv := r.awaitJoins(ctx)
	if kv == nil {
		return Invite{}, errNotReady
	}
	if ttl <= 0 {
		ttl = r.opts.InviteTTL
	}
	ttl = min(max(ttl, MinInviteTTL), MaxInviteTTL)
	now := r.opts.Now()
	secret := randomHex(32)
	inv := invite{Name: name, CreatedAt: now.UnixMilli(), ExpiresAt: now.Add(ttl).UnixMilli(), SecretSHA256: secretKey(secret)}
	if srv := r.server.Load(); srv != nil && serverAuthOn(srv) {
		inv.User = "join-" + randomHex(8)
	}
	b, _ := json.Marshal(inv)
	actx, cancel := context.WithTimeout(ctx, kvTimeout)
	_, err := kv.Create(actx, inv.SecretSHA256, b)
	cancel()
	if err != nil {
		return Invite{}, protocol.Errorf(protocol.ErrUnavailable, "join codes: %v", err)
	}
	r.applyInvite(inv.SecretSHA256, &inv) // admit the user here at once
	code, err := encodeJoinCode(protocol.JoinCode{V: 1, URLs: urls, Prefix: r.opts.Prefix, User: inv.User, Secret: secret,
		Name: name, ExpiresAt: inv.ExpiresAt, GatewayKeys: r.opts.GatewayKeys()})
	if err != nil {
		return Invite{}, protocol.Errorf(protocol.ErrInternal, "encode join code: %v", err)
	}
	r.log.Info("join code issued", "name", name, "expiresAt", time.UnixMilli(inv.ExpiresAt), "oneTimeUser", inv.User != "")
	return Invite{Code: code, Command: "execmesh node --join " + code, ExpiresAtMs: inv.ExpiresAt}, nil
}

// awaitJoins returns the join-code bucket once it is open, waiting up to
// readyWait (JetStream starting); nil when it is not.
func (r *Registry) awaitJoins(ctx context.Context) jetstream.KeyValue {
	wctx, cancel := context.WithTimeout(ctx, readyWait)
	defer cancel()
	select {
	case <-r.joinsSet:
	case <-wctx.Done():
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.joins
}

func encodeJoinCode(c protocol.JoinCode) (string, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// watchJoins follows the join-code bucket: every gateway admits the
// one-time users of unexpired, unused codes.
func (r *Registry) watchJoins(ctx context.Context) {
	bus.RetryForever(ctx, r.log, "join codes not available", func(ctx context.Context) error {
		kv, err := bus.OpenKeyValue(ctx, r.opts.JS, r.opts.Prefix, r.opts.Replicas, r.names.Joins)
		if err != nil {
			return err
		}
		r.mu.Lock()
		if r.joins == nil {
			close(r.joinsSet)
		}
		r.joins = kv
		r.mu.Unlock()
		return bus.WatchKeyValue(ctx, kv, ">", nil, func(e jetstream.KeyValueEntry) {
			if e.Operation() != jetstream.KeyValuePut {
				r.applyInvite(e.Key(), nil)
				return
			}
			var inv invite
			if json.Unmarshal(e.Value(), &inv) == nil {
				r.applyInvite(e.Key(), &inv)
			}
		})
	})
}

// applyInvite keeps this gateway's server in step with one join code (nil:
// the code was deleted).
func (r *Registry) applyInvite(key string, inv *invite) {
	now := r.opts.Now()
	r.mu.Lock()
	old := r.invites[key]
	if old != nil && old.timer != nil {
		old.timer.Stop()
	}
	if inv == nil {
		delete(r.invites, key)
	} else {
		c := *inv
		r.invites[key] = &c
		if exp := time.UnixMilli(c.ExpiresAt); exp.After(now) {
			c.timer = time.AfterFunc(exp.Sub(now), func() { r.expireInvite(key) })
		} else {
			// Forget it an hour after it expired (any gateway may).
			c.timer = time.AfterFunc(max(exp.Add(inviteKeep).Sub(now), time.Second), func() { r.forgetInvite(key) })
		}
	}
	r.mu.Unlock()
	srv := r.server.Load()
	if srv == nil || !serverAuthOn(srv) {
		return
	}
	active := inv != nil && inv.User != "" && time.UnixMilli(inv.ExpiresAt).After(now)
	var err error
	switch {
	case active:
		var perms, perr = bus.JoinPermissions(r.opts.Prefix, inv.User)
		if perr != nil {
			err = perr
			break
		}
		// A used code's user is kept until the code expires: the gateway
		// refuses a second use anyway, and removing the user would close
		// the joiner's connection, which may still wait for its answer.
		err = srv.AddUser(bus.User{Name: inv.User, PasswordSHA256: inv.SecretSHA256, Permissions: perms})
	case old != nil && old.User != "":
		err = srv.RemoveUser(old.User)
	case inv != nil && inv.User != "":
		err = srv.RemoveUser(inv.User)
	}
	if err != nil {
		r.log.Warn("updating a join code's one-time NATS user", "err", err)
	}
}

// expireInvite removes an expired code's one-time user from this
// gateway's server, and schedules forgetting the code.
func (r *Registry) expireInvite(key string) {
	r.mu.Lock()
	inv := r.invites[key]
	r.mu.Unlock()
	if inv != nil {
		r.applyInvite(key, inv) // now expired: removes the user, schedules forget
	}
}

// forgetInvite deletes a code an hour after it expired.
func (r *Registry) forgetInvite(key string) {
	r.mu.Lock()
	kv := r.joins
	r.mu.Unlock()
	if kv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(r.ctx, kvTimeout)
	defer cancel()
	e, err := kv.Get(ctx, key)
	if err != nil {
		return
	}
	var inv invite
	if json.Unmarshal(e.Value(), &inv) == nil && r.opts.Now().Sub(time.UnixMilli(inv.ExpiresAt)) >= inviteKeep {
		_ = kv.Delete(ctx, key, jetstream.LastRevision(e.Revision()))
	}
}

// redeem handles a join request: the code must be known, unexpired and
// unused, and the node must prove it holds the seed of the key it
// presents. The code is marked used by compare-and-set (one redemption
// wins, whichever gateway serves it), then the node is paired as joined:
// every gateway's server admits its key with permissions confined to its
// subjects.
func (r *Registry) redeem(ctx context.Context, req protocol.NodePairRequest) protocol.NodePairResponse {
	refuse := func(t protocol.ErrorType, format string, args ...any) protocol.NodePairResponse {
		e := protocol.Errorf(t, format, args...)
		r.log.Warn("join refused", "nodeId", req.NodeID, "reason", e.Message)
		return protocol.NodePairResponse{Error: e}
	}
	id, err := bus.NodeIDFromPublicKey(req.PublicKey)
	if err != nil || id != req.NodeID {
		return refuse(protocol.ErrInvalidRequest, "join: node id %q does not match its public key", req.NodeID)
	}
	sig, err := base64.RawURLEncoding.DecodeString(req.Signature)
	if err != nil {
		return refuse(protocol.ErrInvalidRequest, "join: malformed signature")
	}
	kp, err := nkeys.FromPublicKey(req.PublicKey)
	if err != nil || kp.Verify(protocol.JoinSignedText(req.JoinSecret, req.PublicKey), sig) != nil {
		return refuse(protocol.ErrDenied, "join: the signature does not match the node's public key")
	}
	if req.JoinSecret == "" {
		return refuse(protocol.ErrNotFound, "join code is not valid: it was never issued by this gateway, or it expired long ago")
	}
	// Every gateway answers a join request, the first answer counts: one
	// that has not opened the bucket yet must not call the code unknown.
	kv := r.awaitJoins(ctx)
	if kv == nil {
		return refuse(protocol.ErrUnavailable, "join codes are not available yet (JetStream starting); retry")
	}
	key := secretKey(req.JoinSecret)
	for attempt := 0; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, kvTimeout)
		e, err := kv.Get(actx, key)
		cancel()
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return refuse(protocol.ErrNotFound, "join code is not valid: it was never issued by this gateway, or it expired long ago")
		}
		if err != nil {
			return refuse(protocol.ErrUnavailable, "join: %v", err)
		}
		var inv invite
		if err := json.Unmarshal(e.Value(), &inv); err != nil {
			return refuse(protocol.ErrInternal, "join: corrupt code entry")
		}
		now := r.opts.Now()
		switch {
		case inv.UsedBy == id:
			// The same node asking again (its answer was lost): the code
			// is its own already.
			return protocol.NodePairResponse{Status: protocol.NodePairingPaired, NodeID: id, Message: "joined and paired", GatewayKeys: r.opts.GatewayKeys()}
		case inv.UsedBy != "":
			return refuse(protocol.ErrConflict, "join code was already used (by node %s); a code works once: create a new one with `execmesh nodes invite`", inv.UsedBy)
		case now.After(time.UnixMilli(inv.ExpiresAt)):
			return refuse(protocol.ErrConflict, "join code expired at %s; create a new one with `execmesh nodes invite`", time.UnixMilli(inv.ExpiresAt).UTC().Format(time.RFC3339))
		case req.JoinUser != inv.User:
			return refuse(protocol.ErrInvalidRequest, "join: the code's user does not match")
		}
		inv.UsedBy = id
		b, _ := json.Marshal(inv)
		actx, cancel = context.WithTimeout(ctx, kvTimeout)
		_, err = kv.Update(actx, key, b, e.Revision())
		cancel()
		if err == nil {
			name := req.Name
			if name == "" {
				name = inv.Name
			}
			if _, err := r.Admit(ctx, req.PublicKey, name); err != nil {
				return refuse(protocol.ErrUnavailable, "join: pairing the node: %v", err)
			}
			r.log.Info("node joined by code and paired", "node", id, "name", name)
			return protocol.NodePairResponse{Status: protocol.NodePairingPaired, NodeID: id, Message: "joined and paired", GatewayKeys: r.opts.GatewayKeys()}
		}
		if attempt >= 5 || !bus.IsWrongLastSequence(err) {
			return refuse(protocol.ErrUnavailable, "join: %v", err)
		}
		// Another gateway redeemed it meanwhile: read it again.
	}
}
