package nodeagent

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/protocol"
	"github.com/execmesh/execmesh/session"
)

// handlerFunc serves one endpoint: it returns the JSON reply, or an error
// that is answered as a micro error (an *protocol.Error keeps its type and
// text).
type handlerFunc func(ctx context.Context, req micro.Request) ([]byte, error)

// headerFunc is a handlerFunc whose reply carries headers too.
type headerFunc func(ctx context.Context, req micro.Request) ([]byte, nats.Header, error)

// noHeader adapts a handlerFunc to a headerFunc.
func noHeader(fn handlerFunc) headerFunc {
	return func(ctx context.Context, req micro.Request) ([]byte, nats.Header, error) {
		b, err := fn(ctx, req)
		return b, nil, err
	}
}

// endpoint adapts fn to micro. Every endpoint is a single subscription
// whose messages are handled one at a time, so the handler only hands the
// request to a tracked goroutine: a poll waiting 30 s must not hold up
// the next exec. Once Close has begun requests are refused as retryable.
func (a *Agent) endpoint(name string, fn headerFunc) micro.HandlerFunc {
	return func(req micro.Request) {
		if req.Reply() == "" {
			// Nobody to answer: do nothing rather than run blind.
			a.log.Debug("request without reply subject ignored", "endpoint", name)
			return
		}
		a.mu.Lock()
		if a.closing {
			a.mu.Unlock()
			a.replyError(req, &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true, Message: "node agent " + a.id.NodeID + " is shutting down"})
			return
		}
		a.handlerWG.Add(1)
		nc := a.nc
		a.mu.Unlock()
		go func() {
			defer a.handlerWG.Done()
			defer func() {
				if r := recover(); r != nil {
					a.log.Error("handler panic", "endpoint", name, "panic", r)
					a.publishError(nc, req.Reply(), protocol.Errorf(protocol.ErrInternal, "node agent %s: internal error in %s", a.id.NodeID, name))
				}
			}()
			reply, hdr, err := fn(a.handlerCtx, req)
			if err != nil {
				pe := protocol.AsError(err)
				if a.handlerCtx.Err() != nil && pe.Type == protocol.ErrInternal {
					// Close cut the wait short (a foreground command is
					// stopped with the agent): say so, retryably.
					pe = &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true, Message: "node agent " + a.id.NodeID + " is shutting down: " + pe.Message}
				}
				a.publishErrorData(nc, req.Reply(), pe, errorDataFor(err, pe))
				return
			}
			if hdr == nil {
				hdr = nats.Header{}
			}
			hdr.Set(HeaderInstance, a.instance)
			if err := bus.RespondChunked(nc, req.Reply(), reply, hdr); err != nil {
				a.log.Warn("reply not sent", "endpoint", name, "err", err)
			}
		}()
	}
}

// replyError answers req with a micro error: code = the HTTP status of the
// error type, description = its message, data = the *protocol.Error. Only
// from the micro handler's own goroutine: req.Error records the error for
// STATS in a field the handler's caller reads unsynchronised.
func (a *Agent) replyError(req micro.Request, e *protocol.Error) {
	if err := req.Error(errorCode(e), e.Message, errorData(e)); err != nil {
		a.log.Debug("error reply not sent", "err", err)
	}
}

// publishError sends the same error reply as replyError from any
// goroutine (such errors are not counted in the service's STATS).
func (a *Agent) publishError(nc *nats.Conn, reply string, e *protocol.Error) {
	a.publishErrorData(nc, reply, e, errorData(e))
}

// publishErrorData is publishError with the error data given.
func (a *Agent) publishErrorData(nc *nats.Conn, reply string, e *protocol.Error, data []byte) {
	m := nats.NewMsg(reply)
	m.Header.Set(micro.ErrorHeader, e.Message)
	m.Header.Set(micro.ErrorCodeHeader, errorCode(e))
	m.Data = data
	if err := nc.PublishMsg(m); err != nil {
		a.log.Debug("error reply not sent", "err", err)
	}
}

// handleExec starts a command (ExecRequest). With an idempotency key, a
// repeated start answers what the first one answered.
func (a *Agent) handleExec(ctx context.Context, req micro.Request) ([]byte, error) {
	var r ExecRequest
	if err := decodeStrict("exec", req.Data(), &r); err != nil {
		return nil, err
	}
	if strings.TrimSpace(r.SessionKey) == "" {
		return nil, protocol.Errorf(protocol.ErrInvalidRequest, "exec: sessionKey is required")
	}
	args, err := protocol.DecodeExecArgs(r.Args)
	if err != nil {
		return nil, err
	}
	key := req.Headers().Get(HeaderIdempotencyKey)
	if key == "" {
		return a.runExec(ctx, &r, args)
	}
	if !validIdempotencyKey(key) {
		return nil, protocol.Errorf(protocol.ErrInvalidRequest, "exec: invalid %s header (1 to %d printable characters)", HeaderIdempotencyKey, maxIdempotencyKeyLen)
	}
	reply, err, replayed := a.idem.do(ctx, key, r.SessionKey, func() ([]byte, error) { return a.runExec(ctx, &r, args) })
	if replayed {
		a.log.Info("exec start repeated; answering the first start", "idempotencyKey", key)
	}
	return reply, err
}

