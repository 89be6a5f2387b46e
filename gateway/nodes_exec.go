package gateway

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/protocol"
	"github.com/execmesh/execmesh/session"
)

// remoteSession is one node session in the gateway's index. Fields are
// guarded by nodeRouter.mu.
type remoteSession struct {
	sessionKey string
	// id is what callers see. It is the node's own session id unless that
	// collides, in this sessionKey, with a session of the gateway or of
	// another node; then the node id's first characters are appended
	// ("nimble-coral-k3x9") and results are rewritten both ways.
	id          string
	nodeID      string
	nodeSession string
	// instance is the node agent run that holds the session; a node that
	// restarts (new instance) has lost it.
	instance string
	details  protocol.Details // last list entry seen, for lost sessions
	lost     bool
	// seq orders index additions: a node's list answers only for entries
	// added before it was asked (see reconcile).
	seq uint64
}

// target is the node a call with req's routing goes to, once the
// router is up and start-up discovery had its chance (selectNode).
func (r *nodeRouter) target(ctx context.Context, req NodeExecRequest) (nodeInfo, error) {
	if err := r.alive(); err != nil {
		return nodeInfo{}, err
	}
	r.waitDiscovered(ctx)
	return r.selectNode(req)
}

// errNodeTimeout marks a request whose answer did not come, because the
// deadline passed, the gateway's NATS connection dropped or the node went
// silent while it waited: it may have been delivered and acted upon.
var errNodeTimeout = errors.New("no answer from the node in time")

// errNodeSilent is the cause of a request given up because its node
// stopped sending heartbeats, or a new run of the agent (which knows
// nothing of the old run's requests) took its place, while it waited.
var errNodeSilent = errors.New("the node went silent")

// nodeWatchInterval is how often a waiting request checks that its node
// is still there.
const nodeWatchInterval = 250 * time.Millisecond

// noAnswer says why a call failed with errNodeTimeout.
func noAnswer(err error, timeout time.Duration) string {
	switch {
	case errors.Is(err, bus.ErrConnectionLost):
		return "no answer (the gateway's NATS connection dropped while it waited)"
	case errors.Is(err, errNodeSilent):
		return "no answer, and the node stopped sending heartbeats (or restarted) while the gateway waited"
	}
	return fmt.Sprintf("no answer within %s", timeout)
}

// watchNode gives up a request (cancel with errNodeSilent) when its node
// stops being live, or another run of the agent replaces the one that got
// the request: neither will ever answer. Without it a request delivered
// to a node that then died, hung or lost its network waits for its whole
// deadline (a poll: 30 s plus the margin), because NATS reports "no
// responders" only when a request finds no subscriber. It returns when
// ctx ends.
func (r *nodeRouter) watchNode(ctx context.Context, id, instance string, cancel context.CancelCauseFunc) {
	t := time.NewTicker(nodeWatchInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.mu.Lock()
		e := r.nodes[id]
		silent := e == nil || !r.liveLocked(e, r.now()) || (instance != "" && e.instance != "" && e.instance != instance)
		r.mu.Unlock()
		if silent {
			cancel(errNodeSilent)
			return
		}
	}
}

