package gateway

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/execmesh/execmesh/config"

	"github.com/execmesh/execmesh/approvals"
	"github.com/execmesh/execmesh/host"
	"github.com/execmesh/execmesh/hostbus"
	"github.com/execmesh/execmesh/index"
	"github.com/execmesh/execmesh/nodes"
	"github.com/execmesh/execmesh/protocol"
	"github.com/execmesh/execmesh/sandbox"
	"github.com/execmesh/execmesh/session"
)

// warnBackgroundDisabled is prefixed when the process tool is denied and a
// call asked for background or yieldMs (spec §11).
const warnBackgroundDisabled = "Warning: background execution is disabled; running synchronously."

// exec resolves an exec call — host, policy, the session id — and runs it
// on the host it resolves to. It knows nothing of how a host runs a
// command.
func (c *call) exec(ctx context.Context, args protocol.ExecArgs) (protocol.Result, error) {
	if strings.TrimSpace(args.Command) == "" {
		return protocol.Result{}, protocol.Errorf(protocol.ErrInvalidRequest, "Provide a command to start.")
	}
	defaults := c.g.sessionDefaults(c.sessionKey)
	limits, err := effectiveLimits(&c.cfg, c.agentID, args.Limits)
	if err != nil {
		return protocol.Result{}, err
	}
	req := protocol.ExecRequest{SessionKey: c.sessionKey, AgentID: c.agentID, Args: args, Stream: c.stream}
	if c.stream != nil {
		// Attached starts are background sessions from the start.
		req.Args.Background, req.Args.YieldMs = true, nil
	}
	if !limits.IsZero() {
		req.Limits = &limits
	}

	// The process tool denied means no pollable sessions: run synchronously.
	if !toolAllowed(&c.cfg, c.agentID, protocol.ToolProcess, "") {
		req.Sync = true
		if args.Background || args.YieldMs != nil {
			req.Warnings = append(req.Warnings, warnBackgroundDisabled)
		}
	}
	elevated := args.Elevated != nil && *args.Elevated
	if elevated {
		if err := checkElevated(&c.cfg, c.agentID, c.sessionKey); err != nil {
			return protocol.Result{}, err
		}
	}
	requested, err := parseRequestedHost(args.Host)
	if err != nil {
		return protocol.Result{}, err
	}
	if requested == "" && defaults.Host != "" {
		requested = defaults.Host
	}
	configured := c.cfg.ExecHost(c.agentID)
	sandboxOn := c.cfg.Sandbox.Mode != sandbox.ModeOff
	target, err := resolveTarget(configured, requested, strings.TrimSpace(args.Node), sandboxOn, elevated)
	if err != nil {
		return protocol.Result{}, err
	}
	// Security and ask only tighten from the configured values (spec §5).
	req.Security, req.Ask = c.policy(defaults, args)
	if target != hostSandbox && req.Security == approvals.SecurityDeny {
		return protocol.Result{}, protocol.Errorf(protocol.ErrDenied, "exec denied: host=%s security=deny", target)
	}
	req.Target = target
	req.Args.Host, req.Args.Node, req.Args.Security, req.Args.Ask, req.Args.Elevated, req.Args.Limits = "", "", "", "", nil, nil

	if target == hostNode {
		return c.execNode(ctx, req, strings.TrimSpace(args.Node), defaults)
	}
	return c.execLocal(ctx, req)
}

// policy resolves the effective security and ask modes: the agent's or
// global tools.exec values (config.Config.ExecPolicy), tightened by the
// session's defaults and the call's own values.
func (c *call) policy(d SessionExecDefaults, args protocol.ExecArgs) (security, ask string) {
	security, ask = c.cfg.ExecPolicy(c.agentID)
	p := approvals.Policy{Security: security, Ask: ask}.Tighten(d.Security, d.Ask).Tighten(args.Security, args.Ask)
	return p.Security, p.Ask
}

// execLocal runs a host=gateway or host=sandbox call on the gateway's own
// machine, under a session id from the index.
func (c *call) execLocal(ctx context.Context, req protocol.ExecRequest) (protocol.Result, error) {
	rec := index.Record{SessionKey: c.sessionKey, Host: index.HostGateway, HostID: c.g.id, Instance: c.g.local.Instance(),
		Command: req.Args.Command, StartedAt: time.Now().UnixMilli(), State: index.StateRunning}
	sid, err := c.g.takeID(ctx, rec, req)
	if err != nil {
		return protocol.Result{}, err
	}
	req.SessionID = sid.id
	if err := startedSession(ctx, sid.id); err != nil {
		c.g.forgetStart(sid)
		return protocol.Result{}, err
	}
	reply, err := c.g.local.Exec(ctx, req)
	return c.started(ctx, sid, c.g.local, req, reply, err, nil)
}

