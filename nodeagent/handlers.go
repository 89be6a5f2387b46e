package nodeagent

import (
	"context"
	"encoding/json"

	"github.com/nats-io/nats.go/micro"

	"github.com/execmesh/execmesh/protocol"
)

// The node agent's own endpoints, beside the host endpoints that
// hostbus.Server serves (exec, process, list, applypatch).

// handleApprovalsGet returns the node's exec-approvals.json: {path,
// exists, hash, file}, the socket token removed.
func (a *Agent) handleApprovalsGet(_ context.Context, req micro.Request) ([]byte, error) {
	if len(req.Data()) > 0 {
		var empty struct{}
		if err := decodeStrict("approvals.get", req.Data(), &empty); err != nil {
			return nil, err
		}
	}
	v, err := a.readApprovals()
	if err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

// handleApprovalsSet replaces the node's exec-approvals.json, given the
// hash of the file it replaces (OpenClaw's system.execApprovals.set).
func (a *Agent) handleApprovalsSet(_ context.Context, req micro.Request) ([]byte, error) {
	var r approvalsSet
	if err := decodeStrict("approvals.set", req.Data(), &r); err != nil {
		return nil, err
	}
	v, err := a.writeApprovals(r)
	if err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

// handleWhich finds binaries on the node's PATH.
func (a *Agent) handleWhich(_ context.Context, req micro.Request) ([]byte, error) {
	var r WhichRequest
	if err := decodeStrict("which", req.Data(), &r); err != nil {
		return nil, err
	}
	return json.Marshal(WhichResponse{Bins: a.which(r.Bins)})
}

// handlePairing takes the gateway's word on the node's pairing.
func (a *Agent) handlePairing(_ context.Context, req micro.Request) ([]byte, error) {
	var n PairingNotice
	if err := decodeStrict("pairing", req.Data(), &n); err != nil {
		return nil, err
	}
	switch n.Status {
	case PairingPending, PairingPaired, PairingRejected:
	default:
		return nil, protocol.Errorf(protocol.ErrInvalidRequest, "pairing: unknown status %q", n.Status)
	}
	if n.Status == PairingPaired {
		// Trust on first use: the node's subject accepts only gateway
		// identities, and later notices cannot replace keys it has.
		if added, err := a.keys.adopt(n.GatewayKeys); err != nil {
			a.log.Warn("could not save the gateway keys", "err", err)
		} else if added {
			a.log.Info("trusting the gateway's approval signing key", "keys", n.GatewayKeys)
		}
	}
	a.mu.Lock()
	a.notices++
	a.mu.Unlock()
	a.setPairing(n.Status)
	return []byte("{}"), nil
}