// call sends one request to a node endpoint and returns its reply.
// Errors: a retryable *protocol.Error when the node (or the gateway's
// NATS connection) is not there, so nothing was delivered; an error
// wrapping errNodeTimeout when the deadline passed or the node went
// silent meanwhile (outcome unknown); the
// node's *protocol.Error when it refused the request; the caller's ctx
// error when the caller went away.
func (r *nodeRouter) call(ctx context.Context, n nodeInfo, endpoint string, body []byte, hdr nats.Header, timeout time.Duration) (*nats.Msg, error) {
	if r.nc.IsClosed() || !r.nc.IsConnected() {
		return nil, &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true,
			Message: fmt.Sprintf("the gateway is not connected to NATS; node %s cannot be reached. Retry later.", n.label())}
	}
	rctx, cancel := ctx, context.CancelFunc(func() {})
	if timeout > 0 {
		rctx, cancel = context.WithTimeout(ctx, timeout)
	}
	defer cancel()
	if n.live {
		// A node that is not live now (just started gateway, no heartbeat
		// yet) may still answer; only a live one can go silent.
		wctx, wcancel := context.WithCancelCause(rctx)
		defer wcancel(nil)
		go r.watchNode(wctx, n.id, n.instance, wcancel)
		rctx = wctx
	}
	m, err := bus.RequestChunked(rctx, r.nc, r.subj.Node(n.id, endpoint), body, hdr)
	switch {
	case errors.Is(err, bus.ErrUnreachable):
		// Nobody subscribes: the node is gone. Forget its liveness so
		// that the next call fails at once, until it beats again.
		r.mu.Lock()
		if e := r.nodes[n.id]; e != nil {
			e.lastSeen = time.Time{}
		}
		r.mu.Unlock()
		return nil, &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true,
			Message: fmt.Sprintf("node %s is unreachable (not connected to NATS); nothing was delivered. Retry when it reconnects.", n.label())}
	case err != nil && ctx.Err() != nil:
		return nil, ctx.Err()
	case err != nil && errors.Is(context.Cause(rctx), errNodeSilent):
		r.log.Info("request given up: the node went silent", "node", n.id, "endpoint", endpoint)
		return nil, fmt.Errorf("%w (%s): %w", errNodeTimeout, timeout, errNodeSilent)
	case err != nil && (rctx.Err() != nil || errors.Is(err, bus.ErrConnectionLost)):
		// Fails fast on a dropped connection rather than at the
		// deadline; the outcome is unknown either way.
		return nil, fmt.Errorf("%w (%s): %w", errNodeTimeout, timeout, err)
	case err != nil:
		return nil, &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true, Message: fmt.Sprintf("node %s: %v", n.label(), err)}
	}
	if rerr := bus.ReplyError(m); rerr != nil {
		var se *bus.ServiceError
		errors.As(rerr, &se)
		var pe protocol.Error
		if se != nil && json.Unmarshal(se.Data, &pe) == nil && pe.Type != "" && pe.Message != "" {
			if pe.Type == protocol.ErrApprovalRequired {
				var data struct {
					Approval *protocol.NodeApprovalRequired `json:"approval"`
				}
				_ = json.Unmarshal(se.Data, &data)
				return nil, &nodeApprovalNeeded{pe: &pe, summary: data.Approval}
			}
			return nil, &pe
		}
		return nil, protocol.Errorf(protocol.ErrInternal, "node %s: %v", n.label(), rerr)
	}
	return m, nil
}

// newUUID returns a random (version 4) UUID, the idempotency key of one
// exec start.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// Exec selects a node and starts the command there. The yield window and
// timeout are resolved here and sent, so that the request deadline (their
// sum with RequestMargin) and the node's behaviour come from one value;
// there is no shorter hidden transport timeout. Every start carries a
// fresh idempotency key: a duplicate delivery runs once, and a start that
// gets no answer in time is reported as possibly started, never re-run.
func (r *nodeRouter) Exec(ctx context.Context, req NodeExecRequest) (protocol.Result, error) {
	n, err := r.target(ctx, req)
	if err != nil {
		return protocol.Result{}, err
	}
	res, err := r.execOn(ctx, n, req, nil)
	var need *nodeApprovalNeeded
	if errors.As(err, &need) {
		// The node's own evaluation needs an approval: ask for it here,
		// as for host=gateway, and start the run once it is given.
		return r.requestApproval(n, req, need.summary), nil
	}
	return res, err
}

