// Package nodeagent is execmesh's headless node host: the process behind
// `execmesh node` (and the local node of `execmesh up`). It connects to
// NATS with its own nkey identity, serves its endpoints as the micro
// service "execmesh-node" under <prefix>.node.<id>, runs the session core
// (package session) for the commands a gateway routes to it, and enforces
// its own environment, working-directory and policy rules on every request,
// whatever route it came by.
//
// # Endpoints
//
// Group <prefix>.node.<id>, where id is derived from the node's public key
// (bus.NodeIDFromPublicKey):
//
//	exec           ExecRequest → protocol.Result (idempotent with HeaderIdempotencyKey)
//	process        ProcessRequest → protocol.Result
//	list           ListRequest → ListResponse (one sessionKey, or all: gateway resync)
//	approvals.get  {} → the node's exec-approvals.json: {path, exists, hash, file}
//	approvals.set  {file, baseHash} → the same, after replacing the file
//	which          WhichRequest → WhichResponse
//	pairing        PairingNotice → {} (the gateway's approve/reject)
//
// Requests are decoded strictly; a malformed one is answered with a micro
// error (code = HTTP status, data = the JSON of a *protocol.Error) and
// changes nothing. Replies go through bus.RespondChunked, so a result larger
// than the server's max_payload arrives whole. Handlers never block the
// micro subscription: every request is served by a tracked goroutine.
//
// # Presence, pairing, exit events
//
// The agent publishes a Heartbeat on <prefix>.presence.<id> every
// Config.HeartbeatInterval and announces itself on <prefix>.pair.request
// when its connection comes up, comes back, and while it is not paired.
// The gateway routes work only to paired, live nodes; the agent also refuses
// exec while the gateway has told it it is pending or rejected. Exit events
// of backgrounded sessions go to JetStream (bus.PublishExitEvent) with a
// message id that makes republishing after a reconnect harmless.
//
// # Policy
//
// The node re-checks every run with its own <state-dir>/exec-approvals.json
// through approvals.Authorize: the stricter of the gateway's security/ask,
// the node's --security/--ask and the file decides; allowlisted commands
// run as their plan of resolved paths, and every run under security
// allowlist runs in the node's kernel confinement (host.ConfineConfig,
// package confine). A run that needs an approval is answered
// ErrApprovalRequired with the node's evaluation and the approval's
// binding (the SHA-256 of its executables and scripts); the gateway asks
// its operators and starts the run again with the decision and that
// binding, which the node checks right before it spawns ("approval no
// longer matches: <path> changed").
//
// apply_patch writes only under the agent's workspace below
// Config.Workspace (default <state-dir>/workspace) unless the gateway
// sends anyWorkdir, and never inside a .git directory.
//
// # Environment and working directory
//
// Commands inherit the node's own environment after protocol.SanitizeHostEnv.
// Request overrides are checked with protocol.ValidateHostEnvOverrides, except
// that PATH is accepted when it only prepends absolute directories to the
// node's own PATH (protocol.NodePathOverrideAllowed). A workdir is resolved on
// this host; an unusable one gives OpenClaw's failed "workdir … is
// unavailable" result and runs nothing.
//
// # Joining by code
//
// With Config.Join the agent first redeems a join code (JoinCode): it
// connects with the code's one-time credential, sends its public key signed
// with its seed, and, once the gateway has admitted the key, reconnects with
// it. The URLs and prefix are saved in the state dir (JoinFile) for later
// starts.
//
// # Counters
//
// The micro stats endpoint ($SRV.STATS) carries the agent's counters (Stats:
// sessions running and finished, calls by endpoint, output bytes, exit
// events published, NATS reconnects) as every endpoint's data;
// Agent.MetricsStats feeds the same counters to metrics.NewNode for
// `execmesh node --metrics-addr`.
//
// # Disconnects
//
// The connection retries forever. Sessions keep running while NATS is
// away; on reconnect the agent re-announces itself and the gateway
// resynchronises its session index from the list endpoint.
package nodeagent
