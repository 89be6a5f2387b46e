package nodeagent

import (
	"encoding/json"
	"errors"
	"slices"

	"github.com/execmesh/execmesh/approvals"
	"github.com/execmesh/execmesh/protocol"
)

// runDecision is the node's verdict on one command: run it as written, or
// run the allowlisted plan in argv.
type runDecision struct {
	argv []string // nil: the command as written, through the shell
}

// authorize applies the node's own exec approvals (DESIGN.md §3.4: the node
// re-checks with its own file) to a run the gateway sent.
//
// The effective policy is the stricter of the gateway's (security and ask,
// themselves tightened by Config.Security and Config.Ask) and the agent's
// entry of <state-dir>/exec-approvals.json, where unset values restrict
// nothing. Then as on the gateway: security deny denies; full runs the
// command as written (ask=always needs an approval); allowlist runs a
// satisfied command as its plan of resolved paths, and a miss with ask off
// is "exec denied: allowlist miss". A run that needs an approval is
// answered ErrApprovalRequired with the evaluation (approvalRequiredError)
// unless the gateway's Approval comes with it: allow-once and
// allow-always run the command as written (allow-always first adds its
// resolved binaries to the node's own file), timeout applies the node's
// askFallback.
func (a *Agent) authorize(r *ExecRequest, command, workdir string, env map[string]string) (runDecision, error) {
	policy := a.policy(r.Security, r.Ask, r.AgentID)
	if policy.Security == approvals.SecurityDeny {
		return runDecision{}, protocol.Errorf(protocol.ErrDenied, "%s", approvals.DenySecurity(approvals.HostNode))
	}
	ev := approvals.Evaluate(command, approvals.EvalOptions{
		Cwd:       workdir,
		PATH:      env["PATH"],
		Home:      env["HOME"],
		Allowlist: policy.Allowlist,
	})
	d := approvals.Decide(approvals.HostNode, policy, ev)
	if d.Verdict == approvals.NeedsApproval {
		fb := approvals.Fallback(policy, ev)
		switch {
		case r.Approval == nil:
			// The gateway asks its operators and comes back with the
			// decision in Approval.
			return runDecision{}, &approvalRequiredError{
				pe: protocol.Errorf(ErrApprovalRequired, "exec on node %s needs approval (%s)", a.id.NodeID, d.Reason),
				summary: ApprovalRequired{
					Command:        command,
					Cwd:            workdir,
					AllowAlways:    policy.Ask != approvals.AskAlways && len(ev.AllowAlwaysPaths()) > 0,
					AskFallback:    policy.AskFallback,
					FallbackAllows: fb.Verdict == approvals.Allow,
					Reason:         d.Reason,
				},
			}
		case r.Approval.Decision == DecisionAllowOnce || r.Approval.Decision == DecisionAllowAlways:
			if r.Approval.Decision == DecisionAllowAlways {
				a.persistAllowAlways(r.AgentID, ev)
			}
			// An approved command runs as written (DESIGN.md §7).
			return runDecision{}, nil
		case r.Approval.Decision == DecisionTimeout:
			if fb.Verdict != approvals.Allow {
				return runDecision{}, protocol.Errorf(protocol.ErrDenied, "%s", fb.Reason)
			}
			d = fb
		default:
			return runDecision{}, protocol.Errorf(protocol.ErrInvalidRequest, "exec: unknown approval decision %q", r.Approval.Decision)
		}
	}
	switch {
	case d.Verdict == approvals.Deny:
		return runDecision{}, protocol.Errorf(protocol.ErrDenied, "%s", d.Reason)
	case d.RunPlan:
		return runDecision{argv: planArgv(ev)}, nil
	}
	return runDecision{}, nil
}

// persistAllowAlways adds the resolved binaries of an allow-always run to
// the agent's allowlist in the node's own approvals file (never a shell or
// a wrapper: AllowAlwaysPaths leaves them out).
func (a *Agent) persistAllowAlways(agentID string, ev approvals.Evaluation) {
	paths := ev.AllowAlwaysPaths()
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
	security, ask = a.cfg.stricter(security, ask)
	policy := approvals.Policy{Security: security, Ask: ask}
	if a.cfg.StateDir != "" {
		path := approvals.Path(a.cfg.StateDir)
		f, _, err := approvals.Load(path)
		if err != nil {
			// A corrupt or unsafe file is not trusted to loosen anything:
			// treat it as empty (it never loosens) and say so.
			a.log.Warn("exec approvals file unusable; treating it as empty", "path", path, "err", err)
		}
		if f == nil {
			f = approvals.NewFile()
		}
		filePolicy := f.Resolve(agentID, approvals.Policy{Security: approvals.SecurityFull, Ask: approvals.AskOff, AskFallback: approvals.SecurityDeny})
		policy = approvals.Stricter(policy, filePolicy)
	}
	return policy
}

// planArgv is the argv that runs an allowlisted plan: the program itself
// for one segment, else the rendered pipeline through /bin/sh (every word
// quoted: no shell sees the original text again).
func planArgv(ev approvals.Evaluation) []string {
	if len(ev.Argv) == 1 {
		return slices.Clone(ev.Argv[0])
	}
	return []string{"/bin/sh", "-c", ev.Rendered}
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
