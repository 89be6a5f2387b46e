package gateway

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"
	"unicode"

	"github.com/execmesh/execmesh/approvals"
	"github.com/execmesh/execmesh/protocol"
	"github.com/execmesh/execmesh/session"
)

// gatewayPolicy resolves the effective approvals policy for a
// host=gateway call: tools.exec (and per-call values, already tightened in
// p) merged with the agent's entry of the approvals file, which can only
// tighten (spec §5.2).
func (c *call) gatewayPolicy(p *plan) approvals.Policy {
	path := approvals.Path(c.cfg.StateDir)
	f, _, err := approvals.Load(path)
	if err != nil {
		// A corrupt or unsafe file is treated as empty and left untouched.
		c.g.log.Warn("exec approvals file unusable; treating it as empty", "path", path, "err", err)
	}
	return approvals.Stricter(approvals.Levels{Security: p.security, Ask: p.ask}.Policy(), f.AgentPolicy(c.agentID))
}

// approvalBinding is what an approval is bound to; anything that changes
// between approval and spawn denies the run.
type approvalBinding struct {
	command  string
	cwd      string
	cwdIno   uint64
	cwdDev   uint64
	env      []string
	agentID  string
	resolved []string           // resolved executables at request time
	files    *approvals.Binding // executables and scripts with their hashes
}

func statDir(dir string) (dev, ino uint64, ok bool) {
	fi, err := os.Stat(dir)
	if err != nil || !fi.IsDir() {
		return 0, 0, false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, 0, false
	}
	return uint64(st.Dev), st.Ino, true
}

func resolvedPaths(ev approvals.Evaluation) []string {
	var out []string
	for _, s := range ev.Segments {
		out = append(out, s.ResolvedPath)
		out = append(out, s.WrapperPaths...)
	}
	return out
}

// authRequest is what approvals.Authorize needs to know about a
// host=gateway command.
func (c *call) authRequest(p *plan, req session.ExecRequest, policy approvals.Policy) approvals.Request {
	home, _ := os.UserHomeDir()
	return approvals.Request{
		Host:        hostGateway,
		AgentID:     c.agentID,
		Command:     p.args.Command,
		Cwd:         req.Workdir,
		Env:         protocol.EnvMap(req.Env),
		Home:        home,
		PTY:         req.PTY,
		Policy:      policy,
		SafeBins:    c.cfg.Tools.Exec.SafeBins,
		TrustedDirs: c.cfg.Tools.Exec.SafeBinTrustedDirs,
	}
}

// withAuthorization applies an allowed authorization to a request: the
// plan's argv when there is one, and the allowlist environment.
func withAuthorization(req session.ExecRequest, auth approvals.Authorization) session.ExecRequest {
	if auth.Argv != nil {
		req.Argv = auth.Argv
	}
	if len(auth.Env) > 0 {
		env := protocol.EnvMap(req.Env)
		maps.Copy(env, auth.Env)
		req.Env = protocol.EnvList(env)
	}
	return req
}

// authorizeGateway applies exec approvals to a host=gateway call. It
// returns the request to run, or an approval-pending result, or a denial.
func (c *call) authorizeGateway(ctx context.Context, p *plan, req session.ExecRequest) (*session.ExecRequest, *protocol.Result, error) {
	ar := c.authRequest(p, req, c.gatewayPolicy(p))
	auth, err := approvals.Authorize(ar)
	if err != nil {
		return nil, nil, protocol.Errorf(protocol.ErrInternal, "exec approvals: %v", err)
	}
	switch auth.Verdict {
	case approvals.Deny:
		return nil, nil, protocol.Errorf(protocol.ErrDenied, "%s", auth.Reason)
	case approvals.Allow:
		if auth.RunPlan {
			c.recordUse(auth.Evaluation)
		}
		run := withAuthorization(req, auth)
		return &run, nil, nil
	}
	res := c.g.requestApproval(c, p, req, ar, auth)
	return nil, &res, nil
}

func (c *call) recordUse(ev approvals.Evaluation) {
	path := approvals.Path(c.cfg.StateDir)
	if _, err := approvals.Update(path, func(f *approvals.File) error {
		if f.RecordUse(c.agentID, ev, ev.Rendered, time.Now()) == 0 {
			return errNoChange
		}
		return nil
	}); err != nil && !errors.Is(err, errNoChange) {
		c.g.log.Warn("recording allowlist use", "err", err)
	}
}

