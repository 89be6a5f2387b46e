package gateway

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/execmesh/execmesh/index"
	"github.com/execmesh/execmesh/nodes"
	"github.com/execmesh/execmesh/protocol"
)

// Exit events become system events here, whichever host they come from:
// the local host calls onLocalExit, the node registry's exit feed calls
// onNodeExit. Nothing is acknowledged upstream before it is stored: a
// node's event is acknowledged to JetStream only once its system event is
// in the event store, and a local one is retried until it is (the gateway
// reports unhealthy meanwhile).

// deliverRetry bounds the retry delay of events not stored yet.
const deliverRetry = 5 * time.Second

// logEvery bounds the lines of a condition that repeats for every event
// (an event store that fails, events for sessions the host does not
// run): at most one per key in this time, with the count it stands for.
const logEvery = 10 * time.Second

// onLocalExit handles the exit of a local session, in the session core's
// goroutine: the first attempt runs there, so that a poll the session core
// holds until its exit event is out finds the event stored (and drops it);
// when the store fails, a tracked goroutine retries.
func (g *Gateway) onLocalExit(ev protocol.ExitEvent) {
	ctx, cancel := context.WithTimeout(g.bg, deliverRetry)
	err := g.handleExit(ctx, ev, "")
	cancel()
	if err == nil {
		g.local.Manager().ExitStored(ev.SessionID)
		return
	}
	g.backlog.Add(1)
	g.spawn(func(ctx context.Context) {
		defer g.backlog.Add(-1)
		for attempt := 1; ; attempt++ {
			err := g.handleExit(ctx, ev, "")
			if err == nil {
				g.local.Manager().ExitStored(ev.SessionID)
				return
			}
			if ctx.Err() != nil {
				g.log.Error("exit event not stored before shutdown", "sessionId", ev.SessionID, "err", err)
				return
			}
			g.rare.Warn(ev.SessionKey, "exit event not stored yet; retrying", "retries",
				"sessionKey", ev.SessionKey, "sessionId", ev.SessionID, "attempt", attempt, "err", err)
			t := time.NewTimer(min(time.Duration(attempt)*500*time.Millisecond, deliverRetry))
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
		}
	})
}

// onNodeExit handles a node's exit event from the exit feed; an error has
// it redelivered.
func (g *Gateway) onNodeExit(ctx context.Context, n nodes.Node, ev protocol.ExitEvent) error {
	if ev.Lost != "" {
		// The node's restarted session core found what its crashed run
		// left of this session, and ended it.
		// An error has it redelivered: the node's record of it goes only
		// once JetStream took the report, and the report only once its
		// event is stored here.
		return g.hostLost(ctx, ev.SessionID, ev.SessionKey, ev.StartedAt, ev.Lost, index.HostNode, n.ID)
	}
	return g.handleExit(ctx, ev, n.ID)
}

// handleExit turns one exit event into what it must be: the Exec finished
// event of an approved run, or the exit notice of a background session
// (unless a poll already delivered the end), and marks the session
// finished in the index. nodeID is the node that sent it ("" for the
// local host); an event counts only for a session the index says that
// host holds for that sessionKey, so no host can notify any agent about
// any session.
func (g *Gateway) handleExit(ctx context.Context, ev protocol.ExitEvent, nodeID string) error {
	rec, ok := g.index.Lookup(ctx, ev.SessionID)
	wantHost, wantID := index.HostGateway, g.id
	if nodeID != "" {
		wantHost, wantID = index.HostNode, nodeID
	}
	if !ok || rec.SessionKey != ev.SessionKey || rec.Host != wantHost || rec.HostID != wantID {
		if err := g.index.Healthy(); err != nil {
			return err // cannot tell: try again later
		}
		if !ok && g.index.Reserved(ctx, ev.SessionID) {
			// The call that backgrounded it has not written its record
			// yet (it does before it answers): try again later.
			return fmt.Errorf("exit event of session %s before its index record", ev.SessionID)
		}
		g.rare.Warn(wantID, "exit events for sessions the host does not run dropped", "dropped",
			"host", wantID, "sessionId", ev.SessionID, "sessionKey", ev.SessionKey)
		return nil
	}
	end := endIdentity(rec.SessionKey, ev.SessionID, rec.StartedAt)
	if ev.RunID != "" {
		if g.approvalFinished(ctx, ev, end) {
			return g.finish(ctx, ev)
		}
	}
	if ev.Notify && ev.Text != "" && ev.SessionKey != "" && !rec.Polled {
		if err := g.notifyExit(ctx, ev, end); err != nil {
			return err
		}
	}
	return g.finish(ctx, ev)
}