// execOn starts the command on node n; approval, set only by the approval
// flow, is the gateway's approval of the run.
func (r *nodeRouter) execOn(ctx context.Context, n nodeInfo, req NodeExecRequest, approval *protocol.NodeExecApproval) (protocol.Result, error) {
	opts := r.options()
	cfg := r.g.Config()
	args := req.Args
	args.Host, args.Node, args.Security, args.Ask, args.Elevated = "", "", "", "", nil
	if args.YieldMs == nil && !args.Background && !req.Sync {
		y := float64(r.defaultYieldMs(cfg))
		args.YieldMs = &y
	}
	if args.Timeout == nil {
		t := float64(cfg.Tools.Exec.TimeoutSec)
		args.Timeout = &t
	}
	var deadline time.Duration
	switch {
	case req.Sync:
		if *args.Timeout > 0 {
			deadline = time.Duration(*args.Timeout*float64(time.Second)) + opts.RequestMargin
		} // else: the caller's context alone
	case args.Background:
		deadline = opts.CallTimeout
	default:
		y := min(max(*args.YieldMs, MinYieldMs), MaxYieldMs)
		deadline = time.Duration(y*float64(time.Millisecond)) + opts.RequestMargin
	}
	rawArgs, err := json.Marshal(args)
	if err != nil {
		return protocol.Result{}, protocol.Errorf(protocol.ErrInternal, "exec: encode arguments: %v", err)
	}
	var limits *protocol.Limits
	if !req.Limits.IsZero() {
		limits = &req.Limits
	}
	body, err := json.Marshal(protocol.NodeExecRequest{
		SessionKey: req.SessionKey, AgentID: req.AgentID, Args: rawArgs,
		Security: req.Security, Ask: req.Ask, Warnings: req.Warnings, Sync: req.Sync,
		Approval: approval, Limits: limits,
	})
	if err != nil {
		return protocol.Result{}, protocol.Errorf(protocol.ErrInternal, "exec: encode request: %v", err)
	}
	key := newUUID()
	hdr := nats.Header{}
	hdr.Set(protocol.NodeHeaderIdempotencyKey, key)
	m, err := r.call(ctx, n, protocol.NodeEndpointExec, body, hdr, deadline)
	if errors.Is(err, errNodeTimeout) {
		r.log.Warn("exec start outcome unknown", "node", n.id, "idempotencyKey", key, "err", err)
		return protocol.Result{}, &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true,
			Message: fmt.Sprintf("exec on node %s: %s, so the command may or may not have started (idempotency key %s). It was not retried automatically; check with process list before running it again.", n.label(), noAnswer(err, deadline), key)}
	}
	if err != nil {
		return protocol.Result{}, err
	}
	var res protocol.Result
	if err := json.Unmarshal(m.Data, &res); err != nil {
		return protocol.Result{}, protocol.Errorf(protocol.ErrInternal, "exec on node %s: malformed result: %v", n.label(), err)
	}
	if id := res.SessionID(); id != "" && res.Status() == protocol.StatusRunning {
		// Until a list refreshes it, the entry shows what the start said.
		d := cloneDetails(res.Details)
		d["command"] = req.Args.Command
		delete(d, "followUp")
		instance := m.Header.Get(protocol.NodeHeaderInstance)
		if instance == "" {
			instance = n.instance
		}
		alias := r.indexAdd(req.SessionKey, n.id, instance, id, d)
		rewriteSessionID(&res, id, alias)
	}
	return res, nil
}

// defaultYieldMs is the gateway's default yield window: tools.exec.backgroundMs,
// else the session core's default with the OPENCLAW_BASH_YIELD_MS override.
func (r *nodeRouter) defaultYieldMs(cfg Config) int {
	if cfg.Tools.Exec.BackgroundMs > 0 {
		return cfg.Tools.Exec.BackgroundMs
	}
	sc := session.DefaultConfig()
	sc.ApplyEnv(r.g.opts.Getenv)
	return sc.DefaultYieldMs
}

// alive refuses calls once the backend is closing.
func (r *nodeRouter) alive() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closing {
		return &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true, Message: "gateway is shutting down"}
	}
	return nil
}

// selectNode picks the node of an exec call (spec §19.1): the requested
// node (id or name), else the agent's or the global bound node, else the
// only live paired node.
func (r *nodeRouter) selectNode(req NodeExecRequest) (nodeInfo, error) {
	bound := strings.TrimSpace(req.AgentNode)
	if bound == "" {
		bound = strings.TrimSpace(req.ConfigNode)
	}
	requested := strings.TrimSpace(req.Requested)
	nodes := r.allNodes()
	now := r.now()
	if requested != "" && bound != "" && requested != bound {
		a, errA := resolveNodeName(nodes, requested)
		b, errB := resolveNodeName(nodes, bound)
		if errA != nil || errB != nil || a.id != b.id {
			return nodeInfo{}, protocol.Errorf(protocol.ErrHostNotAllowed, "exec node not allowed (bound to %s)", bound)
		}
	}
	target := requested
	if target == "" {
		target = bound
	}
	if target != "" {
		n, err := resolveNodeName(nodes, target)
		if err != nil {
			return nodeInfo{}, err
		}
		switch {
		case n.pairing == protocol.NodePairingRejected:
			return nodeInfo{}, protocol.Errorf(protocol.ErrHostNotAllowed, "exec node %q was rejected; it gets no work (approve it with `execmesh nodes approve %s`)", target, n.id)
		case n.pairing != protocol.NodePairingPaired:
			return nodeInfo{}, protocol.Errorf(protocol.ErrHostNotAllowed, "exec node %q is not paired yet; approve it with `execmesh nodes approve %s`", target, n.id)
		case !n.live:
			return nodeInfo{}, unreachableError(n, now, "nothing was started")
		}
		return n, nil
	}
	var live, paired []nodeInfo
	for _, n := range nodes {
		if n.pairing != protocol.NodePairingPaired {
			continue
		}
		paired = append(paired, n)
		if n.live {
			live = append(live, n)
		}
	}
	switch {
	case len(live) == 1:
		return live[0], nil
	case len(live) > 1:
		return nodeInfo{}, protocol.Errorf(protocol.ErrHostNotAllowed, "exec host=node requires a node id when multiple nodes are available (set tools.exec.node or exec.node).")
	case len(paired) == 1:
		return nodeInfo{}, unreachableError(paired[0], now, "nothing was started")
	}
	return nodeInfo{}, protocol.Errorf(protocol.ErrHostNotAllowed, "exec host=node requires a paired node (none available). This requires a companion app or node host.")
}

