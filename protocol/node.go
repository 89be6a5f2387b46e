package protocol

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
	// GatewayKeys are the public keys the gateways sign approval
	// decisions with. A node that trusts none yet takes them from the
	// first notice of its pairing (its subject accepts only gateway
	// identities); later it keeps the keys it has.
	GatewayKeys []string `json:"gatewayKeys,omitempty"`
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
	// Instance changes on every start of the agent: a new one means the
	// sessions of the old run are gone.
	Instance  string `json:"instance"`
	StartedAt int64  `json:"startedAt"` // unix ms
	// Sessions is the number of sessions the node holds.
	Sessions int `json:"sessions"`
	// Server is the NATS server the node is connected to.
	Server string `json:"server,omitempty"`
	// IntervalMs is the node's heartbeat interval, so the gateway can
	// tell a late heartbeat from a lost node.
	IntervalMs int64 `json:"intervalMs"`
	// Containment is how the node's session core contains process
	// trees ("cgroup" or "process-group").
	Containment string `json:"containment,omitempty"`
	// Confinement is how the node holds security allowlist runs:
	// "landlock" (the kernel) or "ask" (every program that is not a safe
	// bin needs approval); ConfinementReason says why for "ask".
	Confinement       string `json:"confinement,omitempty"`
	ConfinementReason string `json:"confinementReason,omitempty"`
	TS                int64  `json:"ts"` // unix ms
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
	// GatewayKeys, on the answer to a paired node, are the keys the
	// gateways sign approval decisions with.
	GatewayKeys []string `json:"gatewayKeys,omitempty"`
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
	// GatewayKeys are the keys the gateways sign approval decisions with;
	// the joined node trusts them.
	GatewayKeys []string `json:"gatewayKeys,omitempty"`
}
