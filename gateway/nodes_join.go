package gateway

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/protocol"
)

// inviteKeep is how long an expired invite is remembered, to say
// "expired" rather than "unknown".
const inviteKeep = time.Hour

// nodeInvite is one join code. Fields are guarded by nodeRouter.mu.
type nodeInvite struct {
	user        string // one-time NATS user, "" when the server needs none
	name        string
	created     time.Time
	expiresAt   time.Time
	used        bool
	usedBy      string
	userRemoved bool
}

// secretKey indexes invites by a hash of the secret, so the map lookup
// reveals nothing about the secret through timing.
func secretKey(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// SetEmbeddedServer gives the node backend the gateway's embedded NATS
// server, which join codes need: each code adds a one-time user limited
// to the join subject, and a redeemed code adds the node's nkey with
// permissions confined to its own subjects (bus.NodeUser), without
// disturbing other connections. Nodes paired earlier (recorded in
// <state-dir>/nodes.json with their keys) are admitted again at once,
// since a restarted server starts without them. Call it after ServeNATS.
func (g *Gateway) SetEmbeddedServer(s *bus.Server) error {
	r := g.router()
	if r == nil {
		return errNodesNotAttached
	}
	if s == nil {
		return fmt.Errorf("gateway: SetEmbeddedServer: nil server")
	}
	r.mu.Lock()
	r.server = s
	r.mu.Unlock()
	if !r.serverAuthOn(s) {
		return nil
	}
	users, nk := s.Users()
	have := map[string]bool{}
	for _, u := range nk {
		have[u.PublicKey] = true
	}
	added := 0
	for _, n := range r.store.all() {
		if n.Pairing != protocol.NodePairingPaired || n.PublicKey == "" || have[n.PublicKey] {
			continue
		}
		u, err := bus.NodeUser(r.prefix, n.PublicKey)
		if err != nil {
			r.log.Warn("stored node has an invalid key", "node", n.ID, "err", err)
			continue
		}
		nk = append(nk, u)
		added++
	}
	if added == 0 {
		return nil
	}
	if err := s.ReloadUsers(users, nk); err != nil {
		return fmt.Errorf("gateway: re-admitting %d joined nodes: %w", added, err)
	}
	r.log.Info("joined nodes re-admitted to the embedded NATS server", "nodes", added)
	return nil
}

// AdmitNode pairs the node holding publicKey as if it had joined by code:
// the decision is stored (marked joined, so that a restarted embedded
// server re-admits the key), and when the embedded server authenticates
// clients its nkey is added with permissions confined to the node's own
// subjects. `execmesh up` uses it for its local node: the embedded
// server admits no client without an identity, loopback included. Call
// it after ServeNATS (and SetEmbeddedServer, if the key must be admitted
// to the server right away).
func (g *Gateway) AdmitNode(publicKey string) error {
	r := g.router()
	if r == nil {
		return errNodesNotAttached
	}
	id, err := bus.NodeIDFromPublicKey(publicKey)
	if err != nil {
		return protocol.Errorf(protocol.ErrInvalidRequest, "%v", err)
	}
	r.mu.Lock()
	srv := r.server
	n := r.nodes[id]
	if n == nil {
		n = &nodeEntry{id: id, interval: defaultHeartbeatInterval, firstSeen: r.now()}
		r.nodes[id] = n
	}
	n.publicKey, n.joined = publicKey, true
	r.mu.Unlock()
	if srv != nil && r.serverAuthOn(srv) {
		u, err := bus.NodeUser(r.prefix, publicKey)
		if err != nil {
			return err
		}
		if err := srv.AddNKeyUser(u); err != nil {
			return fmt.Errorf("gateway: admit node %s: %w", id, err)
		}
	}
	_, err = r.decide(r.ctx, id, protocol.NodePairingPaired, true)
	return err
}

// serverAuthOn reports whether the server authenticates clients: then a
// join code needs a one-time user and a joined node its nkey entry.
func (r *nodeRouter) serverAuthOn(s *bus.Server) bool {
	users, nk := s.Users()
	return len(users)+len(nk) > 0
}

// joinURLs returns the NATS URLs a join code carries.
func (r *nodeRouter) joinURLs(srv *bus.Server, opts NodeOptions) []string {
	if len(opts.JoinURLs) > 0 {
		return opts.JoinURLs
	}
	if srv == nil {
		return nil
	}
	local := srv.ClientURL()
	addr, ok := srv.NATSServer().Addr().(*net.TCPAddr)
	if !ok || addr == nil || local == "" {
		return nil
	}
	if !addr.IP.IsUnspecified() {
		return []string{local}
	}
	// Listening everywhere: offer every routable address, loopback last.
	scheme, _, _ := strings.Cut(local, "://")
	var urls []string
	if ifaddrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range ifaddrs {
			ipn, ok := a.(*net.IPNet)
			if !ok || ipn.IP.IsLoopback() || ipn.IP.IsLinkLocalUnicast() || ipn.IP.IsMulticast() {
				continue
			}
			urls = append(urls, scheme+"://"+net.JoinHostPort(ipn.IP.String(), strconv.Itoa(addr.Port)))
		}
	}
	return append(urls, local)
}

