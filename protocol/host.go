package protocol

// The messages of a host: what the gateway asks the machine that runs a
// command (its own, or a node agent's over NATS) and what it answers. A
// request crosses every layer as this one value: the gateway resolves the
// host, the policy and the session id, the host runs its pipeline
// (environment, workdir, approvals) and the session core.

// Exec targets: the pipeline a host runs a request through.
const (
	TargetGateway = "gateway" // the gateway's own machine, through approvals
	TargetSandbox = "sandbox" // inside the sandbox runtime, no approvals
	TargetNode    = "node"    // a node agent's machine, through its approvals
)

// ExecRequest is one exec call, resolved by the gateway, as a host runs
// it. On the wire (NodeEndpointExec) it is decoded strictly.
type ExecRequest struct {
	// SessionKey is the caller's scope; process actions for the session
	// answer only under the same key. Required.
	SessionKey string `json:"sessionKey"`
	AgentID    string `json:"agentId,omitempty"`
	// SessionID is the id the gateway allocated for the session, unique
	// across the fleet; the command sees it as EXECMESH_SESSION. Empty
	// lets the host pick one.
	SessionID string `json:"sessionId,omitempty"`
	// IdempotencyKey, when set, is what a remote host dedupes the start
	// by (hostbus sends it as the NodeHeaderIdempotencyKey header, not in
	// the body): a start sent again with the same key gets the first
	// start's answer. Empty means a fresh key per call.
	IdempotencyKey string `json:"-"`
	// Target is the pipeline: TargetGateway, TargetSandbox or TargetNode.
	Target string `json:"target"`
	// Args are the exec tool's arguments; the host-selection fields (host,
	// node, security, ask, elevated) are already resolved and cleared.
	// The gateway sends yieldMs and timeout resolved, so that its request
	// deadline and the host's behaviour come from the same values.
	Args ExecArgs `json:"args"`
	// Security and Ask are the gateway's resolved policy; a host only
	// tightens them (with its own approvals file and limits).
	Security string `json:"security,omitempty"`
	Ask      string `json:"ask,omitempty"`
	// Warnings are prefixed to the result text.
	Warnings []string `json:"warnings,omitempty"`
	// Sync runs the command to completion (the caller may not use the
	// process tool).
	Sync bool `json:"sync,omitempty"`
	// Limits are the effective resource limits the gateway resolved
	// (tools.exec.limits, the agent's, then the call's "limits"); the
	// host's session core applies them to the session's cgroup, or
	// refuses the exec where its controllers are missing.
	Limits *Limits `json:"limits,omitempty"`
	// Approval is the operator's decision on this run, signed by the
	// gateway: set only on the start of a run whose first attempt needed
	// an approval. A host verifies it before acting on it.
	Approval *SignedDecision `json:"approval,omitempty"`
	// Stream, when set, binds a stream to the session before it runs
	// (the caller then claims it with an AttachRequest); the request is a
	// background start.
	Stream *StreamSpec `json:"stream,omitempty"`
}

// ExecReply answers an ExecRequest over NATS.
type ExecReply struct {
	Result Result `json:"result"`
	// Instance is the run of the host that holds the session.
	Instance string `json:"instance,omitempty"`
}

// ErrApprovalRequired is the error type of an exec that needs an approval
// the request does not carry. The error data holds, besides type and
// message, "approval": an ApprovalRequest.
const ErrApprovalRequired ErrorType = "approval_required"

// ApprovalRequest is a host's evaluation of a run that needs an operator's
// approval: what to show, what may be decided, and the plan a decision
// must be bound to.
type ApprovalRequest struct {
	// AllowAlways is whether allow-always may be offered (ask is not
	// always and the command resolves to binaries that can be
	// allowlisted).
	AllowAlways bool   `json:"allowAlways"`
	AskFallback string `json:"askFallback"`
	// FallbackAllows is whether askFallback would run the command when
	// the approval times out.
	FallbackAllows bool   `json:"fallbackAllows"`
	Reason         string `json:"reason,omitempty"`
	// Plan is exactly what would run; a decision is signed over it.
	Plan Plan `json:"plan"`
}

// Plan is what an approved run is bound to. A host computes it when it
// asks for the approval and again when the approved start arrives; the
// run happens only if the two agree and the gateway's signature covers
// this plan.
type Plan struct {
	Host       string   `json:"host"`             // TargetGateway or TargetNode
	NodeID     string   `json:"nodeId,omitempty"` // the node, for TargetNode
	AgentID    string   `json:"agentId"`
	SessionKey string   `json:"sessionKey"`
	Command    string   `json:"command"`
	Argv       []string `json:"argv,omitempty"` // the allowlisted plan, when there is one
	Cwd        string   `json:"cwd"`
	// CwdID is the cwd's device and inode ("dev:ino"), so that a
	// directory put in its place does not inherit the approval.
	CwdID string `json:"cwdId,omitempty"`
	// EnvDigest is the SHA-256 (hex) of the command's sorted environment.
	EnvDigest string `json:"envDigest"`
	// Files are the executables, wrappers and script operands the
	// command would run (package approvals binds them), with their
	// content hashes at approval time.
	Files []BoundFile `json:"files,omitempty"`
}

