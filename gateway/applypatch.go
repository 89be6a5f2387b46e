package gateway

import (
	"context"
	"errors"
	"strings"

	"github.com/execmesh/execmesh/applypatch"
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
	configured := configuredHost(&c.cfg, c.agentID)
	sandboxOn := c.cfg.Sandbox.Mode != sandbox.ModeOff
	host, err := resolveHost(configured, requested, sandboxOn, false)
	if err != nil {
		return protocol.Result{}, err
	}
	security, _ := c.policy(configured, sandboxOn, defaults, protocol.ExecArgs{})
	if host != hostSandbox && security == "deny" {
		return protocol.Result{}, protocol.Errorf(protocol.ErrDenied, "apply_patch denied: host=%s security=deny", host)
	}
	var root string
	switch {
	case host == hostNode:
		nodes := c.g.nodeBackend()
		pn, ok := nodes.(patchNodes)
		if !ok || nodes == nil {
			return protocol.Result{}, protocol.Errorf(protocol.ErrHostNotAllowed, "exec host=node requires a paired node (none available). This requires a companion app or node host.")
		}
		node := strings.TrimSpace(args.Node)
		if node == "" {
			node = defaults.Node
		}
		req := NodeExecRequest{SessionKey: c.sessionKey, AgentID: c.agentID, Requested: node, ConfigNode: c.cfg.Tools.Exec.Node, Security: security}
		if a, ok := c.cfg.Agent(c.agentID); ok {
			req.AgentNode = a.Tools.Exec.Node
		}
		return pn.ApplyPatch(ctx, req, args)
	case host == hostSandbox && sandboxOn:
		ws, err := c.g.sandbox.Workspace(c.agentID)
		if err != nil {
			return protocol.Result{}, protocol.Errorf(protocol.ErrInvalidRequest, "apply_patch host=sandbox: %v", err)
		}
		dir, err := applypatch.WorkdirIn(ws, args.Workdir)
		if err != nil {
			return protocol.WorkdirUnavailableResult(args.Workdir), nil
		}
		root = dir
	case c.cfg.Tools.Exec.ApplyPatch.WorkspaceOnly:
		ws, err := applypatch.AgentWorkspace(c.cfg.Sandbox.Workspace, c.agentID)
		if err != nil {
			return protocol.Result{}, protocol.Errorf(protocol.ErrInvalidRequest, "apply_patch: %v", err)
		}
		dir, err := applypatch.WorkdirIn(ws, args.Workdir)
		switch {
		case errors.Is(err, applypatch.ErrOutsideWorkspace):
			return protocol.Result{}, protocol.Errorf(protocol.ErrSecurityViolation, "apply_patch: %v (tools.exec.applyPatch.workspaceOnly)", err)
		case err != nil:
			return protocol.WorkdirUnavailableResult(args.Workdir), nil
		}
		root = dir
	default:
		dir, ok := c.localWorkdir(args.Workdir)
		if !ok {
			return protocol.WorkdirUnavailableResult(args.Workdir), nil
		}
		root = dir
	}
	return PatchResult(applypatch.Apply(ctx, root, args.Input, applypatch.Options{}))
}

// PatchResult turns applypatch's outcome into the tool's answer: escapes
// from the root are refused as security violations, other failures are
// failed results the model can read.
func PatchResult(sum applypatch.Summary, err error) (protocol.Result, error) {
	switch {
	case err == nil:
		return sum.Result(), nil
	case errors.Is(err, applypatch.ErrOutsideRoot):
		return protocol.Result{}, protocol.Errorf(protocol.ErrSecurityViolation, "%v", err)
	default:
		return protocol.FailedResult(err.Error()), nil
	}
}

// patchNodes is implemented by node backends that can apply patches on a
// node.
type patchNodes interface {
	ApplyPatch(ctx context.Context, req NodeExecRequest, args protocol.ApplyPatchArgs) (protocol.Result, error)
}
