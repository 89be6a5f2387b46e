package gateway

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/execmesh/execmesh/host"
	"github.com/execmesh/execmesh/index"
	"github.com/execmesh/execmesh/nodes"
	"github.com/execmesh/execmesh/protocol"
	"github.com/execmesh/execmesh/session"
)

// listConcurrency bounds parallel list requests to hosts.
const listConcurrency = 8

// process answers a process action: list merges every host's sessions;
// any other action goes to the host the session index names.
func (c *call) process(ctx context.Context, args protocol.ProcessArgs) (protocol.Result, error) {
	if args.Action == "list" {
		return c.list(ctx, args)
	}
	g := c.g
	id := args.SessionID
	if id == "" || g.local.Has(c.sessionKey, id) {
		return c.onHost(ctx, g.local, id, args, nil, id != "")
	}
	rec, ok := g.index.Lookup(ctx, id)
	if !ok || rec.SessionKey != c.sessionKey {
		// Unknown in this scope: the local session core gives the tool's
		// text, and the index keeps the record (another sessionKey's).
		return c.onHost(ctx, g.local, id, args, nil, false)
	}
	if rec.Host == index.HostGateway && rec.HostID != g.id && rec.State != index.StateLost && !g.peers.Alive(rec.HostID) {
		// Its gateway is gone, and with it the session.
		reason := fmt.Sprintf("gateway %s, whose host ran it, is gone", rec.HostID)
		g.sessionLost(ctx, id, rec.SessionKey, rec.StartedAt, reason, index.HostGateway, rec.HostID)
		rec.State, rec.LostReason = index.StateLost, reason
	}
	if rec.State == index.StateLost {
		return c.lost(ctx, id, rec, args)
	}
	h, n, err := g.hostOf(ctx, rec)
	if err != nil {
		return protocol.Result{}, err
	}
	if n != nil && rec.Instance != "" && n.Instance != "" && n.Instance != rec.Instance {
		// The node restarted since it started the session: it is gone.
		reason := fmt.Sprintf("node %s restarted", n.Label())
		g.markLost(ctx, id, reason)
		rec.State, rec.LostReason = index.StateLost, reason
		return c.lost(ctx, id, rec, args)
	}
	return c.onHost(ctx, h, id, args, &rec, true)
}

// hostOf returns the host a record names, with the node when it is one.
func (g *Gateway) hostOf(ctx context.Context, rec index.Record) (host.Host, *nodes.Node, error) {
	switch rec.Host {
	case index.HostNode:
		n, ok := g.nodes.AwaitLive(ctx, rec.HostID)
		switch {
		case !ok:
			return nil, nil, &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true, Message: fmt.Sprintf("node %s of this session is not known to this gateway yet; retry", rec.HostID)}
		case n.Pairing == protocol.NodePairingRejected:
			return nil, nil, protocol.Errorf(protocol.ErrHostNotAllowed, "the session is on node %s, which was rejected; approve it again to reach its sessions", n.Label())
		case !n.Live:
			return nil, nil, nodes.UnreachableError(n, g.nodes.Now(), "the session may still be running there and can be reached once the node reconnects")
		}
		return g.nodes.Host(n), &n, nil
	case index.HostGateway:
		if rec.HostID == g.id {
			return g.local, nil, nil
		}
		h, err := g.gatewayHost(rec.HostID)
		return h, nil, err
	}
	return nil, nil, protocol.Errorf(protocol.ErrInternal, "session index: unknown host kind %q", rec.Host)
}

