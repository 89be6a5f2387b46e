package gateway

import (
	"context"

	"github.com/execmesh/execmesh/protocol"
)

// NodeExecRequest is a host=node exec call after host resolution, as the
// node backend receives it.
type NodeExecRequest struct {
	SessionKey string
	AgentID    string
	// Requested is the per-call `node`; AgentNode is
	// agents.list[].tools.exec.node and ConfigNode tools.exec.node. The
	// backend selects the node from them (spec §19.1).
	Requested  string
	AgentNode  string
	ConfigNode string
	Args       protocol.ExecArgs
	Security   string
	Ask        string
	Warnings   []string
	Sync       bool // the process tool is denied: run to completion
	// Limits are the effective resource limits, applied by the node.
	Limits protocol.Limits
}

// nodeBackend routes node-targeted calls over NATS. It is nil until the
// gateway is attached to a bus.
type nodeBackend interface {
	// Exec starts a command on the selected node.
	Exec(ctx context.Context, req NodeExecRequest) (protocol.Result, error)
	// Process forwards a process action for a node session. handled is
	// false when no node owns sessionId in this scope.
	Process(ctx context.Context, sessionKey string, args protocol.ProcessArgs) (res protocol.Result, handled bool, err error)
	// ListPage returns the list entries of the node sessions in scope
	// and the size of the whole list: all of them when limit is 0, else
	// at most limit per source (see nodeRouter.ListPage).
	ListPage(ctx context.Context, sessionKey string, limit int) ([]protocol.Details, int, error)
	// Close stops the backend.
	Close(ctx context.Context) error
}
