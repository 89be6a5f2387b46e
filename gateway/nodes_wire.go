package gateway

import (
	"encoding/json"

	"github.com/execmesh/execmesh/protocol"
)

// The messages the gateway exchanges with node agents. They mirror
// nodeagent's exported wire types (nodeagent/wire.go), field for field:
// gateway and node agent share only the protocol package, so each side
// keeps its own copy, and nodes_wire_test.go decodes each side's messages
// with the other's types to keep them in step.

// Header and endpoint names of the node protocol.
const (
	nodeHeaderIdempotencyKey = "Execmesh-Idempotency-Key"
	// nodeHeaderSession is set by a node on a process reply when the
	// session is gone afterwards ("gone"): removed, or never there.
	nodeHeaderSession = "Execmesh-Session"
	// nodeHeaderInstance is set by a node on every reply: the id of the
	// agent run that answered.
	nodeHeaderInstance = "Execmesh-Instance"

	nodeEndpointExec    = protocol.NodeEndpointExec
	nodeEndpointProcess = protocol.NodeEndpointProcess
	nodeEndpointList    = "list"
	nodeEndpointPairing = "pairing"
	// nodeEndpointApplyPatch is nodeagent.EndpointApplyPatch.
	nodeEndpointApplyPatch = "applypatch"

	pairingPending  = "pending"
	pairingPaired   = "paired"
	pairingRejected = "rejected"

	pairAnnounce = "announce"
	pairJoin     = "join"
)

// nodeExecWire is nodeagent.ExecRequest.
type nodeExecWire struct {
	SessionKey string          `json:"sessionKey"`
	AgentID    string          `json:"agentId,omitempty"`
	Args       json.RawMessage `json:"args"`
	Security   string          `json:"security,omitempty"`
	Ask        string          `json:"ask,omitempty"`
	Warnings   []string        `json:"warnings,omitempty"`
	Sync       bool            `json:"sync,omitempty"`
	// Approval is set only by the gateway's approval flow
	// (nodes_approval.go), never from a client's arguments.
	Approval *nodeExecApprovalWire `json:"approval,omitempty"`
}

// nodeExecApprovalWire is nodeagent.ExecApproval.
type nodeExecApprovalWire struct {
	ID       string `json:"id"`
	Decision string `json:"decision"`
}

// nodeErrApprovalRequired is nodeagent.ErrApprovalRequired, and
// nodeDecisionTimeout nodeagent.DecisionTimeout.
const (
	nodeErrApprovalRequired protocol.ErrorType = "approval_required"
	nodeDecisionTimeout                        = "timeout"
)

// nodeApprovalRequiredWire is nodeagent.ApprovalRequired.
type nodeApprovalRequiredWire struct {
	Command        string `json:"command"`
	Cwd            string `json:"cwd"`
	AllowAlways    bool   `json:"allowAlways"`
	AskFallback    string `json:"askFallback"`
	FallbackAllows bool   `json:"fallbackAllows"`
	Reason         string `json:"reason,omitempty"`
}

// nodeApplyPatchWire is nodeagent.ApplyPatchRequest.
type nodeApplyPatchWire struct {
	SessionKey string          `json:"sessionKey"`
	AgentID    string          `json:"agentId,omitempty"`
	Args       json.RawMessage `json:"args"`
	Security   string          `json:"security,omitempty"`
}

// nodeProcessWire is nodeagent.ProcessRequest.
type nodeProcessWire struct {
	SessionKey string          `json:"sessionKey"`
	Args       json.RawMessage `json:"args"`
}

// nodeListWire is nodeagent.ListRequest.
type nodeListWire struct {
	SessionKey string `json:"sessionKey,omitempty"`
	All        bool   `json:"all,omitempty"`
	// Limit asks for the newest Limit entries of each sessionKey only
	// (a paged list); 0 for all.
	Limit int `json:"limit,omitempty"`
}

// nodeListReplyWire is nodeagent.ListResponse.
type nodeListReplyWire struct {
	NodeID   string `json:"nodeId"`
	Instance string `json:"instance"`
	Sessions []struct {
		SessionKey string           `json:"sessionKey"`
		Details    protocol.Details `json:"details"`
	} `json:"sessions"`
	// Total counts the entries Limit aside; Partial says Limit left some
	// out, so sessions missing from Sessions may still exist.
	Total   int  `json:"total,omitempty"`
	Partial bool `json:"partial,omitempty"`
}

// pairingNoticeWire is nodeagent.PairingNotice.
type pairingNoticeWire struct {
	Status string `json:"status"`
}

// heartbeatWire is nodeagent.Heartbeat.
type heartbeatWire struct {
	NodeID     string `json:"nodeId"`
	PublicKey  string `json:"publicKey"`
	Name       string `json:"name"`
	Platform   string `json:"platform"`
	Hostname   string `json:"hostname,omitempty"`
	Version    string `json:"version,omitempty"`
	Instance   string `json:"instance"`
	StartedAt  int64  `json:"startedAt"`
	Sessions   int    `json:"sessions"`
	Server     string `json:"server,omitempty"`
	IntervalMs int64  `json:"intervalMs"`
	TS         int64  `json:"ts"`
}

// pairRequestWire is nodeagent.PairRequest.
type pairRequestWire struct {
	Type       string `json:"type"`
	NodeID     string `json:"nodeId"`
	PublicKey  string `json:"publicKey"`
	Name       string `json:"name"`
	Platform   string `json:"platform"`
	Version    string `json:"version,omitempty"`
	Instance   string `json:"instance,omitempty"`
	JoinUser   string `json:"joinUser,omitempty"`
	JoinSecret string `json:"joinSecret,omitempty"`
	Signature  string `json:"signature,omitempty"`
}

// joinSignedText is nodeagent.JoinSignedText.
func joinSignedText(secret, publicKey string) []byte {
	return []byte("execmesh-join:" + secret + ":" + publicKey)
}

// pairReplyWire is nodeagent.PairResponse.
type pairReplyWire struct {
	Status  string          `json:"status"`
	NodeID  string          `json:"nodeId"`
	Message string          `json:"message,omitempty"`
	Error   *protocol.Error `json:"error,omitempty"`
}

// joinCodeWire is nodeagent.JoinCode; a code is unpadded base64url of its
// JSON.
type joinCodeWire struct {
	V         int      `json:"v"`
	URLs      []string `json:"urls"`
	Prefix    string   `json:"prefix"`
	User      string   `json:"user,omitempty"`
	Secret    string   `json:"secret"`
	Name      string   `json:"name,omitempty"`
	ExpiresAt int64    `json:"expiresAt,omitempty"`
}