// inviteReply is the answer of POST /v1/nodes/invite.
type inviteReply struct {
	Code        string `json:"code"`
	Command     string `json:"command"`
	ExpiresAtMs int64  `json:"expiresAtMs"`
}

// createInvite issues a join code valid for ttl (0: the default).
func (r *nodeRouter) createInvite(name string, ttl time.Duration) (inviteReply, error) {
	r.mu.Lock()
	srv, opts := r.server, r.opts
	r.mu.Unlock()
	urls := r.joinURLs(srv, opts)
	if len(urls) == 0 {
		return inviteReply{}, protocol.Errorf(protocol.ErrConflict,
			"join codes need the gateway's embedded NATS server; with an external NATS cluster give nodes credentials with NATS's account tooling (deploy/) and pair them with `execmesh nodes approve`")
	}
	if ttl <= 0 {
		ttl = opts.InviteTTL
	}
	ttl = min(max(ttl, minInviteTTL), maxInviteTTL)
	now := r.now()
	inv := &nodeInvite{name: name, created: now, expiresAt: now.Add(ttl)}
	secret := randomHex(32)
	if srv != nil && r.serverAuthOn(srv) {
		inv.user = "join-" + randomHex(8)
		perms, err := bus.JoinPermissions(r.prefix, inv.user)
		if err != nil {
			return inviteReply{}, protocol.Errorf(protocol.ErrInternal, "join permissions: %v", err)
		}
		if err := srv.AddUser(bus.User{Name: inv.user, Password: secret, Permissions: perms}); err != nil {
			return inviteReply{}, protocol.Errorf(protocol.ErrInternal, "adding the join code's one-time NATS user: %v", err)
		}
	}
	b, err := json.Marshal(protocol.JoinCode{V: 1, URLs: urls, Prefix: r.prefix, User: inv.user, Secret: secret, Name: name, ExpiresAt: inv.expiresAt.UnixMilli()})
	if err != nil {
		return inviteReply{}, protocol.Errorf(protocol.ErrInternal, "encode join code: %v", err)
	}
	r.mu.Lock()
	r.invites[secretKey(secret)] = inv
	r.mu.Unlock()
	code := base64.RawURLEncoding.EncodeToString(b)
	r.log.Info("join code issued", "name", name, "expiresAt", inv.expiresAt, "oneTimeUser", inv.user != "")
	return inviteReply{Code: code, Command: "execmesh node --join " + code, ExpiresAtMs: inv.expiresAt.UnixMilli()}, nil
}