// notifyExit queues the exit notice of a session no poll delivered the
// end of. The session's index record settles the race with a poll that
// delivers the end meanwhile: the notice is marked pending before it is
// stored and stored after, by compare-and-set; a poll that finds it
// pending waits for it (polled), and one that comes after the mark sees
// it and removes the notice, or is seen here and the notice is removed
// here. Either way no notice stays for a session a poll delivered. The
// notice is stored under end, the session's end identity, so that a lost
// report of the same session, stored before or after it, leaves its agent
// one of the two; a session already told lost gets no notice at all.
func (g *Gateway) notifyExit(ctx context.Context, ev protocol.ExitEvent, end string) error {
	skip := false
	if err := g.index.Update(ctx, ev.SessionID, func(r *index.Record) bool {
		skip = r.Polled || r.Notice == index.NoticeStored || r.LostTold
		if skip || r.Notice == index.NoticePending {
			return false
		}
		r.Notice = index.NoticePending
		return true
	}); err != nil {
		return err
	}
	if skip {
		return nil
	}
	se := protocol.SystemEvent{SessionKey: ev.SessionKey, ContextKey: "exec:" + ev.SessionID, Kind: protocol.EventExecExit, Text: ev.Text}
	if err := g.events.Push(ctx, se, end); err != nil {
		return err
	}
	polled := false
	if err := g.index.Update(ctx, ev.SessionID, func(r *index.Record) bool {
		polled = r.Polled
		r.Notice = index.NoticeStored
		return true
	}); err != nil {
		return err
	}
	if polled {
		// A poll delivered the end while the notice was stored.
		return g.events.Drop(ctx, ev.SessionKey, se.ContextKey)
	}
	return nil
}

// finish marks a session finished in the index. A failed write is an
// error, so the exit is handled again (a local one retried, a node's
// redelivered; both are idempotent): a record left running would never
// be swept, and outlive its session for good.
func (g *Gateway) finish(ctx context.Context, ev protocol.ExitEvent) error {
	if err := g.index.Update(ctx, ev.SessionID, func(r *index.Record) bool {
		return r.Ended(index.StateFinished, time.Now())
	}); err != nil {
		return fmt.Errorf("marking session %s finished: %w", ev.SessionID, err)
	}
	return nil
}

// endIdentity is the identity of a session's end in the event queue: the
// exit notice (exec.exit, or exec.finished of an approved run) and the
// lost report (exec.lost) are both stored under it, so that the queue's
// duplicate window keeps whichever came first, whatever the order and
// whoever tells it (the exit feed, a redelivered exit, a host's lost
// report, a gateway noticing a restart). It is derived from the index
// record (sessionKey, id and the record's StartedAt, never the session id
// alone), which every teller reads, not from the host's event.
func endIdentity(sessionKey, id string, startedAt int64) string {
	return "end:" + protocol.EncodeSessionKeyToken(sessionKey) + ":" + id + ":" + strconv.FormatInt(startedAt, 10)
}

// emit stores a system event, retrying in the background until it is
// stored (dedupe makes retries harmless).
func (g *Gateway) emit(ctx context.Context, ev protocol.SystemEvent, dedupe string) {
	g.untilStored(ctx, "system event "+ev.Kind, func(ctx context.Context) error { return g.events.Push(ctx, ev, dedupe) }, nil)
}

// untilStored runs store, which stores something and must be harmless to
// repeat, until it succeeds: once here, then in a tracked goroutine that
// retries (counted in the backlog /healthz reports) until it succeeds or
// the gateway shuts down; stored, when set, is called once it did.
func (g *Gateway) untilStored(ctx context.Context, what string, store func(context.Context) error, stored func()) {
	if err := store(ctx); err == nil {
		if stored != nil {
			stored()
		}
		return
	}
	g.backlog.Add(1)
	g.spawn(func(ctx context.Context) {
		defer g.backlog.Add(-1)
		for attempt := 1; ; attempt++ {
			t := time.NewTimer(min(time.Duration(attempt)*500*time.Millisecond, deliverRetry))
			select {
			case <-ctx.Done():
				t.Stop()
				g.log.Error(what+" not stored before shutdown", "attempt", attempt)
				return
			case <-t.C:
			}
			err := store(ctx)
			if err == nil {
				if stored != nil {
					stored()
				}
				return
			}
			g.rare.Warn("", what+" not stored yet; retrying", "retries", "attempt", attempt, "err", err)
		}
	})
}

