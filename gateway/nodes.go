package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/protocol"
)

// Node backend defaults, in one place.
const (
	// defaultHeartbeatInterval is assumed for a node until its first
	// heartbeat says otherwise (nodeagent's default).
	defaultHeartbeatInterval = 5 * time.Second
	// presenceMisses heartbeats missed in a row make a node unreachable,
	// unless NodeOptions.PresenceTTL says otherwise.
	presenceMisses       = 3
	minPresenceTTL       = time.Second
	defaultGhostTTL      = 10 * time.Minute
	defaultRequestMargin = 15 * time.Second
	defaultCallTimeout   = 15 * time.Second
	defaultInviteTTL     = 15 * time.Minute
	maxInviteTTL         = 24 * time.Hour
	minInviteTTL         = time.Second
	// maxPollWait is the session core's cap on a poll wait (DESIGN §3.2).
	maxPollWait = 30 * time.Second
	// deliveredTTL is how long an exit event id is remembered, so that a
	// redelivery or a late republish is not queued twice.
	deliveredTTL = 24 * time.Hour
	maxDelivered = 100000
	// discoveryWait is how long the gateway collects micro PING answers
	// at start, to learn the live nodes before their next heartbeat.
	discoveryWait = 500 * time.Millisecond
	// notifyTimeout bounds telling a node about its pairing.
	notifyTimeout = 2 * time.Second
	// listConcurrency bounds parallel list requests to nodes.
	listConcurrency = 8
)

// NodeOptions tunes the node backend. Zero fields keep their defaults.
// The defaults can also be set through the environment the gateway reads
// (Options.Getenv): EXECMESH_NODE_PRESENCE_TTL_MS, EXECMESH_NODE_GHOST_TTL_MS,
// EXECMESH_NODE_REQUEST_MARGIN_MS, EXECMESH_NODE_CALL_TIMEOUT_MS,
// EXECMESH_NODE_INVITE_TTL_MS and EXECMESH_NODE_JOIN_URLS (comma-separated).
type NodeOptions struct {
	// PresenceTTL: a node without a heartbeat for this long is
	// unreachable. Default: three of the node's own heartbeat intervals
	// (15 s for nodeagent's default of 5 s).
	PresenceTTL time.Duration
	// GhostTTL: an unpaired node unreachable for this long is dropped
	// from the node list (paired and rejected nodes stay). Default 10 min.
	GhostTTL time.Duration
	// RequestMargin is added to the longest wait of a request (the yield
	// window of an exec, the wait of a poll, the timeout of a synchronous
	// run) to form its deadline. Default 15 s.
	RequestMargin time.Duration
	// CallTimeout bounds requests that do not wait (process actions
	// other than poll, list, background starts). Default 15 s.
	CallTimeout time.Duration
	// InviteTTL is the lifetime of a join code when the invite names
	// none. Default 15 min; at most 24 h.
	InviteTTL time.Duration
	// JoinURLs are the NATS URLs put into join codes. Default: the
	// embedded server's address (every interface's address when it
	// listens on all of them).
	JoinURLs []string
}

// nodeOptionsFromEnv returns the defaults overridden by EXECMESH_NODE_*.
func nodeOptionsFromEnv(getenv func(string) string, log *slog.Logger) NodeOptions {
	o := NodeOptions{}
	ms := func(key string, dst *time.Duration) {
		v := strings.TrimSpace(getenv(key))
		if v == "" {
			return
		}
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			log.Warn("ignoring invalid setting", "key", key, "value", v)
			return
		}
		*dst = time.Duration(n) * time.Millisecond
	}
	ms("EXECMESH_NODE_PRESENCE_TTL_MS", &o.PresenceTTL)
	ms("EXECMESH_NODE_GHOST_TTL_MS", &o.GhostTTL)
	ms("EXECMESH_NODE_REQUEST_MARGIN_MS", &o.RequestMargin)
	ms("EXECMESH_NODE_CALL_TIMEOUT_MS", &o.CallTimeout)
	ms("EXECMESH_NODE_INVITE_TTL_MS", &o.InviteTTL)
	if v := strings.TrimSpace(getenv("EXECMESH_NODE_JOIN_URLS")); v != "" {
		for u := range strings.SplitSeq(v, ",") {
			if u = strings.TrimSpace(u); u != "" {
				o.JoinURLs = append(o.JoinURLs, u)
			}
		}
	}
	return o.withDefaults()
}

