package openclawnode

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Frame types of the gateway protocol.
const (
	FrameReq   = "req"
	FrameRes   = "res"
	FrameEvent = "event"
)

// Error codes the node answers with (OpenClaw's ErrorCodes and node-host
// codes).
const (
	CodeInvalidRequest  = "INVALID_REQUEST"
	CodeUnavailable     = "UNAVAILABLE"
	CodeSystemRunDenied = "SYSTEM_RUN_DENIED"
	CodeMCPToolError    = "MCP_TOOL_ERROR"
	CodeTimeout         = "TIMEOUT"
)

// Frame is one JSON frame of the protocol: a request {type:"req", id,
// method, params}, a response {type:"res", id, ok, payload | error} or an
// event {type:"event", event, payload, seq}.
type Frame struct {
	Type    string          `json:"type"`
	ID      string          `json:"id,omitempty"`
	Method  string          `json:"method,omitempty"`
	Params  json.RawMessage `json:"params,omitempty"`
	OK      *bool           `json:"ok,omitempty"`
	Payload json.RawMessage `json:"payload,omitempty"`
	Error   *ErrorShape     `json:"error,omitempty"`
	Event   string          `json:"event,omitempty"`
	Seq     *int64          `json:"seq,omitempty"`
}

// ErrorShape is the error of a response frame or of node.invoke.result.
type ErrorShape struct {
	Code    string          `json:"code,omitempty"`
	Message string          `json:"message,omitempty"`
	Details json.RawMessage `json:"details,omitempty"`
}

func (e *ErrorShape) Error() string {
	if e == nil {
		return "<nil>"
	}
	s := e.Code + ": " + e.Message
	if len(e.Details) > 0 {
		s += " " + string(e.Details)
	}
	return s
}

// DecodeFrame decodes and checks one frame: a known type, an id on
// requests and responses, a method on requests, an event name on events,
// ok on responses.
func DecodeFrame(data []byte) (Frame, error) {
	var f Frame
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&f); err != nil {
		return Frame{}, fmt.Errorf("malformed frame: %w", err)
	}
	if dec.More() {
		return Frame{}, fmt.Errorf("malformed frame: data after the JSON object")
	}
	switch f.Type {
	case FrameReq:
		if f.ID == "" || f.Method == "" {
			return Frame{}, fmt.Errorf("request frame without id or method")
		}
	case FrameRes:
		if f.ID == "" || f.OK == nil {
			return Frame{}, fmt.Errorf("response frame without id or ok")
		}
	case FrameEvent:
		if f.Event == "" {
			return Frame{}, fmt.Errorf("event frame without an event name")
		}
	default:
		return Frame{}, fmt.Errorf("frame of unknown type %q", f.Type)
	}
	return f, nil
}

// requestFrame builds a request frame.
func requestFrame(id, method string, params any) ([]byte, error) {
	p, err := json.Marshal(params)
	if err != nil {
		return nil, fmt.Errorf("encode %s params: %w", method, err)
	}
	return json.Marshal(Frame{Type: FrameReq, ID: id, Method: method, Params: p})
}

// errorResponse builds the response refusing a request.
func errorResponse(id, code, message string) []byte {
	no := false
	b, _ := json.Marshal(Frame{Type: FrameRes, ID: id, OK: &no, Error: &ErrorShape{Code: code, Message: message}})
	return b
}

// Challenge is the payload of the connect.challenge event.
type Challenge struct {
	Nonce string `json:"nonce"`
	TS    int64  `json:"ts"`
}

// maxNonceLen bounds a challenge nonce: OpenClaw's are UUIDs.
const maxNonceLen = 256

// ConnectParams are the params of the connect request of a node host.
type ConnectParams struct {
	MinProtocol int           `json:"minProtocol"`
	MaxProtocol int           `json:"maxProtocol"`
	Client      ClientInfo    `json:"client"`
	Caps        []string      `json:"caps"`
	Commands    []string      `json:"commands"`
	Role        string        `json:"role"`
	Scopes      []string      `json:"scopes"`
	Auth        *ConnectAuth  `json:"auth,omitempty"`
	Device      *DeviceParams `json:"device,omitempty"`
	PathEnv     string        `json:"pathEnv,omitempty"`
}

// ClientInfo is ConnectParams.client.
type ClientInfo struct {
	ID           string `json:"id"`
	DisplayName  string `json:"displayName,omitempty"`
	Version      string `json:"version"`
	Platform     string `json:"platform"`
	DeviceFamily string `json:"deviceFamily,omitempty"`
	Mode         string `json:"mode"`
	InstanceID   string `json:"instanceId,omitempty"`
}

// ConnectAuth is ConnectParams.auth: the gateway token, or the device
// token of an earlier hello-ok.
type ConnectAuth struct {
	Token       string `json:"token,omitempty"`
	DeviceToken string `json:"deviceToken,omitempty"`
}

// DeviceParams is ConnectParams.device: the signed identity.
type DeviceParams struct {
	ID        string `json:"id"`
	PublicKey string `json:"publicKey"`
	Signature string `json:"signature"`
	SignedAt  int64  `json:"signedAt"`
	Nonce     string `json:"nonce"`
}

// HelloOK is the payload of the connect response (the fields the node
// uses).
type HelloOK struct {
	Type     string `json:"type"`
	Protocol int    `json:"protocol"`
	Server   struct {
		Version string `json:"version"`
		ConnID  string `json:"connId"`
	} `json:"server"`
	Auth *struct {
		DeviceToken string   `json:"deviceToken"`
		Role        string   `json:"role"`
		Scopes      []string `json:"scopes"`
	} `json:"auth"`
	Policy struct {
		TickIntervalMs int64 `json:"tickIntervalMs"`
		MaxPayload     int64 `json:"maxPayload"`
	} `json:"policy"`
}

// InvokeRequest is the payload of the node.invoke.request event.
type InvokeRequest struct {
	ID             string  `json:"id"`
	NodeID         string  `json:"nodeId"`
	Command        string  `json:"command"`
	ParamsJSON     *string `json:"paramsJSON"`
	TimeoutMs      *int64  `json:"timeoutMs"`
	IdempotencyKey *string `json:"idempotencyKey"`
	SessionKey     string  `json:"sessionKey,omitempty"`
}

// InvokeResult is the params of the node.invoke.result request.
type InvokeResult struct {
	ID          string      `json:"id"`
	NodeID      string      `json:"nodeId"`
	OK          bool        `json:"ok"`
	PayloadJSON string      `json:"payloadJSON,omitempty"`
	Error       *ErrorShape `json:"error,omitempty"`
}

// InvokeCancel is the payload of the node.invoke.cancel event.
type InvokeCancel struct {
	InvokeID string `json:"invokeId"`
	NodeID   string `json:"nodeId"`
}

// NodeEvent is the params of the node.event request.
type NodeEvent struct {
	Event       string `json:"event"`
	PayloadJSON string `json:"payloadJSON"`
}