// startID is the session id of a start: a reservation of the index
// (index.Take) that becomes the session's record only when the call
// leaves a session running, before it answers; a foreground run that
// ended gives it back unwritten. committed: the record is written (a
// start that must be found before it runs, an approved run, a start
// taken over from a dead gateway).
type startID struct {
	id        string
	res       index.Reservation
	rec       index.Record
	committed bool
}

// takeID takes the session id of a start of req, whose record is rec. A
// keyed start (an Idempotency-Key: a retry through another gateway must
// find its session even while it runs) and a background start (its exit
// event may come before the answer) have the record written at once.
func (g *Gateway) takeID(ctx context.Context, rec index.Record, req protocol.ExecRequest) (startID, error) {
	res, err := g.index.Take(ctx)
	if err != nil {
		return startID{}, err
	}
	sid := startID{id: res.ID, res: res, rec: rec}
	if starterOf(ctx) != nil || (req.Args.Background && !req.Sync) {
		if err := g.index.Commit(ctx, res, rec); err != nil {
			g.forgetStart(sid)
			return startID{}, err
		}
		sid.committed = true
	}
	return sid, nil
}

// execNode runs a host=node call on the node it selects (spec §19.1).
func (c *call) execNode(ctx context.Context, req protocol.ExecRequest, requestedNode string, d SessionExecDefaults) (protocol.Result, error) {
	if requestedNode == "" {
		requestedNode = d.Node
	}
	bound := c.cfg.Tools.Exec.Node
	if a, ok := c.cfg.Agent(c.agentID); ok && a.Tools.Exec.Node != "" {
		bound = a.Tools.Exec.Node
	}
	// The request env is checked here as for host=gateway (DESIGN.md §7);
	// the node applies its own policy again.
	if err := protocol.ValidateHostEnvOverrides(req.Args.Env); err != nil {
		return protocol.Result{}, err
	}
	if len(c.cfg.Tools.Exec.PathPrepend) > 0 {
		req.Warnings = append(req.Warnings, protocol.PathPrependIgnoredOnNodeWarning)
	}
	st := starterOf(ctx)
	if st != nil && st.reuseID != "" {
		requestedNode = st.node // a start taken over goes where it went
	}
	n, err := c.g.nodes.Select(ctx, requestedNode, bound)
	if err != nil {
		return protocol.Result{}, err
	}
	// The yield window and timeout are resolved here and sent, so that
	// the request deadline and the node's behaviour come from one value.
	if req.Args.YieldMs == nil && !req.Args.Background && !req.Sync {
		y := float64(c.g.defaultYieldMs(c.cfg))
		req.Args.YieldMs = &y
	}
	if req.Args.Timeout == nil {
		t := float64(c.cfg.Tools.Exec.TimeoutSec)
		req.Args.Timeout = &t
	}
	rec := index.Record{SessionKey: c.sessionKey, Host: index.HostNode, HostID: n.ID, Instance: n.Instance,
		Command: req.Args.Command, StartedAt: time.Now().UnixMilli(), State: index.StateRunning}
	var sid startID
	if st != nil && st.reuseID != "" {
		sid = startID{id: st.reuseID, rec: rec, committed: true} // its index record is the dead gateway's
	} else if sid, err = c.g.takeID(ctx, rec, req); err != nil {
		return protocol.Result{}, err
	}
	req.SessionID = sid.id
	if st != nil {
		req.IdempotencyKey = st.nodeKey()
	}
	if err := startedSession(ctx, sid.id); err != nil {
		c.g.forgetStart(sid)
		return protocol.Result{}, err
	}
	h := c.g.nodes.Host(n)
	reply, err := h.Exec(ctx, req)
	return c.started(ctx, sid, h, req, reply, err, &n)
}