// resolveNodeName finds a node by id, else by display name (exact, then
// case-insensitive). An unknown or ambiguous name is a 400 that says so.
func resolveNodeName(nodes []nodeInfo, target string) (nodeInfo, error) {
	for _, n := range nodes {
		if n.id == target {
			return n, nil
		}
	}
	for _, fold := range []bool{false, true} {
		var found []nodeInfo
		for _, n := range nodes {
			if n.name == target || fold && strings.EqualFold(n.name, target) {
				found = append(found, n)
			}
		}
		switch {
		case len(found) == 1:
			return found[0], nil
		case len(found) > 1:
			ids := make([]string, len(found))
			for i, n := range found {
				ids[i] = n.id
			}
			return nodeInfo{}, protocol.Errorf(protocol.ErrInvalidRequest, "exec node %q is ambiguous: several nodes have that name (ids %s); use the node id", target, strings.Join(ids, ", "))
		}
	}
	var known []string
	for _, n := range nodes {
		if n.pairing == protocol.NodePairingPaired {
			known = append(known, n.label())
		}
	}
	if len(known) == 0 {
		return nodeInfo{}, protocol.Errorf(protocol.ErrInvalidRequest, "exec node %q is unknown: no node with that id or name (no paired nodes)", target)
	}
	return nodeInfo{}, protocol.Errorf(protocol.ErrInvalidRequest, "exec node %q is unknown: no node with that id or name (paired nodes: %s)", target, strings.Join(known, ", "))
}

// indexAdd records a node session and returns the id callers see. An
// entry for the same node session (same instance) is reused.
func (r *nodeRouter) indexAdd(sessionKey, nodeID, instance, nodeSession string, details protocol.Details) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.indexAddLocked(sessionKey, nodeID, instance, nodeSession, details).id
}

func (r *nodeRouter) indexAddLocked(sessionKey, nodeID, instance, nodeSession string, details protocol.Details) *remoteSession {
	scope := r.index[sessionKey]
	if scope == nil {
		scope = map[string]*remoteSession{}
		r.index[sessionKey] = scope
	}
	for _, rs := range r.indexedLocked(sessionKey, nodeID, nodeSession) {
		if rs.nodeID == nodeID && rs.nodeSession == nodeSession && !rs.lost && (rs.instance == instance || rs.instance == "" || instance == "") {
			if instance != "" {
				rs.instance = instance
			}
			if details != nil {
				rs.details = details
			}
			return rs
		}
	}
	r.indexSeq++
	rs := &remoteSession{sessionKey: sessionKey, nodeID: nodeID, nodeSession: nodeSession, instance: instance, details: details, seq: r.indexSeq}
	rs.id = r.aliasLocked(sessionKey, nodeID, nodeSession)
	scope[rs.id] = rs
	return rs
}

// indexedLocked returns the index entries of node nodeID's session
// nodeSession under sessionKey. aliasLocked names them nodeSession, then
// nodeSession-<prefix of nodeID>, then (only when every prefix is taken)
// nodeSession-<nodeID>-<n>, so only those ids need looking at; scanning
// the whole scope per entry made list and resync quadratic in the number
// of sessions. r.mu is held.
func (r *nodeRouter) indexedLocked(sessionKey, nodeID, nodeSession string) []*remoteSession {
	scope := r.index[sessionKey]
	var out []*remoteSession
	add := func(rs *remoteSession) {
		if rs != nil && rs.nodeID == nodeID && rs.nodeSession == nodeSession {
			out = append(out, rs)
		}
	}
	add(scope[nodeSession])
	last := ""
	for n := 4; n < len(nodeID); n += 2 {
		last = nodeSession + "-" + nodeID[:n]
		add(scope[last])
	}
	if _, taken := scope[last]; last == "" || taken || r.g.local.Has(sessionKey, last) {
		// Numeric aliases may exist: look at the whole scope.
		out = out[:0]
		for _, rs := range scope {
			add(rs)
		}
	}
	return out
}

