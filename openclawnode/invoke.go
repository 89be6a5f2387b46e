package openclawnode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/execmesh/execmesh/approvals"
	"github.com/execmesh/execmesh/host"
	"github.com/execmesh/execmesh/protocol"
)

// SessionKeyPrefix goes before every sessionKey OpenClaw sends: sessions
// started through OpenClaw are scoped apart from those of an execmesh
// gateway using the same node.
const SessionKeyPrefix = "openclaw:"

// defaultSessionKey is the scope of calls that carry no sessionKey (as
// OpenClaw's node host does).
const defaultSessionKey = "node"

// outcome is what an invoke answers: a JSON payload or an error.
type outcome struct {
	payload any
	err     *ErrorShape
}

func fail(code, format string, args ...any) outcome {
	return outcome{err: &ErrorShape{Code: code, Message: fmt.Sprintf(format, args...)}}
}

// serveInvoke checks and runs one node.invoke.request and sends its
// result on the connection it came by.
func (c *Client) serveInvoke(cn *conn, req InvokeRequest) {
	log := c.log.With("invokeId", req.ID, "command", req.Command)
	var out outcome
	switch {
	case req.NodeID != c.id.DeviceID:
		log.Warn("invoke for another node refused", "nodeId", req.NodeID)
		out = fail(CodeInvalidRequest, "invoke for node %q reached node %q", req.NodeID, c.id.DeviceID)
	case !c.firstInvoke(req.ID):
		log.Warn("invoke id replayed by the gateway; not run again")
		out = fail(CodeInvalidRequest, "invoke id %q was received before; not run again", req.ID)
	case req.ParamsJSON != nil && len(*req.ParamsJSON) > maxParamsBytes:
		log.Warn("invoke params too large; refused", "bytes", len(*req.ParamsJSON))
		out = fail(CodeInvalidRequest, "paramsJSON of %d bytes (at most %d)", len(*req.ParamsJSON), maxParamsBytes)
	default:
		ctx, cancel := context.WithCancel(cn.ctx)
		if req.TimeoutMs != nil && *req.TimeoutMs > 0 {
			ctx, cancel = context.WithTimeout(cn.ctx, time.Duration(*req.TimeoutMs)*time.Millisecond)
		}
		cn.mu.Lock()
		cn.invokes[req.ID] = cancel
		cn.mu.Unlock()
		out = c.run(ctx, cn, req)
		cancel()
		cn.mu.Lock()
		delete(cn.invokes, req.ID)
		cn.mu.Unlock()
	}
	res := InvokeResult{ID: req.ID, NodeID: c.id.DeviceID, OK: out.err == nil, Error: out.err}
	if out.err == nil {
		b, err := json.Marshal(out.payload)
		if err != nil {
			res = InvokeResult{ID: req.ID, NodeID: c.id.DeviceID, Error: &ErrorShape{Code: CodeUnavailable, Message: "encode result: " + err.Error()}}
		} else {
			res.PayloadJSON = string(b)
		}
	}
	c.deliver(cn, res)
}

// deliver sends an invoke's result on the connection it came by.
func (c *Client) deliver(cn *conn, res InvokeResult) {
	log := c.log.With("invokeId", res.ID)
	if cn.ctx.Err() != nil {
		log.Warn("invoke result not delivered: the connection to the OpenClaw gateway was lost during the invoke", "ok", res.OK)
		return
	}
	if _, err := c.request(cn, "node.invoke.result", res); err != nil {
		log.Warn("invoke result not delivered", "err", err)
	}
}

// firstInvoke records an invoke id and reports whether it is new.
func (c *Client) firstInvoke(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.seen[id]; ok {
		return false
	}
	c.seen[id] = struct{}{}
	c.seenList = append(c.seenList, id)
	if len(c.seenList) > seenInvokes {
		delete(c.seen, c.seenList[0])
		c.seenList = c.seenList[1:]
	}
	return true
}