// started settles the index entry of a start on host h: a session that
// runs keeps it (with the instance of the host that holds it, written
// before the call answers), anything else gives its id back; a run that
// needs an approval becomes a pending approval.
func (c *call) started(ctx context.Context, sid startID, h host.Host, req protocol.ExecRequest, reply protocol.ExecReply, err error, n *nodes.Node) (protocol.Result, error) {
	g := c.g
	if err != nil {
		if a, ok := host.AsApprovalNeeded(err); ok {
			g.giveBack(sid) // nothing ran under it
			return g.requestApproval(ctx, c, req, n, a.Request)
		}
		// A start whose outcome is unknown keeps its id: the command may
		// run, and the index is how the agent reaches it.
		if errors.Is(err, hostbus.ErrNoAnswer) || isOutcomeUnknown(err) {
			if !sid.committed {
				if cerr := g.index.Commit(context.WithoutCancel(ctx), sid.res, sid.rec); cerr != nil {
					g.log.Warn("session of a start without an answer not recorded", "sessionId", sid.id, "err", cerr)
				}
			}
		} else {
			g.forgetStart(sid)
		}
		return protocol.Result{}, err
	}
	res := reply.Result
	if res.Status() != protocol.StatusRunning {
		g.giveBack(sid)
		return res, nil
	}
	inst := ""
	if n != nil && reply.Instance != "" && reply.Instance != n.Instance {
		inst = reply.Instance
	}
	cwd := res.Details.Cwd.Value()
	if !sid.committed {
		rec := sid.rec
		if inst != "" {
			rec.Instance = inst
		}
		if cwd != "" {
			rec.Cwd = cwd
		}
		if cerr := g.index.Commit(context.WithoutCancel(ctx), sid.res, rec); cerr != nil {
			// Unreachable but through this call's answer, which cannot be
			// given: the session is stopped.
			g.log.Warn("session not recorded in the index; stopping it", "sessionId", sid.id, "err", cerr)
			_, _ = h.Process(context.WithoutCancel(ctx), protocol.ProcessRequest{SessionKey: c.sessionKey,
				Args: protocol.ProcessArgs{Action: "kill", SessionID: sid.id}})
			g.forgetStart(sid)
			return protocol.Result{}, &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true,
				Message: fmt.Sprintf("the session could not be recorded in the session index (%v); it was stopped. Retry.", cerr)}
		}
		return res, nil
	}
	switch {
	case inst != "":
		// Before the answer: a record naming the node's earlier run would
		// make the next call take the session for lost.
		_ = g.index.Update(ctx, sid.id, func(r *index.Record) bool {
			r.Instance = inst
			if cwd != "" {
				r.Cwd = cwd
			}
			return true
		})
	case cwd != "":
		// Only shown in lists: off the call's path.
		id := sid.id
		g.spawn(func(ctx context.Context) {
			_ = g.index.Update(ctx, id, func(r *index.Record) bool { r.Cwd = cwd; return true })
		})
	}
	return res, nil
}

// forget gives a session id back, off the call's path.
func (g *Gateway) forget(id string) {
	g.spawn(func(ctx context.Context) { g.index.Remove(ctx, id) })
}

// forgetStart gives the id of a start back, off the call's path: its
// record removed, or its reservation deleted (the id may be unfit for
// another call: the host may hold it).
func (g *Gateway) forgetStart(sid startID) {
	if sid.committed {
		g.forget(sid.id)
		return
	}
	g.spawn(func(ctx context.Context) { g.index.Drop(ctx, sid.res) })
}

// giveBack gives back the id of a start that left no session: a
// reservation returns to the pool (no write), a written record is
// removed.
func (g *Gateway) giveBack(sid startID) {
	if sid.committed {
		g.forget(sid.id)
		return
	}
	g.index.Release(g.bg, sid.res)
}

// isOutcomeUnknown reports a retryable error that says the start may
// have happened (hostbus.Remote's "no answer" errors).
func isOutcomeUnknown(err error) bool {
	pe := protocol.AsError(err)
	return pe.Retryable && strings.Contains(pe.Message, "may or may not have started")
}

// defaultYieldMs is the gateway's default yield window: tools.exec.backgroundMs,
// else the session core's default with the OPENCLAW_BASH_YIELD_MS override.
func (g *Gateway) defaultYieldMs(cfg config.Config) int {
	if cfg.Tools.Exec.BackgroundMs > 0 {
		return cfg.Tools.Exec.BackgroundMs
	}
	sc := session.DefaultConfig()
	sc.ApplyEnv(g.opts.Getenv)
	return sc.DefaultYieldMs
}