// aliasLocked picks the visible id of a new node session: the node's own
// id when it is free in sessionKey (no gateway session, no other indexed
// session), else that id with more and more of the node id appended.
func (r *nodeRouter) aliasLocked(sessionKey, nodeID, nodeSession string) string {
	taken := func(id string) bool {
		if _, ok := r.index[sessionKey][id]; ok {
			return true
		}
		return r.g.local.Has(sessionKey, id)
	}
	if !taken(nodeSession) {
		return nodeSession
	}
	for n := 4; n < len(nodeID); n += 2 {
		if id := nodeSession + "-" + nodeID[:n]; !taken(id) {
			return id
		}
	}
	for i := 2; ; i++ {
		if id := fmt.Sprintf("%s-%s-%d", nodeSession, nodeID, i); !taken(id) {
			return id
		}
	}
}

// visibleIDLocked returns the visible id of a node session, or its own id
// when the index does not know it.
func (r *nodeRouter) visibleIDLocked(sessionKey, nodeID, nodeSession string) string {
	for _, rs := range r.indexedLocked(sessionKey, nodeID, nodeSession) {
		if rs.nodeID == nodeID && rs.nodeSession == nodeSession && !rs.lost {
			return rs.id
		}
	}
	return nodeSession
}

// rewriteSessionID replaces a node's session id by the visible id in a
// result (details and text).
func rewriteSessionID(res *protocol.Result, nodeSession, visible string) {
	if nodeSession == visible {
		return
	}
	if res.Details != nil {
		if id, _ := res.Details["sessionId"].(string); id == nodeSession {
			res.Details["sessionId"] = visible
		}
	}
	for i := range res.Content {
		res.Content[i].Text = strings.ReplaceAll(res.Content[i].Text, nodeSession, visible)
	}
}

// lookup returns a copy of the indexed session visible as id.
func (r *nodeRouter) lookup(sessionKey, id string) (remoteSession, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rs, ok := r.index[sessionKey][id]
	if !ok {
		return remoteSession{}, false
	}
	return *rs, true
}

func (r *nodeRouter) indexDrop(sessionKey, id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if scope := r.index[sessionKey]; scope != nil {
		delete(scope, id)
		if len(scope) == 0 {
			delete(r.index, sessionKey)
		}
	}
}

func (r *nodeRouter) indexMarkLost(sessionKey, id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rs := r.index[sessionKey][id]; rs != nil {
		rs.lost = true
	}
}

// syncPending reports whether a live paired node's sessions have not been
// indexed yet (right after a gateway start).
func (r *nodeRouter) syncPending() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	var ids []string
	for id, n := range r.nodes {
		if n.pairing == protocol.NodePairingPaired && r.liveLocked(n, now) && (n.synced == "" || n.synced != n.instance) {
			ids = append(ids, id)
		}
	}
	return ids
}

