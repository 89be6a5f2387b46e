package nodeagent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/execmesh/execmesh/protocol"
)

// The messages a node agent exchanges with a gateway. The gateway keeps its
// own copies of these shapes (gateway/nodes_wire.go), because the two
// sides share only the protocol package; gateway tests decode one side's
// messages with the other's types to keep them in step.
//
// Every request is JSON and decoded strictly: unknown fields, wrong types
// and trailing data are refused with a micro error reply whose code is the
// HTTP status of the error type ("400", "404", "409", "503") and
// whose data is the JSON of a *protocol.Error, so the gateway can hand the
// very same error to its caller.

// HeaderIdempotencyKey carries the idempotency key of an exec start: a
// UUID the gateway picks per call. A node that receives the same key again
// (a retry, or a late duplicate) returns the answer of the first start
// instead of running the command twice. nats.Header does not canonicalise
// keys: use this exact spelling.
const HeaderIdempotencyKey = "Execmesh-Idempotency-Key"

// HeaderSession is set on a process reply to SessionGone when, after the
// action, the node does not hold the session (it was removed, swept after
// its retention, or never existed in that sessionKey).
const (
	HeaderSession = "Execmesh-Session"
	SessionGone   = "gone"
)

// HeaderInstance is set on every successful reply to the agent's Instance,
// so a gateway can tell a reply of a restarted node from one of the run
// that started a session, even before the new run's first heartbeat.
const HeaderInstance = "Execmesh-Instance"

// Endpoint names of a node's micro service, below the group
// <prefix>.node.<id>. Names with a dot are subject suffixes; their micro
// endpoint names use '-' instead (micro allows no dots in names).
const (
	EndpointExec         = protocol.NodeEndpointExec         // ExecRequest → protocol.Result
	EndpointProcess      = protocol.NodeEndpointProcess      // ProcessRequest → protocol.Result
	EndpointList         = "list"                            // ListRequest → ListResponse
	EndpointApprovalsGet = protocol.NodeEndpointApprovalsGet // {} → the exec-approvals file
	EndpointApprovalsSet = protocol.NodeEndpointApprovalsSet // {file, baseHash} → the new file
	EndpointWhich        = protocol.NodeEndpointWhich        // WhichRequest → WhichResponse
	EndpointPairing      = "pairing"                         // PairingNotice → {} (gateway tells the node its pairing status)
	EndpointApplyPatch   = "applypatch"                      // ApplyPatchRequest → protocol.Result
)

// Pairing states, as the gateway reports them.
const (
	PairingPending  = "pending"
	PairingPaired   = "paired"
	PairingRejected = "rejected"
)

// Pair request types.
const (
	PairAnnounce = "announce" // a node presents itself; the gateway answers its pairing status
	PairJoin     = "join"     // a node redeems a join code
)

// ExecRequest starts a command on the node (endpoint exec).
type ExecRequest struct {
	// SessionKey is the caller's scope; the node's process actions for
	// the session answer only under the same key. Required.
	SessionKey string `json:"sessionKey"`
	AgentID    string `json:"agentId,omitempty"`
	// Args are the exec tool arguments, decoded on the node with
	// protocol.DecodeExecArgs (strict). The gateway sends yieldMs and
	// timeout resolved, so that its request deadline and the node's
	// behaviour come from the same values.
	Args json.RawMessage `json:"args"`
	// Security and Ask are the gateway's resolved policy; the node only
	// tightens them (Config.Security, Config.Ask).
	Security string   `json:"security,omitempty"`
	Ask      string   `json:"ask,omitempty"`
	Warnings []string `json:"warnings,omitempty"`
	// Sync runs the command to completion (the caller may not use the
	// process tool).
	Sync bool `json:"sync,omitempty"`
	// Approval is set only by the gateway, on the start of a run it
	// asked an approval for (after ErrApprovalRequired): never from the
	// exec arguments, which are decoded strictly and have no such field.
	Approval *ExecApproval `json:"approval,omitempty"`
}

// Decisions an ExecApproval carries: the operator's, or DecisionTimeout
// when nobody answered in time (the node then applies its askFallback).
const (
	DecisionAllowOnce   = "allow-once"
	DecisionAllowAlways = "allow-always"
	DecisionTimeout     = "timeout"
)

// ExecApproval is the gateway's approval of one run.
type ExecApproval struct {
	// ID is the gateway's approval id; the run's exit event carries it
	// as RunID.
	ID       string `json:"id"`
	Decision string `json:"decision"`
}

// ErrApprovalRequired is the error type of an exec start that needs an
// approval the request does not carry. The error data holds, besides
// type and message, "approval": an ApprovalRequired.
const ErrApprovalRequired protocol.ErrorType = "approval_required"