var errNoChange = errors.New("no change")

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

// requestApproval registers a pending approval, starts waiting for the
// decision in the background and returns the approval-pending result.
func (g *Gateway) requestApproval(c *call, p *plan, req session.ExecRequest, ar approvals.Request, auth approvals.Authorization) protocol.Result {
	decisions := []string{DecisionAllowOnce, DecisionAllowAlways, DecisionDeny}
	if !auth.AllowAlways {
		decisions = []string{DecisionAllowOnce, DecisionDeny}
	}
	ttl := time.Duration(c.cfg.Tools.Exec.ApprovalTimeoutMs) * time.Millisecond
	e := g.approvals.add(PendingApproval{
		Command: p.args.Command, Host: hostGateway, Cwd: req.Workdir,
		AgentID: c.agentID, SessionKey: c.sessionKey, Decisions: decisions,
	}, ttl)
	dev, ino, _ := statDir(req.Workdir)
	b := approvalBinding{command: p.args.Command, cwd: req.Workdir, cwdDev: dev, cwdIno: ino,
		env: slices.Clone(req.Env), agentID: c.agentID, resolved: resolvedPaths(auth.Evaluation), files: auth.Binding}
	g.bgWG.Add(1)
	go func() {
		defer g.bgWG.Done()
		g.runApproval(c, e, req, ar, b)
	}()
	return protocol.TextResult(approvalText(e.PendingApproval, p.warnings), protocol.Details{
		"status":       protocol.StatusApprovalPending,
		"approvalId":   e.ID,
		"approvalSlug": e.Slug,
		"expiresAtMs":  e.ExpiresAtMs,
		"host":         hostGateway,
		"command":      p.args.Command,
		"cwd":          req.Workdir,
	})
}

// awaitDecision waits for the operator's decision on e ("" when the
// approval timed out or the gateway is closing) and counts it.
func (g *Gateway) awaitDecision(e *approvalEntry) string {
	decision := g.approvals.wait(g.bg, e)
	if decision == "" {
		g.opts.Metrics.ObserveApproval("timeout")
	} else {
		g.opts.Metrics.ObserveApproval(decision)
	}
	return decision
}

// runApproval waits for the decision and acts on it: denied, or run in the
// background with the approval's system events. Right before the spawn
// the approval's binding is checked: the same cwd, env and executables,
// and the same content of the executables and scripts
// (`approval no longer matches: <path> changed`).
func (g *Gateway) runApproval(c *call, e *approvalEntry, req session.ExecRequest, ar approvals.Request, b approvalBinding) {
	decision := g.awaitDecision(e)
	denied := func(reason string) {
		g.emit(protocol.SystemEvent{SessionKey: c.sessionKey, ContextKey: "exec:" + e.ID, Kind: protocol.EventExecDenied,
			Text: fmt.Sprintf("Exec denied (gateway id=%s, %s): %s", e.ID, reason, b.command)})
	}
	if g.bg.Err() != nil {
		denied("gateway-shutdown")
		return
	}
	switch decision {
	case DecisionDeny:
		denied(approvals.DenyUserDenied)
		return
	case "":
		decision = approvals.DecisionTimeout
	}
	ex := c.cfg.Tools.Exec
	if decision != approvals.DecisionTimeout {
		if why := checkBinding(b, req, ex); why != "" {
			denied("approval-binding-changed: " + why)
			return
		}
	}
	ar.Decision, ar.Approved = decision, b.files
	auth, err := approvals.Authorize(ar)
	if err != nil || auth.Verdict != approvals.Allow {
		reason := auth.Reason
		if err != nil {
			reason = err.Error()
		}
		denied(reason)
		return
	}
	if decision == approvals.DecisionTimeout {
		if why := checkBinding(b, req, ex); why != "" {
			denied("approval-binding-changed: " + why)
			return
		}
	}
	if decision == DecisionAllowAlways {
		if err := g.persistAllowAlways(c, auth.AllowAlwaysPaths); err != nil {
			g.log.Warn("allow-always not persisted", "approval", e.ID, "err", err)
		}
	}
	g.runApproved(c, e, withAuthorization(req, auth), b.command)
}