// Process forwards a process action on a node session. handled is false
// when no node session of sessionKey has that id.
func (r *nodeRouter) Process(ctx context.Context, sessionKey string, args protocol.ProcessArgs) (protocol.Result, bool, error) {
	if args.Action == "list" || args.SessionID == "" {
		return protocol.Result{}, false, nil
	}
	if err := r.alive(); err != nil {
		return protocol.Result{}, false, err
	}
	rs, ok := r.lookup(sessionKey, args.SessionID)
	if !ok {
		// Right after a start the index may not be rebuilt yet.
		r.waitDiscovered(ctx)
		for _, id := range r.syncPending() {
			r.resync(ctx, id)
		}
		if rs, ok = r.lookup(sessionKey, args.SessionID); !ok {
			return protocol.Result{}, false, nil
		}
	}
	n, known := r.nodeSnapshot(rs.nodeID)
	if !known {
		n = nodeInfo{nodeEntry: nodeEntry{id: rs.nodeID}}
	}
	if !rs.lost && rs.instance != "" && n.instance != "" && n.instance != rs.instance {
		r.indexMarkLost(sessionKey, rs.id)
		rs.lost = true
	}
	if rs.lost {
		if args.Action == "remove" {
			r.indexDrop(sessionKey, rs.id)
			return protocol.TextResult(fmt.Sprintf("Removed session %s (lost when node %s restarted).", rs.id, n.label()),
				protocol.Details{"status": protocol.StatusCompleted, "sessionId": rs.id}), true, nil
		}
		return lostResult(rs, n), true, nil
	}
	if n.pairing == protocol.NodePairingRejected {
		return protocol.Result{}, true, protocol.Errorf(protocol.ErrHostNotAllowed, "session %s is on node %s, which was rejected; approve it again to reach its sessions", rs.id, n.label())
	}
	if !n.live {
		return protocol.Result{}, true, unreachableError(n, r.now(), fmt.Sprintf("session %s keeps running there and can be reached again once it reconnects", rs.id))
	}
	opts := r.options()
	timeout := opts.CallTimeout
	if args.Action == "poll" {
		wait := time.Duration(0)
		if args.Timeout != nil {
			wait = min(time.Duration(*args.Timeout)*time.Millisecond, maxPollWait)
		}
		timeout = wait + opts.RequestMargin
	}
	fwd := args
	fwd.SessionID = rs.nodeSession
	rawArgs, err := json.Marshal(fwd)
	if err != nil {
		return protocol.Result{}, true, protocol.Errorf(protocol.ErrInternal, "process: encode arguments: %v", err)
	}
	body, _ := json.Marshal(protocol.NodeProcessRequest{SessionKey: sessionKey, Args: rawArgs})
	m, err := r.call(ctx, n, protocol.NodeEndpointProcess, body, nil, timeout)
	if errors.Is(err, errNodeTimeout) {
		return protocol.Result{}, true, &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true,
			Message: fmt.Sprintf("process %s on node %s: %s; the action may or may not have been applied.", args.Action, n.label(), noAnswer(err, timeout))}
	}
	if err != nil {
		return protocol.Result{}, true, err
	}
	if inst := m.Header.Get(protocol.NodeHeaderInstance); inst != "" && rs.instance != "" && inst != rs.instance {
		// Another run of the node answered: it restarted before the
		// gateway heard of it, and the session went with the old run.
		r.indexMarkLost(sessionKey, rs.id)
		if args.Action == "remove" {
			r.indexDrop(sessionKey, rs.id)
			return protocol.TextResult(fmt.Sprintf("Removed session %s (lost when node %s restarted).", rs.id, n.label()),
				protocol.Details{"status": protocol.StatusCompleted, "sessionId": rs.id}), true, nil
		}
		return lostResult(rs, n), true, nil
	}
	var res protocol.Result
	if err := json.Unmarshal(m.Data, &res); err != nil {
		return protocol.Result{}, true, protocol.Errorf(protocol.ErrInternal, "process on node %s: malformed result: %v", n.label(), err)
	}
	rewriteSessionID(&res, rs.nodeSession, rs.id)
	if m.Header.Get(protocol.NodeHeaderSession) == protocol.NodeSessionGone {
		// Removed, or swept after its retention: the node no longer has it.
		r.indexDrop(sessionKey, rs.id)
	}
	if args.Action == "poll" {
		if st := res.Status(); st == protocol.StatusCompleted || st == protocol.StatusFailed {
			// The caller saw the end: a queued exit event is redundant.
			r.g.events.acknowledge(sessionKey, "exec:"+rs.id)
		}
	}
	return res, true, nil
}

// lostResult answers an action on a session its node no longer has
// because the node restarted.
func lostResult(rs remoteSession, n nodeInfo) protocol.Result {
	text := fmt.Sprintf("Session %s was lost: node %s restarted and no longer has it; its output and exit status are gone. Use process remove to forget it.", rs.id, n.label())
	res := protocol.FailedResult(text)
	res.Details["sessionId"] = rs.id
	res.Details["lost"] = true
	return res
}

