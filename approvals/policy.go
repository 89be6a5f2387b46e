package approvals

import (
	"fmt"
	"strings"
)

// Security levels, from most to least restrictive.
const (
	SecurityDeny      = "deny"
	SecurityAllowlist = "allowlist"
	SecurityFull      = "full"
)

// Ask modes, from least to most prompting.
const (
	AskOff    = "off"
	AskOnMiss = "on-miss"
	AskAlways = "always"
)

// Hosts a command can run on.
const (
	HostSandbox = "sandbox"
	HostGateway = "gateway"
	HostNode    = "node"
)

// Denial reasons returned by Decide and Fallback, with OpenClaw's texts.
const (
	DenyAllowlistMiss       = "exec denied: allowlist miss"
	DenyApprovalTimeout     = "approval-timeout"
	DenyApprovalTimeoutMiss = "approval-timeout (allowlist-miss)"
)

// DenySecurity returns the denial text for a host whose security is deny:
// "exec denied: host=<host> security=deny".
func DenySecurity(host string) string {
	return fmt.Sprintf("exec denied: host=%s security=deny", host)
}

// NormalizeSecurity trims and lower-cases a security value and reports
// whether it is one of deny, allowlist, full.
func NormalizeSecurity(s string) (string, bool) {
	s = strings.ToLower(strings.TrimSpace(s))
	return s, securityRank(s) >= 0
}

// NormalizeAsk trims and lower-cases an ask value and reports whether it is
// one of off, on-miss, always.
func NormalizeAsk(s string) (string, bool) {
	s = strings.ToLower(strings.TrimSpace(s))
	return s, askRank(s) >= 0
}

func securityRank(s string) int {
	switch s {
	case SecurityDeny:
		return 0
	case SecurityAllowlist:
		return 1
	case SecurityFull:
		return 2
	}
	return -1
}

func askRank(s string) int {
	switch s {
	case AskOff:
		return 0
	case AskOnMiss:
		return 1
	case AskAlways:
		return 2
	}
	return -1
}

// MinSecurity returns the more restrictive of two security values
// (deny < allowlist < full). An invalid value counts as deny: it fails
// closed.
func MinSecurity(a, b string) string {
	a, aok := NormalizeSecurity(a)
	b, bok := NormalizeSecurity(b)
	if !aok || !bok {
		return SecurityDeny
	}
	if securityRank(a) <= securityRank(b) {
		return a
	}
	return b
}

// MaxAsk returns the more prompting of two ask values
// (off < on-miss < always). An invalid value counts as always.
func MaxAsk(a, b string) string {
	a, aok := NormalizeAsk(a)
	b, bok := NormalizeAsk(b)
	if !aok || !bok {
		return AskAlways
	}
	if askRank(a) >= askRank(b) {
		return a
	}
	return b
}

// Policy is the effective approvals policy for one agent on one host.
type Policy struct {
	Security    string  `json:"security"`
	Ask         string  `json:"ask"`
	AskFallback string  `json:"askFallback"`
	Allowlist   []Entry `json:"allowlist,omitempty"`
}

// DefaultPolicy returns the policy that applies when nothing is configured
// for the given configured host (tools.exec.host, auto already resolved):
// security deny for sandbox (such an agent cannot reach the gateway or node
// hosts until security is set), allowlist for gateway and node; ask on-miss;
// askFallback deny. An unknown host gets deny.
func DefaultPolicy(configuredHost string) Policy {
	p := Policy{Security: SecurityDeny, Ask: AskOnMiss, AskFallback: SecurityDeny}
	switch strings.ToLower(strings.TrimSpace(configuredHost)) {
	case HostGateway, HostNode:
		p.Security = SecurityAllowlist
	}
	return p
}

// Tighten applies per-call security and ask values, which may only make the
// policy stricter: security = MinSecurity(p, requested), ask =
// MaxAsk(p, requested). Empty or invalid requested values are ignored.
func (p Policy) Tighten(security, ask string) Policy {
	if s, ok := NormalizeSecurity(security); ok {
		p.Security = MinSecurity(p.Security, s)
	}
	if a, ok := NormalizeAsk(ask); ok {
		p.Ask = MaxAsk(p.Ask, a)
	}
	return p
}

