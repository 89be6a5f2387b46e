package nodeagent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/execmesh/execmesh/protocol"
)

// The messages a node agent exchanges with a gateway are defined once, in
// the protocol package (protocol/node.go); the names below are aliases of
// those types and constants, kept so that callers of nodeagent can go on
// using them.
//
// Every request is JSON and decoded strictly (decodeStrict): unknown
// fields, wrong types and trailing data are refused with a micro error
// reply whose code is the HTTP status of the error type ("400", "404",
// "409", "503") and whose data is the JSON of a *protocol.Error, so the
// gateway can hand the very same error to its caller.

// Header names and values of the node protocol.
const (
	// HeaderIdempotencyKey is protocol.NodeHeaderIdempotencyKey.
	HeaderIdempotencyKey = protocol.NodeHeaderIdempotencyKey
	// HeaderSession is protocol.NodeHeaderSession.
	HeaderSession = protocol.NodeHeaderSession
	// SessionGone is protocol.NodeSessionGone.
	SessionGone = protocol.NodeSessionGone
	// HeaderInstance is protocol.NodeHeaderInstance.
	HeaderInstance = protocol.NodeHeaderInstance
)

// Endpoint names of a node's micro service, below the group
// <prefix>.node.<id>. Names with a dot are subject suffixes; their micro
// endpoint names use '-' instead (micro allows no dots in names).
const (
	EndpointExec         = protocol.NodeEndpointExec         // ExecRequest → protocol.Result
	EndpointProcess      = protocol.NodeEndpointProcess      // ProcessRequest → protocol.Result
	EndpointList         = protocol.NodeEndpointList         // ListRequest → ListResponse
	EndpointApprovalsGet = protocol.NodeEndpointApprovalsGet // {} → the exec-approvals file
	EndpointApprovalsSet = protocol.NodeEndpointApprovalsSet // {file, baseHash} → the new file
	EndpointWhich        = protocol.NodeEndpointWhich        // WhichRequest → WhichResponse
	EndpointPairing      = protocol.NodeEndpointPairing      // PairingNotice → {} (gateway tells the node its pairing status)
	EndpointApplyPatch   = protocol.NodeEndpointApplyPatch   // ApplyPatchRequest → protocol.Result
)

// Pairing states, as the gateway reports them (protocol.NodePairing*).
const (
	PairingPending  = protocol.NodePairingPending  // waiting for an operator
	PairingPaired   = protocol.NodePairingPaired   // approved
	PairingRejected = protocol.NodePairingRejected // refused
)

// Pair request types (protocol.NodePairAnnounce, protocol.NodePairJoin).
const (
	PairAnnounce = protocol.NodePairAnnounce // a node presents itself; the gateway answers its pairing status
	PairJoin     = protocol.NodePairJoin     // a node redeems a join code
)

// Decisions an ExecApproval carries (protocol.NodeDecision*).
const (
	DecisionAllowOnce   = protocol.NodeDecisionAllowOnce   // run this once
	DecisionAllowAlways = protocol.NodeDecisionAllowAlways // run, and allowlist the binaries
	DecisionTimeout     = protocol.NodeDecisionTimeout     // nobody answered: the node applies its askFallback
)

// ErrApprovalRequired is protocol.ErrApprovalRequired.
const ErrApprovalRequired = protocol.ErrApprovalRequired

// ExecRequest is protocol.NodeExecRequest.
type ExecRequest = protocol.NodeExecRequest

// ExecApproval is protocol.NodeExecApproval.
type ExecApproval = protocol.NodeExecApproval

// ApprovalRequired is protocol.NodeApprovalRequired.
type ApprovalRequired = protocol.NodeApprovalRequired

// ApplyPatchRequest is protocol.NodeApplyPatchRequest.
type ApplyPatchRequest = protocol.NodeApplyPatchRequest

// ProcessRequest is protocol.NodeProcessRequest.
type ProcessRequest = protocol.NodeProcessRequest

// ListRequest is protocol.NodeListRequest.
type ListRequest = protocol.NodeListRequest

// ListResponse is protocol.NodeListResponse.
type ListResponse = protocol.NodeListResponse

// ListedSession is protocol.NodeListedSession.
type ListedSession = protocol.NodeListedSession

// WhichRequest is protocol.NodeWhichRequest.
type WhichRequest = protocol.NodeWhichRequest

// WhichResponse is protocol.NodeWhichResponse.
type WhichResponse = protocol.NodeWhichResponse

// PairingNotice is protocol.NodePairingNotice.
type PairingNotice = protocol.NodePairingNotice

// Heartbeat is protocol.NodeHeartbeat.
type Heartbeat = protocol.NodeHeartbeat

// PairRequest is protocol.NodePairRequest.
type PairRequest = protocol.NodePairRequest

// PairResponse is protocol.NodePairResponse.
type PairResponse = protocol.NodePairResponse

// JoinCode is protocol.JoinCode.
type JoinCode = protocol.JoinCode

// JoinSignedText is protocol.JoinSignedText: the text a joining node signs
// with its nkey.
func JoinSignedText(secret, publicKey string) []byte {
	return protocol.JoinSignedText(secret, publicKey)
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
