package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/execmesh/execmesh/approvals"
	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/host"
	"github.com/execmesh/execmesh/index"
	"github.com/execmesh/execmesh/nodes"
	"github.com/execmesh/execmesh/protocol"
)

// Exec approvals (DESIGN.md §3.4). A host that needs an operator's
// decision answers with its plan; the gateway records a pending approval
// in the approvals bucket (shared by the gateways), answers
// approval-pending, and the gateway that recorded it (its owner) acts on
// the decision, which any gateway may record by compare-and-set: the
// first decision wins, a second gets 409. An approved run starts on the
// same host with the decision signed over the host's plan, in the
// background; its exit becomes the Exec finished system event.

// Approval decisions an operator may give.
const (
	DecisionAllowOnce   = protocol.DecisionAllowOnce   // "allow-once"
	DecisionAllowAlways = protocol.DecisionAllowAlways // "allow-always"
	DecisionDeny        = protocol.DecisionDeny        // "deny"
)

// Approval states.
const (
	approvalPending  = "pending"
	approvalDecided  = "decided"
	approvalExpired  = "expired"
	approvalRunning  = "running"
	approvalFinished = "finished"
	approvalDenied   = "denied"
)

const (
	// approvalKeep is how long a settled approval stays in the bucket, so
	// that a late second answer gets 409 rather than 404.
	approvalKeep = time.Hour
	// decisionTTL bounds how long a signed decision may be acted on.
	decisionTTL = 2 * time.Minute
)

// PendingApproval is one exec waiting for a decision, as listed by
// GET /v1/approvals.
type PendingApproval struct {
	ID          string `json:"id"`
	Slug        string `json:"slug"`
	Command     string `json:"command"`
	Host        string `json:"host"`
	NodeID      string `json:"nodeId,omitempty"`
	Cwd         string `json:"cwd"`
	AgentID     string `json:"agentId"`
	SessionKey  string `json:"sessionKey"`
	ExpiresAtMs int64  `json:"expiresAtMs"`
	// Decisions lists what may be answered (allow-always is not offered
	// when ask is always or nothing could be allowlisted).
	Decisions []string `json:"decisions"`
}

// approvalRecord is one approval in the bucket.
type approvalRecord struct {
	PendingApproval
	State     string `json:"state"`
	Decision  string `json:"decision,omitempty"`
	DecidedAt int64  `json:"decidedAt,omitempty"`
	// Owner is the gateway that acts on the decision.
	Owner string `json:"owner"`
	// Request is the exec to start once approved; Plan what the decision
	// is signed over.
	Request        protocol.ExecRequest `json:"request"`
	Plan           protocol.Plan        `json:"plan"`
	AskFallback    string               `json:"askFallback,omitempty"`
	FallbackAllows bool                 `json:"fallbackAllows,omitempty"`
	// SessionID is the approved run's session.
	SessionID string `json:"sessionId,omitempty"`
	// DeniedReason says why nothing runs (the reason of its Exec denied
	// event).
	DeniedReason string `json:"deniedReason,omitempty"`
	SettledAt    int64  `json:"settledAt,omitempty"`
}

type approvalEntry struct {
	rec      approvalRecord
	revision uint64
}

// approvalStore is the approvals bucket, its cache, and this gateway's
// work on the approvals it owns.
type approvalStore struct {
	g  *Gateway
	kv atomic.Pointer[jetstream.KeyValue]

	mu      sync.Mutex
	cache   map[string]approvalEntry
	timers  map[string]*time.Timer // expiry of owned pending approvals
	notices map[string]*time.Timer // Exec running notices of owned runs
	acting  map[string]bool        // owned approvals being acted on
	stopped bool
}

func newApprovalStore(g *Gateway) *approvalStore {
	return &approvalStore{g: g, cache: map[string]approvalEntry{}, timers: map[string]*time.Timer{}, notices: map[string]*time.Timer{}, acting: map[string]bool{}}
}

func (s *approvalStore) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	if p := s.kv.Load(); p != nil {
		return *p, nil
	}
	g := s.g
	name := bus.StreamNamesFor(g.prefix).Approvals
	actx, cancel := context.WithTimeout(ctx, index.Timeout)
	defer cancel()
	kv, err := g.js.KeyValue(actx, name)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		for _, c := range bus.KeyValueConfigs(g.prefix, g.replicas) {
			if c.Bucket == name {
				kv, err = g.js.CreateOrUpdateKeyValue(actx, c)
			}
		}
	}
	if err != nil {
		return nil, err
	}
	s.kv.Store(&kv)
	return kv, nil
}

