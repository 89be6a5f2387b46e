// Package nodes is the gateway's node control plane: the registry of node
// agents and their pairing (shared by every gateway through a JetStream KV
// bucket, decisions settled by compare-and-set), presence (each gateway
// hears the heartbeats itself; a timer per node, reset on each beat, and a
// probe the node must answer, so liveness is checked in both directions),
// join codes (one-time, in a KV bucket), the embedded NATS server's node
// identities, and the feed of node exit events.
//
// The registry is built from explicit Options and reports back through
// callbacks; it knows nothing of the gateway's tool API. Requests to a
// node go through Host, a hostbus.Remote tied to the node's liveness: a
// request in flight when its node goes silent fails then, not at its
// deadline.
package nodes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/hostbus"
	"github.com/execmesh/execmesh/protocol"
)

// Defaults, in one place.
const (
	// DefaultHeartbeatInterval is assumed for a node until its first
	// heartbeat says otherwise (nodeagent's default).
	DefaultHeartbeatInterval = 5 * time.Second
	// presenceMisses heartbeats missed in a row make a node unreachable,
	// unless Options.PresenceTTL says otherwise.
	presenceMisses   = 3
	minPresenceTTL   = time.Second
	DefaultGhostTTL  = 10 * time.Minute
	DefaultInviteTTL = 15 * time.Minute
	MaxInviteTTL     = 24 * time.Hour
	MinInviteTTL     = time.Second
	// inviteKeep is how long a used or expired join code is remembered,
	// to say "used" or "expired" rather than "unknown".
	inviteKeep = time.Hour
	// notifyTimeout bounds telling a node about its pairing.
	notifyTimeout = 2 * time.Second
	// probeTimeout bounds one liveness probe.
	probeTimeout = 2 * time.Second
	// kvTimeout bounds one registry KV operation.
	kvTimeout = 5 * time.Second
)

