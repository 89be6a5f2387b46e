package protocol

import (
	"encoding/base64"
	"strings"
)

// NATS subjects. Every subject starts with a configurable prefix (default
// "execmesh") so that several installations can share one NATS account:
//
//	<prefix>.gw.invoke                    tool invoke request (the body of POST /tools/invoke); reply = result
//	<prefix>.gw.events.<sessionKeyToken>  system events the gateway publishes for one sessionKey
//	<prefix>.node.<nodeId>.<endpoint>     a node's service group (nats micro), endpoints:
//	                                        exec, process, approvals.get, approvals.set, which,
//	                                        list, pairing, applypatch, ping, attach
//	<prefix>.node.<nodeId>.stream.<id>    input of one of the node's streams (gateway → node)
//	<prefix>.nstream.<nodeId>.<id>        output of one of the node's streams (node → gateway)
//	<prefix>.presence.<nodeId>            node heartbeats
//	<prefix>.events.exit.<nodeId>         exit events of a node's sessions (JetStream, durable)
//	<prefix>.pair.request                 pairing requests of nodes not yet approved
//
// A node's credentials need only its own subjects: subscribe
// <prefix>.node.<nodeId>.>, publish <prefix>.presence.<nodeId>,
// <prefix>.events.exit.<nodeId>, <prefix>.nstream.<nodeId>.> and
// <prefix>.pair.request (plus its reply inbox). Prefixes and node ids are
// single subject tokens (ValidateSubjectPrefix, ValidateNodeID); a
// sessionKey is carried as one token with EncodeSessionKeyToken.

// DefaultSubjectPrefix is the subject prefix when none is configured.
const DefaultSubjectPrefix = "execmesh"

// Endpoints of a node's service group, appended to SubjectSet.NodeGroup.
// Some contain a dot: they are subject suffixes, not micro endpoint names.
const (
	NodeEndpointExec         = "exec"          // start a command; ExecRequest → ExecReply
	NodeEndpointProcess      = "process"       // a process action on a node session; ProcessRequest → ProcessReply
	NodeEndpointApprovalsGet = "approvals.get" // read the node's exec-approvals.json
	NodeEndpointApprovalsSet = "approvals.set" // replace it, given the current hash
	NodeEndpointWhich        = "which"         // resolve binaries on the node's PATH; NodeWhichRequest → NodeWhichResponse
	NodeEndpointList         = "list"          // list the node's sessions; ListRequest → ListReply
	NodeEndpointPairing      = "pairing"       // the gateway tells the node its pairing status; NodePairingNotice → {}
	NodeEndpointApplyPatch   = "applypatch"    // apply a patch on the node; ApplyPatchRequest → Result
	NodeEndpointPing         = "ping"          // the gateway's liveness probe; {} → PingReply
	NodeEndpointAttach       = "attach"        // open a stream of a node session (hostbus); → the started Control
)

// Limits on the tokens this package validates. NATS has no such small limit;
// these keep subjects, credentials and logs readable.
const (
	maxSubjectPrefixLen = 64
	maxNodeIDLen        = 128
	maxStreamIDLen      = 64
)

// SubjectSet holds the subject names of one installation. Build it with
// Subjects; the zero value is not useful.
type SubjectSet struct {
	Prefix        string // the validated prefix, e.g. "execmesh"
	Invoke        string // <prefix>.gw.invoke
	GatewayEvents string // <prefix>.gw.events.* : every sessionKey's events
	PairRequest   string // <prefix>.pair.request
	Presence      string // <prefix>.presence.* : every node's heartbeats
	ExitEvents    string // <prefix>.events.exit.* : subjects of the exit-event stream
	SystemEvents  string // <prefix>.sysev.* : the system-event queues, one subject per sessionKey token
	Nodes         string // <prefix>.node.> : every node endpoint
}

// Subjects returns the subject names for prefix; an empty prefix means
// DefaultSubjectPrefix. It does not validate: call ValidateSubjectPrefix on
// configured values first (a bad prefix gives subjects that match the wrong
// things).
func Subjects(prefix string) SubjectSet {
	if prefix == "" {
		prefix = DefaultSubjectPrefix
	}
	return SubjectSet{
		Prefix:        prefix,
		Invoke:        prefix + ".gw.invoke",
		GatewayEvents: prefix + ".gw.events.*",
		PairRequest:   prefix + ".pair.request",
		Presence:      prefix + ".presence.*",
		ExitEvents:    prefix + ".events.exit.*",
		SystemEvents:  prefix + ".sysev.*",
		Nodes:         prefix + ".node.>",
	}
}

// SystemEventsFor returns the subject of sessionKey's event queue:
// <prefix>.sysev.<EncodeSessionKeyToken(sessionKey)>.
func (s SubjectSet) SystemEventsFor(sessionKey string) string {
	return s.Prefix + ".sysev." + EncodeSessionKeyToken(sessionKey)
}

// GatewayEventsFor returns the subject of the system events for
// sessionKey: <prefix>.gw.events.<EncodeSessionKeyToken(sessionKey)>.
func (s SubjectSet) GatewayEventsFor(sessionKey string) string {
	return s.Prefix + ".gw.events." + EncodeSessionKeyToken(sessionKey)
}

// NodeGroup returns <prefix>.node.<nodeID>, the group of a node's micro
// service.
func (s SubjectSet) NodeGroup(nodeID string) string {
	return s.Prefix + ".node." + nodeID
}

// Node returns the subject of one endpoint of a node:
// <prefix>.node.<nodeID>.<endpoint>, endpoint being one of the
// NodeEndpoint constants.
func (s SubjectSet) Node(nodeID, endpoint string) string {
	return s.Prefix + ".node." + nodeID + "." + endpoint
}