func (o NodeOptions) withDefaults() NodeOptions {
	if o.GhostTTL <= 0 {
		o.GhostTTL = defaultGhostTTL
	}
	if o.RequestMargin <= 0 {
		o.RequestMargin = defaultRequestMargin
	}
	if o.CallTimeout <= 0 {
		o.CallTimeout = defaultCallTimeout
	}
	if o.InviteTTL <= 0 {
		o.InviteTTL = defaultInviteTTL
	}
	o.InviteTTL = min(max(o.InviteTTL, minInviteTTL), maxInviteTTL)
	o.JoinURLs = slices.Clone(o.JoinURLs)
	return o
}

// nodeEntry is the gateway's view of one node. Fields are guarded by
// nodeRouter.mu.
type nodeEntry struct {
	id        string
	publicKey string
	name      string
	platform  string
	hostname  string
	version   string
	server    string
	contain   string // the node's containment, from heartbeats
	instance  string // current run of the agent, from heartbeats
	startedAt int64
	sessions  int
	interval  time.Duration
	lastSeen  time.Time // zero: not seen since the gateway started
	firstSeen time.Time
	pairing   string // pending, paired or rejected
	joined    bool
	// synced is the instance the session index was last rebuilt from;
	// syncing marks a resync in flight.
	synced  string
	syncing bool
}

// nodeInfo is a copy of a nodeEntry, safe to use without the lock.
type nodeInfo struct {
	nodeEntry
	live bool
}

func (n *nodeEntry) label() string {
	if n.name != "" && n.name != n.id {
		return n.name + " (" + n.id + ")"
	}
	return n.id
}

// nodeRouter is the gateway's node backend: registry and pairing,
// presence, routing, the index of remote sessions, exit events and join
// codes. It implements nodeBackend.
type nodeRouter struct {
	g      *Gateway
	log    *slog.Logger
	nc     *nats.Conn
	js     jetstream.JetStream
	prefix string
	subj   protocol.SubjectSet
	store  *nodeStore
	now    func() time.Time

	// ctx ends when Close begins; every goroutine of the router derives
	// from it and is counted in wg.
	ctx        context.Context
	cancel     context.CancelFunc
	wg         sync.WaitGroup
	closeOnce  sync.Once
	closed     chan struct{}
	closeErr   error
	discovered chan struct{} // closed once the start-up discovery is done

	mu        sync.Mutex // guards everything below
	opts      NodeOptions
	closing   bool
	subs      []*nats.Subscription
	consumer  jetstream.ConsumeContext
	nodes     map[string]*nodeEntry
	index     map[string]map[string]*remoteSession // sessionKey → visible id → session
	indexSeq  uint64                               // last remoteSession.seq
	server    *bus.Server
	invites   map[string]*nodeInvite // by secretKey(secret)
	delivered map[string]time.Time   // exit-event ids already queued

	// runs holds the approval-gated node runs waiting for their exit
	// event: approval id → *nodeRunWaiter (nodes_approval.go).
	runs sync.Map
}

