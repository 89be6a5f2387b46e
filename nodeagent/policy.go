package nodeagent

import (
	"encoding/json"
	"errors"

	"github.com/execmesh/execmesh/approvals"
	"github.com/execmesh/execmesh/protocol"
)

// runDecision is the node's verdict on one command: run it as written, or
// run the allowlisted plan in argv, with env set over its environment.
type runDecision struct {
	argv []string          // nil: the command as written, through the shell
	env  map[string]string // approvals.AllowlistEnv for runs under security allowlist
}

// authorize applies the node's own exec approvals (DESIGN.md §3.4: the node
// re-checks with its own file) to a run the gateway sent, through
// approvals.Authorize.
//
// The effective policy is the stricter of the gateway's (security and ask,
// themselves tightened by Config.Security and Config.Ask) and the agent's
// entry of <state-dir>/exec-approvals.json, where unset values restrict
// nothing. Then as on the gateway: security deny denies; full runs the
// command as written (ask=always needs an approval); allowlist runs a
// satisfied command as its plan of resolved paths, and a miss with ask off
// is "exec denied: allowlist miss". A run that needs an approval is
// answered ErrApprovalRequired with the evaluation and the approval's
// binding (approvalRequiredError) unless the gateway's Approval comes with
// it: allow-once and allow-always run the command as written if its
// executables and scripts still match the binding the approval carries
// back (allow-always first adds its resolved binaries to the node's own
// file), timeout applies the node's askFallback.
func (a *Agent) authorize(r *ExecRequest, command, workdir string, env map[string]string, pty bool) (runDecision, error) {
	req := approvals.Request{
		Host:    approvals.HostNode,
		AgentID: r.AgentID,
		Command: command,
		Cwd:     workdir,
		Env:     env,
		PTY:     pty,
		Policy:  a.policy(r.Security, r.Ask, r.AgentID),
	}
	if r.Approval != nil {
		switch r.Approval.Decision {
		case DecisionAllowOnce, DecisionAllowAlways, DecisionTimeout:
		default:
			return runDecision{}, protocol.Errorf(protocol.ErrInvalidRequest, "exec: unknown approval decision %q", r.Approval.Decision)
		}
		req.Decision = r.Approval.Decision
		req.Approved = (*approvals.Binding)(r.Approval.Binding)
	}
	auth, err := approvals.Authorize(req)
	if err != nil {
		return runDecision{}, protocol.Errorf(protocol.ErrInvalidRequest, "exec: %v", err)
	}
	switch auth.Verdict {
	case approvals.NeedsApproval:
		// The gateway asks its operators and comes back with the
		// decision in Approval.
		return runDecision{}, &approvalRequiredError{
			pe: protocol.Errorf(ErrApprovalRequired, "exec on node %s needs approval (%s)", a.id.NodeID, auth.Reason),
			summary: ApprovalRequired{
				Command:        command,
				Cwd:            workdir,
				AllowAlways:    auth.AllowAlways,
				AskFallback:    auth.AskFallback,
				FallbackAllows: auth.FallbackAllows,
				Reason:         auth.Reason,
				Binding:        (*protocol.ApprovalBinding)(auth.Binding),
			},
		}
	case approvals.Deny:
		return runDecision{}, protocol.Errorf(protocol.ErrDenied, "%s", auth.Reason)
	}
	if auth.Applied && req.Decision == DecisionAllowAlways {
		a.persistAllowAlways(r.AgentID, auth.AllowAlwaysPaths)
	}
	return runDecision{argv: auth.Argv, env: auth.Env}, nil
}