// redeem handles a join request: the code must be known, unexpired and
// unused, and the node must prove it holds the seed of the key it
// presents. The node's key is then admitted to the embedded server with
// permissions confined to its subjects, and the node is paired.
func (r *nodeRouter) redeem(req protocol.NodePairRequest) protocol.NodePairResponse {
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
	r.mu.Lock()
	inv := r.invites[secretKey(req.JoinSecret)]
	now := r.now()
	switch {
	case req.JoinSecret == "" || inv == nil:
		r.mu.Unlock()
		return refuse(protocol.ErrNotFound, "join code is not valid: it was never issued by this gateway, or it expired long ago")
	case inv.used && inv.usedBy == id:
		// The same node asking again (its answer was lost): the code is
		// its own already.
		r.mu.Unlock()
		return protocol.NodePairResponse{Status: protocol.NodePairingPaired, NodeID: id, Message: "joined and paired"}
	case inv.used:
		by := inv.usedBy
		r.mu.Unlock()
		return refuse(protocol.ErrConflict, "join code was already used (by node %s); a code works once: create a new one with `execmesh nodes invite`", by)
	case now.After(inv.expiresAt):
		at := inv.expiresAt
		r.mu.Unlock()
		return refuse(protocol.ErrConflict, "join code expired at %s; create a new one with `execmesh nodes invite`", at.UTC().Format(time.RFC3339))
	case req.JoinUser != inv.user:
		r.mu.Unlock()
		return refuse(protocol.ErrInvalidRequest, "join: the code's user does not match")
	}
	inv.used, inv.usedBy = true, id
	srv := r.server
	r.mu.Unlock()

	if srv != nil && r.serverAuthOn(srv) {
		u, err := bus.NodeUser(r.prefix, req.PublicKey)
		if err == nil {
			err = srv.AddNKeyUser(u)
		}
		if err != nil {
			r.mu.Lock()
			inv.used, inv.usedBy = false, ""
			r.mu.Unlock()
			return refuse(protocol.ErrInternal, "join: admitting the node's key to NATS: %v", err)
		}
	}
	r.mu.Lock()
	n := r.nodes[id]
	if n == nil {
		n = &nodeEntry{id: id, interval: defaultHeartbeatInterval, firstSeen: now}
		r.nodes[id] = n
	}
	n.publicKey, n.pairing, n.joined = req.PublicKey, protocol.NodePairingPaired, true
	if req.Name != "" {
		n.name = req.Name
	} else if inv.name != "" {
		n.name = inv.name
	}
	if req.Platform != "" {
		n.platform = req.Platform
	}
	n.synced = ""
	stored := storedNode{ID: id, PublicKey: req.PublicKey, Name: n.name, Pairing: protocol.NodePairingPaired, Joined: true, DecidedAt: now.UnixMilli()}
	r.mu.Unlock()
	if err := r.store.put(stored); err != nil {
		r.log.Warn("node pairing store", "err", err)
	}
	r.log.Info("node joined by code and paired", "node", id, "name", stored.Name)
	return protocol.NodePairResponse{Status: protocol.NodePairingPaired, NodeID: id, Message: "joined and paired"}
}

// expireInvitesLocked forgets old invites and returns the one-time users
// to remove from the server (used codes after a grace, expired ones).
// r.mu is held.
func (r *nodeRouter) expireInvitesLocked(now time.Time) []string {
	var users []string
	for k, inv := range r.invites {
		// A used code's user is kept until the code expires: the gateway
		// refuses a second use anyway, and removing the user would close
		// the joiner's connection, which may still be waiting for (or
		// retrying) its answer.
		if inv.user != "" && !inv.userRemoved && r.server != nil && now.After(inv.expiresAt) {
			inv.userRemoved = true
			users = append(users, inv.user)
		}
		if now.Sub(inv.expiresAt) > inviteKeep && (inv.userRemoved || inv.user == "") {
			delete(r.invites, k)
		}
	}
	return users
}