// attachNodes creates the node backend on nc and makes it the gateway's
// (ServeNATS calls it). It subscribes to presence and pairing, adds the
// /v1/nodes routes, and starts, in the background, the exit-event
// consumer and the discovery of live nodes. The backend stops when ctx
// ends or CloseNodes is called.
func (g *Gateway) attachNodes(ctx context.Context, nc *nats.Conn, prefix string) error {
	if prefix == "" {
		prefix = protocol.DefaultSubjectPrefix
	}
	if err := protocol.ValidateSubjectPrefix(prefix); err != nil {
		return fmt.Errorf("nats.prefix: %w", err)
	}
	cfg := g.Config()
	store, err := openNodeStore(cfg.StateDir)
	if err != nil {
		return err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	r := &nodeRouter{
		g:          g,
		log:        g.log.With("component", "nodes"),
		nc:         nc,
		js:         js,
		prefix:     prefix,
		subj:       protocol.Subjects(prefix),
		store:      store,
		now:        time.Now,
		closed:     make(chan struct{}),
		discovered: make(chan struct{}),
		opts:       nodeOptionsFromEnv(g.opts.Getenv, g.log),
		nodes:      map[string]*nodeEntry{},
		index:      map[string]map[string]*remoteSession{},
		invites:    map[string]*nodeInvite{},
		delivered:  map[string]time.Time{},
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	for _, s := range store.all() {
		r.nodes[s.ID] = &nodeEntry{id: s.ID, publicKey: s.PublicKey, name: s.Name, pairing: s.Pairing, joined: s.Joined, interval: defaultHeartbeatInterval}
	}
	for _, sub := range []struct {
		subject string
		cb      nats.MsgHandler
	}{
		{r.subj.Presence, r.onHeartbeat},
		{r.subj.PairRequest, r.onPairRequest},
	} {
		s, err := nc.Subscribe(sub.subject, sub.cb)
		if err != nil {
			r.unsubscribeAll()
			return fmt.Errorf("subscribe %s: %w", sub.subject, err)
		}
		_ = bus.SetPendingLimits(s)
		r.subs = append(r.subs, s)
	}
	g.natsMu.Lock()
	if g.nodes != nil {
		g.natsMu.Unlock()
		r.unsubscribeAll()
		return errors.New("node backend already attached")
	}
	g.nodes = r
	g.natsMu.Unlock()
	// Handler() has not been called yet (the server wiring calls
	// ServeNATS first), so the routes are still read from here.
	g.routes = append(g.routes, r.routes()...)

	r.spawn(r.runExitConsumer)
	r.spawn(r.discover)
	r.spawn(r.sweepLoop)
	// The watcher is the one goroutine the router does not count: it is
	// what calls Close when the NATS API stops.
	go func() {
		select {
		case <-ctx.Done():
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := r.Close(cctx); err != nil {
				r.log.Warn("node backend close", "err", err)
			}
		case <-r.closed:
		}
	}()
	r.log.Info("node backend attached", "prefix", prefix, "storedNodes", len(r.nodes))
	return nil
}

// router returns the attached node backend, or nil.
func (g *Gateway) router() *nodeRouter {
	r, _ := g.nodeBackend().(*nodeRouter)
	return r
}

// errNodesNotAttached: a node operation before ServeNATS.
var errNodesNotAttached = errors.New("gateway: the node backend is not attached (call ServeNATS first)")

// SetNodeOptions replaces the node backend's tuning (presence TTL, ghost
// TTL, request margins, invite lifetime, join URLs). Zero fields take
// their defaults. Call it after ServeNATS.
func (g *Gateway) SetNodeOptions(o NodeOptions) error {
	r := g.router()
	if r == nil {
		return errNodesNotAttached
	}
	r.mu.Lock()
	r.opts = o.withDefaults()
	r.mu.Unlock()
	return nil
}

// CloseNodes stops the node backend: it stops taking node messages,
// drains the exit-event consumer (in-flight events are acknowledged) and
// waits for its goroutines, bounded by ctx. Gateway.Close stops it too,
// in the background; call CloseNodes first for an orderly shutdown.
func (g *Gateway) CloseNodes(ctx context.Context) error {
	r := g.router()
	if r == nil {
		return nil
	}
	return r.Close(ctx)
}

// ApproveNode pairs the node with this id, so that it receives work, and
// records the decision in <state-dir>/nodes.json. The node need not have
// been seen yet: `execmesh up` approves its own local node before the
// node's first heartbeat. Before ServeNATS the decision is written to the
// file and picked up when the backend attaches.
func (g *Gateway) ApproveNode(id string) error {
	if err := protocol.ValidateNodeID(id); err != nil {
		return err
	}
	if r := g.router(); r != nil {
		_, err := r.decide(r.ctx, id, protocol.NodePairingPaired, true)
		return err
	}
	store, err := openNodeStore(g.Config().StateDir)
	if err != nil {
		return err
	}
	n, _ := store.get(id)
	n.ID, n.Pairing, n.DecidedAt = id, protocol.NodePairingPaired, time.Now().UnixMilli()
	return store.put(n)
}

// spawn runs f in a goroutine counted in r.wg, unless Close has begun.
func (r *nodeRouter) spawn(f func(ctx context.Context)) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closing {
		return false
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		f(r.ctx)
	}()
	return true
}

func (r *nodeRouter) unsubscribeAll() {
	r.mu.Lock()
	subs := r.subs
	r.subs = nil
	r.mu.Unlock()
	for _, s := range subs {
		_ = s.Unsubscribe()
	}
}

// Close stops the backend: no more node messages, the exit consumer
// drained, background work ended. It is idempotent.
func (r *nodeRouter) Close(ctx context.Context) error {
	r.closeOnce.Do(func() {
		r.mu.Lock()
		r.closing = true
		cons := r.consumer
		r.consumer = nil
		r.mu.Unlock()
		r.unsubscribeAll()
		var errs []error
		if cons != nil {
			// Drain lets the handler finish (and acknowledge) what was
			// already delivered; the rest is redelivered to the next
			// gateway.
			cons.Drain()
			select {
			case <-cons.Closed():
			case <-ctx.Done():
				cons.Stop()
				errs = append(errs, fmt.Errorf("exit consumer drain: %w", ctx.Err()))
			}
		}
		r.cancel()
		done := make(chan struct{})
		go func() {
			r.wg.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-ctx.Done():
			errs = append(errs, fmt.Errorf("node backend goroutines: %w", ctx.Err()))
		}
		r.closeErr = errors.Join(errs...)
		close(r.closed)
	})
	return r.closeErr
}

// options returns the current tuning.
func (r *nodeRouter) options() NodeOptions {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.opts
}

// presenceTTLLocked is how long n may stay silent and still be live.
func (r *nodeRouter) presenceTTLLocked(n *nodeEntry) time.Duration {
	if r.opts.PresenceTTL > 0 {
		return r.opts.PresenceTTL
	}
	iv := n.interval
	if iv <= 0 {
		iv = defaultHeartbeatInterval
	}
	return max(presenceMisses*iv, minPresenceTTL)
}

// liveLocked reports whether n sent a heartbeat recently enough.
func (r *nodeRouter) liveLocked(n *nodeEntry, now time.Time) bool {
	return !n.lastSeen.IsZero() && now.Sub(n.lastSeen) <= r.presenceTTLLocked(n)
}

func (r *nodeRouter) infoLocked(n *nodeEntry, now time.Time) nodeInfo {
	return nodeInfo{nodeEntry: *n, live: r.liveLocked(n, now)}
}

// nodeSnapshot returns a copy of the node id, if known.
func (r *nodeRouter) nodeSnapshot(id string) (nodeInfo, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.nodes[id]
	if !ok {
		return nodeInfo{}, false
	}
	return r.infoLocked(n, r.now()), true
}

// allNodes returns copies of every known node, sorted by name and id.
func (r *nodeRouter) allNodes() []nodeInfo {
	r.mu.Lock()
	now := r.now()
	out := make([]nodeInfo, 0, len(r.nodes))
	for _, n := range r.nodes {
		out = append(out, r.infoLocked(n, now))
	}
	r.mu.Unlock()
	slices.SortFunc(out, func(a, b nodeInfo) int {
		if c := strings.Compare(a.name, b.name); c != 0 {
			return c
		}
		return strings.Compare(a.id, b.id)
	})
	return out
}

// onHeartbeat records a node's heartbeat. It runs on the subscription's
// goroutine and only updates state; a resync it triggers runs elsewhere.
func (r *nodeRouter) onHeartbeat(m *nats.Msg) {
	token := strings.TrimPrefix(m.Subject, r.prefix+".presence.")
	var hb protocol.NodeHeartbeat
	if err := json.Unmarshal(m.Data, &hb); err != nil {
		r.log.Debug("malformed heartbeat", "subject", m.Subject, "err", err)
		return
	}
	// The id must be the one derived from the key, and the subject the
	// node's own (NATS permissions confine a joined node to it).
	id, err := bus.NodeIDFromPublicKey(hb.PublicKey)
	if err != nil || id != hb.NodeID || id != token {
		r.log.Warn("heartbeat with an inconsistent node id ignored", "subject", m.Subject, "nodeId", hb.NodeID)
		return
	}
	r.seen(seenInfo{
		id: id, publicKey: hb.PublicKey, name: hb.Name, platform: hb.Platform, hostname: hb.Hostname,
		version: hb.Version, server: hb.Server, instance: hb.Instance, startedAt: hb.StartedAt,
		sessions: hb.Sessions, sessionsKnown: true, interval: time.Duration(hb.IntervalMs) * time.Millisecond,
		containment: hb.Containment,
	})
}

// seenInfo is what a heartbeat, an announcement or a discovery answer
// tells about a node.
type seenInfo struct {
	id, publicKey, name, platform, hostname, version, server, instance string
	containment                                                        string
	startedAt                                                          int64
	sessions                                                           int
	sessionsKnown                                                      bool
	interval                                                           time.Duration
}

// seen updates the registry with a sign of life and starts a resync of
// the node's sessions when the node is paired and its index is not built
// from its current instance.
func (r *nodeRouter) seen(s seenInfo) {
	r.mu.Lock()
	now := r.now()
	n, ok := r.nodes[s.id]
	if !ok {
		n = &nodeEntry{id: s.id, pairing: protocol.NodePairingPending, interval: defaultHeartbeatInterval, firstSeen: now}
		r.nodes[s.id] = n
		r.log.Info("new node awaiting pairing", "node", s.id, "name", s.name, "approve", "execmesh nodes approve "+s.id)
	}
	if n.firstSeen.IsZero() {
		n.firstSeen = now
	}
	wasLive := r.liveLocked(n, now)
	n.lastSeen = now
	set := func(dst *string, v string) {
		if v != "" {
			*dst = v
		}
	}
	set(&n.name, s.name)
	set(&n.contain, s.containment)
	set(&n.platform, s.platform)
	set(&n.hostname, s.hostname)
	set(&n.version, s.version)
	set(&n.server, s.server)
	if s.startedAt != 0 {
		n.startedAt = s.startedAt
	}
	if s.sessionsKnown {
		n.sessions = s.sessions
	}
	if s.interval > 0 {
		n.interval = s.interval
	}
	pubChanged := false
	if s.publicKey != "" && n.publicKey == "" {
		n.publicKey = s.publicKey
		pubChanged = n.pairing != protocol.NodePairingPending
	}
	restarted := s.instance != "" && n.instance != "" && s.instance != n.instance
	if s.instance != "" {
		n.instance = s.instance
	}
	needSync := r.needResyncLocked(n, now, !wasLive)
	stored := storedNode{ID: n.id, PublicKey: n.publicKey, Name: n.name, Pairing: n.pairing, Joined: n.joined}
	r.mu.Unlock()
	if restarted {
		r.log.Warn("node restarted: its earlier sessions are lost", "node", s.id, "instance", s.instance)
	}
	if pubChanged {
		if old, ok := r.store.get(stored.ID); ok {
			stored.DecidedAt = old.DecidedAt
			if err := r.store.put(stored); err != nil {
				r.log.Warn("node pairing store", "err", err)
			}
		}
	}
	if needSync {
		r.startResync(s.id)
	}
}

// needResyncLocked reports whether n's sessions should be listed again to
// rebuild the index (it is paired and live, and the index was not built
// from its current instance, or force), and marks the resync as started.
// r.mu is held.
func (r *nodeRouter) needResyncLocked(n *nodeEntry, now time.Time, force bool) bool {
	if n.pairing != protocol.NodePairingPaired || n.syncing || n.instance == "" || !r.liveLocked(n, now) {
		return false
	}
	if !force && n.synced == n.instance {
		return false
	}
	n.syncing = true
	return true
}

// startResync runs resync for id in a tracked goroutine.
func (r *nodeRouter) startResync(id string) {
	if r.spawn(func(ctx context.Context) { r.resync(ctx, id) }) {
		return
	}
	r.mu.Lock()
	if n := r.nodes[id]; n != nil {
		n.syncing = false
	}
	r.mu.Unlock()
}

// onPairRequest answers pairing requests: announcements get the node's
// status; join requests redeem a join code. The work runs in a tracked
// goroutine (a join writes the pairing store and admits a key).
func (r *nodeRouter) onPairRequest(m *nats.Msg) {
	if m.Reply == "" {
		return
	}
	r.spawn(func(ctx context.Context) {
		var req protocol.NodePairRequest
		if err := json.Unmarshal(m.Data, &req); err != nil {
			r.replyPair(m, protocol.NodePairResponse{Error: protocol.Errorf(protocol.ErrInvalidRequest, "pairing request: malformed JSON: %v", err)})
			return
		}
		switch req.Type {
		case protocol.NodePairAnnounce:
			r.replyPair(m, r.announce(req))
		case protocol.NodePairJoin:
			r.replyPair(m, r.redeem(req))
		default:
			r.replyPair(m, protocol.NodePairResponse{Error: protocol.Errorf(protocol.ErrInvalidRequest, "pairing request: unknown type %q", req.Type)})
		}
	})
}

func (r *nodeRouter) replyPair(m *nats.Msg, reply protocol.NodePairResponse) {
	b, err := json.Marshal(reply)
	if err != nil {
		return
	}
	if err := m.Respond(b); err != nil {
		r.log.Debug("pairing reply not sent", "err", err)
	}
}

// announce records a node that presents itself and answers its status.
func (r *nodeRouter) announce(req protocol.NodePairRequest) protocol.NodePairResponse {
	id, err := bus.NodeIDFromPublicKey(req.PublicKey)
	if err != nil || id != req.NodeID {
		return protocol.NodePairResponse{Error: protocol.Errorf(protocol.ErrInvalidRequest, "pairing request: node id %q does not match public key", req.NodeID)}
	}
	// Any client allowed on the pairing subject can claim any key here, so
	// an announcement only registers an unknown node as pending; the
	// liveness and details of a known node come from its heartbeats,
	// which NATS permissions tie to the node's own subject.
	if n, ok := r.nodeSnapshot(id); ok {
		return protocol.NodePairResponse{Status: n.pairing, NodeID: id}
	}
	r.seen(seenInfo{id: id, publicKey: req.PublicKey, name: req.Name, platform: req.Platform, version: req.Version, instance: req.Instance})
	n, _ := r.nodeSnapshot(id)
	return protocol.NodePairResponse{Status: n.pairing, NodeID: id}
}

// decide approves (protocol.NodePairingPaired) or rejects
// (protocol.NodePairingRejected) a node and stores the decision.
// allowUnknown admits an id never seen (ApproveNode). The node is told at
// once when it is connected, so its own gate agrees.
func (r *nodeRouter) decide(ctx context.Context, id, pairing string, allowUnknown bool) (nodeInfo, error) {
	r.mu.Lock()
	n, ok := r.nodes[id]
	if !ok {
		if !allowUnknown {
			r.mu.Unlock()
			return nodeInfo{}, protocol.Errorf(protocol.ErrNotFound, "unknown node %q", id)
		}
		n = &nodeEntry{id: id, interval: defaultHeartbeatInterval}
		r.nodes[id] = n
	}
	old := n.pairing
	n.pairing = pairing
	if pairing == protocol.NodePairingPaired {
		n.synced = "" // rebuild the index from the node
	}
	stored := storedNode{ID: n.id, PublicKey: n.publicKey, Name: n.name, Pairing: pairing, Joined: n.joined, DecidedAt: r.now().UnixMilli()}
	srv := r.server
	info := r.infoLocked(n, r.now())
	r.mu.Unlock()
	if err := r.store.put(stored); err != nil {
		r.mu.Lock()
		n.pairing = old
		r.mu.Unlock()
		return nodeInfo{}, protocol.Errorf(protocol.ErrInternal, "%v", err)
	}
	// A node admitted by code loses (or regains) its NATS identity.
	if srv != nil && stored.Joined && stored.PublicKey != "" && r.serverAuthOn(srv) {
		var err error
		if pairing == protocol.NodePairingRejected {
			err = srv.RemoveNKeyUser(stored.PublicKey)
		} else {
			var u bus.NKeyUser
			if u, err = bus.NodeUser(r.prefix, stored.PublicKey); err == nil {
				err = srv.AddNKeyUser(u)
			}
		}
		if err != nil {
			r.log.Warn("updating the node's NATS identity", "node", id, "err", err)
		}
	}
	r.log.Info("node pairing decided", "node", id, "pairing", pairing)
	if info.live {
		r.notifyPairing(ctx, id, pairing)
	}
	if pairing == protocol.NodePairingPaired {
		r.mu.Lock()
		need := r.needResyncLocked(n, r.now(), true)
		r.mu.Unlock()
		if need {
			r.startResync(id)
		}
	}
	info, _ = r.nodeSnapshot(id)
	return info, nil
}

// notifyPairing tells a node its pairing status (best effort: a node
// that misses it asks again while it is not paired).
func (r *nodeRouter) notifyPairing(ctx context.Context, id, pairing string) {
	b, _ := json.Marshal(protocol.NodePairingNotice{Status: pairing})
	nctx, cancel := context.WithTimeout(ctx, notifyTimeout)
	defer cancel()
	if _, err := bus.RequestChunked(nctx, r.nc, r.subj.Node(id, protocol.NodeEndpointPairing), b, nil); err != nil {
		r.log.Debug("pairing notice not delivered", "node", id, "err", err)
	}
}

// discover asks every node service for a PING at start, so that live
// nodes are known (and resynchronised) before their next heartbeat.
//
// Any client may answer $SRV.PING with any metadata, so an answer is only
// a hint: each node id it names is probed on that node's own list
// endpoint, which NATS permissions let only that node serve, and only the
// probe's answer (its instance and sessions) counts.
func (r *nodeRouter) discover(ctx context.Context) {
	defer close(r.discovered)
	ids := r.pingNodes(ctx)
	var wg sync.WaitGroup
	sem := make(chan struct{}, listConcurrency)
	for _, id := range ids {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			r.probe(ctx, id)
		})
	}
	wg.Wait()
}

