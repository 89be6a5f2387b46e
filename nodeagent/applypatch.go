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
// workdir: absolute, or relative to the node's default cwd; a workdir that
// is not a directory gives the failed-workdir result. The node's own
// security applies (deny refuses); a patch that would leave the workdir
// is a security violation and changes nothing.
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
	dir, ok := a.resolveWorkdir(args.Workdir)
	if !ok {
		return json.Marshal(protocol.WorkdirUnavailableResult(args.Workdir))
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
