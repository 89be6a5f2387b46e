package protocol

import "encoding/json"

// The messages a node agent and a gateway exchange over NATS. Both sides use
// these types, so there is one definition of each message; the JSON names
// are the wire format that running nodes and gateways speak, and
// node_test.go pins them.
//
// A node decodes every request strictly: unknown fields, wrong types and
// trailing data are refused with a micro error reply whose code is the HTTP
// status of the error type ("400", "404", "409", "503") and whose data is
// the JSON of an *Error, so the gateway can hand the very same error to its
// caller.

// NodeHeaderIdempotencyKey carries the idempotency key of an exec start: a
// UUID the gateway picks per call. A node that receives the same key again
// (a retry, or a late duplicate) returns the answer of the first start
// instead of running the command twice. nats.Header does not canonicalise
// keys: use this exact spelling.
const NodeHeaderIdempotencyKey = "Execmesh-Idempotency-Key"

// NodeHeaderSession is set on a process reply to NodeSessionGone when, after
// the action, the node does not hold the session (it was removed, swept
// after its retention, or never existed in that sessionKey).
const (
	NodeHeaderSession = "Execmesh-Session"
	NodeSessionGone   = "gone"
)

// NodeHeaderInstance is set on every successful reply of a node to the
// agent's instance id, so a gateway can tell a reply of a restarted node
// from one of the run that started a session, even before the new run's
// first heartbeat.
const NodeHeaderInstance = "Execmesh-Instance"

// Pairing states of a node, as the gateway reports them (NodePairResponse,
// NodePairingNotice).
const (
	NodePairingPending  = "pending"
	NodePairingPaired   = "paired"
	NodePairingRejected = "rejected"
)

// Types of a NodePairRequest.
const (
	NodePairAnnounce = "announce" // a node presents itself; the gateway answers its pairing status
	NodePairJoin     = "join"     // a node redeems a join code
)

// Decisions a NodeExecApproval carries: the operator's, or
// NodeDecisionTimeout when nobody answered in time (the node then applies
// its askFallback).
const (
	NodeDecisionAllowOnce   = "allow-once"
	NodeDecisionAllowAlways = "allow-always"
	NodeDecisionTimeout     = "timeout"
)

// ErrApprovalRequired is the error type of a node's exec start that needs
// an approval the request does not carry. The error data holds, besides
// type and message, "approval": a NodeApprovalRequired.
const ErrApprovalRequired ErrorType = "approval_required"

// NodeExecRequest starts a command on a node (endpoint NodeEndpointExec).
type NodeExecRequest struct {
	// SessionKey is the caller's scope; the node's process actions for
	// the session answer only under the same key. Required.
	SessionKey string `json:"sessionKey"`
	AgentID    string `json:"agentId,omitempty"`
	// Args are the exec tool arguments, decoded on the node with
	// DecodeExecArgs (strict). The gateway sends yieldMs and timeout
	// resolved, so that its request deadline and the node's behaviour
	// come from the same values.
	Args json.RawMessage `json:"args"`
	// Security and Ask are the gateway's resolved policy; the node only
	// tightens them.
	Security string   `json:"security,omitempty"`
	Ask      string   `json:"ask,omitempty"`
	Warnings []string `json:"warnings,omitempty"`
	// Sync runs the command to completion (the caller may not use the
	// process tool).
	Sync bool `json:"sync,omitempty"`
	// Approval is set only by the gateway, on the start of a run it
	// asked an approval for (after ErrApprovalRequired): never from the
	// exec arguments, which are decoded strictly and have no such field.
	Approval *NodeExecApproval `json:"approval,omitempty"`
	// Limits are the effective resource limits the gateway resolved
	// (tools.exec.limits, the agent's, then the call's "limits"); the
	// node's session core applies them to the session's cgroup, or
	// refuses the exec where its controllers are missing.
	Limits *Limits `json:"limits,omitempty"`
}

// NodeExecApproval is the gateway's approval of one run.
type NodeExecApproval struct {
	// ID is the gateway's approval id; the run's exit event carries it
	// as RunID.
	ID string `json:"id"`
	// Decision is one of the NodeDecision constants.
	Decision string `json:"decision"`
}

// NodeApprovalRequired is a node's evaluation of a run that needs
// approval, sent in the data of an ErrApprovalRequired error.
type NodeApprovalRequired struct {
	Command string `json:"command"`
	Cwd     string `json:"cwd"`
	// AllowAlways is whether allow-always may be offered (ask is not
	// always and the command resolves to binaries that can be
	// allowlisted).
	AllowAlways bool   `json:"allowAlways"`
	AskFallback string `json:"askFallback"`
	// FallbackAllows is whether the askFallback would run the command
	// when the approval times out.
	FallbackAllows bool   `json:"fallbackAllows"`
	Reason         string `json:"reason,omitempty"`
}

// NodeApplyPatchRequest applies an apply_patch patch on a node (endpoint
// NodeEndpointApplyPatch), under the requested workdir with the node's
// workdir rules.
type NodeApplyPatchRequest struct {
	SessionKey string `json:"sessionKey"`
	AgentID    string `json:"agentId,omitempty"`
	// Args are the apply_patch tool arguments (DecodeApplyPatchArgs,
	// strict).
	Args json.RawMessage `json:"args"`
	// Security is the gateway's resolved security; the node only
	// tightens it.
	Security string `json:"security,omitempty"`
}

// NodeProcessRequest is a process action on a node session (endpoint
// NodeEndpointProcess).
type NodeProcessRequest struct {
	SessionKey string `json:"sessionKey"`
	// Args are the process tool arguments (DecodeProcessArgs).
	Args json.RawMessage `json:"args"`
}

