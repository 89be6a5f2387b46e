package gateway

import (
	"context"
	"strings"

	"github.com/execmesh/execmesh/approvals"
	"github.com/execmesh/execmesh/protocol"
	"github.com/execmesh/execmesh/sandbox"
)

// applyPatch runs the apply_patch tool on the host the call resolves to,
// with exec's host and workdir rules: the patch may only touch files under
// the workdir, never inside a .git directory, and with
// tools.exec.applyPatch.workspaceOnly (the default) the workdir must lie
// in the agent's workspace (<sandbox.workspace>/<agentId>; a node applies
// its own workspace root).
func (c *call) applyPatch(ctx context.Context, args protocol.ApplyPatchArgs) (protocol.Result, error) {
	requested, err := parseRequestedHost(args.Host)
	if err != nil {
		return protocol.Result{}, err
	}
	defaults := c.g.sessionDefaults(c.sessionKey)
	if requested == "" && defaults.Host != "" {
		requested = defaults.Host
	}
	configured := c.cfg.ExecHost(c.agentID)
	sandboxOn := c.cfg.Sandbox.Mode != sandbox.ModeOff
	target, err := resolveTarget(configured, requested, strings.TrimSpace(args.Node), sandboxOn, false)
	if err != nil {
		return protocol.Result{}, err
	}
	security, _ := c.policy(defaults, protocol.ExecArgs{})
	if target != hostSandbox && security == approvals.SecurityDeny {
		return protocol.Result{}, protocol.Errorf(protocol.ErrDenied, "apply_patch denied: host=%s security=deny", target)
	}
	args.Host, args.Node = "", strings.TrimSpace(args.Node)
	req := protocol.ApplyPatchRequest{SessionKey: c.sessionKey, AgentID: c.agentID, Target: target, Args: args, Security: security,
		AnyWorkdir: !c.cfg.Tools.Exec.ApplyPatch.WorkspaceOnly}
	if target != hostNode {
		return c.g.local.ApplyPatch(ctx, req)
	}
	node := args.Node
	if node == "" {
		node = defaults.Node
	}
	bound := c.cfg.Tools.Exec.Node
	if a, ok := c.cfg.Agent(c.agentID); ok && a.Tools.Exec.Node != "" {
		bound = a.Tools.Exec.Node
	}
	n, err := c.g.nodes.Select(ctx, node, bound)
	if err != nil {
		return protocol.Result{}, err
	}
	req.Args.Node = ""
	return c.g.nodes.Host(n).ApplyPatch(ctx, req)
}