// probe asks node id for its complete session list on its own subject;
// an answer proves the node is there and which run of it answers, and
// rebuilds its index entries when it is paired.
func (r *nodeRouter) probe(ctx context.Context, id string) {
	n, ok := r.nodeSnapshot(id)
	if !ok {
		n = nodeInfo{nodeEntry: nodeEntry{id: id}}
	}
	body, _ := json.Marshal(protocol.NodeListRequest{All: true})
	asOf := r.indexMark()
	m, err := r.call(ctx, n, protocol.NodeEndpointList, body, nil, r.options().CallTimeout)
	if err != nil {
		r.log.Debug("discovery probe unanswered", "node", id, "err", err)
		return
	}
	var reply protocol.NodeListResponse
	if err := json.Unmarshal(m.Data, &reply); err != nil || reply.NodeID != id || reply.Instance == "" {
		return
	}
	r.seen(seenInfo{id: id, instance: reply.Instance, sessions: len(reply.Sessions)})
	if n, ok := r.nodeSnapshot(id); !ok || n.pairing != protocol.NodePairingPaired {
		return
	}
	entries := map[string][]protocol.Details{}
	for _, s := range reply.Sessions {
		entries[s.SessionKey] = append(entries[s.SessionKey], s.Details)
	}
	r.reconcile(id, reply.Instance, entries, true, false, asOf)
	r.mu.Lock()
	if e := r.nodes[id]; e != nil && e.instance == reply.Instance {
		e.synced = reply.Instance
	}
	r.mu.Unlock()
}

