package gateway

import (
	"context"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/execmesh/execmesh/protocol"
)

// Approval decisions. The two that allow a run are also what the gateway
// sends a node in protocol.NodeExecApproval.Decision, so they are the
// protocol's values.
const (
	DecisionAllowOnce   = protocol.NodeDecisionAllowOnce   // "allow-once"
	DecisionAllowAlways = protocol.NodeDecisionAllowAlways // "allow-always"
	DecisionDeny        = "deny"
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
	// when ask is always).
	Decisions []string `json:"decisions"`
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

// approvalEntry is a pending approval and the channel its decision goes to.
// The fields after decided are guarded by the store's mu.
type approvalEntry struct {
	PendingApproval
	decided chan string // buffered 1; receives the first decision
	done    bool
	// What became of it, for GET /v1/approvals/<id>.
	decision     string
	expired      bool
	sessionID    string
	deniedReason string
	finishedAt   time.Time
}

// approvalStore holds pending approvals; the first decision wins.
type approvalStore struct {
	mu      sync.Mutex
	pending map[string]*approvalEntry
	// recent remembers decided or expired approvals for a while, so that a
	// late second answer gets 409 rather than 404 and their outcome can
	// still be read.
	recent map[string]*approvalEntry
	now    func() time.Time
}

// approvalKeep is how long a decided or expired approval is remembered.
const approvalKeep = time.Hour

func newApprovalStore() *approvalStore {
	return &approvalStore{pending: map[string]*approvalEntry{}, recent: map[string]*approvalEntry{}, now: time.Now}
}

// add registers a new pending approval and returns it.
func (s *approvalStore) add(p PendingApproval, ttl time.Duration) *approvalEntry {
	p.ID = uuid.NewString()
	p.Slug = p.ID[:8]
	p.ExpiresAtMs = s.now().Add(ttl).UnixMilli()
	e := &approvalEntry{PendingApproval: p, decided: make(chan string, 1)}
	s.mu.Lock()
	s.pending[p.ID] = e
	s.mu.Unlock()
	return e
}

// lookupLocked finds a pending approval by id or slug. s.mu must be held.
func (s *approvalStore) lookupLocked(idOrSlug string) (*approvalEntry, bool) {
	if e, ok := s.pending[idOrSlug]; ok {
		return e, true
	}
	var found *approvalEntry
	for _, e := range s.pending {
		if e.Slug == idOrSlug {
			if found != nil {
				return nil, false // ambiguous slug: use the full id
			}
			found = e
		}
	}
	return found, found != nil
}

// decide records the first decision for idOrSlug.
func (s *approvalStore) decide(idOrSlug, decision string) (*approvalEntry, error) {
	switch decision {
	case DecisionAllowOnce, DecisionAllowAlways, DecisionDeny:
	default:
		return nil, protocol.Errorf(protocol.ErrInvalidRequest, "invalid decision %q (expected allow-once, allow-always or deny)", decision)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.lookupLocked(idOrSlug)
	if !ok {
		for id := range s.recent {
			if id == idOrSlug || strings.HasPrefix(id, idOrSlug) && len(idOrSlug) >= 8 {
				return nil, protocol.Errorf(protocol.ErrConflict, "approval %s was already decided or expired", idOrSlug)
			}
		}
		return nil, protocol.Errorf(protocol.ErrNotFound, "no pending approval %s (unknown or expired)", idOrSlug)
	}
	allowed := false
	for _, d := range e.Decisions {
		allowed = allowed || d == decision
	}
	if !allowed {
		return nil, protocol.Errorf(protocol.ErrInvalidRequest, "decision %s is not available for approval %s (allowed: %s)", decision, e.Slug, strings.Join(e.Decisions, ", "))
	}
	s.finishLocked(e)
	e.decision = decision
	e.decided <- decision
	return e, nil
}

// expire removes e when nobody decided in time; it reports whether it did.
func (s *approvalStore) expire(e *approvalEntry) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.done {
		return false
	}
	s.finishLocked(e)
	e.expired = true
	return true
}

func (s *approvalStore) finishLocked(e *approvalEntry) {
	e.done = true
	delete(s.pending, e.ID)
	now := s.now()
	e.finishedAt = now
	s.recent[e.ID] = e
	for id, old := range s.recent {
		if now.Sub(old.finishedAt) > approvalKeep {
			delete(s.recent, id)
		}
	}
}

// started records the session of e's run.
func (s *approvalStore) started(e *approvalEntry, sessionID string) {
	s.mu.Lock()
	e.sessionID = sessionID
	s.mu.Unlock()
}

// denied records why e's command does not run.
func (s *approvalStore) denied(e *approvalEntry, reason string) {
	s.mu.Lock()
	e.deniedReason = reason
	s.mu.Unlock()
}

// state returns what became of the approval idOrSlug (pending ones, and
// decided or expired ones for an hour).
func (s *approvalStore) state(idOrSlug string) (ApprovalState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.lookupLocked(idOrSlug)
	if !ok {
		var found []*approvalEntry
		for id, r := range s.recent {
			if id == idOrSlug || r.Slug == idOrSlug {
				found = append(found, r)
			}
		}
		switch len(found) {
		case 0:
			return ApprovalState{}, protocol.Errorf(protocol.ErrNotFound, "no approval %s (unknown, or decided more than an hour ago)", idOrSlug)
		case 1:
			e = found[0]
		default:
			return ApprovalState{}, protocol.Errorf(protocol.ErrInvalidRequest, "approval slug %s is ambiguous: use the full id", idOrSlug)
		}
	}
	st := ApprovalState{PendingApproval: e.PendingApproval, State: ApprovalPending,
		Decision: e.decision, SessionID: e.sessionID, DeniedReason: e.deniedReason}
	switch {
	case e.decision != "":
		st.State = ApprovalDecided
	case e.expired:
		st.State = ApprovalExpired
	}
	return st, nil
}

// list returns the pending approvals, oldest first.
func (s *approvalStore) list() []PendingApproval {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]PendingApproval, 0, len(s.pending))
	for _, e := range s.pending {
		out = append(out, e.PendingApproval)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ExpiresAtMs < out[j].ExpiresAtMs })
	return out
}

// wait blocks until a decision arrives, the approval expires, or ctx ends.
// It returns "" when no decision was made.
func (s *approvalStore) wait(ctx context.Context, e *approvalEntry) string {
	timer := time.NewTimer(time.Until(time.UnixMilli(e.ExpiresAtMs)))
	defer timer.Stop()
	select {
	case d := <-e.decided:
		return d
	case <-timer.C:
	case <-ctx.Done():
	}
	if s.expire(e) {
		return ""
	}
	return <-e.decided // decided in the same instant: the decision wins
}
