package nodeagent

import (
	"context"
	"encoding/json"
	"errors"
	"strings"

	"github.com/nats-io/nats.go/micro"

	"github.com/execmesh/execmesh/applypatch"
	"github.com/execmesh/execmesh/approvals"
	"github.com/execmesh/execmesh/protocol"
)

// handleApplyPatch applies a patch (ApplyPatchRequest) under the requested
// workdir. Unless the gateway allows any workdir (AnyWorkdir), the workdir
// is taken inside the agent's workspace below Config.Workspace (empty: the
// workspace itself; relative: from it; absolute or through a link: it
// must stay inside, else a security violation). With AnyWorkdir it is
// absolute, or relative to the node's default cwd. A workdir that is not a
// directory gives the failed-workdir result. The node's own security
// applies (deny refuses); a patch that would leave the workdir or write
// inside a .git directory is a security violation and changes nothing.
func (a *Agent) handleApplyPatch(ctx context.Context, req micro.Request) ([]byte, error) {
	var r ApplyPatchRequest
	if err := decodeStrict("applypatch", req.Data(), &r); err != nil {
		return nil, err
	}
	if strings.TrimSpace(r.SessionKey) == "" {
		return nil, protocol.Errorf(protocol.ErrInvalidRequest, "applypatch: sessionKey is required")
	}
	args, err := protocol.DecodeApplyPatchArgs(r.Args)
	if err != nil {
		return nil, err
	}
	if st := a.Pairing(); st == PairingPending || st == PairingRejected {
		return nil, protocol.Errorf(protocol.ErrDenied, "node %s is not paired with the gateway (pairing %s); approve it with `execmesh nodes approve %s`", a.id.NodeID, st, a.id.NodeID)
	}
	if a.policy(r.Security, "", r.AgentID).Security == approvals.SecurityDeny {
		return nil, protocol.Errorf(protocol.ErrDenied, "apply_patch denied: host=node security=deny")
	}
	var dir string
	if r.AnyWorkdir {
		d, ok := a.resolveWorkdir(args.Workdir)
		if !ok {
			return json.Marshal(protocol.WorkdirUnavailableResult(args.Workdir))
		}
		dir = d
	} else {
		if a.cfg.Workspace == "" {
			return nil, protocol.Errorf(protocol.ErrSecurityViolation, "apply_patch: node %s has no workspace root (Config.Workspace), and the gateway allows patches only in the agent's workspace", a.id.NodeID)
		}
		ws, err := applypatch.AgentWorkspace(a.cfg.Workspace, r.AgentID)
		if err != nil {
			return nil, protocol.Errorf(protocol.ErrInvalidRequest, "apply_patch: %v", err)
		}
		d, err := applypatch.WorkdirIn(ws, args.Workdir)
		switch {
		case errors.Is(err, applypatch.ErrOutsideWorkspace):
			return nil, protocol.Errorf(protocol.ErrSecurityViolation, "apply_patch: %v (tools.exec.applyPatch.workspaceOnly)", err)
		case err != nil:
			return json.Marshal(protocol.WorkdirUnavailableResult(args.Workdir))
		}
		dir = d
	}
	sum, err := applypatch.Apply(ctx, dir, args.Input, applypatch.Options{})
	switch {
	case err == nil:
		return json.Marshal(sum.Result())
	case errors.Is(err, applypatch.ErrOutsideRoot):
		return nil, protocol.Errorf(protocol.ErrSecurityViolation, "%v", err)
	default:
		return json.Marshal(protocol.FailedResult(err.Error()))
	}
}
