// Package bus is execmesh's NATS wiring: the embedded nats-server, client
// connections with daemon settings, chunked request/reply under the
// server's max_payload, node identities and confined permissions, and the
// JetStream assets.
//
// # Server
//
// StartServer runs an embedded nats-server (DefaultServerConfig: loopback
// 127.0.0.1:4222, JetStream on, store under <state-dir>/nats). It never
// handles signals itself (NoSigs), routes the server's log to slog, waits
// for readiness, and refuses to listen beyond loopback without
// authentication. Server.Shutdown is idempotent and waits for the server
// to finish. Identities can be replaced live (ReloadUsers, AddNKeyUser,
// RemoveNKeyUser, AddUser, RemoveUser) without a configuration reload:
// the server admits clients through its own authenticator, so identity
// changes never race with the server's JetStream work; the authentication
// mode itself (on/off) is fixed at start.
//
// # Clients
//
// Connect reconnects forever with capped, jittered back-off, retries a
// failed first connection and logs connection events. A failed attempt is
// a warning when its reason changes (at most every 30 s otherwise); where
// nats.go's reason hides a server certificate that does not verify
// ("nkeys not supported by the server", given before the TLS handshake),
// Connect checks the certificates and logs the x509 reason with the
// server's URL. A blocking Connect logs "waiting for NATS" while it
// waits. Subscriptions that
// carry output should get SetPendingLimits (PendingMsgsLimit,
// PendingBytesLimit) instead of nats.go's smaller defaults. A same-process
// client passes ClientConfig.InProcess and skips TCP.
//
// # Subjects
//
// protocol.Subjects builds the subject names. With prefix p (DefaultPrefix
// "execmesh") and node id <id>:
//
//	p.gw.invoke           tool calls to the gateway
//	p.node.<id>.>         the node's micro service (name NodeServiceName, group p.node.<id>)
//	p.presence.<id>       heartbeats
//	p.events.exit.<id>    exit events, in the JetStream stream StreamNames.Exit
//	p.pair.request        pairing and join requests
//	_INBOX.c-<id>.>       a confined identity's reply inbox (InboxPrefix)
//
// # Chunked replies
//
// A reply larger than ChunkSize(nc) is sent by RespondChunked as parts on
// the reply subject, each with the header HeaderChunk = "i/n" (1-based);
// the first part also carries the caller's headers. A reply that fits in
// one message goes out plain (the caller's headers alone). RequestChunked
// subscribes to a fresh inbox with the bus pending limits, publishes the
// request and reassembles the parts in index order. "No responders"
// becomes ErrUnreachable at once. Replies over one FlowWindow (8 MB) are
// flow controlled: the last part of each window carries a reply subject,
// the requester acknowledges it, and the responder keeps at most two
// windows unacknowledged, so no reply size can make the server drop the
// requester as a slow consumer.
//
// # Identities and permissions
//
// A node's identity is an nkey user key pair kept in <state-dir>/node.nkey
// (mode 0600, LoadOrCreateNodeIdentity); its node id is the lower-cased 16
// characters after the key's 'U' (NodeIDFromPublicKey). NodeUser builds
// the server entry of a node, confined by NodePermissions to its own
// subjects; JoinPermissions confines the one-time user of a join code.
//
// # JetStream
//
// EnsureStreams creates or updates, for prefix "execmesh":
//
//	EXECMESH_EXIT       stream on execmesh.events.exit.*, file, 2 min duplicate window, 7 days
//	execmesh_nodes      KV, node registry and pairing, history 5
//	execmesh_presence   KV, heartbeats, memory, TTL 15 s
//	execmesh_idem       KV, exec idempotency keys, TTL 24 h
//
// All buckets allow per-key TTLs. PublishExitEvent publishes with the
// message id ExitMsgID, so a republished event is stored once.
//
// Package bustest starts embedded servers for tests of any package.
package bus