// stop ends this gateway's timers (Close).
func (s *approvalStore) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
	for _, t := range s.timers {
		t.Stop()
	}
	for _, t := range s.notices {
		t.Stop()
	}
}

// run follows the bucket: the cache, and the decisions on approvals this
// gateway owns (whichever gateway recorded them).
func (s *approvalStore) run(ctx context.Context) {
	for attempt := 1; ctx.Err() == nil; attempt++ {
		kv, err := s.bucket(ctx)
		if err == nil {
			err = s.follow(ctx, kv)
		}
		if ctx.Err() != nil {
			return
		}
		s.g.log.Warn("approvals not available; retrying", "attempt", attempt, "err", err)
		s.kv.Store(nil)
		t := time.NewTimer(min(time.Duration(attempt)*500*time.Millisecond, 10*time.Second))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func (s *approvalStore) follow(ctx context.Context, kv jetstream.KeyValue) error {
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return err
	}
	defer w.Stop() //nolint:errcheck
	sweep := time.NewTicker(time.Minute)
	defer sweep.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-sweep.C:
			s.sweep(ctx)
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("watch ended")
			}
			if e == nil {
				continue
			}
			s.apply(e)
		}
	}
}

// apply takes one bucket change into the cache and acts on what this
// gateway owns.
func (s *approvalStore) apply(e jetstream.KeyValueEntry) {
	s.mu.Lock()
	cur, ok := s.cache[e.Key()]
	if ok && cur.revision >= e.Revision() {
		s.mu.Unlock()
		return
	}
	if e.Operation() != jetstream.KeyValuePut {
		delete(s.cache, e.Key())
		s.mu.Unlock()
		return
	}
	var rec approvalRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		s.mu.Unlock()
		return
	}
	s.cache[e.Key()] = approvalEntry{rec: rec, revision: e.Revision()}
	s.mu.Unlock()
	s.react(rec)
}

// react does the owner's part for one record: arm the expiry of a pending
// approval, act on a decision.
func (s *approvalStore) react(rec approvalRecord) {
	if rec.Owner != s.g.id {
		return
	}
	switch rec.State {
	case approvalPending:
		s.mu.Lock()
		if _, armed := s.timers[rec.ID]; !armed && !s.stopped {
			id := rec.ID
			s.timers[id] = time.AfterFunc(max(time.Until(time.UnixMilli(rec.ExpiresAtMs)), 0), func() { s.expire(id) })
		}
		s.mu.Unlock()
	case approvalDecided, approvalExpired:
		s.mu.Lock()
		if t := s.timers[rec.ID]; t != nil {
			t.Stop()
			delete(s.timers, rec.ID)
		}
		if s.acting[rec.ID] || s.stopped {
			s.mu.Unlock()
			return
		}
		s.acting[rec.ID] = true
		s.mu.Unlock()
		s.g.spawn(func(ctx context.Context) { s.act(ctx, rec) })
	}
}