// checkBinding re-checks, right before spawning, that what was approved is
// what would run: same cwd directory, same env, same resolved executables.
func checkBinding(b approvalBinding, req session.ExecRequest, ex ExecConfig) string {
	dev, ino, ok := statDir(req.Workdir)
	if !ok || dev != b.cwdDev || ino != b.cwdIno || req.Workdir != b.cwd {
		return "cwd changed"
	}
	if !slices.Equal(req.Env, b.env) {
		return "env changed"
	}
	home, _ := os.UserHomeDir()
	ev := approvals.Evaluate(b.command, approvals.EvalOptions{Cwd: req.Workdir, PATH: protocol.EnvMap(req.Env)["PATH"], Home: home, SafeBins: ex.SafeBins, TrustedDirs: ex.SafeBinTrustedDirs})
	if !slices.Equal(resolvedPaths(ev), b.resolved) {
		return "executable changed"
	}
	return ""
}

func (g *Gateway) persistAllowAlways(c *call, paths []string) error {
	if len(paths) == 0 {
		return errors.New("nothing to allow always")
	}
	_, err := approvals.Update(approvals.Path(c.cfg.StateDir), func(f *approvals.File) error {
		for _, p := range paths {
			if _, err := f.AddAllowAlways(c.agentID, p); err != nil {
				return err
			}
		}
		return nil
	})
	return err
}

// runApproved starts an approved command in the background and sends the
// Exec running / Exec finished events (spec §18).
func (g *Gateway) runApproved(c *call, e *approvalEntry, req session.ExecRequest, command string) {
	finished := make(chan protocol.ExitEvent, 1)
	req.Background = true
	req.Synchronous = false
	req.NotifyOff = true
	req.OnExitHook = func(ev protocol.ExitEvent) { finished <- ev }
	res, err := g.local.Exec(g.bg, req)
	if err != nil || res.Status() != protocol.StatusRunning {
		reason := "spawn-failed"
		if err != nil {
			g.log.Warn("approved exec failed to start", "approval", e.ID, "err", err)
		}
		g.emit(protocol.SystemEvent{SessionKey: c.sessionKey, ContextKey: "exec:" + e.ID, Kind: protocol.EventExecDenied,
			Text: fmt.Sprintf("Exec denied (gateway id=%s, %s): %s", e.ID, reason, command)})
		return
	}
	sid := res.SessionID()
	var notice <-chan time.Time
	if ms := c.cfg.Tools.Exec.ApprovalRunningNoticeMs; ms > 0 {
		t := time.NewTimer(time.Duration(ms) * time.Millisecond)
		defer t.Stop()
		notice = t.C
	}
	for {
		select {
		case <-notice:
			notice = nil
			secs := noticeSeconds(c.cfg.Tools.Exec.ApprovalRunningNoticeMs)
			g.emit(protocol.SystemEvent{SessionKey: c.sessionKey, ContextKey: "exec:" + e.ID, Kind: protocol.EventExecRunning,
				Text: fmt.Sprintf("Exec running (gateway id=%s, session=%s, >%ds): %s", e.ID, sid, secs, command)})
		case ev := <-finished:
			g.emit(protocol.SystemEvent{SessionKey: c.sessionKey, ContextKey: "exec:" + e.ID, Kind: protocol.EventExecFinished,
				Text: finishedText(e.ID, sid, ev)})
			return
		case <-g.bg.Done():
			// Shutdown: the session core ends the process; its exit still
			// arrives through finished, but nobody waits for it now.
			return
		}
	}
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

// HTTP: GET /v1/approvals and POST /v1/approvals/{id}.

func (g *Gateway) handleListApprovals(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"approvals": g.approvals.list()})
}

func (g *Gateway) handleDecideApproval(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Decision string `json:"decision"`
	}
	if err := decodeStrict(w, r, &body); err != nil {
		writeError(w, err)
		return
	}
	e, err := g.approvals.decide(r.PathValue("id"), body.Decision)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ok": true, "id": e.ID, "decision": body.Decision})
}

// PendingApprovals lists the exec approvals waiting for a decision.
func (g *Gateway) PendingApprovals() []PendingApproval { return g.approvals.list() }

// ResolveApproval records a decision for a pending approval (id or slug).
func (g *Gateway) ResolveApproval(idOrSlug, decision string) error {
	_, err := g.approvals.decide(idOrSlug, decision)
	return err
}