// run dispatches an invoke by command.
func (c *Client) run(ctx context.Context, cn *conn, req InvokeRequest) outcome {
	params := []byte("{}")
	if req.ParamsJSON != nil && strings.TrimSpace(*req.ParamsJSON) != "" {
		params = []byte(*req.ParamsJSON)
	}
	switch req.Command {
	case CmdSystemRunPrepare:
		return c.prepare(params)
	case CmdSystemRun:
		return c.systemRun(ctx, cn, params)
	case CmdSystemWhich:
		var p struct {
			Bins []string `json:"bins"`
		}
		if err := json.Unmarshal(params, &p); err != nil || p.Bins == nil {
			return fail(CodeInvalidRequest, "INVALID_REQUEST: bins required")
		}
		found := map[string]string{}
		if c.cfg.Which != nil {
			found = c.cfg.Which(p.Bins)
		}
		return outcome{payload: map[string]any{"bins": found}}
	case CmdExecApprovalsGet:
		if c.cfg.ApprovalsGet == nil {
			return fail(CodeUnavailable, "this node has no exec approvals file")
		}
		v, err := c.cfg.ApprovalsGet()
		if err != nil {
			return fail(CodeInvalidRequest, "%s", err)
		}
		// OpenClaw's node host creates the file on first read, and its
		// `approvals set --node` needs the hash of the file it replaces:
		// an empty file (version 1, no agents) loosens and tightens nothing.
		var view struct {
			Exists bool `json:"exists"`
		}
		if json.Unmarshal(v, &view) == nil && !view.Exists && c.cfg.ApprovalsSet != nil {
			if created, err := c.cfg.ApprovalsSet(json.RawMessage(`{"version":1}`), ""); err == nil {
				v = created
			} else {
				c.log.Warn("empty exec approvals file not created", "err", err)
			}
		}
		return outcome{payload: v}
	case CmdExecApprovalsSet:
		if c.cfg.ApprovalsSet == nil {
			return fail(CodeUnavailable, "this node has no exec approvals file")
		}
		if !c.cfg.ApprovalsWritable {
			c.log.Warn("the OpenClaw gateway tried to replace the node's exec approvals; refused (--openclaw-approvals-set allows it)")
			return fail(CodeInvalidRequest, "this node's exec approvals are read-only to the OpenClaw gateway (the node allows changes with --openclaw-approvals-set)")
		}
		var p struct {
			File     json.RawMessage `json:"file"`
			BaseHash string          `json:"baseHash"`
		}
		if err := json.Unmarshal(params, &p); err != nil {
			return fail(CodeInvalidRequest, "INVALID_REQUEST: %v", err)
		}
		v, err := c.cfg.ApprovalsSet(p.File, p.BaseHash)
		if err != nil {
			return fail(CodeInvalidRequest, "%s", err)
		}
		return outcome{payload: v}
	case CmdMCPToolsCall:
		return c.callTool(ctx, req, params)
	default:
		c.log.Warn("the OpenClaw gateway invoked a command this node does not serve", "command", req.Command)
		return fail(CodeUnavailable, "command not supported")
	}
}

// runParams are the params of system.run and system.run.prepare (the
// fields the node reads; OpenClaw's turnSource* and the like are
// ignored).
type runParams struct {
	Command              []string          `json:"command"`
	RawCommand           *string           `json:"rawCommand"`
	SystemRunPlan        json.RawMessage   `json:"systemRunPlan"`
	Cwd                  *string           `json:"cwd"`
	Env                  map[string]string `json:"env"`
	TimeoutMs            *float64          `json:"timeoutMs"`
	AgentID              *string           `json:"agentId"`
	SessionKey           *string           `json:"sessionKey"`
	RunID                *string           `json:"runId"`
	Approved             *bool             `json:"approved"`
	ApprovalDecision     *string           `json:"approvalDecision"`
	SuppressNotifyOnExit *bool             `json:"suppressNotifyOnExit"`
	Security             *string           `json:"security"`
	Ask                  *string           `json:"ask"`
}

// runPlan is the plan of system.run.prepare (OpenClaw's
// SystemRunApprovalPlan, without a policy snapshot).
type runPlan struct {
	Argv           []string `json:"argv"`
	Cwd            *string  `json:"cwd"`
	CommandText    string   `json:"commandText"`
	CommandPreview *string  `json:"commandPreview"`
	AgentID        *string  `json:"agentId"`
	SessionKey     *string  `json:"sessionKey"`
}