// onHost runs a process action on h and settles what it says about the
// session: gone from the host that holds it (owned: forget its record),
// ended and delivered by a poll (its exit notice is redundant).
func (c *call) onHost(ctx context.Context, h host.Host, id string, args protocol.ProcessArgs, rec *index.Record, owned bool) (protocol.Result, error) {
	reply, err := h.Process(ctx, protocol.ProcessRequest{SessionKey: c.sessionKey, Args: args})
	if err != nil {
		return protocol.Result{}, err
	}
	g := c.g
	if rec != nil && reply.Instance != "" && rec.Instance != "" && reply.Instance != rec.Instance {
		// Another run of the host answered: it restarted before the
		// gateway heard of it, and the session went with the old run.
		reason := "its host restarted"
		g.markLost(ctx, id, reason)
		r := *rec
		r.LostReason = reason
		r.Ended(index.StateLost, time.Now())
		return c.lost(ctx, id, r, args)
	}
	res := reply.Result
	if args.Action == "poll" && owned && !reply.Gone {
		if st := res.Status(); st == protocol.StatusCompleted || st == protocol.StatusFailed {
			g.polled(ctx, c.sessionKey, id)
		}
	}
	if reply.Gone && owned {
		g.forget(id)
	}
	return res, nil
}

// polled records that a poll delivered a session's end: a queued exit
// notice is removed before the poll answers, and one not queued yet never
// will be (notifyExit reads the mark).
func (g *Gateway) polled(ctx context.Context, sessionKey, id string) {
	var notice string
	_ = g.index.Update(ctx, id, func(r *index.Record) bool {
		notice = r.Notice
		if r.Polled {
			return false
		}
		r.Polled = true
		return true
	})
	if notice == index.NoticePending {
		// Being stored right now: wait for it, so that the notice is gone
		// before the agent reads its events.
		deadline := time.Now().Add(noticeWait)
		for notice == index.NoticePending && time.Now().Before(deadline) && ctx.Err() == nil {
			time.Sleep(10 * time.Millisecond)
			if r, ok := g.index.Read(ctx, id); ok {
				notice = r.Notice
			}
		}
	}
	if err := g.events.Drop(ctx, sessionKey, "exec:"+id); err != nil {
		g.rare.Warn(sessionKey, "cannot drop the exit notice of a polled session", "failures",
			"sessionKey", sessionKey, "sessionId", id, "err", err)
	}
}

// noticeWait bounds how long a poll waits for an exit notice being stored.
const noticeWait = 2 * time.Second

// markLost records that a session is gone with its host.
func (g *Gateway) markLost(ctx context.Context, id, reason string) {
	_ = g.index.Update(ctx, id, func(r *index.Record) bool {
		if r.State == index.StateLost {
			return false
		}
		r.LostReason = reason
		r.Ended(index.StateLost, time.Now())
		return true
	})
}

// lost answers an action on a session its host no longer has.
func (c *call) lost(ctx context.Context, id string, rec index.Record, args protocol.ProcessArgs) (protocol.Result, error) {
	reason := rec.LostReason
	if reason == "" {
		reason = "its host restarted"
	}
	if args.Action == "remove" || args.Action == "clear" {
		c.g.index.Remove(ctx, id)
		return protocol.TextResult(fmt.Sprintf("Removed session %s (lost: %s).", id, reason),
			protocol.Details{Status: protocol.Some(protocol.StatusCompleted), SessionID: protocol.Some(id)}), nil
	}
	text := fmt.Sprintf("Session %s was lost: %s, and its output and exit status are gone. Use process remove to forget it.", id, reason)
	res := protocol.FailedResult(text)
	res.Details.SessionID = protocol.Some(id)
	res.Details.Lost = protocol.Some(true)
	return res, nil
}

// list answers process list: the gateway's sessions and every host's,
// newest first. With offset or limit (session.ListPage) every host lists
// only its End newest entries, and the page is cut from their merge.
func (c *call) list(ctx context.Context, args protocol.ProcessArgs) (protocol.Result, error) {
	lr, err := c.listEntries(ctx, args)
	if err != nil {
		return protocol.Result{}, err
	}
	return lr.Result(), nil
}