// request records the pending approval of a run a host refused without
// one, and returns the approval-pending result.
func (s *approvalStore) request(ctx context.Context, c *call, req protocol.ExecRequest, n *nodes.Node, ar protocol.ApprovalRequest) (protocol.Result, error) {
	kv, err := s.bucket(ctx)
	if err != nil {
		return protocol.Result{}, &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true, Message: fmt.Sprintf("exec approvals are not available (JetStream: %v); nothing was started. Retry.", err)}
	}
	decisions := []string{DecisionAllowOnce, DecisionAllowAlways, DecisionDeny}
	if !ar.AllowAlways {
		decisions = []string{DecisionAllowOnce, DecisionDeny}
	}
	id := uuid.NewString()
	ttl := time.Duration(c.cfg.Tools.Exec.ApprovalTimeoutMs) * time.Millisecond
	host := hostGateway
	nodeID := ""
	if n != nil {
		host, nodeID = hostNode, n.ID
	}
	req.SessionID = "" // the approved run gets its own
	rec := approvalRecord{
		PendingApproval: PendingApproval{
			ID: id, Slug: id[:8], Command: req.Args.Command, Host: host, NodeID: nodeID, Cwd: ar.Plan.Cwd,
			AgentID: c.agentID, SessionKey: c.sessionKey, ExpiresAtMs: time.Now().Add(ttl).UnixMilli(), Decisions: decisions,
		},
		State: approvalPending, Owner: s.g.id, Request: req, Plan: ar.Plan,
		AskFallback: ar.AskFallback, FallbackAllows: ar.FallbackAllows,
	}
	b, _ := json.Marshal(rec)
	rev, err := kv.Create(ctx, id, b)
	if err != nil {
		return protocol.Result{}, &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true, Message: fmt.Sprintf("exec approvals: %v; nothing was started. Retry.", err)}
	}
	s.mu.Lock()
	s.cache[id] = approvalEntry{rec: rec, revision: rev}
	s.mu.Unlock()
	s.react(rec)
	d := protocol.Details{
		Status:       protocol.Some(protocol.StatusApprovalPending),
		ApprovalID:   protocol.Some(id),
		ApprovalSlug: protocol.Some(rec.Slug),
		ExpiresAtMs:  protocol.Some(rec.ExpiresAtMs),
		Host:         protocol.Some(host),
		Command:      protocol.Some(req.Args.Command),
		Cwd:          protocol.Some(ar.Plan.Cwd),
	}
	if nodeID != "" {
		d.NodeID = protocol.Some(nodeID)
	}
	return protocol.TextResult(approvalText(rec.PendingApproval, req.Warnings), d), nil
}

// lookup finds an approval by id or slug (an ambiguous slug matches none).
func (s *approvalStore) lookup(idOrSlug string) (approvalEntry, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.cache[idOrSlug]; ok {
		return e, true
	}
	var found *approvalEntry
	for _, e := range s.cache {
		if e.rec.Slug == idOrSlug {
			if found != nil {
				return approvalEntry{}, false
			}
			found = &e
		}
	}
	if found == nil {
		return approvalEntry{}, false
	}
	return *found, true
}

// decide records an operator's decision: 404 for an unknown or expired
// approval, 409 once decided, 400 for a decision that is not offered.
func (s *approvalStore) decide(ctx context.Context, idOrSlug, decision string) (PendingApproval, error) {
	switch decision {
	case DecisionAllowOnce, DecisionAllowAlways, DecisionDeny:
	default:
		return PendingApproval{}, protocol.Errorf(protocol.ErrInvalidRequest, "invalid decision %q (expected allow-once, allow-always or deny)", decision)
	}
	kv, err := s.bucket(ctx)
	if err != nil {
		return PendingApproval{}, &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true, Message: fmt.Sprintf("exec approvals are not available: %v", err)}
	}
	e, ok := s.lookup(idOrSlug)
	if !ok {
		// Maybe recorded an instant ago through another gateway.
		if kve, err := kv.Get(ctx, idOrSlug); err == nil {
			s.apply(kve)
			e, ok = s.lookup(idOrSlug)
		}
	}
	if !ok {
		return PendingApproval{}, protocol.Errorf(protocol.ErrNotFound, "no pending approval %s (unknown or expired)", idOrSlug)
	}
	for attempt := 0; attempt < 10; attempt++ {
		rec := e.rec
		switch {
		case rec.State == approvalExpired || (rec.State == approvalPending && time.Now().UnixMilli() > rec.ExpiresAtMs):
			return PendingApproval{}, protocol.Errorf(protocol.ErrNotFound, "no pending approval %s (unknown or expired)", idOrSlug)
		case rec.State != approvalPending:
			return PendingApproval{}, protocol.Errorf(protocol.ErrConflict, "approval %s was already decided (%s)", rec.Slug, rec.Decision)
		case !slices.Contains(rec.Decisions, decision):
			return PendingApproval{}, protocol.Errorf(protocol.ErrInvalidRequest, "decision %s is not available for approval %s (allowed: %s)", decision, rec.Slug, strings.Join(rec.Decisions, ", "))
		}
		rec.State, rec.Decision, rec.DecidedAt = approvalDecided, decision, time.Now().UnixMilli()
		b, _ := json.Marshal(rec)
		rev, err := kv.Update(ctx, rec.ID, b, e.revision)
		if err == nil {
			s.g.opts.Metrics.ObserveApproval(decision)
			s.mu.Lock()
			s.cache[rec.ID] = approvalEntry{rec: rec, revision: rev}
			s.mu.Unlock()
			s.react(rec)
			return rec.PendingApproval, nil
		}
		if !bus.IsWrongLastSequence(err) {
			return PendingApproval{}, &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true, Message: fmt.Sprintf("exec approvals: %v", err)}
		}
		// Another gateway wrote it meanwhile: read it again.
		kve, gerr := kv.Get(ctx, rec.ID)
		if gerr != nil {
			return PendingApproval{}, protocol.Errorf(protocol.ErrNotFound, "no pending approval %s (unknown or expired)", idOrSlug)
		}
		s.apply(kve)
		if e, ok = s.lookup(rec.ID); !ok {
			return PendingApproval{}, protocol.Errorf(protocol.ErrNotFound, "no pending approval %s (unknown or expired)", idOrSlug)
		}
	}
	return PendingApproval{}, protocol.Errorf(protocol.ErrConflict, "approval %s: concurrent decisions; retry", idOrSlug)
}

