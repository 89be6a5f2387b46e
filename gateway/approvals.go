package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/google/uuid"

	"github.com/execmesh/execmesh/approvals"
	"github.com/execmesh/execmesh/approvalstore"
	"github.com/execmesh/execmesh/host"
	"github.com/execmesh/execmesh/index"
	"github.com/execmesh/execmesh/internal/visible"
	"github.com/execmesh/execmesh/nodes"
	"github.com/execmesh/execmesh/protocol"
)

// Exec approvals (DESIGN.md §3.4). A host that needs an operator's
// decision answers with its plan; the gateway records a pending approval
// in the approvals store (shared by the gateways), answers
// approval-pending, and the record's owner acts on the decision, which
// any gateway may record: the first decision wins, a second gets 409. An
// approved run starts on the same host with the decision signed over the
// host's plan, in the background; its exit becomes the Exec finished
// system event.

// Approval decisions an operator may give.
const (
	DecisionAllowOnce   = protocol.DecisionAllowOnce   // "allow-once"
	DecisionAllowAlways = protocol.DecisionAllowAlways // "allow-always"
	DecisionDeny        = protocol.DecisionDeny        // "deny"
)

// decisionTTL bounds how long a signed decision may be acted on.
const decisionTTL = 2 * time.Minute

// PendingApproval is one exec waiting for a decision, as listed by
// GET /v1/approvals.
type PendingApproval = approvalstore.Approval

// approvalRecord is one approval of the store.
type approvalRecord = approvalstore.Record

// notices are the Exec running notices of the approved runs this gateway
// owns, by approval id.
type notices struct {
	mu      sync.Mutex
	timers  map[string]*time.Timer
	stopped bool
}

func (n *notices) arm(id string, d time.Duration, f func()) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stopped {
		return
	}
	if n.timers == nil {
		n.timers = map[string]*time.Timer{}
	}
	n.timers[id] = time.AfterFunc(d, func() {
		n.mu.Lock()
		delete(n.timers, id)
		n.mu.Unlock()
		f()
	})
}

func (n *notices) cancel(id string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if t := n.timers[id]; t != nil {
		t.Stop()
		delete(n.timers, id)
	}
}

func (n *notices) stop() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.stopped = true
	for _, t := range n.timers {
		t.Stop()
	}
}

// requestApproval records the pending approval of a run a host refused
// without one, and returns the approval-pending result.
func (g *Gateway) requestApproval(ctx context.Context, c *call, req protocol.ExecRequest, n *nodes.Node, ar protocol.ApprovalRequest) (protocol.Result, error) {
	// An approved run starts later, with nobody attached to claim a
	// stream bound now.
	req.Stream = nil
	decisions := []string{DecisionAllowOnce, DecisionAllowAlways, DecisionDeny}
	if !ar.AllowAlways {
		decisions = []string{DecisionAllowOnce, DecisionDeny}
	}
	id := uuid.NewString()
	ttl := time.Duration(c.cfg.Tools.Exec.ApprovalTimeoutMs) * time.Millisecond
	hostKind, nodeID, hostGW := hostGateway, "", g.id
	if n != nil {
		hostKind, nodeID, hostGW = hostNode, n.ID, ""
	}
	req.SessionID = "" // the approved run gets its own
	rec := approvalRecord{
		Approval: PendingApproval{
			ID: id, Slug: id[:8], Command: req.Args.Command, Host: hostKind, NodeID: nodeID, Cwd: ar.Plan.Cwd,
			AgentID: c.agentID, SessionKey: c.sessionKey, ExpiresAtMs: time.Now().Add(ttl).UnixMilli(), Decisions: decisions,
		},
		HostGateway: hostGW, Request: req, Plan: ar.Plan, AskFallback: ar.AskFallback, FallbackAllows: ar.FallbackAllows,
	}
	if err := g.appr.Create(ctx, rec); err != nil {
		return protocol.Result{}, err
	}
	d := protocol.Details{
		Status:       protocol.Some(protocol.StatusApprovalPending),
		ApprovalID:   protocol.Some(id),
		ApprovalSlug: protocol.Some(rec.Slug),
		ExpiresAtMs:  protocol.Some(rec.ExpiresAtMs),
		Host:         protocol.Some(hostKind),
		Command:      protocol.Some(req.Args.Command),
		Cwd:          protocol.Some(ar.Plan.Cwd),
	}
	if nodeID != "" {
		d.NodeID = protocol.Some(nodeID)
	}
	return protocol.TextResult(approvalText(rec.Approval, req.Warnings), d), nil
}

