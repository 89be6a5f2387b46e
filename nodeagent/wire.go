package nodeagent

import (
	"github.com/execmesh/execmesh/hostbus"
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

// decodeStrict is hostbus.DecodeStrict.
func decodeStrict(what string, data []byte, v any) error {
	return hostbus.DecodeStrict(what, data, v)
}