// Stricter merges the requested policy (tools.exec settings and per-call
// values) with the host's approvals-file policy, as the gateway and the node
// agent do for host=gateway and host=node: security = MinSecurity, ask =
// MaxAsk, askFallback = MinSecurity(security, file.AskFallback), and the
// file's allowlist. The file can tighten but never loosen.
func Stricter(requested, file Policy) Policy {
	sec := MinSecurity(requested.Security, file.Security)
	return Policy{
		Security:    sec,
		Ask:         MaxAsk(requested.Ask, file.Ask),
		AskFallback: MinSecurity(sec, file.AskFallback),
		Allowlist:   file.Allowlist,
	}
}

// RequiresApproval reports whether a command must be approved by a human
// before it runs (OpenClaw's requiresExecApproval without durable
// approvals): always with ask=always; otherwise only with ask=on-miss in
// allowlist mode when the analysis failed or the allowlist is not
// satisfied. security=full with on-miss never prompts; allowlist with ask
// off never prompts (misses are denied instead).
func RequiresApproval(ask, security string, analysisOK, allowlistSatisfied bool) bool {
	ask, _ = NormalizeAsk(ask)
	security, _ = NormalizeSecurity(security)
	if ask == AskAlways {
		return true
	}
	return ask == AskOnMiss && security == SecurityAllowlist && (!analysisOK || !allowlistSatisfied)
}

// Verdict is the outcome of Decide.
type Verdict int

// Verdicts.
const (
	// Deny: do not run; Decision.Reason is the error text.
	Deny Verdict = iota
	// NeedsApproval: ask a human; an approved command runs as written.
	NeedsApproval
	// Allow: run now (the plan when Decision.RunPlan is set).
	Allow
)

func (v Verdict) String() string {
	switch v {
	case Allow:
		return "allow"
	case NeedsApproval:
		return "needs-approval"
	default:
		return "deny"
	}
}

// Decision is what to do with one command.
type Decision struct {
	Verdict Verdict
	// Reason is the denial text for Deny, and why approval is needed for
	// NeedsApproval (the evaluation's reason, or "ask=always").
	Reason string
	// RunPlan tells the caller to execute Evaluation.Argv (or Rendered)
	// instead of the command text: set when the allowlist allowed it.
	RunPlan bool
}

// Decide applies a policy to an evaluated command for a host. host=sandbox
// runs need no approval. Otherwise: security deny denies
// ("exec denied: host=<host> security=deny"); security full allows the
// command as written unless ask is always; allowlist allows a satisfied
// command as its plan, asks on a miss with ask on-miss (and always with ask
// always), and denies a miss with ask off ("exec denied: allowlist miss").
// Invalid policy values fail closed (security deny, ask always).
func Decide(host string, p Policy, ev Evaluation) Decision {
	if strings.EqualFold(strings.TrimSpace(host), HostSandbox) {
		return Decision{Verdict: Allow}
	}
	sec, ok := NormalizeSecurity(p.Security)
	if !ok {
		sec = SecurityDeny
	}
	ask, ok := NormalizeAsk(p.Ask)
	if !ok {
		ask = AskAlways
	}
	switch sec {
	case SecurityDeny:
		return Decision{Verdict: Deny, Reason: DenySecurity(host)}
	case SecurityFull:
		if ask == AskAlways {
			return Decision{Verdict: NeedsApproval, Reason: "ask=always"}
		}
		return Decision{Verdict: Allow}
	}
	if RequiresApproval(ask, sec, ev.AnalysisOK, ev.Satisfied) {
		reason := ev.Reason
		if reason == "" {
			reason = "ask=always"
		}
		return Decision{Verdict: NeedsApproval, Reason: reason}
	}
	if !ev.Satisfied {
		return Decision{Verdict: Deny, Reason: DenyAllowlistMiss}
	}
	return Decision{Verdict: Allow, RunPlan: true}
}

// Fallback decides a command whose approval got no answer in time, from the
// policy's askFallback (capped by its security): full runs the command as
// written, allowlist runs it only as a satisfied plan, anything else denies.
// Callers that want silence never to run anything (OpenClaw's later
// hardening) set askFallback to deny, the default.
func Fallback(p Policy, ev Evaluation) Decision {
	switch MinSecurity(p.Security, p.AskFallback) {
	case SecurityFull:
		return Decision{Verdict: Allow}
	case SecurityAllowlist:
		if ev.Satisfied {
			return Decision{Verdict: Allow, RunPlan: true}
		}
		return Decision{Verdict: Deny, Reason: DenyApprovalTimeoutMiss}
	}
	return Decision{Verdict: Deny, Reason: DenyApprovalTimeout}
}