func str(p *string) string {
	if p == nil {
		return ""
	}
	return strings.TrimSpace(*p)
}

func decodeRun(params []byte) (runParams, *ErrorShape) {
	var p runParams
	if err := json.Unmarshal(params, &p); err != nil {
		return p, &ErrorShape{Code: CodeInvalidRequest, Message: "INVALID_REQUEST: paramsJSON: " + err.Error()}
	}
	if len(p.Command) == 0 || p.Command[0] == "" {
		return p, &ErrorShape{Code: CodeInvalidRequest, Message: "command required"}
	}
	// A policy the node cannot read is refused, not ignored: it was
	// meant to tighten something.
	if v := str(p.Security); v != "" {
		if _, ok := approvals.NormalizeSecurity(v); !ok {
			return p, &ErrorShape{Code: CodeInvalidRequest, Message: fmt.Sprintf("INVALID_REQUEST: security %q (want deny, allowlist or full)", v)}
		}
	}
	if v := str(p.Ask); v != "" {
		if _, ok := approvals.NormalizeAsk(v); !ok {
			return p, &ErrorShape{Code: CodeInvalidRequest, Message: fmt.Sprintf("INVALID_REQUEST: ask %q (want off, on-miss or always)", v)}
		}
	}
	return p, nil
}

// shellNames are the shells whose "-c"/"-lc" payload is the command text.
var shellNames = []string{"sh", "bash", "dash", "zsh", "ash"}

// commandText is what the node runs for argv: the payload of a shell
// wrapper (OpenClaw sends ["/bin/sh", "-lc", cmd]), else argv quoted for
// the shell. A rawCommand that is not that text is refused: the node
// runs what the approval plan shows, nothing else.
func commandText(argv []string, raw string) (string, *ErrorShape) {
	var text string
	if len(argv) == 3 && slices.Contains(shellNames, filepath.Base(argv[0])) && (argv[1] == "-c" || argv[1] == "-lc") {
		text = argv[2]
	} else {
		q := make([]string, len(argv))
		for i, a := range argv {
			q[i] = shellQuote(a)
		}
		text = strings.Join(q, " ")
	}
	if strings.TrimSpace(text) == "" {
		return "", &ErrorShape{Code: CodeInvalidRequest, Message: "command required"}
	}
	if raw != "" && raw != text && raw != strings.Join(argv, " ") {
		return "", &ErrorShape{Code: CodeInvalidRequest, Message: "INVALID_REQUEST: rawCommand does not match command"}
	}
	return text, nil
}

func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("/._-=:,+@%", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// prepare answers system.run.prepare with the run's plan.
func (c *Client) prepare(params []byte) outcome {
	p, e := decodeRun(params)
	if e != nil {
		return outcome{err: e}
	}
	text, e := commandText(p.Command, str(p.RawCommand))
	if e != nil {
		return outcome{err: e}
	}
	if _, e := c.workdir(str(p.Cwd)); e != nil {
		return outcome{err: e}
	}
	plan := runPlan{Argv: p.Command, Cwd: p.Cwd, CommandText: text, AgentID: p.AgentID, SessionKey: p.SessionKey}
	return outcome{payload: map[string]any{
		"plan":                plan,
		"allowAlwaysCoverage": map[string]any{"complete": false, "patterns": []any{}},
	}}
}

// workdir is the directory a run of OpenClaw's works in: dir, which must
// be Config.Workdir or beneath it (symbolic links resolved), or
// Config.Workdir when dir is empty.
func (c *Client) workdir(dir string) (string, *ErrorShape) {
	base := c.cfg.Workdir
	if dir == "" || base == "" {
		if dir == "" {
			return base, nil
		}
		return dir, nil
	}
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(base, dir)
	}
	real := filepath.Clean(dir)
	if r, err := filepath.EvalSymlinks(real); err == nil {
		real = r
	}
	if rel, err := filepath.Rel(base, real); err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		c.log.Warn("the OpenClaw gateway asked for a directory outside the node's workdir; refused", "cwd", dir, "workdir", base)
		return "", &ErrorShape{Code: CodeInvalidRequest,
			Message: fmt.Sprintf("INVALID_REQUEST: cwd %s is outside this node's working directory %s", dir, base)}
	}
	return real, nil
}