// ApprovalRequired is the node's evaluation of a run that needs approval.
type ApprovalRequired struct {
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

// approvalRequiredError is returned by authorize; the endpoint sends its
// summary in the error data.
type approvalRequiredError struct {
	pe      *protocol.Error
	summary ApprovalRequired
}

func (e *approvalRequiredError) Error() string { return e.pe.Message }
func (e *approvalRequiredError) Unwrap() error { return e.pe }

// errorDataFor is errorData, with the approval summary of an
// approval-required error.
func errorDataFor(err error, pe *protocol.Error) []byte {
	var ar *approvalRequiredError
	if errors.As(err, &ar) {
		b, merr := json.Marshal(struct {
			*protocol.Error
			Approval ApprovalRequired `json:"approval"`
		}{pe, ar.summary})
		if merr == nil {
			return b
		}
	}
	return errorData(pe)
}

// ApplyPatchRequest applies an apply_patch patch on the node (endpoint
// applypatch), under the requested workdir with the node's workdir rules.
type ApplyPatchRequest struct {
	SessionKey string `json:"sessionKey"`
	AgentID    string `json:"agentId,omitempty"`
	// Args are the apply_patch tool arguments
	// (protocol.DecodeApplyPatchArgs, strict).
	Args json.RawMessage `json:"args"`
	// Security is the gateway's resolved security; the node only
	// tightens it.
	Security string `json:"security,omitempty"`
}

// ProcessRequest is a process action on a node session (endpoint process).
type ProcessRequest struct {
	SessionKey string `json:"sessionKey"`
	// Args are the process tool arguments (protocol.DecodeProcessArgs).
	Args json.RawMessage `json:"args"`
}

// ListRequest asks for the node's sessions (endpoint list): those of one
// sessionKey, or with All every session the node holds (the gateway's
// resynchronisation after a restart or a reconnect).
type ListRequest struct {
	SessionKey string `json:"sessionKey,omitempty"`
	All        bool   `json:"all,omitempty"`
	// Limit, when above 0, asks for only the Limit newest entries of each
	// sessionKey (process list order), for a gateway answering a paged
	// list: the offset+limit of its caller. 0 lists everything.
	Limit int `json:"limit,omitempty"`
}

// ListResponse answers a ListRequest.
type ListResponse struct {
	NodeID string `json:"nodeId"`
	// Instance identifies this run of the node agent; it changes when the
	// agent restarts, and with it every session the node held is gone.
	Instance string          `json:"instance"`
	Sessions []ListedSession `json:"sessions"`
	// Total is, with a Limit, how many entries the sessionKeys listed
	// have in all, Limit aside.
	Total int `json:"total,omitempty"`
	// Partial is set when Limit left entries out: a session not in
	// Sessions may still exist on the node.
	Partial bool `json:"partial,omitempty"`
}

// ListedSession is one session of a ListResponse: its scope and its
// process-list entry.
type ListedSession struct {
	SessionKey string           `json:"sessionKey"`
	Details    protocol.Details `json:"details"`
}

// WhichRequest asks where binaries are on the node's PATH (endpoint which).
type WhichRequest struct {
	Bins []string `json:"bins"`
}

// WhichResponse maps each binary found to its path; names with a path
// separator and binaries not found are left out.
type WhichResponse struct {
	Bins map[string]string `json:"bins"`
}

// PairingNotice is the gateway's word on the node's pairing (endpoint
// pairing), sent when an operator approves or rejects the node.
type PairingNotice struct {
	Status string `json:"status"`
}

// Heartbeat is what a node publishes on <prefix>.presence.<id> every
// heartbeat interval.
type Heartbeat struct {
	NodeID    string `json:"nodeId"`
	PublicKey string `json:"publicKey"`
	Name      string `json:"name"`
	Platform  string `json:"platform"`
	Hostname  string `json:"hostname,omitempty"`
	Version   string `json:"version,omitempty"`
	// Instance changes on every start of the agent (see ListResponse).
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
}

// PairRequest is sent on <prefix>.pair.request: a node announcing itself
// (Type PairAnnounce) or redeeming a join code (Type PairJoin).
type PairRequest struct {
	Type      string `json:"type"`
	NodeID    string `json:"nodeId"`
	PublicKey string `json:"publicKey"`
	Name      string `json:"name"`
	Platform  string `json:"platform"`
	Version   string `json:"version,omitempty"`
	Instance  string `json:"instance,omitempty"`
	// JoinUser and JoinSecret come from the join code (PairJoin only).
	JoinUser   string `json:"joinUser,omitempty"`
	JoinSecret string `json:"joinSecret,omitempty"`
	// Signature proves the node holds the seed of PublicKey: the nkey
	// signature, base64url, of JoinSignedText(JoinSecret, PublicKey)
	// (PairJoin only).
	Signature string `json:"signature,omitempty"`
}

// JoinSignedText is the text a joining node signs with its nkey.
func JoinSignedText(secret, publicKey string) []byte {
	return []byte("execmesh-join:" + secret + ":" + publicKey)
}

// PairResponse answers a PairRequest.
type PairResponse struct {
	Status  string `json:"status"` // PairingPending, PairingPaired or PairingRejected
	NodeID  string `json:"nodeId"`
	Message string `json:"message,omitempty"`
	// Error is set when the request was refused (a join code that is
	// unknown, expired or already used, a bad signature, …).
	Error *protocol.Error `json:"error,omitempty"`
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

// decodeStrict decodes one JSON object into v, refusing unknown fields,
// wrong types and trailing data, with an *protocol.Error that says what
// was wrong.
func decodeStrict(what string, data []byte, v any) error {
	data = bytes.TrimSpace(data)
	if len(data) == 0 || data[0] != '{' {
		return protocol.Errorf(protocol.ErrInvalidRequest, "%s: request must be a JSON object", what)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return protocol.Errorf(protocol.ErrInvalidRequest, "%s: field %q must be %s", what, te.Field, jsonKind(te.Type.Kind().String()))
		}
		return protocol.Errorf(protocol.ErrInvalidRequest, "%s: malformed request: %v", what, err)
	}
	if dec.More() {
		return protocol.Errorf(protocol.ErrInvalidRequest, "%s: trailing data after the JSON object", what)
	}
	return nil
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	case "slice":
		return "an array"
	case "map", "struct":
		return "an object"
	default:
		return "a " + goKind
	}
}

// errorData is the data of a micro error reply: the JSON of e.
func errorData(e *protocol.Error) []byte {
	b, err := json.Marshal(e)
	if err != nil {
		return nil
	}
	return b
}

// errorCode is the micro error code of e: its HTTP status.
func errorCode(e *protocol.Error) string {
	return fmt.Sprint(e.Type.HTTPStatus())
}