// expire settles an owned approval nobody answered in time.
func (s *approvalStore) expire(id string) {
	s.mu.Lock()
	delete(s.timers, id)
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(s.g.bg, index.Timeout)
	defer cancel()
	_ = s.update(ctx, id, func(r *approvalRecord) bool {
		if r.State != approvalPending {
			return false
		}
		r.State = approvalExpired
		return true
	})
}

// update changes a record by compare-and-set and reacts to the result.
func (s *approvalStore) update(ctx context.Context, id string, fn func(*approvalRecord) bool) error {
	kv, err := s.bucket(ctx)
	if err != nil {
		return err
	}
	for attempt := 0; attempt < 10; attempt++ {
		kve, err := kv.Get(ctx, id)
		if err != nil {
			return err
		}
		var rec approvalRecord
		if err := json.Unmarshal(kve.Value(), &rec); err != nil {
			return err
		}
		if !fn(&rec) {
			return nil
		}
		b, _ := json.Marshal(rec)
		rev, err := kv.Update(ctx, id, b, kve.Revision())
		if err == nil {
			s.mu.Lock()
			if cur, ok := s.cache[id]; !ok || cur.revision < rev {
				s.cache[id] = approvalEntry{rec: rec, revision: rev}
			}
			s.mu.Unlock()
			s.react(rec)
			return nil
		}
		if !bus.IsWrongLastSequence(err) {
			return err
		}
	}
	return errors.New("approvals: record contended")
}

// act carries out a decision (or an expiry) on an owned approval.
func (s *approvalStore) act(ctx context.Context, rec approvalRecord) {
	g := s.g
	denied := func(reason string) {
		g.emitApprovalEvent(ctx, rec, protocol.EventExecDenied, fmt.Sprintf("Exec denied (%s, %s): %s", approvalHostTag(rec), reason, rec.Command))
		_ = s.update(ctx, rec.ID, func(r *approvalRecord) bool {
			r.State, r.DeniedReason, r.SettledAt = approvalDenied, reason, time.Now().UnixMilli()
			return true
		})
	}
	decision := rec.Decision
	switch {
	case rec.State == approvalExpired:
		g.opts.Metrics.ObserveApproval("timeout")
		if !rec.FallbackAllows {
			reason := approvals.DenyApprovalTimeout
			if rec.AskFallback == approvals.SecurityAllowlist {
				reason = approvals.DenyApprovalTimeoutMiss
			}
			denied(reason)
			return
		}
		decision = protocol.DecisionTimeout
	case decision == DecisionDeny:
		denied("user-denied")
		return
	}
	signed, err := g.signer.sign(ctx, protocol.Decision{ApprovalID: rec.ID, Decision: decision, Plan: rec.Plan, ExpiresAtMs: time.Now().Add(decisionTTL).UnixMilli()})
	if err != nil {
		g.log.Warn("approved exec not started: cannot sign the decision", "approval", rec.ID, "err", err)
		denied("spawn-failed")
		return
	}
	req := rec.Request
	req.Approval = &signed
	req.Args.Background, req.Args.YieldMs, req.Sync = true, nil, false
	res, err := g.startApproved(ctx, rec, req)
	if err != nil || res.Status() != protocol.StatusRunning {
		reason := "spawn-failed"
		var pe *protocol.Error
		switch {
		case errors.As(err, &pe) && pe.Type == protocol.ErrDenied && strings.HasPrefix(pe.Message, approvals.DenyApprovalTimeout):
			reason = pe.Message
		case errors.As(err, &pe) && pe.Type == protocol.ErrDenied && strings.HasPrefix(pe.Message, host.BindingChanged):
			reason = "approval-binding-changed: " + strings.TrimPrefix(pe.Message, host.BindingChanged)
		case errors.As(err, &pe) && pe.Type == protocol.ErrDenied && rec.Host == hostNode:
			reason = "node-denied: " + pe.Message
		case errors.As(err, &pe) && pe.Type == protocol.ErrDenied:
			reason = "gateway-denied: " + pe.Message
		case err != nil:
			g.log.Warn("approved exec failed to start", "approval", rec.ID, "err", err)
		default:
			g.log.Warn("approved exec did not start in the background", "approval", rec.ID, "status", res.Status())
		}
		denied(reason)
		return
	}
	sid := res.SessionID()
	_ = s.update(ctx, rec.ID, func(r *approvalRecord) bool { r.State, r.SessionID = approvalRunning, sid; return true })
	if ms := g.Config().Tools.Exec.ApprovalRunningNoticeMs; ms > 0 {
		s.mu.Lock()
		if !s.stopped {
			s.notices[rec.ID] = time.AfterFunc(time.Duration(ms)*time.Millisecond, func() { s.notice(rec.ID, sid, ms) })
		}
		s.mu.Unlock()
	}
}