// policyFor is the run's policy: the node's base, tightened by what the
// call asks.
func (c *Client) policyFor(security, ask string) (string, string) {
	p := approvals.Policy{Security: c.cfg.Security, Ask: c.cfg.Ask}.Tighten(security, ask)
	return p.Security, p.Ask
}

// scopeKey is the node's session scope of an OpenClaw sessionKey.
func scopeKey(sessionKey string) string {
	if sessionKey == "" {
		sessionKey = defaultSessionKey
	}
	return SessionKeyPrefix + sessionKey
}

// agentOf is the agent id of a sessionKey "agent:<id>:…".
func agentOf(sessionKey string) string {
	parts := strings.SplitN(sessionKey, ":", 3)
	if len(parts) >= 2 && parts[0] == "agent" {
		return parts[1]
	}
	return ""
}

// execEvent is the payload of exec.finished and exec.denied.
type execEvent struct {
	SessionKey           string `json:"sessionKey"`
	RunID                string `json:"runId"`
	Host                 string `json:"host"`
	Command              string `json:"command"`
	ExitCode             *int   `json:"exitCode,omitempty"`
	TimedOut             *bool  `json:"timedOut,omitempty"`
	Success              *bool  `json:"success,omitempty"`
	Output               string `json:"output,omitempty"`
	Reason               string `json:"reason,omitempty"`
	SuppressNotifyOnExit bool   `json:"suppressNotifyOnExit,omitempty"`
}

// outputTail bounds the output of an exec.finished event.
const outputTail = 2000

// systemRun runs a system.run synchronously on the session core.
func (c *Client) systemRun(ctx context.Context, cn *conn, params []byte) outcome {
	p, e := decodeRun(params)
	if e != nil {
		return outcome{err: e}
	}
	text, e := commandText(p.Command, str(p.RawCommand))
	if e != nil {
		return outcome{err: e}
	}
	if len(p.SystemRunPlan) > 0 && string(p.SystemRunPlan) != "null" {
		var plan runPlan
		if err := json.Unmarshal(p.SystemRunPlan, &plan); err != nil || !slices.Equal(plan.Argv, p.Command) || str(plan.Cwd) != str(p.Cwd) {
			c.log.Warn("system.run whose plan does not match its command refused")
			return fail(CodeInvalidRequest, "SYSTEM_RUN_DENIED: execution plan mismatch")
		}
	}
	sessionKey := str(p.SessionKey)
	ev := execEvent{SessionKey: sessionKey, RunID: str(p.RunID), Host: "node", Command: text,
		SuppressNotifyOnExit: p.SuppressNotifyOnExit != nil && *p.SuppressNotifyOnExit}
	if ev.SessionKey == "" {
		ev.SessionKey = defaultSessionKey
	}
	if p.Approved != nil && *p.Approved || str(p.ApprovalDecision) != "" {
		// OpenClaw's operator approved on OpenClaw's side; that is no
		// decision execmesh's policy acts on, so it loosens nothing.
		c.log.Info("system.run carries an OpenClaw approval; the node's own policy decides", "runId", ev.RunID)
	}
	workdir, e := c.workdir(str(p.Cwd))
	if e != nil {
		return outcome{err: e}
	}
	security, ask := c.policyFor(str(p.Security), str(p.Ask))
	req := protocol.ExecRequest{
		SessionKey: scopeKey(sessionKey), AgentID: str(p.AgentID), Target: protocol.TargetNode, Sync: true,
		Security: security, Ask: ask,
		Args: protocol.ExecArgs{Command: text, Workdir: workdir, Env: p.Env},
	}
	if req.AgentID == "" {
		req.AgentID = agentOf(sessionKey)
	}
	if p.TimeoutMs != nil && *p.TimeoutMs > 0 {
		sec := *p.TimeoutMs / 1000
		req.Args.Timeout = &sec
	}
	reply, err := c.cfg.Host.Exec(ctx, req)
	if err != nil {
		return c.denied(cn, ev, err)
	}
	r := reply.Result
	exit, hasExit := r.Details.ExitCode.Get()
	timedOut := r.Details.TimedOut.Value()
	success := r.Status() == protocol.StatusCompleted && hasExit && exit == 0
	out := r.Details.Aggregated.Value()
	var errText any
	if r.Status() == protocol.StatusFailed {
		errText = r.Text()
		if out != "" {
			errText = strings.TrimSpace(strings.TrimPrefix(r.Text(), out))
		}
	}
	var exitCode any
	if hasExit {
		exitCode = exit
	}
	finished := ev
	finished.TimedOut, finished.Success = &timedOut, &success
	if hasExit {
		finished.ExitCode = &exit
	}
	finished.Output = tail(strings.TrimSpace(out+"\n"+fmt.Sprint(orEmpty(errText))), outputTail)
	c.event(cn, "exec.finished", finished)
	return outcome{payload: map[string]any{
		"exitCode": exitCode, "timedOut": timedOut, "success": success,
		"stdout": out, "stderr": "", "error": errText,
	}}
}