// runExec applies the node's own checks and runs the command.
func (a *Agent) runExec(ctx context.Context, r *ExecRequest, args protocol.ExecArgs) ([]byte, error) {
	if st := a.Pairing(); st == PairingPending || st == PairingRejected {
		return nil, protocol.Errorf(protocol.ErrDenied, "node %s is not paired with the gateway (pairing %s); approve it with `execmesh nodes approve %s`", a.id.NodeID, st, a.id.NodeID)
	}
	env, err := a.commandEnv(args.Env)
	if err != nil {
		return nil, err
	}
	workdir, ok := a.resolveWorkdir(args.Workdir)
	if !ok {
		return json.Marshal(protocol.WorkdirUnavailableResult(args.Workdir))
	}
	decision, err := a.authorize(r, args.Command, workdir, protocol.EnvMap(env))
	if err != nil {
		return nil, err
	}
	// The gateway's effective limits; a call's own may only tighten them.
	var limits protocol.Limits
	if r.Limits != nil {
		limits = *r.Limits
	}
	if args.Limits != nil {
		if limits, err = limits.Tighten(*args.Limits, func(k string) string { return protocol.ToolExec + ` parameter "limits.` + k + `"` }); err != nil {
			return nil, err
		}
	}
	sreq := session.ExecRequest{
		Limits:      limits,
		Command:     args.Command,
		Argv:        decision.argv,
		Workdir:     workdir,
		Env:         env,
		YieldMs:     args.YieldMs,
		Background:  args.Background,
		TimeoutSec:  args.Timeout,
		PTY:         args.PTY,
		Synchronous: r.Sync,
		ScopeKey:    r.SessionKey,
		Warnings:    r.Warnings,
	}
	// Exit events are published from the request's hook, so that the
	// exit of an approval-gated run carries its approval id even when it
	// comes before Exec returns.
	runID := ""
	if r.Approval != nil {
		// The gateway sends Exec finished for the run instead of the
		// usual exit notification.
		runID = r.Approval.ID
		sreq.Background, sreq.Synchronous, sreq.NotifyOff = true, false, true
	}
	sreq.OnExitHook = func(ev protocol.ExitEvent) {
		ev.RunID = runID
		a.onExit(ev)
	}
	res, err := a.mgr.Exec(ctx, sreq)
	if err != nil {
		return nil, err
	}
	a.track(r.SessionKey, res.SessionID())
	return json.Marshal(res)
}

// handleProcess runs a process action on one of the node's sessions. The
// reply carries HeaderSession "gone" when the session is not (or no
// longer) there, so the gateway can drop it from its index without
// reading result texts.
func (a *Agent) handleProcess(ctx context.Context, req micro.Request) ([]byte, nats.Header, error) {
	var r ProcessRequest
	if err := decodeStrict("process", req.Data(), &r); err != nil {
		return nil, nil, err
	}
	if strings.TrimSpace(r.SessionKey) == "" {
		return nil, nil, protocol.Errorf(protocol.ErrInvalidRequest, "process: sessionKey is required")
	}
	args, err := protocol.DecodeProcessArgs(r.Args)
	if err != nil {
		return nil, nil, err
	}
	res := a.mgr.Process(ctx, r.SessionKey, args)
	var hdr nats.Header
	if args.SessionID != "" {
		a.track(r.SessionKey, args.SessionID)
		if !a.mgr.Has(r.SessionKey, args.SessionID) {
			hdr = nats.Header{}
			hdr.Set(HeaderSession, SessionGone)
		}
	}
	b, err := json.Marshal(res)
	return b, hdr, err
}

// handleList lists the sessions of one sessionKey, or of all. With a
// Limit each sessionKey contributes only its Limit newest entries, and
// the reply says how many there are in all and whether some were left
// out.
func (a *Agent) handleList(ctx context.Context, req micro.Request) ([]byte, error) {
	var r ListRequest
	if err := decodeStrict("list", req.Data(), &r); err != nil {
		return nil, err
	}
	if r.Limit < 0 {
		return nil, protocol.Errorf(protocol.ErrInvalidRequest, "list: limit must not be negative")
	}
	var scopes []string
	switch {
	case r.All:
		scopes = a.scopeKeys()
	case strings.TrimSpace(r.SessionKey) != "":
		scopes = []string{r.SessionKey}
	default:
		return nil, protocol.Errorf(protocol.ErrInvalidRequest, "list: sessionKey or all is required")
	}
	resp := ListResponse{NodeID: a.id.NodeID, Instance: a.instance, Sessions: []ListedSession{}}
	for _, scope := range scopes {
		entries, total, err := a.listScope(ctx, scope, r.Limit)
		if err != nil {
			return nil, err
		}
		for _, d := range entries {
			resp.Sessions = append(resp.Sessions, ListedSession{SessionKey: scope, Details: d})
		}
		if r.Limit > 0 {
			resp.Total += total
			resp.Partial = resp.Partial || total > len(entries)
		}
	}
	return json.Marshal(resp)
}

