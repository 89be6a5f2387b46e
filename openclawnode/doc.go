// Package openclawnode makes an execmesh node an OpenClaw node host: one
// job, OpenClaw's gateway <-> node-host protocol 4 over a WebSocket, with
// the node's own session core (package host) doing every run.
//
// Tested with OpenClaw 2026.9.6 (its dist/runner-*.mjs, dist/client-*.mjs,
// dist/device-auth-*.mjs and dist/startup-state-migrations-*.mjs define the
// other side).
//
// # Connection
//
// The gateway speaks first: event connect.challenge {nonce, ts}. The client
// answers with the request "connect" as client id "node-host", mode and
// role "node", no scopes, its commands, the gateway token (or the device
// token the gateway issued earlier) and its Ed25519 device identity, which
// signs the v3 string (SignaturePayload):
//
//	v3|deviceId|node-host|node|node||<ts>|<token>|<nonce>|<platform>|<deviceFamily>
//
// The deviceId is hex(sha256(raw public key)); key and signature travel as
// base64url. The identity and the device token of hello-ok live in the
// node's state dir (IdentityFile, DeviceTokenFile, mode 0600): a command
// run under security allowlist cannot read them (the confinement hides the
// state dir). The gateway sends tick events every policy.tickIntervalMs;
// after twice that without a frame the client closes the socket and
// reconnects, with a doubling, jittered backoff (ReconnectMin..
// ReconnectMax) that starts over after each hello-ok.
//
// # Pairing
//
// OpenClaw pairs the device (automatically on loopback), then an operator
// approves the command surface with `openclaw nodes approve <deviceId>`;
// until then the gateway sends no system.run. Nothing on the node changes
// with pairing: its own policy decides every run.
//
// # Commands
//
// node.invoke.request events are served concurrently and answered with the
// request node.invoke.result:
//
//	system.run.prepare        the plan: argv, cwd, commandText, agentId, sessionKey
//	system.run                runs synchronously on the session core; exec.finished or exec.denied follow
//	system.which              {bins: {name: path}} on the node's own PATH
//	system.execApprovals.get  the node's exec-approvals.json {path, exists, hash, file}
//	system.execApprovals.set  replaces it, given baseHash (Config.ApprovalsWritable)
//	mcp.tools.call.v1         the plugin tools execmesh_exec and execmesh_process
//
// Every run goes through the node's host pipeline: its environment rules,
// its exec-approvals.json, its security and ask (Config.Security and
// Config.Ask are the base, which a call may only tighten) and, under
// security allowlist, its kernel confinement. OpenClaw's own approval
// (approved, approvalDecision) is not an execmesh decision and loosens
// nothing: a run execmesh would ask about is answered SYSTEM_RUN_DENIED
// (and exec.denied). The prepare answer carries no execPolicy, so the
// gateway does not second-guess the node with its own analysis of it.
//
// # Plugin tools
//
// After hello-ok the client publishes two tools with node.pluginTools.update
// under OpenClaw's reserved plugin id "node-mcp" (command mcp.tools.call.v1,
// server "execmesh"): execmesh_exec and execmesh_process, the execmesh exec
// and process tools with background sessions, poll, log, write, send-keys
// and kill. Their sessions are scoped by the sessionKey the gateway forwards
// with each call, prefixed with SessionKeyPrefix so that they never mix with
// the sessions of an execmesh gateway on the same node. When a background
// session ends, its exit goes to OpenClaw as exec.finished (Client.Exit).
//
// # Bad input
//
// Frames above Config.MaxFrameBytes close the socket with status 1009;
// requests for unknown methods get an INVALID_REQUEST response; unknown
// invoke commands get UNAVAILABLE; an invoke id seen before, an invoke for
// another node id or malformed params get INVALID_REQUEST and run nothing;
// a challenge nonce the client signed before is refused and the socket
// closed; invokes beyond Config.MaxInvokes at once get UNAVAILABLE.
// node.invoke.cancel stops the invoke it names. When the socket drops during an invoke, the invoke is cancelled
// (a synchronous run is stopped) and its result, which cannot be
// delivered, is logged. Each of these logs one line.
package openclawnode