// Options configure a Registry. Conn, JS and Prefix are required.
type Options struct {
	Logger *slog.Logger
	Conn   *nats.Conn
	JS     jetstream.JetStream
	Prefix string
	// Replicas of the streams and buckets the registry creates when they
	// are missing (nats.replicas); 0 means 1.
	Replicas int
	// Server is the gateway's embedded NATS server, nil with an external
	// cluster. With it, the registry admits to the server exactly the
	// node identities the registry records (nodes that joined by code)
	// and the one-time users of unexpired join codes.
	Server *bus.Server
	// PresenceTTL: a node without a heartbeat for this long is
	// unreachable. Default: three of the node's own heartbeat intervals.
	PresenceTTL time.Duration
	// GhostTTL: a pending node unreachable this long is dropped from the
	// list. Default 10 min.
	GhostTTL time.Duration
	// InviteTTL is the lifetime of a join code that names none. Default
	// 15 min; at most 24 h.
	InviteTTL time.Duration
	// JoinURLs returns the NATS URLs a join code carries; nil or empty
	// means join codes cannot be issued.
	JoinURLs func() []string
	// GatewayKeys returns the public keys the gateways sign approval
	// decisions with; they go into join codes and pairing notices.
	GatewayKeys func() []string
	// RequestMargin and CallTimeout tune the Remote hosts (hostbus).
	RequestMargin time.Duration
	CallTimeout   time.Duration
	// ServerWatch, when set, makes calls to nodes fail within seconds of
	// the NATS server going silent (hostbus.Remote.ServerWatch).
	ServerWatch *bus.ServerWatch
	// Requests, when set, carries the requests to nodes on Conn over one
	// shared reply subscription (hostbus.Remote.Requests).
	Requests *bus.Requester
	// OnExit receives each exit event a paired node published, with the
	// node's registry entry. A nil error acknowledges it; an error has it
	// redelivered later (it must not be lost).
	OnExit func(ctx context.Context, n Node, ev protocol.ExitEvent) error
	// OnRestart is called when a node's heartbeats come from a new run of
	// the agent: the sessions of the old run are gone.
	OnRestart func(n Node, oldInstance string)
	// OnRejected is called when a node is rejected.
	OnRejected func(n Node)
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

func (o *Options) defaults() error {
	if o.Conn == nil || o.JS == nil {
		return errors.New("nodes: Conn and JS are required")
	}
	if o.Prefix == "" {
		o.Prefix = protocol.DefaultSubjectPrefix
	}
	if err := protocol.ValidateSubjectPrefix(o.Prefix); err != nil {
		return fmt.Errorf("nodes: Prefix: %w", err)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.GhostTTL <= 0 {
		o.GhostTTL = DefaultGhostTTL
	}
	if o.InviteTTL <= 0 {
		o.InviteTTL = DefaultInviteTTL
	}
	o.InviteTTL = min(max(o.InviteTTL, MinInviteTTL), MaxInviteTTL)
	if o.JoinURLs == nil {
		o.JoinURLs = func() []string { return nil }
	}
	if o.GatewayKeys == nil {
		o.GatewayKeys = func() []string { return nil }
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return nil
}

// Node is a copy of one node's entry, safe to use without locks.
type Node struct {
	ID        string
	PublicKey string
	Name      string
	Pairing   string // pending, paired or rejected
	Joined    bool   // joined by code: the embedded server admits its key
	Platform  string
	Hostname  string
	Version   string
	Server    string // the NATS server it is connected to
	Instance  string // the run of the agent its heartbeats come from
	StartedAt int64
	Sessions  int
	// Containment is the process-containment mode the node reports.
	Containment string
	// Confinement is how the node holds allowlist runs (landlock or
	// ask), and ConfinementReason why for ask.
	Confinement       string
	ConfinementReason string
	// Live is true while heartbeats come within the presence TTL and the
	// node answers probes.
	Live bool
	// LastSeen is the last heartbeat (zero: none since the gateway
	// started); Probed the last answered probe.
	LastSeen time.Time
	Probed   time.Time
	// Silent says what the node did when it stopped counting as live,
	// completing "it …" ("stopped sending heartbeats", "did not answer
	// the liveness probe", …); empty while live.
	Silent string
}

// Label names the node in texts: "name (id)", or the id.
func (n Node) Label() string {
	if n.Name != "" && n.Name != n.ID {
		return n.Name + " (" + n.ID + ")"
	}
	return n.ID
}

// record is a node's registry entry in the KV bucket: what every gateway
// shares. Pending nodes are not stored; they announce themselves again.
type record struct {
	ID        string `json:"id"`
	PublicKey string `json:"publicKey,omitempty"` // empty for a node approved by id before it was seen
	Name      string `json:"name,omitempty"`
	Pairing   string `json:"pairing"` // paired or rejected
	Joined    bool   `json:"joined,omitempty"`
	DecidedAt int64  `json:"decidedAt"` // unix ms
}

// entry is the registry's view of one node. Guarded by Registry.mu.
type entry struct {
	rec       record
	revision  uint64 // KV revision of rec (or of its deletion); 0 when never stored
	stored    bool
	firstSeen time.Time
	lastSeen  time.Time
	probed    time.Time // last answered probe
	probing   bool
	interval  time.Duration
	instance  string
	hb        protocol.NodeHeartbeat
	live      bool
	silent    string      // Node.Silent
	timer     *time.Timer // presence expiry
	ghost     *time.Timer // drops a pending node silent for GhostTTL
	// epoch ends (with cause hostbus.ErrSilent) when the node goes silent
	// or a new run replaces the one that was live; requests in flight
	// are tied to it.
	epoch       context.Context
	cancelEpoch context.CancelCauseFunc
}

// Registry is the node control plane. Build it with Start; stop it with
// Close.
type Registry struct {
	opts  Options
	log   *slog.Logger
	subj  protocol.SubjectSet
	names bus.StreamNames

	ctx    context.Context // ends when Close begins
	cancel context.CancelFunc
	wg     sync.WaitGroup

	server atomic.Pointer[bus.Server] // the embedded server, nil with an external one

	// feedLost is set while the exit feed's consumer, once consuming, is
	// lost and not created again yet (FeedHealthy).
	feedLost atomic.Pointer[error]

	mu       sync.Mutex // guards everything below
	closing  bool
	started  time.Time     // when Start ran
	liveCh   chan struct{} // closed (and replaced) when a node becomes live
	nodes    map[string]*entry
	kv       jetstream.KeyValue
	joins    jetstream.KeyValue
	invites  map[string]*invite // by key: every gateway's join codes
	subs     []*nats.Subscription
	consumer jetstream.ConsumeContext
	ready    chan struct{} // closed once the registry bucket was read
	joinsSet chan struct{} // closed once the join-code bucket is open
}

// Start builds the registry: it subscribes to presence and pairing, reads
// and watches the registry and join-code buckets (retrying in the
// background while JetStream is not ready), and consumes node exit
// events. ctx bounds nothing after Start returns; call Close.
func Start(opts Options) (*Registry, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	r := &Registry{
		opts:     opts,
		log:      opts.Logger.With("component", "nodes"),
		subj:     protocol.Subjects(opts.Prefix),
		names:    bus.StreamNamesFor(opts.Prefix),
		nodes:    map[string]*entry{},
		invites:  map[string]*invite{},
		ready:    make(chan struct{}),
		joinsSet: make(chan struct{}),
		started:  opts.Now(),
		liveCh:   make(chan struct{}),
	}
	r.server.Store(opts.Server)
	r.ctx, r.cancel = context.WithCancel(context.Background())
	for _, sub := range []struct {
		subject string
		cb      nats.MsgHandler
	}{
		{r.subj.Presence, r.onHeartbeat},
		{r.subj.PairRequest, r.onPairRequest},
	} {
		s, err := opts.Conn.Subscribe(sub.subject, sub.cb)
		if err != nil {
			r.unsubscribeAll()
			return nil, fmt.Errorf("nodes: subscribe %s: %w", sub.subject, err)
		}
		_ = bus.SetPendingLimits(s)
		r.subs = append(r.subs, s)
	}
	r.spawn(r.watchRegistry)
	r.spawn(r.watchJoins)
	r.spawn(r.runExitFeed)
	return r, nil
}

// spawn runs f in a goroutine counted in r.wg, unless Close has begun.
func (r *Registry) spawn(f func(ctx context.Context)) bool {
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

func (r *Registry) unsubscribeAll() {
	r.mu.Lock()
	subs := r.subs
	r.subs = nil
	r.mu.Unlock()
	for _, s := range subs {
		_ = s.Unsubscribe()
	}
}

// Close stops the registry: no more node messages, the exit feed drained
// (what was delivered is handled and acknowledged; the rest goes to
// another gateway or the next run), background work ended, bounded by ctx.
// It is idempotent.
func (r *Registry) Close(ctx context.Context) error {
	r.mu.Lock()
	if r.closing {
		r.mu.Unlock()
		return nil
	}
	r.closing = true
	cons := r.consumer
	r.consumer = nil
	for _, e := range r.nodes {
		for _, t := range []*time.Timer{e.timer, e.ghost} {
			if t != nil {
				t.Stop()
			}
		}
	}
	r.mu.Unlock()
	r.unsubscribeAll()
	var errs []error
	if cons != nil {
		cons.Drain()
		select {
		case <-cons.Closed():
		case <-ctx.Done():
			cons.Stop()
			errs = append(errs, fmt.Errorf("exit feed drain: %w", ctx.Err()))
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
		errs = append(errs, fmt.Errorf("nodes: goroutines: %w", ctx.Err()))
	}
	return errors.Join(errs...)
}

// Ready waits until the registry bucket was read (or ctx ends), so that
// pairing decisions are known.
func (r *Registry) Ready(ctx context.Context) error {
	select {
	case <-r.ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// awaitReady waits, within ctx and readyWait, for the registry bucket to
// be read: a gateway that just started must not call a paired node
// unknown. Not read in time is errNotReady, a retryable 503.
func (r *Registry) awaitReady(ctx context.Context) error {
	select {
	case <-r.ready:
		return nil
	default:
	}
	wctx, cancel := context.WithTimeout(ctx, readyWait)
	defer cancel()
	if r.Ready(wctx) != nil {
		return errNotReady
	}
	return nil
}

// presenceTTLLocked is how long e may stay silent and still be live.
func (r *Registry) presenceTTLLocked(e *entry) time.Duration {
	if r.opts.PresenceTTL > 0 {
		return r.opts.PresenceTTL
	}
	iv := e.interval
	if iv <= 0 {
		iv = DefaultHeartbeatInterval
	}
	return max(presenceMisses*iv, minPresenceTTL)
}

// nodeLocked returns the copy of e.
func (r *Registry) nodeLocked(e *entry) Node {
	n := Node{
		ID: e.rec.ID, PublicKey: e.rec.PublicKey, Name: e.rec.Name, Pairing: e.rec.Pairing, Joined: e.rec.Joined,
		Platform: e.hb.Platform, Hostname: e.hb.Hostname, Version: e.hb.Version, Server: e.hb.Server,
		Instance: e.instance, StartedAt: e.hb.StartedAt, Sessions: e.hb.Sessions, Containment: e.hb.Containment,
		Confinement: e.hb.Confinement, ConfinementReason: e.hb.ConfinementReason,
		Live: e.live, LastSeen: e.lastSeen, Probed: e.probed, Silent: e.silent,
	}
	if n.Name == "" {
		n.Name = e.hb.Name
	}
	return n
}

// Get returns the node with this id.
func (r *Registry) Get(id string) (Node, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.nodes[id]
	if !ok {
		return Node{}, false
	}
	return r.nodeLocked(e), true
}

// List returns every known node, sorted by name and id.
func (r *Registry) List() []Node {
	r.mu.Lock()
	out := make([]Node, 0, len(r.nodes))
	for _, e := range r.nodes {
		out = append(out, r.nodeLocked(e))
	}
	r.mu.Unlock()
	slices.SortFunc(out, func(a, b Node) int {
		if c := strings.Compare(a.Name, b.Name); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out
}

// Resolve finds a node by id, else by display name (exact, then
// case-insensitive). An unknown or ambiguous name is a 400 that says so.
func (r *Registry) Resolve(target string) (Node, error) {
	nodes := r.List()
	for _, n := range nodes {
		if n.ID == target {
			return n, nil
		}
	}
	for _, fold := range []bool{false, true} {
		var found []Node
		for _, n := range nodes {
			if n.Name == target || fold && strings.EqualFold(n.Name, target) {
				found = append(found, n)
			}
		}
		switch {
		case len(found) == 1:
			return found[0], nil
		case len(found) > 1:
			ids := make([]string, len(found))
			for i, n := range found {
				ids[i] = n.ID
			}
			return Node{}, protocol.Errorf(protocol.ErrInvalidRequest, "node %q is ambiguous: several nodes have that name (ids %s); use the node id", target, strings.Join(ids, ", "))
		}
	}
	var known []string
	for _, n := range nodes {
		if n.Pairing == protocol.NodePairingPaired {
			known = append(known, n.Label())
		}
	}
	if len(known) == 0 {
		return Node{}, protocol.Errorf(protocol.ErrNotFound, "node %q is unknown: no node with that id or name (no paired nodes)", target)
	}
	return Node{}, protocol.Errorf(protocol.ErrNotFound, "node %q is unknown: no node with that id or name (paired nodes: %s)", target, strings.Join(known, ", "))
}

// Select picks the node of an exec call (spec §19.1): the requested node
// (id or name), else the bound node (the agent's or the global
// tools.exec.node), else the only live paired node. The node must be
// paired and live.
func (r *Registry) Select(ctx context.Context, requested, bound string) (Node, error) {
	if err := r.awaitReady(ctx); err != nil {
		return Node{}, err
	}
	requested, bound = strings.TrimSpace(requested), strings.TrimSpace(bound)
	if requested != "" && bound != "" && requested != bound {
		a, errA := r.Resolve(requested)
		b, errB := r.Resolve(bound)
		if errA != nil || errB != nil || a.ID != b.ID {
			return Node{}, protocol.Errorf(protocol.ErrHostNotAllowed, "exec node not allowed (bound to %s)", bound)
		}
	}
	target := requested
	if target == "" {
		target = bound
	}
	now := r.opts.Now()
	if target != "" {
		n, err := r.Resolve(target)
		if err != nil {
			var pe *protocol.Error
			if errors.As(err, &pe) && pe.Type == protocol.ErrNotFound {
				pe = &protocol.Error{Type: protocol.ErrInvalidRequest, Message: "exec " + pe.Message}
				return Node{}, pe
			}
			return Node{}, err
		}
		if !n.Live && n.Pairing == protocol.NodePairingPaired {
			n = r.awaitLive(ctx, n.ID)
		}
		switch {
		case n.Pairing == protocol.NodePairingRejected:
			return Node{}, protocol.Errorf(protocol.ErrHostNotAllowed, "exec node %q was rejected; it gets no work (approve it with `execmesh nodes approve %s`)", target, n.ID)
		case n.Pairing != protocol.NodePairingPaired:
			return Node{}, protocol.Errorf(protocol.ErrHostNotAllowed, "exec node %q is not paired yet; approve it with `execmesh nodes approve %s`", target, n.ID)
		case !n.Live:
			return Node{}, UnreachableError(n, now, "nothing was started")
		}
		return n, nil
	}
	var live, paired []Node
	for _, n := range r.List() {
		if n.Pairing != protocol.NodePairingPaired {
			continue
		}
		paired = append(paired, n)
		if n.Live {
			live = append(live, n)
		}
	}
	switch {
	case len(live) == 1:
		return live[0], nil
	case len(live) > 1:
		return Node{}, protocol.Errorf(protocol.ErrHostNotAllowed, "exec host=node requires a node id when multiple nodes are available (set tools.exec.node or exec.node).")
	case len(paired) == 1:
		if n := r.awaitLive(ctx, paired[0].ID); n.Live {
			return n, nil
		}
		return Node{}, UnreachableError(paired[0], now, "nothing was started")
	}
	return Node{}, protocol.Errorf(protocol.ErrHostNotAllowed, "exec host=node requires a paired node (none available). This requires a companion app or node host.")
}

// AwaitLive returns node id, first waiting (within ctx) for it to become
// live when it may just not have been heard yet: this registry started
// less than a presence TTL ago and no heartbeat of the node came since,
// or a heartbeat came and its liveness probe is under way. A registry
// that has not read the registry bucket yet first waits for it, as long.
// A gateway that just started thereby reaches the nodes that are there
// instead of calling them unreachable or unknown.
func (r *Registry) AwaitLive(ctx context.Context, id string) (Node, bool) {
	n := r.awaitLive(ctx, id)
	return n, n.ID != ""
}

func (r *Registry) awaitLive(ctx context.Context, id string) Node {
	if r.awaitReady(ctx) != nil {
		n, _ := r.Get(id)
		return n
	}
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	// limit bounds the whole wait: until the first heartbeat is due,
	// then one probe, so a node that beats but never answers is not
	// waited for probe after probe.
	var limit time.Time
	for {
		r.mu.Lock()
		e := r.nodes[id]
		if e == nil {
			r.mu.Unlock()
			return Node{}
		}
		n := r.nodeLocked(e)
		now := r.opts.Now()
		if limit.IsZero() {
			limit = r.started.Add(r.presenceTTLLocked(e))
			if limit.Before(now) {
				limit = now
			}
			limit = limit.Add(probeTimeout)
		}
		var until time.Time
		switch {
		case e.live:
		case e.lastSeen.IsZero():
			until = r.started.Add(r.presenceTTLLocked(e))
		case e.probing:
			until = now.Add(probeTimeout)
		}
		ch := r.liveCh
		r.mu.Unlock()
		if until.After(limit) {
			until = limit
		}
		if until.IsZero() || !now.Before(until) {
			return n
		}
		if t == nil {
			t = time.NewTimer(until.Sub(now))
		} else {
			t.Reset(until.Sub(now))
		}
		// Look again when the wait is over: a heartbeat that came
		// meanwhile may have a probe under way, which is waited for.
		select {
		case <-ch:
		case <-t.C:
		case <-ctx.Done():
			return n
		}
	}
}

// UnreachableError is the retryable error for a node that is not
// connected; nothing was sent or started.
func UnreachableError(n Node, now time.Time, what string) error {
	last := "never since the gateway started"
	if !n.LastSeen.IsZero() {
		last = now.Sub(n.LastSeen).Round(time.Second).String() + " ago"
	}
	why := "last heartbeat " + last
	if n.Silent != "" {
		why += "; then it " + n.Silent
	}
	return &protocol.Error{
		Type: protocol.ErrUnavailable, Retryable: true,
		Message: fmt.Sprintf("node %s is unreachable (%s); %s. Retry when it reconnects.", n.Label(), why, what),
	}
}

// Host returns the node as a host: calls go to its endpoints and fail as
// soon as it goes silent.
func (r *Registry) Host(n Node) *hostbus.Remote {
	id := n.ID
	return &hostbus.Remote{
		Conn:          r.opts.Conn,
		Group:         r.subj.NodeGroup(id),
		Label:         "node " + n.Label(),
		Log:           r.log,
		Watch:         func(ctx context.Context) (context.Context, context.CancelFunc) { return r.watch(ctx, id, n.Instance) },
		OnUnreachable: func() { r.markDown(id) },
		RequestMargin: r.opts.RequestMargin,
		CallTimeout:   r.opts.CallTimeout,
		ServerWatch:   r.opts.ServerWatch,
		Requests:      r.opts.Requests,
	}
}

// watch derives from ctx a context that ends with cause hostbus.ErrSilent
// when node id goes silent, or when a run other than instance replaces
// it. A node that is not live now (no heartbeat yet) may still answer, so
// nothing is watched for it.
func (r *Registry) watch(ctx context.Context, id, instance string) (context.Context, context.CancelFunc) {
	r.mu.Lock()
	e := r.nodes[id]
	if e == nil || !e.live || e.epoch == nil || (instance != "" && e.instance != "" && e.instance != instance) {
		r.mu.Unlock()
		return context.WithCancel(ctx)
	}
	epoch := e.epoch
	r.mu.Unlock()
	wctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(epoch, func() { cancel(context.Cause(epoch)) })
	return wctx, func() {
		stop()
		cancel(nil)
	}
}

// markDown records that a request found nobody listening for node id:
// it is not live until it beats (and answers) again.
func (r *Registry) markDown(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e := r.nodes[id]; e != nil {
		r.goSilentLocked(e, "was no longer connected to NATS")
	}
}

// goSilentLocked marks e not live and ends its epoch, why completing
// "the host …". r.mu is held. The presence timer keeps running: its
// expiry is what drops a pending node that stays silent (GhostTTL).
func (r *Registry) goSilentLocked(e *entry, why string) {
	if e.live {
		r.log.Info("node unreachable", "node", e.rec.ID)
	}
	e.live = false
	e.silent = why
	if e.cancelEpoch != nil {
		e.cancelEpoch(&hostbus.SilentError{Reason: why})
		e.epoch, e.cancelEpoch = nil, nil
	}
}

// onHeartbeat records a node's heartbeat. The id must be the one derived
// from the key, and the subject the node's own (NATS permissions confine
// a node to it).
func (r *Registry) onHeartbeat(m *nats.Msg) {
	token := strings.TrimPrefix(m.Subject, r.opts.Prefix+".presence.")
	var hb protocol.NodeHeartbeat
	if err := json.Unmarshal(m.Data, &hb); err != nil {
		r.log.Debug("malformed heartbeat", "subject", m.Subject, "err", err)
		return
	}
	id, err := bus.NodeIDFromPublicKey(hb.PublicKey)
	if err != nil || id != hb.NodeID || id != token {
		r.log.Warn("heartbeat with an inconsistent node id ignored", "subject", m.Subject, "nodeId", hb.NodeID)
		return
	}
	r.seen(hb)
}

// seen updates the registry with a heartbeat (or an announcement, which
// has the same fields). A node that comes (back) is probed before it
// counts as live; a live node is probed again when its last answer is
// older than half the presence TTL.
func (r *Registry) seen(hb protocol.NodeHeartbeat) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closing {
		return
	}
	now := r.opts.Now()
	e, ok := r.nodes[hb.NodeID]
	if !ok {
		e = &entry{rec: record{ID: hb.NodeID, Pairing: protocol.NodePairingPending}, firstSeen: now, interval: DefaultHeartbeatInterval}
		r.nodes[hb.NodeID] = e
		r.log.Info("new node awaiting pairing", "node", hb.NodeID, "name", hb.Name, "approve", "execmesh nodes approve "+hb.NodeID)
	}
	if e.firstSeen.IsZero() {
		e.firstSeen = now
	}
	if e.rec.PublicKey == "" {
		e.rec.PublicKey = hb.PublicKey
	}
	if hb.IntervalMs > 0 {
		e.interval = time.Duration(hb.IntervalMs) * time.Millisecond
	}
	if hb.Instance != "" && e.instance != "" && hb.Instance != e.instance {
		old := e.instance
		r.log.Warn("node restarted: the sessions of its earlier run are gone", "node", hb.NodeID, "instance", hb.Instance)
		r.goSilentLocked(e, "restarted") // requests sent to the old run will not be answered
		if cb := r.opts.OnRestart; cb != nil {
			n := r.nodeLocked(e)
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				cb(n, old)
			}()
		}
	}
	if hb.Instance != "" {
		e.instance = hb.Instance
	}
	merged := e.hb
	if hb.StartedAt != 0 || hb.TS != 0 {
		merged = hb // a heartbeat; an announcement carries fewer fields
	} else {
		merged.NodeID, merged.PublicKey, merged.Name, merged.Platform, merged.Version, merged.Instance = hb.NodeID, hb.PublicKey, hb.Name, hb.Platform, hb.Version, hb.Instance
	}
	e.hb = merged
	e.lastSeen = now
	ttl := r.presenceTTLLocked(e)
	if e.timer == nil {
		id := hb.NodeID
		e.timer = time.AfterFunc(ttl, func() { r.expire(id) })
	} else {
		e.timer.Reset(ttl)
	}
	if e.live {
		if now.Sub(e.probed) > ttl/2 {
			r.probeLocked(e)
		}
		return
	}
	r.probeLocked(e)
}

// expire runs when a node's presence timer fires.
func (r *Registry) expire(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.nodes[id]
	if e == nil {
		return
	}
	if r.opts.Now().Sub(e.lastSeen) < r.presenceTTLLocked(e) {
		return // a heartbeat raced the timer and reset it
	}
	r.goSilentLocked(e, "stopped sending heartbeats")
	if e.rec.Pairing == protocol.NodePairingPending && !e.stored {
		// Forget pending ghosts after GhostTTL of silence. A timer of
		// its own: the presence timer times the node if it comes back.
		if e.ghost != nil {
			e.ghost.Stop()
		}
		e.ghost = time.AfterFunc(r.opts.GhostTTL, func() { r.dropGhost(id) })
	}
}

// dropGhost forgets a pending node that stayed silent for GhostTTL.
func (r *Registry) dropGhost(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.nodes[id]
	if e == nil || e.live || e.stored || r.opts.Now().Sub(e.lastSeen) < r.opts.GhostTTL {
		return
	}
	delete(r.nodes, id)
}

// probeLocked asks node e to answer on its own subject (only that node
// can serve it): the request direction works too, not only its
// heartbeats. The node counts as live once the answer comes. r.mu is held.
func (r *Registry) probeLocked(e *entry) {
	if e.probing || r.closing {
		return
	}
	e.probing = true
	id := e.rec.ID
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		ctx, cancel := context.WithTimeout(r.ctx, probeTimeout)
		defer cancel()
		m, err := bus.RequestChunked(ctx, r.opts.Conn, r.subj.Node(id, protocol.NodeEndpointPing), []byte("{}"), nil)
		var pong protocol.PingReply
		if err == nil {
			if rerr := bus.ReplyError(m); rerr != nil {
				err = rerr
			} else {
				err = json.Unmarshal(m.Data, &pong)
			}
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		e := r.nodes[id]
		if e == nil {
			return
		}
		e.probing = false
		if err != nil || (pong.Instance != "" && e.instance != "" && pong.Instance != e.instance) {
			r.log.Debug("liveness probe failed", "node", id, "err", err)
			if e.live {
				r.goSilentLocked(e, "did not answer the liveness probe")
			} else {
				e.silent = "did not answer the liveness probe" // its heartbeats come, though
			}
			return
		}
		e.probed = r.opts.Now()
		if !e.live && r.opts.Now().Sub(e.lastSeen) <= r.presenceTTLLocked(e) {
			e.live, e.silent = true, ""
			e.epoch, e.cancelEpoch = context.WithCancelCause(context.Background())
			close(r.liveCh)
			r.liveCh = make(chan struct{})
			r.log.Info("node connected", "node", id, "instance", e.instance)
		}
	}()
}

// Now is the registry's clock.
func (r *Registry) Now() time.Time { return r.opts.Now() }
