// Package protocol holds the wire contract shared by the execmesh gateway and
// its node agents: tool request and result types with their JSON names,
// strict argument decoding, error kinds, system and exit events, the
// exit-notification text, host environment policy, NATS subject names, and
// the messages, headers and endpoint names of the node protocol (node.go).
//
// It imports only the standard library. Nothing else is shared between the
// gateway and a node agent.
package protocol