// ApprovalBinding is what an approval is bound to (package approvals
// computes and checks it): the executables and script files of the
// command with the SHA-256 of their content.
type ApprovalBinding struct {
	Files []BoundFile `json:"files"`
}

// BoundFile is one file of an ApprovalBinding: SHA256 is the hex digest
// of its content, "" for a path that did not exist.
type BoundFile struct {
	Path   string `json:"path"`
	SHA256 string `json:"sha256,omitempty"`
}

// Approval decisions. allow-once and allow-always run the command;
// DecisionTimeout means nobody answered in time and the host applies its
// askFallback.
const (
	DecisionAllowOnce   = "allow-once"
	DecisionAllowAlways = "allow-always"
	DecisionDeny        = "deny"
	DecisionTimeout     = "timeout"
)

// Decision is an operator's answer to one approval, as the gateway signs
// it.
type Decision struct {
	ApprovalID string `json:"approvalId"`
	Decision   string `json:"decision"` // allow-once, allow-always or timeout
	Plan       Plan   `json:"plan"`
	// ExpiresAtMs bounds when the decision may be acted on (unix ms).
	ExpiresAtMs int64 `json:"expiresAtMs"`
}

// SignedDecision is a Decision and the gateway's signature over its
// canonical JSON: the nkey (ed25519) signature, base64url, by the key
// GatewayKey names. Hosts act only on decisions whose signature verifies
// with a gateway key they trust.
type SignedDecision struct {
	Decision   Decision `json:"decision"`
	GatewayKey string   `json:"gatewayKey"`
	Signature  string   `json:"signature"`
}

// ProcessRequest is a process action on a host's session (endpoint
// NodeEndpointProcess).
type ProcessRequest struct {
	SessionKey string      `json:"sessionKey"`
	Args       ProcessArgs `json:"args"`
}

// ProcessReply answers a ProcessRequest.
type ProcessReply struct {
	Result Result `json:"result"`
	// Gone is set when, after the action, the host does not hold the
	// session (removed, swept after its retention, or never there).
	Gone     bool   `json:"gone,omitempty"`
	Instance string `json:"instance,omitempty"`
}

// ListRequest asks for a host's sessions of one sessionKey (endpoint
// NodeEndpointList).
type ListRequest struct {
	SessionKey string `json:"sessionKey"`
	// Limit, when above 0, asks for only the Limit newest entries of each
	// sessionKey (process list order). 0 lists everything.
	Limit int `json:"limit,omitempty"`
}

// ListReply answers a ListRequest.
type ListReply struct {
	// Instance identifies the run of the host; it changes when a node
	// agent restarts, and with it every session it held is gone.
	Instance string          `json:"instance"`
	Sessions []ListedSession `json:"sessions"`
	// Total is how many entries the sessionKeys listed have in all,
	// Limit aside.
	Total int `json:"total"`
	// Partial is set when Limit left entries out.
	Partial bool `json:"partial,omitempty"`
}

// ListedSession is one session of a ListReply: its scope and its
// process-list entry.
type ListedSession struct {
	SessionKey string  `json:"sessionKey"`
	Details    Details `json:"details"`
}

// ApplyPatchRequest applies an apply_patch patch on a host (endpoint
// NodeEndpointApplyPatch), under the requested workdir with the host's
// workdir rules.
type ApplyPatchRequest struct {
	SessionKey string         `json:"sessionKey"`
	AgentID    string         `json:"agentId,omitempty"`
	Target     string         `json:"target"`
	Args       ApplyPatchArgs `json:"args"`
	// Security is the gateway's resolved security; a host only tightens it.
	Security string `json:"security,omitempty"`
	// AnyWorkdir lets the patch write under any workdir the host accepts
	// (the gateway's tools.exec.applyPatch.workspaceOnly is false).
	// Without it the host confines the patch to the agent's workspace, so
	// a request that omits the field gets the stricter rule.
	AnyWorkdir bool `json:"anyWorkdir,omitempty"`
}

// PingReply answers the gateway's liveness probe (NodeEndpointPing): the
// host's run, so a probe answered by a new run is told apart.
type PingReply struct {
	Instance string `json:"instance"`
}