// pingNodes collects the node ids named in answers to a micro PING.
func (r *nodeRouter) pingNodes(ctx context.Context) []string {
	inbox := r.nc.NewRespInbox()
	sub, err := r.nc.SubscribeSync(inbox)
	if err != nil {
		return nil
	}
	defer sub.Unsubscribe() //nolint:errcheck
	subject, err := micro.ControlSubject(micro.PingVerb, bus.NodeServiceName, "")
	if err != nil {
		return nil
	}
	dctx, cancel := context.WithTimeout(ctx, discoveryWait)
	defer cancel()
	if err := r.nc.PublishRequest(subject, inbox, nil); err != nil {
		return nil
	}
	seen := map[string]bool{}
	var ids []string
	for {
		m, err := sub.NextMsgWithContext(dctx)
		if err != nil {
			return ids
		}
		var p micro.Ping
		if json.Unmarshal(m.Data, &p) != nil {
			continue
		}
		id := p.Metadata["nodeId"]
		if protocol.ValidateNodeID(id) != nil || seen[id] {
			continue
		}
		seen[id] = true
		ids = append(ids, id)
	}
}

// waitDiscovered waits (briefly) for the start-up discovery.
func (r *nodeRouter) waitDiscovered(ctx context.Context) {
	select {
	case <-r.discovered:
	case <-ctx.Done():
	case <-time.After(2 * discoveryWait):
	}
}