// listEntries is list with the entries kept as their hosts encoded them,
// which the HTTP answer writes as they are.
func (c *call) listEntries(ctx context.Context, args protocol.ProcessArgs) (protocol.ListResult, error) {
	page, err := session.ListPageOf(args)
	if err != nil {
		return protocol.ListResult{}, err
	}
	end := 0
	if page.Paged {
		end = page.End()
	}
	g := c.g
	local, err := g.local.ListEntries(ctx, protocol.ListRequest{SessionKey: c.sessionKey, Limit: end})
	if err != nil {
		return protocol.ListResult{}, err
	}
	total := local.Total
	remote, remoteTotal := c.remoteEntries(ctx, end)
	total += remoteTotal
	all := remote // no copy of what may be thousands of entries
	if len(local.Entries) > 0 {
		all = append(local.Entries, remote...)
	}
	// Newest first; within a millisecond each host's own order, hosts in
	// a fixed order, so that every host's first entries are its newest
	// and pages of any size fit together. A list from one host is in that
	// order already: a stable sort that finds nothing to do is skipped.
	for i := 1; i < len(all); i++ {
		if all[i-1].StartedAt < all[i].StartedAt {
			all = newestFirst(all)
			break
		}
	}
	if !page.Paged {
		return session.ListEntriesResult(all), nil
	}
	lo, hi := page.Bounds(total)
	lo, hi = min(lo, len(all)), min(hi, len(all))
	return session.PagedListEntriesResult(page, all[lo:hi], total), nil
}

// newestFirst returns entries stably sorted newest first, moving each
// entry once rather than at every swap.
func newestFirst(entries []protocol.ListEntry) []protocol.ListEntry {
	order := make([]int, len(entries))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(i, j int) int { return cmp.Compare(entries[j].StartedAt, entries[i].StartedAt) })
	out := make([]protocol.ListEntry, len(entries))
	for i, j := range order {
		out[i] = entries[j]
	}
	return out
}

// remoteEntries lists the sessions of sessionKey on other hosts: each
// live paired node that holds some (per the index) answers for its own,
// naming itself in each entry; the sessions of nodes that cannot answer
// (unreachable, restarted) are shown from the index. With limit > 0 each
// source gives at most limit entries.
func (c *call) remoteEntries(ctx context.Context, limit int) ([]protocol.ListEntry, int) {
	g := c.g
	g.index.Await(ctx)
	hosts := g.index.ScopeHosts(c.sessionKey, func(r index.Record) bool { return !(r.Host == index.HostGateway && r.HostID == g.id) })
	if len(hosts) == 0 {
		return nil, 0
	}
	type answer struct {
		host    string
		entries []protocol.ListEntry
		total   int
	}
	var (
		mu      sync.Mutex
		answers []answer
		wg      sync.WaitGroup
		sem     = make(chan struct{}, listConcurrency)
	)
	for _, h := range hosts {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			a := c.hostEntries(ctx, h, limit)
			mu.Lock()
			answers = append(answers, answer{host: h.Kind + "/" + h.HostID, entries: a.entries, total: a.total})
			mu.Unlock()
		})
	}
	wg.Wait()
	slices.SortFunc(answers, func(x, y answer) int { return strings.Compare(x.host, y.host) })
	if len(answers) == 1 {
		return answers[0].entries, answers[0].total
	}
	var out []protocol.ListEntry
	total := 0
	for _, a := range answers {
		out = append(out, a.entries...)
		total += a.total
	}
	return out, total
}