// startApproved starts an approved run on the host that asked, under a
// fresh session id.
func (g *Gateway) startApproved(ctx context.Context, rec approvalRecord, req protocol.ExecRequest) (protocol.Result, error) {
	c := &call{g: g, cfg: g.Config(), sessionKey: rec.SessionKey, agentID: rec.AgentID}
	if rec.Host == hostNode {
		n, ok := g.nodes.Get(rec.NodeID)
		switch {
		case !ok:
			return protocol.Result{}, protocol.Errorf(protocol.ErrHostNotAllowed, "node %s is no longer known", rec.NodeID)
		case n.Pairing != protocol.NodePairingPaired:
			return protocol.Result{}, protocol.Errorf(protocol.ErrHostNotAllowed, "node %s is no longer paired", n.Label())
		case !n.Live:
			return protocol.Result{}, nodes.UnreachableError(n, g.nodes.Now(), "the approved command was not started")
		}
		recd := index.Record{SessionKey: rec.SessionKey, Host: index.HostNode, HostID: n.ID, Instance: n.Instance,
			Command: rec.Command, StartedAt: time.Now().UnixMilli(), State: index.StateRunning, RunID: rec.ID}
		id, err := g.index.Allocate(ctx, recd)
		if err != nil {
			return protocol.Result{}, err
		}
		req.SessionID = id
		reply, err := g.nodes.Host(n).Exec(ctx, req)
		return c.started(ctx, id, req, reply, err, &n)
	}
	recd := index.Record{SessionKey: rec.SessionKey, Host: index.HostGateway, HostID: g.id, Instance: g.local.Instance(),
		Command: rec.Command, StartedAt: time.Now().UnixMilli(), State: index.StateRunning, RunID: rec.ID}
	id, err := g.index.Allocate(ctx, recd)
	if err != nil {
		return protocol.Result{}, err
	}
	req.SessionID = id
	reply, err := g.local.Exec(ctx, req)
	if _, ok := host.AsApprovalNeeded(err); ok {
		err = protocol.Errorf(protocol.ErrDenied, "the approved run needs approval again")
	}
	return c.started(ctx, id, req, reply, err, nil)
}

// notice sends the Exec running event of a run still going after the
// notice delay.
func (s *approvalStore) notice(id, sid string, ms int) {
	s.mu.Lock()
	delete(s.notices, id)
	e, ok := s.cache[id]
	s.mu.Unlock()
	if !ok || e.rec.State != approvalRunning {
		return
	}
	rec := e.rec
	var text string
	if rec.Host == hostNode {
		text = fmt.Sprintf("Exec running (node=%s id=%s, >%ds): %s", rec.NodeID, rec.ID, noticeSeconds(ms), rec.Command)
	} else {
		text = fmt.Sprintf("Exec running (gateway id=%s, session=%s, >%ds): %s", rec.ID, sid, noticeSeconds(ms), rec.Command)
	}
	s.g.emitApprovalEvent(s.g.bg, rec, protocol.EventExecRunning, text)
}