// NodeListRequest asks for a node's sessions (endpoint NodeEndpointList):
// those of one sessionKey, or with All every session the node holds (the
// gateway's resynchronisation after a restart or a reconnect).
type NodeListRequest struct {
	SessionKey string `json:"sessionKey,omitempty"`
	All        bool   `json:"all,omitempty"`
	// Limit, when above 0, asks for only the Limit newest entries of each
	// sessionKey (process list order), for a gateway answering a paged
	// list: the offset+limit of its caller. 0 lists everything.
	Limit int `json:"limit,omitempty"`
}

// NodeListResponse answers a NodeListRequest.
type NodeListResponse struct {
	NodeID string `json:"nodeId"`
	// Instance identifies this run of the node agent; it changes when the
	// agent restarts, and with it every session the node held is gone.
	Instance string              `json:"instance"`
	Sessions []NodeListedSession `json:"sessions"`
	// Total is, with a Limit, how many entries the sessionKeys listed
	// have in all, Limit aside.
	Total int `json:"total,omitempty"`
	// Partial is set when Limit left entries out: a session not in
	// Sessions may still exist on the node.
	Partial bool `json:"partial,omitempty"`
}

// NodeListedSession is one session of a NodeListResponse: its scope and
// its process-list entry.
type NodeListedSession struct {
	SessionKey string  `json:"sessionKey"`
	Details    Details `json:"details"`
}

// NodeWhichRequest asks where binaries are on a node's PATH (endpoint
// NodeEndpointWhich).
type NodeWhichRequest struct {
	Bins []string `json:"bins"`
}

// NodeWhichResponse maps each binary found to its path; names with a path
// separator and binaries not found are left out.
type NodeWhichResponse struct {
	Bins map[string]string `json:"bins"`
}

// NodePairingNotice is the gateway's word on a node's pairing (endpoint
// NodeEndpointPairing), sent when an operator approves or rejects the
// node. Status is one of the NodePairing constants.
type NodePairingNotice struct {
	Status string `json:"status"`
}

// NodeHeartbeat is what a node publishes on <prefix>.presence.<id>
// (SubjectSet.PresenceOf) every heartbeat interval.
type NodeHeartbeat struct {
	NodeID    string `json:"nodeId"`
	PublicKey string `json:"publicKey"`
	Name      string `json:"name"`
	Platform  string `json:"platform"`
	Hostname  string `json:"hostname,omitempty"`
	Version   string `json:"version,omitempty"`
	// Instance changes on every start of the agent (see
	// NodeListResponse).
	Instance  string `json:"instance"`
	StartedAt int64  `json:"startedAt"` // unix ms
	// Sessions is the number of sessions the node holds.
	Sessions int `json:"sessions"`
	// Server is the NATS server the node is connected to.
	Server string `json:"server,omitempty"`
	// IntervalMs is the node's heartbeat interval, so the gateway can
	// tell a late heartbeat from a lost node.
	IntervalMs int64 `json:"intervalMs"`
	TS         int64 `json:"ts"` // unix ms
	// Containment is how the node's session core holds process trees:
	// "cgroup" or "process-group" (session.Manager.Containment).
	Containment string `json:"containment,omitempty"`
}

// NodePairRequest is sent on <prefix>.pair.request (SubjectSet.PairRequest):
// a node announcing itself (Type NodePairAnnounce) or redeeming a join code
// (Type NodePairJoin).
type NodePairRequest struct {
	Type      string `json:"type"`
	NodeID    string `json:"nodeId"`
	PublicKey string `json:"publicKey"`
	Name      string `json:"name"`
	Platform  string `json:"platform"`
	Version   string `json:"version,omitempty"`
	Instance  string `json:"instance,omitempty"`
	// JoinUser and JoinSecret come from the join code (NodePairJoin only).
	JoinUser   string `json:"joinUser,omitempty"`
	JoinSecret string `json:"joinSecret,omitempty"`
	// Signature proves the node holds the seed of PublicKey: the nkey
	// signature, base64url, of JoinSignedText(JoinSecret, PublicKey)
	// (NodePairJoin only).
	Signature string `json:"signature,omitempty"`
}

// JoinSignedText is the text a joining node signs with its nkey, and the
// gateway verifies against NodePairRequest.Signature.
func JoinSignedText(secret, publicKey string) []byte {
	return []byte("execmesh-join:" + secret + ":" + publicKey)
}

// NodePairResponse answers a NodePairRequest.
type NodePairResponse struct {
	Status  string `json:"status"` // NodePairingPending, NodePairingPaired or NodePairingRejected
	NodeID  string `json:"nodeId"`
	Message string `json:"message,omitempty"`
	// Error is set when the request was refused (a join code that is
	// unknown, expired or already used, a bad signature, …).
	Error *Error `json:"error,omitempty"`
}

// JoinCode is the content of a join code: base64url (unpadded) of this
// JSON. It carries everything a new machine needs: where NATS is, the
// subject prefix, and a one-time credential.
type JoinCode struct {
	V      int      `json:"v"` // 1
	URLs   []string `json:"urls"`
	Prefix string   `json:"prefix"`
	// User is the one-time NATS user of the code, allowed only to send
	// the join request; empty when the server accepts anonymous clients.
	User string `json:"user,omitempty"`
	// Secret is the one-time secret: the NATS password of User and the
	// proof the gateway checks.
	Secret    string `json:"secret"`
	Name      string `json:"name,omitempty"`      // suggested display name
	ExpiresAt int64  `json:"expiresAt,omitempty"` // unix ms
}