// NodeAll returns <prefix>.node.<nodeID>.>, every endpoint of one node (for
// its subscribe permission).
func (s SubjectSet) NodeAll(nodeID string) string {
	return s.Prefix + ".node." + nodeID + ".>"
}

// PresenceOf returns <prefix>.presence.<nodeID>, where the node publishes
// its heartbeats.
func (s SubjectSet) PresenceOf(nodeID string) string {
	return s.Prefix + ".presence." + nodeID
}

// ExitEventsOf returns <prefix>.events.exit.<nodeID>, where the node
// publishes the exit events of its sessions to JetStream.
func (s SubjectSet) ExitEventsOf(nodeID string) string {
	return s.Prefix + ".events.exit." + nodeID
}

// NodeStreamIn returns <prefix>.node.<nodeID>.stream.<streamID>, where
// the gateway sends the input frames of one of the node's streams (inside
// the node's subscribe permission, NodeAll).
func (s SubjectSet) NodeStreamIn(nodeID, streamID string) string {
	return s.Prefix + ".node." + nodeID + ".stream." + streamID
}

// NodeStreamOut returns <prefix>.nstream.<nodeID>.<streamID>, where the
// node publishes the output frames of one of its streams.
func (s SubjectSet) NodeStreamOut(nodeID, streamID string) string {
	return s.Prefix + ".nstream." + nodeID + "." + streamID
}

// NodeStreamsOf returns <prefix>.nstream.<nodeID>.>, the output of every
// stream of one node (for its publish permission).
func (s SubjectSet) NodeStreamsOf(nodeID string) string {
	return s.Prefix + ".nstream." + nodeID + ".>"
}

// ParseNodeGroup splits a node's group, <prefix>.node.<nodeID> (NodeGroup),
// into its prefix and node id, both validated. The error is an *Error of
// type ErrInvalidRequest.
func ParseNodeGroup(group string) (prefix, nodeID string, err error) {
	prefix, rest, ok := strings.Cut(group, ".node.")
	if !ok || ValidateSubjectPrefix(prefix) != nil || ValidateNodeID(rest) != nil {
		return "", "", Errorf(ErrInvalidRequest, "%q is not a node group (<prefix>.node.<nodeId>)", group)
	}
	return prefix, rest, nil
}

// ValidateStreamID checks the id of a stream carried over NATS
// (StreamSpec.ID, AttachRequest.StreamID): 1 to 64 letters, digits, '-'
// or '_', one subject token. The error is an *Error of type
// ErrInvalidRequest.
func ValidateStreamID(id string) error {
	if !isIDToken(id, maxStreamIDLen) {
		return Errorf(ErrInvalidRequest, "invalid stream id %q: want 1 to %d letters, digits, '-' or '_'", id, maxStreamIDLen)
	}
	return nil
}

// ValidateSubjectPrefix checks a configured subject prefix: one NATS subject
// token of 1 to 64 letters, digits, '-' or '_' (so no spaces, dots, '*',
// '>' or the '$' of system subjects). The error is an *Error of type
// ErrInvalidRequest.
func ValidateSubjectPrefix(prefix string) error {
	if !isIDToken(prefix, maxSubjectPrefixLen) {
		return Errorf(ErrInvalidRequest, "invalid subject prefix %q: want 1 to %d letters, digits, '-' or '_'", prefix, maxSubjectPrefixLen)
	}
	return nil
}

// ValidateNodeID checks a node id: 1 to 128 characters of [A-Za-z0-9_-],
// which makes it one subject token and a valid micro service name part. The
// error is an *Error of type ErrInvalidRequest.
func ValidateNodeID(id string) error {
	if !isIDToken(id, maxNodeIDLen) {
		return Errorf(ErrInvalidRequest, "invalid node id %q: want 1 to %d letters, digits, '-' or '_'", id, maxNodeIDLen)
	}
	return nil
}

func isIDToken(s string, maxLen int) bool {
	if s == "" || len(s) > maxLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// emptySessionKeyToken stands for the empty sessionKey. base64 never
// encodes anything as a single character, so it cannot collide.
const emptySessionKeyToken = "_"

// sessionKeyEncoding is unpadded base64url: its alphabet [A-Za-z0-9_-] is
// safe in a subject token, and Strict decoding admits one token per key.
var sessionKeyEncoding = base64.RawURLEncoding.Strict()

// EncodeSessionKeyToken encodes a sessionKey such as "agent:main:main",
// which may hold dots, spaces or wildcards, as one subject token: unpadded
// base64url of its bytes ("YWdlbnQ6bWFpbjptYWlu"), or "_" for the empty key.
// Each key has exactly one token, so a subscription or a permission on the
// token covers that key and no other.
func EncodeSessionKeyToken(sessionKey string) string {
	if sessionKey == "" {
		return emptySessionKeyToken
	}
	return sessionKeyEncoding.EncodeToString([]byte(sessionKey))
}

// DecodeSessionKeyToken reverses EncodeSessionKeyToken. It refuses any
// token EncodeSessionKeyToken would not have produced; the error is an
// *Error of type ErrInvalidRequest.
func DecodeSessionKeyToken(token string) (string, error) {
	if token == emptySessionKeyToken {
		return "", nil
	}
	// The decoder skips CR and LF; insist on the alphabet so that no
	// second spelling of a token decodes.
	if !isIDToken(token, len(token)) {
		return "", Errorf(ErrInvalidRequest, "invalid sessionKey token %q", token)
	}
	b, err := sessionKeyEncoding.DecodeString(token)
	if err != nil || len(b) == 0 {
		return "", Errorf(ErrInvalidRequest, "invalid sessionKey token %q", token)
	}
	return string(b), nil
}