// finished turns the exit of an approved run into its Exec finished event.
// It reports whether runID named an approval of this sessionKey.
func (s *approvalStore) finished(ctx context.Context, ev protocol.ExitEvent) bool {
	e, ok := s.lookup(ev.RunID)
	if !ok {
		kv, err := s.bucket(ctx)
		if err != nil {
			return false
		}
		kve, err := kv.Get(ctx, ev.RunID)
		if err != nil {
			return false
		}
		s.apply(kve)
		if e, ok = s.lookup(ev.RunID); !ok {
			return false
		}
	}
	rec := e.rec
	if rec.SessionKey != ev.SessionKey || (rec.Host == hostNode && rec.NodeID != ev.NodeID) {
		s.g.log.Warn("exit event with another host's or scope's run id dropped", "nodeId", ev.NodeID, "runId", ev.RunID)
		return false
	}
	s.mu.Lock()
	if t := s.notices[rec.ID]; t != nil {
		t.Stop()
		delete(s.notices, rec.ID)
	}
	s.mu.Unlock()
	sid := ev.SessionID
	text := finishedText(rec.ID, sid, ev)
	if rec.Host == hostNode {
		text = strings.Replace(text, "(gateway id=", "(node="+rec.NodeID+" id=", 1)
	}
	s.g.emitApprovalEvent(ctx, rec, protocol.EventExecFinished, text)
	_ = s.update(ctx, rec.ID, func(r *approvalRecord) bool {
		if r.State == approvalFinished {
			return false
		}
		r.State, r.SettledAt = approvalFinished, time.Now().UnixMilli()
		return true
	})
	return true
}

// sweep forgets settled approvals after approvalKeep (any gateway may).
func (s *approvalStore) sweep(ctx context.Context) {
	kv, err := s.bucket(ctx)
	if err != nil {
		return
	}
	cutoff := time.Now().Add(-approvalKeep).UnixMilli()
	s.mu.Lock()
	var old []approvalEntry
	for _, e := range s.cache {
		settled := e.rec.SettledAt
		if settled == 0 && e.rec.State == approvalExpired {
			settled = e.rec.ExpiresAtMs
		}
		if settled != 0 && settled < cutoff {
			old = append(old, e)
		}
	}
	s.mu.Unlock()
	for _, e := range old {
		_ = kv.Delete(ctx, e.rec.ID, jetstream.LastRevision(e.revision))
	}
}

// list returns the pending approvals, oldest first.
func (s *approvalStore) list() []PendingApproval {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now().UnixMilli()
	out := []PendingApproval{}
	for _, e := range s.cache {
		if e.rec.State == approvalPending && e.rec.ExpiresAtMs >= now {
			out = append(out, e.rec.PendingApproval)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ExpiresAtMs < out[j].ExpiresAtMs })
	return out
}

// approvalHostTag names the host of an approval in event texts.
func approvalHostTag(rec approvalRecord) string {
	if rec.Host == hostNode {
		return "node=" + rec.NodeID + " id=" + rec.ID
	}
	return "gateway id=" + rec.ID
}

// emitApprovalEvent queues a system event of an approval-gated run.
func (g *Gateway) emitApprovalEvent(ctx context.Context, rec approvalRecord, kind, text string) {
	g.emit(ctx, protocol.SystemEvent{SessionKey: rec.SessionKey, ContextKey: "exec:" + rec.ID, Kind: kind, Text: text},
		"approval:"+rec.ID+":"+kind)
}

// approvalText is the approval-pending result text (spec §18), with the
// ways to answer in execmesh.
func approvalText(pa PendingApproval, warnings []string) string {
	var lines []string
	if len(warnings) > 0 {
		lines = append(lines, strings.Join(warnings, "\n"), "")
	}
	lines = append(lines,
		fmt.Sprintf("Approval required (id %s, full %s).", pa.Slug, pa.ID),
		"Host: "+pa.Host,
	)
	if pa.NodeID != "" {
		lines = append(lines, "Node: "+pa.NodeID)
	}
	cwd := pa.Cwd
	if cwd == "" {
		cwd = "(node default)"
	}
	lines = append(lines,
		"CWD: "+cwd,
		"Command:",
		"```sh",
		pa.Command,
		"```",
		"Mode: runs in the background once approved; its result arrives as an Exec finished system event.",
		"Background mode requires pre-approved policy (allow-always or ask=off).",
		fmt.Sprintf("Reply with: /approve %s %s", pa.Slug, strings.Join(pa.Decisions, "|")),
	)
	if !slices.Contains(pa.Decisions, DecisionAllowAlways) {
		lines = append(lines, "Allow Always is unavailable for this command.")
	}
	lines = append(lines,
		"If the short code is ambiguous, use the full id in /approve.",
		fmt.Sprintf("Operators answer with: execmesh approvals resolve %s %s (or POST /v1/approvals/%s).", pa.Slug, strings.Join(pa.Decisions, "|"), pa.ID),
	)
	return strings.Join(lines, "\n")
}

