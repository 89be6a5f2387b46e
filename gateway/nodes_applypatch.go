package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/execmesh/execmesh/protocol"
)

// ApplyPatch applies an apply_patch patch on the node an exec call with
// the same routing would run on (selectNode). The node resolves the
// workdir with its own rules and applies its own security; a patch that
// would leave the workdir comes back as the node's security violation.
func (r *nodeRouter) ApplyPatch(ctx context.Context, req NodeExecRequest, args protocol.ApplyPatchArgs) (protocol.Result, error) {
	n, err := r.target(ctx, req)
	if err != nil {
		return protocol.Result{}, err
	}
	fwd := args
	fwd.Host, fwd.Node = "", ""
	rawArgs, err := json.Marshal(fwd)
	if err != nil {
		return protocol.Result{}, protocol.Errorf(protocol.ErrInternal, "apply_patch: encode arguments: %v", err)
	}
	body, err := json.Marshal(protocol.NodeApplyPatchRequest{SessionKey: req.SessionKey, AgentID: req.AgentID, Args: rawArgs, Security: req.Security,
		AnyWorkdir: !r.g.Config().Tools.Exec.ApplyPatch.WorkspaceOnly})
	if err != nil {
		return protocol.Result{}, protocol.Errorf(protocol.ErrInternal, "apply_patch: encode request: %v", err)
	}
	timeout := r.options().CallTimeout
	m, err := r.call(ctx, n, protocol.NodeEndpointApplyPatch, body, nil, timeout)
	if errors.Is(err, errNodeTimeout) {
		return protocol.Result{}, &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true,
			Message: fmt.Sprintf("apply_patch on node %s: %s, so the patch may or may not have been applied; check the files before applying it again.", n.label(), noAnswer(err, timeout))}
	}
	if err != nil {
		return protocol.Result{}, err
	}
	var res protocol.Result
	if err := json.Unmarshal(m.Data, &res); err != nil {
		return protocol.Result{}, protocol.Errorf(protocol.ErrInternal, "apply_patch on node %s: malformed result: %v", n.label(), err)
	}
	return res, nil
}