// ListPage returns the list entries of the node sessions of sessionKey,
// asked from each live paired node (which also refreshes the index) and
// from the index for nodes that cannot be asked; sessions lost with a
// node restart are listed with status "lost" until removed. total is the
// size of the whole list. With limit 0 every entry is returned. With a
// limit each node is asked for its limit newest entries only, and at
// most limit entries of each source (a node that answered, the index for
// the rest) are returned: enough for the caller to cut any page ending at
// limit from their merge, newest first.
//
// A node whose answer is partial (it left entries out) has its listed
// sessions refreshed and no others: the ones beyond its limit are
// neither dropped from the index nor marked lost, and are left out of
// the entries (they are in the node's total). Sessions of an earlier run
// of the node are marked lost as with a full list.
//
// Entries are ordered so that pages cut from the merge fit together:
// each answering node's in the node's own order (by node id), then the
// index's other entries, newest first; ties of startedAt keep that order
// in a stable sort.
func (r *nodeRouter) ListPage(ctx context.Context, sessionKey string, limit int) (entries []protocol.Details, total int, err error) {
	if err := r.alive(); err != nil {
		return nil, 0, err
	}
	limit = max(limit, 0)
	r.waitDiscovered(ctx)
	nodes := r.allNodes()
	timeout := r.options().CallTimeout
	asOf := r.indexMark()
	full, _ := json.Marshal(protocol.NodeListRequest{SessionKey: sessionKey})
	body := full
	if limit > 0 {
		body, _ = json.Marshal(protocol.NodeListRequest{SessionKey: sessionKey, Limit: limit})
	}
	type answer struct {
		n     nodeInfo
		reply protocol.NodeListResponse
		err   error
	}
	var (
		wg      sync.WaitGroup
		sem     = make(chan struct{}, listConcurrency)
		answers = make([]answer, 0, len(nodes))
		mu      sync.Mutex
	)
	for _, n := range nodes {
		if n.pairing != protocol.NodePairingPaired || !n.live {
			continue
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			a := answer{n: n}
			m, err := r.call(ctx, n, protocol.NodeEndpointList, body, nil, timeout)
			var pe *protocol.Error
			if limit > 0 && errors.As(err, &pe) && pe.Type == protocol.ErrInvalidRequest {
				// A node agent from before paged lists refuses the
				// limit field: ask it for everything.
				m, err = r.call(ctx, n, protocol.NodeEndpointList, full, nil, timeout)
			}
			if err == nil {
				err = json.Unmarshal(m.Data, &a.reply)
			}
			a.err = err
			mu.Lock()
			answers = append(answers, a)
			mu.Unlock()
		})
	}
	wg.Wait()
	slices.SortFunc(answers, func(a, b answer) int { return strings.Compare(a.n.id, b.n.id) })
	type listedBy struct {
		nodeID  string
		listed  []*remoteSession // in the node's order
		partial bool
		total   int
	}
	var (
		errs   []error
		listed []listedBy
	)
	for _, a := range answers {
		if a.err != nil {
			errs = append(errs, fmt.Errorf("node %s: %w", a.n.label(), a.err))
			continue
		}
		var mine []protocol.Details
		for _, s := range a.reply.Sessions {
			if s.SessionKey == sessionKey {
				mine = append(mine, s.Details)
			}
		}
		partial := limit > 0 && a.reply.Partial
		rs := r.reconcile(a.n.id, a.reply.Instance, map[string][]protocol.Details{sessionKey: mine}, false, partial, asOf)
		listed = append(listed, listedBy{nodeID: a.n.id, listed: rs, partial: partial, total: a.reply.Total})
	}

	// Everything now in the index for this scope: fresh entries of the
	// nodes asked, last known entries of the others, and lost sessions,
	// but not what partial answers left out.
	r.mu.Lock()
	defer r.mu.Unlock()
	scope := r.index[sessionKey]
	partialNodes := map[string]bool{}
	taken := map[*remoteSession]bool{}
	for _, l := range listed {
		var page []protocol.Details
		for _, rs := range l.listed {
			if scope[rs.id] != rs || rs.details == nil || taken[rs] {
				continue // removed meanwhile, or listed twice
			}
			taken[rs] = true
			page = append(page, r.indexEntry(rs))
		}
		if l.partial {
			partialNodes[l.nodeID] = true
			total += l.total
		} else {
			total += len(page)
		}
		if limit > 0 && len(page) > limit {
			page = page[:limit]
		}
		entries = append(entries, page...)
	}
	var rest []*remoteSession
	for _, rs := range scope {
		if rs.details == nil || taken[rs] {
			continue
		}
		if partialNodes[rs.nodeID] && !rs.lost && rs.seq <= asOf {
			continue // beyond that node's limit (counted in its total)
		}
		rest = append(rest, rs)
	}
	total += len(rest)
	slices.SortFunc(rest, func(a, b *remoteSession) int {
		if c := cmpNumber(b.details["startedAt"], a.details["startedAt"]); c != 0 {
			return c
		}
		return strings.Compare(a.id, b.id)
	})
	if limit > 0 && len(rest) > limit {
		rest = rest[:limit]
	}
	for _, rs := range rest {
		entries = append(entries, r.indexEntry(rs))
	}
	return entries, total, errors.Join(errs...)
}