// persistAllowAlways adds the resolved binaries of an allow-always run to
// the agent's allowlist in the node's own approvals file (never a shell or
// a wrapper: AllowAlwaysPaths leaves them out).
func (a *Agent) persistAllowAlways(agentID string, paths []string) {
	if a.cfg.StateDir == "" || len(paths) == 0 {
		a.log.Warn("allow-always not persisted: nothing to allow, or no state dir", "paths", len(paths))
		return
	}
	_, err := approvals.Update(approvals.Path(a.cfg.StateDir), func(f *approvals.File) error {
		for _, p := range paths {
			if _, err := f.AddAllowAlways(agentID, p); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		a.log.Warn("allow-always not persisted", "err", err)
	}
}

// policy is the node's effective policy for agentID: the stricter of the
// gateway's security and ask (themselves tightened by Config.Security and
// Config.Ask) and the agent's entry of <state-dir>/exec-approvals.json,
// where unset values restrict nothing.
func (a *Agent) policy(security, ask, agentID string) approvals.Policy {
	policy := a.cfg.requested(security, ask).Policy()
	if a.cfg.StateDir != "" {
		path := approvals.Path(a.cfg.StateDir)
		f, _, err := approvals.Load(path)
		if err != nil {
			// A corrupt or unsafe file is not trusted to loosen anything:
			// treat it as empty (it never loosens) and say so.
			a.log.Warn("exec approvals file unusable; treating it as empty", "path", path, "err", err)
		}
		policy = approvals.Stricter(policy, f.AgentPolicy(agentID))
	}
	return policy
}

// approvalsView is the answer of approvals.get: OpenClaw's
// system.execApprovals.get shape, {path, exists, hash, file}, with the
// socket token removed.
type approvalsView struct {
	Path   string          `json:"path"`
	Exists bool            `json:"exists"`
	Hash   string          `json:"hash"`
	File   *approvals.File `json:"file"`
}

// approvalsSet is the request of approvals.set: the new file and the hash
// of the file it replaces ("" when there is none).
type approvalsSet struct {
	File     json.RawMessage `json:"file"`
	BaseHash string          `json:"baseHash"`
}

func (a *Agent) approvalsPath() (string, error) {
	if a.cfg.StateDir == "" {
		return "", protocol.Errorf(protocol.ErrConflict, "node %s has no state dir, so no exec approvals file", a.id.NodeID)
	}
	return approvals.Path(a.cfg.StateDir), nil
}

func (a *Agent) readApprovals() (approvalsView, error) {
	path, err := a.approvalsPath()
	if err != nil {
		return approvalsView{}, err
	}
	f, hash, err := approvals.Load(path)
	if err != nil {
		return approvalsView{}, protocol.Errorf(protocol.ErrConflict, "exec approvals file: %v", err)
	}
	if f.Socket != nil {
		s := *f.Socket
		s.Token = ""
		f.Socket = &s
	}
	return approvalsView{Path: path, Exists: hash != "", Hash: hash, File: f}, nil
}

func (a *Agent) writeApprovals(req approvalsSet) (approvalsView, error) {
	path, err := a.approvalsPath()
	if err != nil {
		return approvalsView{}, err
	}
	if len(req.File) == 0 || string(req.File) == "null" {
		return approvalsView{}, protocol.Errorf(protocol.ErrInvalidRequest, "approvals.set: file is required")
	}
	file, err := approvals.Parse(req.File)
	if err != nil {
		return approvalsView{}, protocol.Errorf(protocol.ErrInvalidRequest, "approvals.set: %v", err)
	}
	cur, err := a.readApprovals()
	if err != nil {
		return approvalsView{}, err
	}
	switch {
	case cur.Exists && req.BaseHash == "":
		return approvalsView{}, protocol.Errorf(protocol.ErrInvalidRequest, "INVALID_REQUEST: exec approvals base hash required; reload and retry")
	case req.BaseHash != cur.Hash:
		return approvalsView{}, protocol.Errorf(protocol.ErrConflict, "INVALID_REQUEST: exec approvals changed; reload and retry")
	}
	// The socket section is the node's own; a client cannot set it.
	old, _, _ := approvals.Load(path)
	file.Socket = old.Socket
	if _, err := approvals.Save(path, file, req.BaseHash); err != nil {
		if errors.Is(err, approvals.ErrConflict) {
			return approvalsView{}, protocol.Errorf(protocol.ErrConflict, "INVALID_REQUEST: exec approvals changed; reload and retry")
		}
		return approvalsView{}, protocol.Errorf(protocol.ErrConflict, "exec approvals: %v", err)
	}
	return a.readApprovals()
}