// actOnApproval carries out a decision (or an expiry) on an approval this
// gateway owns: Exec denied, or the approved run started with the signed
// decision (approvalstore.Options.OnOwned).
func (g *Gateway) actOnApproval(ctx context.Context, rec approvalRecord) {
	denied := func(reason string) {
		g.emitApprovalEvent(ctx, rec, protocol.EventExecDenied, fmt.Sprintf("Exec denied (%s, %s): %s", approvalHostTag(rec), visible.String(reason), visible.String(rec.Command)))
		_ = g.appr.Update(ctx, rec.ID, func(r *approvalRecord) bool {
			r.State, r.DeniedReason, r.SettledAt = approvalstore.StateDenied, reason, time.Now().UnixMilli()
			return true
		})
	}
	decision := rec.Decision
	switch {
	case rec.State == approvalstore.StateExpired:
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
	if rec.Host != hostNode && rec.HostGateway != g.id {
		// The gateway whose host was to run it is gone with its host.
		denied(fmt.Sprintf("gateway-gone: gateway %s, whose host was to run it, stopped", rec.HostGateway))
		return
	}
	signed, err := g.signer.Sign(ctx, protocol.Decision{ApprovalID: rec.ID, Decision: decision, Plan: rec.Plan, ExpiresAtMs: time.Now().Add(decisionTTL).UnixMilli()})
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
		denied(startFailure(g, rec, res, err))
		return
	}
	sid := res.SessionID()
	_ = g.appr.Update(ctx, rec.ID, func(r *approvalRecord) bool { r.State, r.SessionID = approvalstore.StateRunning, sid; return true })
	if ms := g.Config().Tools.Exec.ApprovalRunningNoticeMs; ms > 0 {
		g.notices.arm(rec.ID, time.Duration(ms)*time.Millisecond, func() { g.notice(rec.ID, sid, ms) })
	}
}

// startFailure is the denial reason of an approved run that did not start.
func startFailure(g *Gateway, rec approvalRecord, res protocol.Result, err error) string {
	var pe *protocol.Error
	switch {
	case errors.As(err, &pe) && pe.Type == protocol.ErrDenied && strings.HasPrefix(pe.Message, approvals.DenyApprovalTimeout):
		return pe.Message
	case errors.As(err, &pe) && pe.Type == protocol.ErrDenied && strings.HasPrefix(pe.Message, host.BindingChanged):
		return "approval-binding-changed: " + strings.TrimPrefix(pe.Message, host.BindingChanged)
	case errors.As(err, &pe) && pe.Type == protocol.ErrDenied && rec.Host == hostNode:
		return "node-denied: " + pe.Message
	case errors.As(err, &pe) && pe.Type == protocol.ErrDenied:
		return "gateway-denied: " + pe.Message
	case err != nil:
		g.log.Warn("approved exec failed to start", "approval", rec.ID, "err", err)
	default:
		g.log.Warn("approved exec did not start in the background", "approval", rec.ID, "status", res.Status())
	}
	return "spawn-failed"
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
		h := g.nodes.Host(n)
		reply, err := h.Exec(ctx, req)
		return c.started(ctx, startID{id: id, rec: recd, committed: true}, h, req, reply, err, &n)
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
	return c.started(ctx, startID{id: id, rec: recd, committed: true}, g.local, req, reply, err, nil)
}

// notice sends the Exec running event of a run still going after the
// notice delay.
func (g *Gateway) notice(id, sid string, ms int) {
	rec, ok := g.appr.Lookup(g.bg, id)
	if !ok || rec.State != approvalstore.StateRunning {
		return
	}
	var text string
	if rec.Host == hostNode {
		text = fmt.Sprintf("Exec running (node=%s id=%s, >%ds): %s", rec.NodeID, rec.ID, noticeSeconds(ms), visible.String(rec.Command))
	} else {
		text = fmt.Sprintf("Exec running (gateway id=%s, session=%s, >%ds): %s", rec.ID, sid, noticeSeconds(ms), visible.String(rec.Command))
	}
	g.emitApprovalEvent(g.bg, rec, protocol.EventExecRunning, text)
}

