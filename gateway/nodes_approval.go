package gateway

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/execmesh/execmesh/approvals"
	"github.com/execmesh/execmesh/protocol"
)

// Approval-gated runs on host=node (DESIGN.md §3.4). The node evaluates a
// run with its own approvals file; when that needs an approval and the
// start carries none, it answers protocol.ErrApprovalRequired with its
// evaluation. The gateway then does what it does for host=gateway: a
// pending approval (GET /v1/approvals, POST /v1/approvals/<id>), an
// approval-pending result, and in the background the wait for the
// decision. An approval starts the run again on the same node with
// protocol.NodeExecRequest.Approval set, in the background and without the
// usual exit notification; the run's exit event carries the approval id
// (RunID) and becomes its Exec finished event. The approval carries back
// the binding the node computed (the hashes of the command's executables
// and scripts), which the node checks right before it spawns.

// nodeApprovalNeeded is the node's protocol.ErrApprovalRequired answer.
type nodeApprovalNeeded struct {
	pe      *protocol.Error
	summary *protocol.NodeApprovalRequired // nil when the node sent none (a replayed answer)
}

func (e *nodeApprovalNeeded) Error() string { return e.pe.Message }

// nodeRunWaiter waits for the exit event of one approval-gated run.
type nodeRunWaiter struct {
	nodeID     string
	sessionKey string
	done       chan nodeRunExit // buffered 1
}

type nodeRunExit struct {
	ev      protocol.ExitEvent
	visible string // the session id callers see
}

// requestApproval registers the pending approval of a node run and starts
// waiting for its decision; it returns the approval-pending result.
func (r *nodeRouter) requestApproval(n nodeInfo, req NodeExecRequest, s *protocol.NodeApprovalRequired) protocol.Result {
	g := r.g
	cfg := g.Config()
	if s == nil {
		s = &protocol.NodeApprovalRequired{Command: req.Args.Command, Cwd: req.Args.Workdir, AskFallback: approvals.SecurityDeny}
	}
	decisions := []string{DecisionAllowOnce, DecisionAllowAlways, DecisionDeny}
	if !s.AllowAlways {
		decisions = []string{DecisionAllowOnce, DecisionDeny}
	}
	ttl := time.Duration(cfg.Tools.Exec.ApprovalTimeoutMs) * time.Millisecond
	e := g.approvals.add(PendingApproval{
		Command: req.Args.Command, Host: hostNode, NodeID: n.id, Cwd: s.Cwd,
		AgentID: req.AgentID, SessionKey: req.SessionKey, Decisions: decisions,
	}, ttl)
	g.bgWG.Add(1)
	go func() {
		defer g.bgWG.Done()
		r.runApproval(n.id, e, req, *s)
	}()
	return protocol.TextResult(approvalText(e.PendingApproval, req.Warnings), protocol.Details{
		"status":       protocol.StatusApprovalPending,
		"approvalId":   e.ID,
		"approvalSlug": e.Slug,
		"expiresAtMs":  e.ExpiresAtMs,
		"host":         hostNode,
		"nodeId":       n.id,
		"command":      req.Args.Command,
		"cwd":          s.Cwd,
	})
}

