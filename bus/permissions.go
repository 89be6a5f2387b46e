package bus

import (
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/execmesh/execmesh/protocol"
)

// responseTTL is how long a node may answer a request it received. A
// foreground exec answers after at most its yield window (120 s), and a
// chunked answer is several messages, so the server's default of one
// message within 2 minutes is too tight.
const responseTTL = 5 * time.Minute

// InboxPrefix returns the reply-inbox prefix for a confined identity,
// "_INBOX.c-<id>": a node (id = node id) or a joining machine (id = its
// one-time user name) sets it as ClientConfig.InboxPrefix, and its
// permissions let it subscribe only below it, so it can never read the
// replies meant for the gateway or for other nodes. The '-' keeps it apart
// from every inbox nats.go makes by default ("_INBOX.<nuid>", base62
// only), whatever the id.
func InboxPrefix(id string) string { return nodeInboxPrefix(id) }

// GatewayPermissions is what a gateway needs on a shared NATS system
// (the users entry `execmesh nodes credentials --gateway` writes, and
// deploy/nats/cluster/auth.conf's): everything under its prefix (tool
// API, node endpoints, presence, pairing, events, the other gateways'
// hosts), the JetStream API (it creates the streams and buckets and reads
// them), acknowledgements and flow control of its streams' consumers,
// every KV bucket of the prefix, micro discovery (it serves a service and
// finds the nodes') and inboxes (its replies and its answers to nodes).
func GatewayPermissions(prefix string) *server.Permissions {
	n := StreamNamesFor(prefix)
	pub := []string{prefix + ".>", "$JS.API.>", "$JS.FC.>", "$JS.ACK." + n.Exit + ".>", "$JS.ACK." + n.Events + ".>"}
	for _, b := range n.Buckets() {
		pub = append(pub, "$KV."+b+".>")
	}
	pub = append(pub, "$SRV.>", "_INBOX.>")
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: pub},
		Subscribe: &server.SubjectPermission{Allow: []string{prefix + ".>", "$SRV.>", "_INBOX.>"}},
	}
}

// NodePermissions confines a node agent to its own subjects:
//
// publish:
//
//	<prefix>.presence.<id>                 heartbeats
//	<prefix>.events.exit.<id>              exit events (a JetStream publish
//	                                       needs only this plus an inbox for the ack)
//	<prefix>.pair.request                  pairing
//	<prefix>.nstream.<id>.>                output of its sessions' streams
//	                                       (hostbus; input arrives on
//	                                       <prefix>.node.<id>.stream.*)
//
// subscribe:
//
//	<prefix>.node.<id>.>                   its micro endpoints
//	_INBOX.c-<id>.>                        replies (see InboxPrefix)
//	$SRV.PING|INFO|STATS[.execmesh-node[.*]]  micro discovery
//
// and replies to any request it received (allow_responses, any number of
// messages within 5 minutes, for chunked replies). Everything else — other
// nodes' subjects, the gateway's tool API, other inboxes, the JetStream
// API — is refused with a permissions violation.
//
// prefix and nodeID must pass protocol.ValidateSubjectPrefix and
// protocol.ValidateNodeID (NodeIDFromPublicKey's ids do); anything else is
// refused, since a crafted id such as "*" would widen the grant.
func NodePermissions(prefix, nodeID string) (*server.Permissions, error) {
	if err := validPrefix(prefix); err != nil {
		return nil, err
	}
	if err := validID(nodeID); err != nil {
		return nil, err
	}
	subj := protocol.Subjects(prefix)
	return &server.Permissions{
		Publish: &server.SubjectPermission{Allow: []string{
			subj.PresenceOf(nodeID),
			subj.ExitEventsOf(nodeID),
			subj.PairRequest,
			subj.NodeStreamsOf(nodeID),
		}},
		Subscribe: &server.SubjectPermission{Allow: []string{
			subj.NodeAll(nodeID),
			nodeInboxPrefix(nodeID) + ".>",
			"$SRV.PING", "$SRV.INFO", "$SRV.STATS",
			subjSrvName("*", NodeServiceName),
			subjSrv("*", NodeServiceName, "*"),
		}},
		Response: &server.ResponsePermission{MaxMsgs: -1, Expires: responseTTL},
	}, nil
}

// NodeUser returns the server identity of the node holding publicKey,
// with NodePermissions for the id derived from that key. Use it (rather
// than NodePermissions with an id from elsewhere) when admitting a node.
func NodeUser(prefix, publicKey string) (NKeyUser, error) {
	id, err := NodeIDFromPublicKey(publicKey)
	if err != nil {
		return NKeyUser{}, err
	}
	p, err := NodePermissions(prefix, id)
	if err != nil {
		return NKeyUser{}, err
	}
	return NKeyUser{PublicKey: publicKey, Permissions: p}, nil
}

// JoinPermissions confines the one-time user of a join code (name is its
// user name): it may only send <prefix>.pair.request and read the reply
// under InboxPrefix(name). The joining machine sends its node public key
// there; the gateway admits the key with AddNKeyUser(NodeUser(…)) and
// removes the one-time user.
func JoinPermissions(prefix, name string) (*server.Permissions, error) {
	if err := validPrefix(prefix); err != nil {
		return nil, err
	}
	if err := validID(name); err != nil {
		return nil, err
	}
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{protocol.Subjects(prefix).PairRequest}},
		Subscribe: &server.SubjectPermission{Allow: []string{nodeInboxPrefix(name) + ".>"}},
	}, nil
}

// OperatorPermissions confines the operator's identity on the embedded
// server (OperatorKeyFile), the one an operator gives the nats CLI. It
// may watch every subject (presence, events, node traffic, replies) and
// ask:
//
//	<prefix>.gw.invoke                     tool calls (the gateway checks the token)
//	$SRV.>                                 micro discovery and stats (nats micro ls|info|stats)
//	$JS.API.INFO, STREAM.NAMES|LIST|INFO.*, CONSUMER.NAMES|LIST.*, CONSUMER.INFO.*.*
//	$JS.API.DIRECT.GET.>, STREAM.MSG.GET.*  JetStream and KV reads (nats stream ls|info|get, nats kv ls|get)
//
// and nothing else: no request to a node's subjects (only the gateway's
// identity sends work and decisions there), no heartbeat, event, pairing
// or KV write in anyone's name, no JetStream change.
func OperatorPermissions(prefix string) (*server.Permissions, error) {
	if err := validPrefix(prefix); err != nil {
		return nil, err
	}
	return &server.Permissions{
		Publish: &server.SubjectPermission{Allow: []string{
			protocol.Subjects(prefix).Invoke,
			"$SRV.>",
			"$JS.API.INFO",
			"$JS.API.STREAM.NAMES",
			"$JS.API.STREAM.LIST",
			"$JS.API.STREAM.INFO.*",
			"$JS.API.STREAM.MSG.GET.*",
			"$JS.API.DIRECT.GET.>",
			"$JS.API.CONSUMER.NAMES.*",
			"$JS.API.CONSUMER.LIST.*",
			"$JS.API.CONSUMER.INFO.*.*",
		}},
		Subscribe: &server.SubjectPermission{Allow: []string{">"}},
	}, nil
}