// sweepLoop drops ghost nodes, expires join codes, forgets old exit-event
// ids and retries resyncs that failed.
func (r *nodeRouter) sweepLoop(ctx context.Context) {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.sweep()
	}
}

func (r *nodeRouter) sweep() {
	r.mu.Lock()
	now := r.now()
	var resync []string
	for id, n := range r.nodes {
		live := r.liveLocked(n, now)
		if n.pairing == protocol.NodePairingPending && !live {
			last := n.lastSeen
			if last.IsZero() {
				last = n.firstSeen
			}
			if now.Sub(last) > r.opts.GhostTTL {
				delete(r.nodes, id)
				continue
			}
		}
		if r.needResyncLocked(n, now, false) {
			resync = append(resync, id)
		}
	}
	for k, at := range r.delivered {
		if now.Sub(at) > deliveredTTL {
			delete(r.delivered, k)
		}
	}
	expired := r.expireInvitesLocked(now)
	srv := r.server
	r.mu.Unlock()
	for _, id := range resync {
		r.startResync(id)
	}
	if srv != nil && len(expired) > 0 {
		var errs []error
		for _, user := range expired {
			errs = append(errs, srv.RemoveUser(user))
		}
		if err := errors.Join(errs...); err != nil {
			r.log.Warn("removing expired join codes' one-time users", "err", err)
		}
	}
}

// unreachableError is the retryable error for a node that is not
// connected; nothing was sent or started.
func unreachableError(n nodeInfo, now time.Time, what string) error {
	last := "never since the gateway started"
	if !n.lastSeen.IsZero() {
		last = now.Sub(n.lastSeen).Round(time.Second).String() + " ago"
	}
	return &protocol.Error{
		Type: protocol.ErrUnavailable, Retryable: true,
		Message: fmt.Sprintf("node %s is unreachable (last heartbeat %s); %s. Retry when it reconnects.", n.label(), last, what),
	}
}