func orEmpty(v any) any {
	if v == nil {
		return ""
	}
	return v
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// denied turns a refusal of the host into OpenClaw's SYSTEM_RUN_DENIED
// (with exec.denied), or INVALID_REQUEST for a malformed request.
func (c *Client) denied(cn *conn, ev execEvent, err error) outcome {
	var perr *protocol.Error
	reason, msg := "", err.Error()
	if a, ok := host.AsApprovalNeeded(err); ok {
		reason = "approval-required"
		msg = fmt.Sprintf("SYSTEM_RUN_DENIED: approval required (execmesh node policy: %s; allowlist the program in the node's exec-approvals.json, OpenClaw approvals do not apply)", a.Request.Reason)
	} else if errors.As(err, &perr) {
		switch perr.Type {
		case protocol.ErrDenied:
			reason, msg = "security-policy", "SYSTEM_RUN_DENIED: "+perr.Message
		case protocol.ErrSecurityViolation, protocol.ErrHostNotAllowed:
			reason, msg = "security-policy", "SYSTEM_RUN_DENIED: "+perr.Message
		case protocol.ErrInvalidRequest:
			return fail(CodeInvalidRequest, "INVALID_REQUEST: %s", perr.Message)
		default:
			return fail(CodeUnavailable, "%s", perr.Message)
		}
	} else {
		return fail(CodeUnavailable, "%s", msg)
	}
	c.log.Info("system.run denied by the node's policy", "command", ev.Command, "reason", reason, "why", msg)
	ev.Reason = reason
	c.event(cn, "exec.denied", ev)
	return fail(CodeSystemRunDenied, "%s", msg)
}

// event sends a node.event on cn.
func (c *Client) event(cn *conn, name string, payload any) {
	b, err := json.Marshal(payload)
	if err != nil {
		return
	}
	if _, err := c.request(cn, "node.event", NodeEvent{Event: name, PayloadJSON: string(b)}); err != nil {
		c.log.Warn("node event not delivered", "event", name, "err", err)
	}
}

// Exit tells OpenClaw that a background session of its plugin tools
// ended (exec.finished); exits of other sessions are not OpenClaw's.
func (c *Client) Exit(ev protocol.ExitEvent) {
	key, ok := strings.CutPrefix(ev.SessionKey, SessionKeyPrefix)
	if !ok || ev.Lost != "" && ev.ExitReason == "" {
		return
	}
	c.mu.Lock()
	cn := c.cur
	c.mu.Unlock()
	if cn == nil {
		c.log.Warn("exit of an OpenClaw session not told: not connected", "sessionId", ev.SessionID)
		return
	}
	success := ev.Status == protocol.StatusCompleted && ev.ExitCode != nil && *ev.ExitCode == 0
	timedOut := ev.ExitReason == "overall-timeout"
	c.event(cn, "exec.finished", execEvent{SessionKey: key, RunID: ev.SessionID, Host: "node", Command: ev.Command,
		ExitCode: ev.ExitCode, Success: &success, TimedOut: &timedOut, Output: tail(strings.TrimSpace(ev.Tail), outputTail),
		SuppressNotifyOnExit: !ev.Notify})
}