// listScope returns the process-list entries of one sessionKey (its
// limit newest ones when limit is above 0) and how many it has in all.
// A complete list also forgets the sessions the session core no longer
// lists; a partial one cannot tell them from those beyond the limit.
func (a *Agent) listScope(ctx context.Context, scope string, limit int) ([]protocol.Details, int, error) {
	args := protocol.ProcessArgs{Action: "list"}
	if limit > 0 {
		args.Limit = &limit
	}
	res := a.mgr.Process(ctx, scope, args)
	entries, err := DetailsList(res.Details["sessions"])
	if err != nil {
		return nil, 0, protocol.Errorf(protocol.ErrInternal, "list: %v", err)
	}
	total := len(entries)
	if limit > 0 {
		n, ok := res.Details["total"].(int)
		if !ok {
			return nil, 0, protocol.Errorf(protocol.ErrInternal, "list: paged result without a total (%s)", res.Text())
		}
		total = n
	}
	listed := make(map[string]bool, len(entries))
	for _, d := range entries {
		if id, _ := d["sessionId"].(string); id != "" {
			listed[id] = true
			a.track(scope, id)
		}
	}
	if total > len(entries) {
		return entries, total, nil
	}
	a.mu.Lock()
	var stale []string
	for id := range a.scopes[scope] {
		if !listed[id] {
			stale = append(stale, id)
		}
	}
	a.mu.Unlock()
	for _, id := range stale {
		a.track(scope, id)
	}
	return entries, total, nil
}

// DetailsList converts the "sessions" of a process list result, which
// the session core may hold as []protocol.Details, []map[string]any or
// []any (after a JSON round trip), to []protocol.Details.
func DetailsList(v any) ([]protocol.Details, error) {
	switch l := v.(type) {
	case nil:
		return nil, nil
	case []protocol.Details:
		return l, nil
	case []map[string]any:
		out := make([]protocol.Details, len(l))
		for i, d := range l {
			out[i] = d
		}
		return out, nil
	case []any:
		out := make([]protocol.Details, 0, len(l))
		for _, e := range l {
			switch d := e.(type) {
			case map[string]any:
				out = append(out, d)
			case protocol.Details:
				out = append(out, d)
			default:
				return nil, fmt.Errorf("list entry of type %T", e)
			}
		}
		return out, nil
	}
	// Anything else: round-trip through JSON.
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var out []protocol.Details
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// handleApprovalsGet returns the node's exec-approvals.json: {path,
// exists, hash, file}, the socket token removed.
func (a *Agent) handleApprovalsGet(_ context.Context, req micro.Request) ([]byte, error) {
	if len(req.Data()) > 0 {
		var empty struct{}
		if err := decodeStrict("approvals.get", req.Data(), &empty); err != nil {
			return nil, err
		}
	}
	v, err := a.readApprovals()
	if err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

// handleApprovalsSet replaces the node's exec-approvals.json, given the
// hash of the file it replaces (OpenClaw's system.execApprovals.set).
func (a *Agent) handleApprovalsSet(_ context.Context, req micro.Request) ([]byte, error) {
	var r approvalsSet
	if err := decodeStrict("approvals.set", req.Data(), &r); err != nil {
		return nil, err
	}
	v, err := a.writeApprovals(r)
	if err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

// handleWhich finds binaries on the node's PATH.
func (a *Agent) handleWhich(_ context.Context, req micro.Request) ([]byte, error) {
	var r WhichRequest
	if err := decodeStrict("which", req.Data(), &r); err != nil {
		return nil, err
	}
	return json.Marshal(WhichResponse{Bins: a.which(r.Bins)})
}

// handlePairing takes the gateway's word on the node's pairing.
func (a *Agent) handlePairing(_ context.Context, req micro.Request) ([]byte, error) {
	var n PairingNotice
	if err := decodeStrict("pairing", req.Data(), &n); err != nil {
		return nil, err
	}
	switch n.Status {
	case PairingPending, PairingPaired, PairingRejected:
	default:
		return nil, protocol.Errorf(protocol.ErrInvalidRequest, "pairing: unknown status %q", n.Status)
	}
	a.setPairing(n.Status)
	return []byte("{}"), nil
}