// approvalFinished turns the exit of an approved run into its Exec
// finished event, stored under end, the session's end identity (a lost
// report of the run's session and this event are one end). It reports
// whether RunID named an approval of this sessionKey run by that host.
func (g *Gateway) approvalFinished(ctx context.Context, ev protocol.ExitEvent, end string) bool {
	rec, ok := g.appr.Lookup(ctx, ev.RunID)
	if !ok {
		return false
	}
	if rec.SessionKey != ev.SessionKey || (rec.Host == hostNode && rec.NodeID != ev.NodeID) {
		g.log.Warn("exit event with another host's or scope's run id dropped", "nodeId", ev.NodeID, "runId", ev.RunID)
		return false
	}
	g.notices.cancel(rec.ID)
	text := finishedText(rec.ID, ev.SessionID, ev)
	if rec.Host == hostNode {
		text = strings.Replace(text, "(gateway id=", "(node="+rec.NodeID+" id=", 1)
	}
	g.emit(ctx, protocol.SystemEvent{SessionKey: rec.SessionKey, ContextKey: "exec:" + rec.ID, Kind: protocol.EventExecFinished, Text: text}, end)
	_ = g.appr.Update(ctx, rec.ID, func(r *approvalRecord) bool {
		if r.State == approvalstore.StateFinished {
			return false
		}
		r.State, r.SettledAt = approvalstore.StateFinished, time.Now().UnixMilli()
		return true
	})
	return true
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
// ways to answer in execmesh. Whoever relays it to an operator shows the
// command and cwd with control and bidi characters as escapes
// (internal/visible); the details keep them raw.
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
	cwd := visible.String(pa.Cwd)
	if cwd == "" {
		cwd = "(node default)"
	}
	lines = append(lines,
		"CWD: "+cwd,
		"Command:",
		"```sh",
		visible.String(pa.Command),
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
	writeJSON(w, http.StatusOK, map[string]any{"approvals": g.appr.List()})
}

func (g *Gateway) handleGetApproval(w http.ResponseWriter, r *http.Request) {
	rec, ok := g.appr.Lookup(r.Context(), r.PathValue("id"))
	if !ok {
		writeError(w, protocol.Errorf(protocol.ErrNotFound, "no approval %s (unknown, or settled more than an hour ago)", r.PathValue("id")))
		return
	}
	st := ApprovalDecided
	switch {
	case rec.Decision != "":
	case rec.State == approvalstore.StateExpired || time.Now().UnixMilli() > rec.ExpiresAtMs:
		st = ApprovalExpired
	case rec.State == approvalstore.StatePending:
		st = ApprovalPending
	}
	writeJSON(w, http.StatusOK, ApprovalState{PendingApproval: rec.Approval, State: st, Decision: rec.Decision,
		SessionID: rec.SessionID, DeniedReason: rec.DeniedReason})
}

func (g *Gateway) handleDecideApproval(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Decision string `json:"decision"`
	}
	if err := decodeStrict(w, r, &body); err != nil {
		writeError(w, err)
		return
	}
	pa, err := g.decide(r.Context(), r.PathValue("id"), body.Decision)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ok": true, "id": pa.ID, "decision": body.Decision})
}

// PendingApprovals lists the exec approvals waiting for a decision.
func (g *Gateway) PendingApprovals() []PendingApproval { return g.appr.List() }

// ResolveApproval records a decision for a pending approval (id or slug).
func (g *Gateway) ResolveApproval(ctx context.Context, idOrSlug, decision string) error {
	_, err := g.decide(ctx, idOrSlug, decision)
	return err
}

// decide records an operator's decision and counts it.
func (g *Gateway) decide(ctx context.Context, idOrSlug, decision string) (PendingApproval, error) {
	pa, err := g.appr.Decide(ctx, idOrSlug, decision)
	if err == nil {
		g.opts.Metrics.ObserveApproval(decision)
	}
	return pa, err
}