// runApproval waits for the decision on a node run and acts on it.
func (r *nodeRouter) runApproval(nodeID string, e *approvalEntry, req NodeExecRequest, s protocol.NodeApprovalRequired) {
	g := r.g
	command := req.Args.Command
	emit := func(kind, text string) {
		g.emit(protocol.SystemEvent{SessionKey: req.SessionKey, ContextKey: "exec:" + e.ID, Kind: kind, Text: text})
	}
	denied := func(reason string) {
		emit(protocol.EventExecDenied, fmt.Sprintf("Exec denied (node=%s id=%s, %s): %s", nodeID, e.ID, reason, command))
	}
	decision := g.awaitDecision(e)
	if g.bg.Err() != nil {
		denied("gateway-shutdown")
		return
	}
	switch decision {
	case DecisionDeny:
		denied("user-denied")
		return
	case "":
		// Nobody answered: the askFallback decides. The node applies its
		// own (it may run an allowlisted plan); when its evaluation said
		// the fallback denies, nothing is sent.
		if !s.FallbackAllows {
			reason := approvals.DenyApprovalTimeout
			if s.AskFallback == approvals.SecurityAllowlist {
				reason = approvals.DenyApprovalTimeoutMiss
			}
			denied(reason)
			return
		}
		decision = protocol.NodeDecisionTimeout
	}

	w := &nodeRunWaiter{nodeID: nodeID, sessionKey: req.SessionKey, done: make(chan nodeRunExit, 1)}
	r.runs.Store(e.ID, w)
	defer r.runs.Delete(e.ID)
	res, err := r.execApproved(nodeID, req, &protocol.NodeExecApproval{ID: e.ID, Decision: decision, Binding: s.Binding})
	if err != nil || res.Status() != protocol.StatusRunning {
		reason := "spawn-failed"
		var pe *protocol.Error
		switch {
		case errors.As(err, &pe) && pe.Type == protocol.ErrDenied && strings.HasPrefix(pe.Message, approvals.DenyApprovalTimeout):
			reason = pe.Message
		case errors.As(err, &pe) && pe.Type == protocol.ErrDenied:
			reason = "node-denied: " + pe.Message
		case err != nil:
			r.log.Warn("approved node exec failed to start", "approval", e.ID, "node", nodeID, "err", err)
		default:
			r.log.Warn("approved node exec did not start in the background", "approval", e.ID, "node", nodeID, "status", res.Status())
		}
		denied(reason)
		return
	}
	sid := res.SessionID()
	cfg := g.Config()
	var notice <-chan time.Time
	if ms := cfg.Tools.Exec.ApprovalRunningNoticeMs; ms > 0 {
		t := time.NewTimer(time.Duration(ms) * time.Millisecond)
		defer t.Stop()
		notice = t.C
	}
	for {
		select {
		case <-notice:
			notice = nil
			emit(protocol.EventExecRunning, fmt.Sprintf("Exec running (node=%s id=%s, >%ds): %s",
				nodeID, e.ID, noticeSeconds(cfg.Tools.Exec.ApprovalRunningNoticeMs), command))
		case x := <-w.done:
			if sid == "" {
				sid = x.visible
			}
			// finishedText is the host=gateway text; only the host part
			// differs.
			text := strings.Replace(finishedText(e.ID, sid, x.ev), "(gateway id=", "(node="+nodeID+" id=", 1)
			emit(protocol.EventExecFinished, text)
			return
		case <-g.bg.Done():
			return
		case <-r.ctx.Done():
			// The node backend stopped: the exit will not arrive here.
			return
		}
	}
}

// execApproved starts an approved run on the node that asked for the
// approval, in the background.
func (r *nodeRouter) execApproved(nodeID string, req NodeExecRequest, approval *protocol.NodeExecApproval) (protocol.Result, error) {
	if err := r.alive(); err != nil {
		return protocol.Result{}, err
	}
	n, ok := r.nodeSnapshot(nodeID)
	switch {
	case !ok:
		return protocol.Result{}, protocol.Errorf(protocol.ErrHostNotAllowed, "node %s is no longer known", nodeID)
	case n.pairing != protocol.NodePairingPaired:
		return protocol.Result{}, protocol.Errorf(protocol.ErrHostNotAllowed, "node %s is no longer paired", n.label())
	case !n.live:
		return protocol.Result{}, unreachableError(n, r.now(), "the approved command was not started")
	}
	req.Args.Background = true
	req.Args.YieldMs = nil
	req.Sync = false
	return r.execOn(r.ctx, n, req, approval)
}

// finishRun hands the exit event of an approval-gated run to its waiter.
// visible is the session id callers see.
func (r *nodeRouter) finishRun(ev protocol.ExitEvent, visible string) {
	v, ok := r.runs.Load(ev.RunID)
	if !ok {
		return
	}
	w := v.(*nodeRunWaiter)
	if w.nodeID != ev.NodeID || w.sessionKey != ev.SessionKey {
		r.log.Warn("exit event with another node's or scope's run id dropped", "nodeId", ev.NodeID, "runId", ev.RunID)
		return
	}
	select {
	case w.done <- nodeRunExit{ev: ev, visible: visible}:
	default:
	}
}
