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

// approvalEntry is a pending approval and the channel its decision goes to.
type approvalEntry struct {
	PendingApproval
	decided chan string // buffered 1; receives the first decision
	done    bool
}

// approvalStore holds pending approvals; the first decision wins.
type approvalStore struct {
	mu      sync.Mutex
	pending map[string]*approvalEntry
	// recent remembers decided or expired ids for a while so a late
	// second answer gets 409 rather than 404.
	recent map[string]time.Time
	now    func() time.Time
}

func newApprovalStore() *approvalStore {
	return &approvalStore{pending: map[string]*approvalEntry{}, recent: map[string]time.Time{}, now: time.Now}
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
	return true
}

func (s *approvalStore) finishLocked(e *approvalEntry) {
	e.done = true
	delete(s.pending, e.ID)
	now := s.now()
	s.recent[e.ID] = now
	for id, at := range s.recent {
		if now.Sub(at) > time.Hour {
			delete(s.recent, id)
		}
	}
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