// flushBacklog waits (bounded by ctx) for the events still being stored.
func (g *Gateway) flushBacklog(ctx context.Context) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for g.backlog.Load() > 0 {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// onNodeRestart marks the sessions of a node's earlier run lost, and tells
// their agents (a node that restarts reports what it recorded of them
// too; the same identity keeps the notice single).
func (g *Gateway) onNodeRestart(n nodes.Node, oldInstance string) {
	g.loseSessions(n, func(r index.Record) bool { return r.Instance == "" || r.Instance == oldInstance },
		fmt.Sprintf("node %s restarted", n.Label()))
}

// onNodeRejected marks the sessions of a rejected node lost.
func (g *Gateway) onNodeRejected(n nodes.Node) {
	g.loseSessions(n, func(index.Record) bool { return true }, fmt.Sprintf("node %s was rejected", n.Label()))
}

func (g *Gateway) loseSessions(n nodes.Node, match func(index.Record) bool, reason string) {
	ctx, cancel := context.WithTimeout(g.bg, 30*time.Second)
	defer cancel()
	for _, id := range g.index.OfHost(index.HostNode, n.ID) {
		rec, ok := g.index.Lookup(ctx, id)
		if !ok || !match(rec) || rec.State != index.StateRunning {
			continue
		}
		g.sessionLost(ctx, id, rec.SessionKey, rec.StartedAt, reason, index.HostNode, n.ID)
	}
}

// sessionLost records that session id of sessionKey is gone with its
// host's run and tells its agent once (exec.lost), retrying in the
// background until the event is stored (tellLost).
func (g *Gateway) sessionLost(ctx context.Context, id, sessionKey string, startedAt int64, reason, hostKind, hostID string) {
	g.untilStored(ctx, "lost report", func(ctx context.Context) error {
		return g.tellLost(ctx, id, sessionKey, startedAt, reason, hostKind, hostID)
	}, nil)
}

// tellLost tells the agent of session id that it is lost, unless it was
// told: the host's own report (its restarted session core found what
// the crash left), a gateway noticing a node's restart, or a gateway
// noticing a peer gone all come here. The event is stored first, under
// an identity of the session's (so tellers that race store it once), and
// the index record is marked told after, so a teller that fails between
// the two tells again. hostKind and hostID name the host that held the
// session (index.HostGateway with this gateway's id: its own session
// core); a host may report only sessions the index says it holds. nil
// means told (or nothing to tell); an error, that the event may not be
// stored yet.
func (g *Gateway) tellLost(ctx context.Context, id, sessionKey string, startedAt int64, reason, hostKind, hostID string) error {
	rec, known := g.index.Lookup(ctx, id)
	switch {
	case known && (rec.SessionKey != sessionKey || rec.Host != hostKind || rec.HostID != hostID):
		g.log.Warn("lost report for a session the host does not hold dropped", "host", hostID, "sessionId", id)
		return nil
	case known && rec.LostTold:
		return nil
	case known:
		startedAt = rec.StartedAt
	case hostKind != index.HostGateway || hostID != g.id:
		if err := g.index.Healthy(); err != nil {
			return err // cannot tell: try again later
		}
		// Nothing to check another host's report against.
		g.log.Warn("lost report for a session the index does not know dropped", "host", hostID, "sessionId", id)
		return nil
	}
	if sessionKey != "" {
		// Under the end identity: an exit notice stored before (its
		// mark lost with a full disk or a crash) or after (an old run's
		// exit redelivered) keeps this report out, or is kept out.
		ev := protocol.SystemEvent{SessionKey: sessionKey, ContextKey: "exec:" + id, Kind: protocol.EventExecLost, Text: lostText(id, reason)}
		if err := g.events.Push(ctx, ev, endIdentity(sessionKey, id, startedAt)); err != nil {
			return err
		}
	}
	if !known {
		return nil
	}
	return g.index.Update(ctx, id, func(r *index.Record) bool {
		if r.LostTold {
			return false
		}
		r.LostReason, r.LostTold = reason, true
		r.Ended(index.StateLost, time.Now())
		return true
	})
}

// hostLost is tellLost for the report of the host's own restarted session
// core, which found the session's record: a session whose exit the index
// says was handled is not told lost. Its record outlived the confirmation
// (the host stopped between the two, or could not remove it from a
// read-only state dir), and its agent has had the exit. nil means the
// report is settled, and the host may forget the record.
func (g *Gateway) hostLost(ctx context.Context, id, sessionKey string, startedAt int64, reason, hostKind, hostID string) error {
	if rec, ok := g.index.Lookup(ctx, id); ok && (rec.State == index.StateFinished || rec.Notice == index.NoticeStored || rec.Polled) &&
		rec.SessionKey == sessionKey && rec.Host == hostKind && rec.HostID == hostID {
		g.log.Debug("lost report for a session whose exit was handled dropped", "host", hostID, "sessionId", id)
		return nil
	}
	return g.tellLost(ctx, id, sessionKey, startedAt, reason, hostKind, hostID)
}

// lostText is the text of an exec.lost event. It names the whole session
// id, as every notice does (DESIGN.md §3.5): the agent matches it to the
// session it started or polls.
func lostText(id, reason string) string {
	return fmt.Sprintf("Exec lost (%s): %s; its output and exit status are gone.", id, reason)
}
