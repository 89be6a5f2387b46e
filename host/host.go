// Package host is where an exec call meets a machine. A Host runs commands
// and answers process actions; there are two kinds: Local, the session core
// of this process behind the one host-exec pipeline (environment, workdir,
// exec approvals, sandbox), and a remote host reached over NATS
// (hostbus.Remote), which is a Local in another process. The gateway
// resolves which host a call goes to and calls it; it does not know how
// either runs a command. The node agent serves its Local over NATS.
package host

import (
	"context"
	"errors"

	"github.com/execmesh/execmesh/protocol"
)

// Host runs exec calls and process actions for the sessions it holds.
// Every method is safe for concurrent use.
type Host interface {
	// Exec runs one resolved exec call. The error is a *protocol.Error
	// raised before anything ran (an *ApprovalNeededError when the run
	// needs an operator's decision); what happens to the command is the
	// result.
	Exec(ctx context.Context, req protocol.ExecRequest) (protocol.ExecReply, error)
	// Process runs a process action (not list) on one of the host's
	// sessions; the reply says when the host does not hold it.
	Process(ctx context.Context, req protocol.ProcessRequest) (protocol.ProcessReply, error)
	// List returns the list entries of one sessionKey's sessions, newest
	// first: all of them, or the Limit newest.
	List(ctx context.Context, req protocol.ListRequest) (protocol.ListReply, error)
	// ApplyPatch applies an apply_patch patch on the host.
	ApplyPatch(ctx context.Context, req protocol.ApplyPatchRequest) (protocol.Result, error)
}

// ApprovalNeededError is Exec's answer for a run that needs an operator's
// approval: the host's evaluation and the plan a decision must be signed
// over. Its protocol type is protocol.ErrApprovalRequired.
type ApprovalNeededError struct {
	Err     *protocol.Error
	Request protocol.ApprovalRequest
}

func (e *ApprovalNeededError) Error() string { return e.Err.Message }

// Unwrap returns the *protocol.Error.
func (e *ApprovalNeededError) Unwrap() error { return e.Err }

// AsApprovalNeeded reports whether err asks for an approval.
func AsApprovalNeeded(err error) (*ApprovalNeededError, bool) {
	var a *ApprovalNeededError
	ok := errors.As(err, &a)
	return a, ok
}