// indexEntry is the list entry of an indexed node session: a copy of the
// last one seen, under the id callers see, with the node that runs it
// (nodeId, and nodeName when the node has one). r.mu is held.
func (r *nodeRouter) indexEntry(rs *remoteSession) protocol.Details {
	d := cloneDetails(rs.details)
	d["sessionId"] = rs.id
	d["nodeId"] = rs.nodeID
	if e := r.nodes[rs.nodeID]; e != nil && e.name != "" {
		d["nodeName"] = e.name
	}
	if rs.lost {
		d["status"] = "lost"
	}
	return d
}

func cloneDetails(d protocol.Details) protocol.Details {
	out := make(protocol.Details, len(d)+1)
	for k, v := range d {
		out[k] = v
	}
	return out
}

// indexMark returns the sequence number of the latest index addition;
// take it before asking a node for its list.
func (r *nodeRouter) indexMark() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.indexSeq
}

// reconcile brings the index in line with what node nodeID (running as
// instance) listed for the sessionKeys in entries; with all set, with
// every sessionKey. Listed sessions are added or refreshed; indexed ones
// it no longer lists are dropped when the same instance holds them
// (removed or swept) and marked lost when they belonged to an earlier
// instance (the node restarted). A partial list (one that left sessions
// out, beyond its limit) refreshes only the listed sessions; the others
// of the same instance stay as they are. Entries added after asOf
// (indexMark before the list was asked for) are newer than the list and
// left alone. It returns the index entries of the listed sessions, in
// the order listed (scope by scope).
func (r *nodeRouter) reconcile(nodeID, instance string, entries map[string][]protocol.Details, all, partial bool, asOf uint64) []*remoteSession {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*remoteSession
	listed := map[string]map[string]bool{} // sessionKey → node session ids
	for scope, list := range entries {
		listed[scope] = map[string]bool{}
		for _, d := range list {
			id, _ := d["sessionId"].(string)
			if id == "" {
				continue
			}
			listed[scope][id] = true
			// An entry of an earlier instance with the same node id is
			// a different session: mark it lost first.
			for _, rs := range r.indexedLocked(scope, nodeID, id) {
				if rs.nodeID == nodeID && rs.nodeSession == id && !rs.lost && rs.instance != "" && rs.instance != instance {
					rs.lost = true
				}
			}
			out = append(out, r.indexAddLocked(scope, nodeID, instance, id, cloneDetails(d)))
		}
	}
	for scope, sessions := range r.index {
		if _, ok := listed[scope]; !ok && !all {
			continue
		}
		for vid, rs := range sessions {
			if rs.nodeID != nodeID || rs.lost || listed[scope][rs.nodeSession] || rs.seq > asOf {
				continue
			}
			if rs.instance != "" && rs.instance != instance {
				rs.lost = true
				if rs.details == nil {
					rs.details = protocol.Details{"sessionId": rs.id, "status": "lost"}
				}
				continue
			}
			if partial {
				continue // maybe beyond the list's limit
			}
			delete(sessions, vid)
		}
		if len(sessions) == 0 {
			delete(r.index, scope)
		}
	}
	return out
}

// resync rebuilds the index entries of one node from its complete list
// (after a gateway start, a node restart or a reconnect).
func (r *nodeRouter) resync(ctx context.Context, id string) {
	defer func() {
		r.mu.Lock()
		if n := r.nodes[id]; n != nil {
			n.syncing = false
		}
		r.mu.Unlock()
	}()
	n, ok := r.nodeSnapshot(id)
	if !ok || n.pairing != protocol.NodePairingPaired || !n.live {
		return
	}
	body, _ := json.Marshal(protocol.NodeListRequest{All: true})
	asOf := r.indexMark()
	m, err := r.call(ctx, n, protocol.NodeEndpointList, body, nil, r.options().CallTimeout)
	if err != nil {
		r.log.Debug("node resync failed; retrying later", "node", id, "err", err)
		return
	}
	var reply protocol.NodeListResponse
	if err := json.Unmarshal(m.Data, &reply); err != nil || reply.NodeID != id {
		r.log.Warn("node resync: malformed list", "node", id, "err", err)
		return
	}
	entries := map[string][]protocol.Details{}
	for _, s := range reply.Sessions {
		entries[s.SessionKey] = append(entries[s.SessionKey], s.Details)
	}
	r.reconcile(id, reply.Instance, entries, true, false, asOf)
	r.mu.Lock()
	if e := r.nodes[id]; e != nil {
		e.synced = reply.Instance
		if e.instance == "" {
			e.instance = reply.Instance
		}
	}
	r.mu.Unlock()
	r.log.Debug("node sessions resynchronised", "node", id, "sessions", len(reply.Sessions))
}