// noticeSeconds is the ">Ns" of an Exec running event: the notice delay
// rounded to whole seconds, at least 1 (spec §18).
func noticeSeconds(ms int) int {
	return max(1, (ms+500)/1000)
}

// finishedText is `Exec finished (gateway id=…, session=…, <label>)` plus
// the last 400 chars of output with whitespace collapsed.
func finishedText(id, sid string, ev protocol.ExitEvent) string {
	label := "code ?"
	switch {
	case ev.ExitReason == "overall-timeout" || ev.ExitReason == "no-output-timeout":
		label = "timeout"
	case ev.ExitCode != nil:
		label = fmt.Sprintf("code %d", *ev.ExitCode)
	}
	text := fmt.Sprintf("Exec finished (gateway id=%s, session=%s, %s)", id, sid, label)
	out := []rune(ev.Tail)
	if len(out) > 400 {
		out = out[len(out)-400:]
	}
	if s := strings.Join(strings.FieldsFunc(string(out), unicode.IsSpace), " "); s != "" {
		text += "\n" + s
	}
	return text
}

// Approval states of GET /v1/approvals/<id>.
const (
	ApprovalPending = "pending"
	ApprovalDecided = "decided"
	ApprovalExpired = "expired"
)

// ApprovalState is GET /v1/approvals/<id>: what became of an approval, for
// a caller that waits for it without reading the sessionKey's system
// events (`execmesh exec`).
type ApprovalState struct {
	PendingApproval
	// State is pending, decided or expired (nobody decided in time).
	State string `json:"state"`
	// Decision is the operator's: allow-once, allow-always or deny.
	Decision string `json:"decision,omitempty"`
	// SessionID is the session of the approved run (or of the run the
	// askFallback allowed) once it started: follow it with process poll.
	SessionID string `json:"sessionId,omitempty"`
	// DeniedReason says why nothing runs (the reason of its Exec denied
	// event: user-denied, approval-timeout, approval-binding-changed: …,
	// spawn-failed, gateway-shutdown).
	DeniedReason string `json:"deniedReason,omitempty"`
}

// HTTP: GET /v1/approvals, GET /v1/approvals/{id}, POST /v1/approvals/{id}.

func (g *Gateway) handleListApprovals(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"approvals": g.appr.list()})
}

func (g *Gateway) handleGetApproval(w http.ResponseWriter, r *http.Request) {
	e, ok := g.appr.lookup(r.PathValue("id"))
	if !ok {
		writeError(w, protocol.Errorf(protocol.ErrNotFound, "no approval %s (unknown, or settled more than an hour ago)", r.PathValue("id")))
		return
	}
	st := ApprovalDecided
	switch {
	case e.rec.Decision != "":
	case e.rec.State == approvalExpired || time.Now().UnixMilli() > e.rec.ExpiresAtMs:
		st = ApprovalExpired
	case e.rec.State == approvalPending:
		st = ApprovalPending
	}
	writeJSON(w, http.StatusOK, ApprovalState{PendingApproval: e.rec.PendingApproval, State: st, Decision: e.rec.Decision,
		SessionID: e.rec.SessionID, DeniedReason: e.rec.DeniedReason})
}

func (g *Gateway) handleDecideApproval(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Decision string `json:"decision"`
	}
	if err := decodeStrict(w, r, &body); err != nil {
		writeError(w, err)
		return
	}
	pa, err := g.appr.decide(r.Context(), r.PathValue("id"), body.Decision)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ok": true, "id": pa.ID, "decision": body.Decision})
}

// PendingApprovals lists the exec approvals waiting for a decision.
func (g *Gateway) PendingApprovals() []PendingApproval { return g.appr.list() }

// ResolveApproval records a decision for a pending approval (id or slug).
func (g *Gateway) ResolveApproval(ctx context.Context, idOrSlug, decision string) error {
	_, err := g.appr.decide(ctx, idOrSlug, decision)
	return err
}