// hostEntries lists one host's sessions of the call's sessionKey; h is
// that host's share of the index, seen before the host is asked (so that
// a session it starts meanwhile is not taken for one it no longer has).
func (c *call) hostEntries(ctx context.Context, h index.ScopeHost, limit int) (a struct {
	entries []protocol.ListEntry
	total   int
}) {
	g := c.g
	any := h.Any
	hst, n, err := g.hostOf(ctx, any)
	restarted := n != nil && any.Instance != "" && n.Instance != "" && n.Instance != any.Instance
	gone := any.Host == index.HostGateway && any.HostID != g.id && !g.peers.Alive(any.HostID)
	if err == nil {
		reply, lerr := listEntries(ctx, hst, protocol.ListRequest{SessionKey: c.sessionKey, Limit: limit})
		if lerr == nil {
			a.entries = reply.Entries
			if n != nil {
				for i := range a.entries {
					a.entries[i].SetNode(n.ID, n.Name)
				}
			}
			a.total = reply.Total
			known := g.index.Held(h, func(yield func(string) bool) { // listed entries with a record here
				for i := range a.entries {
					if !yield(a.entries[i].SessionID) {
						return
					}
				}
			})
			if known == h.Count {
				return a // every record's session was listed
			}
			listed := make(map[string]bool, len(a.entries))
			for i := range a.entries {
				listed[a.entries[i].SessionID] = true
			}
			// Sessions of an earlier run of the node are lost, and the
			// ones the host no longer has (swept) are forgotten; a
			// partial list (a page) leaves the others unknown.
			unlisted := g.index.Records(h, func(id string, r *index.Record) bool {
				return !listed[id] && (!reply.Partial || r.State == index.StateLost || (r.Instance != "" && r.Instance != reply.Instance))
			})
			for id, r := range unlisted {
				switch {
				case r.State == index.StateLost || (r.Instance != "" && r.Instance != reply.Instance):
					if r.State != index.StateLost {
						g.markLost(ctx, id, "its host restarted")
						r.State, r.LostReason = index.StateLost, "its host restarted"
					}
					a.entries = append(a.entries, c.indexEntry(id, r, n))
					a.total++
				case !reply.Partial:
					g.forget(id)
				}
			}
			return a
		}
		err = lerr
	}
	if !errors.Is(err, context.Canceled) {
		g.log.Debug("listing a host's sessions from the index", "host", any.HostID, "err", err)
	}
	// The host cannot answer: show what the index knows.
	for id, r := range g.index.Records(h, nil) {
		switch {
		case r.State == index.StateLost:
		case restarted:
			g.markLost(ctx, id, "its host restarted")
			r.State = index.StateLost
		case gone:
			reason := fmt.Sprintf("gateway %s, whose host ran it, is gone", r.HostID)
			g.sessionLost(ctx, id, r.SessionKey, r.StartedAt, reason, index.HostGateway, r.HostID)
			r.LostReason = reason
			r.Ended(index.StateLost, time.Now())
		}
		a.entries = append(a.entries, c.indexEntry(id, r, n))
	}
	a.total = len(a.entries)
	slices.SortFunc(a.entries, func(x, y protocol.ListEntry) int {
		if c := cmp.Compare(y.StartedAt, x.StartedAt); c != 0 {
			return c
		}
		return strings.Compare(x.SessionID, y.SessionID)
	})
	if limit > 0 && len(a.entries) > limit {
		a.entries = a.entries[:limit]
	}
	return a
}

// listEntries lists a host's entries: kept as the host encoded them
// (hostbus.Remote.ListEntries), else encoded from List's.
func listEntries(ctx context.Context, h host.Host, req protocol.ListRequest) (protocol.ListEntries, error) {
	if r, ok := h.(interface {
		ListEntries(context.Context, protocol.ListRequest) (protocol.ListEntries, error)
	}); ok {
		return r.ListEntries(ctx, req)
	}
	reply, err := h.List(ctx, req)
	if err != nil {
		return protocol.ListEntries{}, err
	}
	d := protocol.ListEntries{Instance: reply.Instance, Entries: make([]protocol.ListEntry, len(reply.Sessions)), Total: reply.Total, Partial: reply.Partial}
	for i := range reply.Sessions {
		d.Entries[i] = protocol.EntryOf(&reply.Sessions[i].Details)
	}
	return d, nil
}

// indexEntry is the list entry of a session shown from the index: its
// host cannot be asked, or no longer has it.
func (c *call) indexEntry(id string, r index.Record, n *nodes.Node) protocol.ListEntry {
	status := "unreachable"
	if r.State == index.StateLost {
		status = index.StateLost
	}
	d := protocol.Details{
		SessionID: protocol.Some(id),
		Status:    protocol.Some(status),
		Command:   protocol.Some(r.Command),
		StartedAt: protocol.Some(r.StartedAt),
	}
	if r.Cwd != "" {
		d.Cwd = protocol.Some(r.Cwd)
	}
	if r.Host == index.HostNode {
		d.NodeID = protocol.Some(r.HostID)
		if n != nil && n.Name != "" {
			d.NodeName = protocol.Some(n.Name)
		}
	}
	return protocol.EntryOf(&d)
}
