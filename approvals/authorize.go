package approvals

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Security and ask: parsing, defaults and tightening, in one place for
// every host. A host's effective policy is built in two steps:
//
//	requested := Configured(global, agent, DefaultSecurity(configuredHost, sandboxOn)).
//		Tighten(sessionDefaults).Tighten(perCall)           // the gateway; a node: .Tighten(its --security/--ask)
//	policy := Stricter(requested.Policy(), file.AgentPolicy(agentID)) // the host's exec-approvals.json
//
// Configured values (tools.exec, agents.list[].tools.exec, what a gateway
// sends a node) are exact lower-case words, validated by ValidSecurity and
// ValidAsk; per-session and per-call values are normalised and may only
// tighten; the approvals file can tighten but never loosen.

// Levels is a security and an ask value; "" is unset.
type Levels struct {
	Security string `json:"security,omitempty"`
	Ask      string `json:"ask,omitempty"`
}

// ValidSecurity reports whether s is exactly deny, allowlist or full.
func ValidSecurity(s string) bool { return securityRank(s) >= 0 }

// ValidAsk reports whether s is exactly off, on-miss or always.
func ValidAsk(s string) bool { return askRank(s) >= 0 }

// ParseLevels checks configured levels ("" allowed) and names the bad one:
// `Security: "x" is not one of deny, allowlist, full`.
func ParseLevels(l Levels) error {
	var errs []error
	if l.Security != "" && !ValidSecurity(l.Security) {
		errs = append(errs, fmt.Errorf("Security: %q is not one of deny, allowlist, full", l.Security))
	}
	if l.Ask != "" && !ValidAsk(l.Ask) {
		errs = append(errs, fmt.Errorf("Ask: %q is not one of off, on-miss, always", l.Ask))
	}
	return errors.Join(errs...)
}

// DefaultSecurity is the security of an agent that configures none
// (DESIGN.md §3.4): deny when its configured host is the sandbox (or auto
// with a sandbox runtime on), allowlist for gateway and node hosts.
func DefaultSecurity(configuredHost string, sandboxOn bool) string {
	h := strings.ToLower(strings.TrimSpace(configuredHost))
	if h == HostSandbox || (h == "auto" && sandboxOn) {
		return SecurityDeny
	}
	return SecurityAllowlist
}

// Configured returns the configured levels: the agent's values where set
// and valid, else the global ones, else defaultSecurity and ask on-miss.
// Invalid values count as unset (they never loosen anything: the default
// is what applies).
func Configured(global, agent Levels, defaultSecurity string) Levels {
	out := Levels{Security: defaultSecurity, Ask: AskOnMiss}
	for _, l := range []Levels{global, agent} {
		if ValidSecurity(l.Security) {
			out.Security = l.Security
		}
		if ValidAsk(l.Ask) {
			out.Ask = l.Ask
		}
	}
	return out
}

// Tighten applies values that may only make l stricter (per-session
// defaults, per-call values, a node's own limits): security becomes the
// more restrictive, ask the more prompting. Values are trimmed and
// lower-cased; empty or invalid ones are ignored.
func (l Levels) Tighten(t Levels) Levels {
	if s, ok := NormalizeSecurity(t.Security); ok {
		l.Security = MinSecurity(l.Security, s)
	}
	if a, ok := NormalizeAsk(t.Ask); ok {
		l.Ask = MaxAsk(l.Ask, a)
	}
	return l
}

// Policy returns l as a policy with askFallback deny and no allowlist,
// ready for Stricter.
func (l Levels) Policy() Policy {
	return Policy{Security: l.Security, Ask: l.Ask, AskFallback: SecurityDeny}
}

// AgentPolicy is agentID's entry of the approvals file as a policy in which
// unset values restrict nothing (security full, ask off, askFallback deny),
// which is what Stricter merges with the requested levels. A nil file has
// no entries.
func (f *File) AgentPolicy(agentID string) Policy {
	if f == nil {
		f = NewFile()
	}
	return f.Resolve(agentID, Policy{Security: SecurityFull, Ask: AskOff, AskFallback: SecurityDeny})
}

// Operator decisions on an approval, and the timeout that applies
// askFallback. The strings are the wire values of the HTTP API and of
// node requests.
const (
	DecisionAllowOnce   = "allow-once"
	DecisionAllowAlways = "allow-always"
	DecisionDeny        = "deny"
	DecisionTimeout     = "timeout"
)

// DenyUserDenied is the reason of a command the operator denied.
const DenyUserDenied = "user-denied"

// ErrUnknownDecision is returned by Authorize for a decision it does not
// know.
var ErrUnknownDecision = errors.New("unknown approval decision")

// Request is everything a host knows about one command it is asked to run.
type Request struct {
	// Host is HostGateway or HostNode (HostSandbox runs need no approval).
	Host    string
	AgentID string
	// Command is the command text as the caller wrote it.
	Command string
	// Cwd is the absolute working directory.
	Cwd string
	// Env is the command's environment (PATH finds executables; HOME
	// expands ~ unless Home is set; GIT_CONFIG_COUNT is extended).
	Env map[string]string
	// Home overrides Env["HOME"] for ~ expansion.
	Home string
	// PTY says the command runs in a terminal.
	PTY bool
	// Policy is the effective policy (see Levels and Stricter).
	Policy Policy
	// SafeBins (nil: DefaultSafeBins), SafeBinProfiles and TrustedDirs
	// are tools.exec.safeBins, safeBinProfiles and safeBinTrustedDirs.
	SafeBins        []string
	SafeBinProfiles map[string]SafeBinProfile
	TrustedDirs     []string
	// Decision is the operator's decision on the approval this command
	// needed ("" when none was asked yet): DecisionAllowOnce,
	// DecisionAllowAlways, DecisionDeny or DecisionTimeout.
	Decision string
	// Approved is the binding of the approval (Authorization.Binding of
	// the call that asked for it). An allow decision runs only if the
	// files still match it.
	Approved *Binding
	// Unconfined, when set, says why the host cannot confine the run in
	// the kernel: under security allowlist only a pipeline of safe bins
	// is then allowed without an approval (with ask off, anything else is
	// denied), and the reason says so.
	Unconfined string
}

// Authorization is the verdict on one command and how to run it.
type Authorization struct {
	// Verdict is Allow (run now), NeedsApproval (ask a human, then call
	// Authorize again with the Decision) or Deny.
	Verdict Verdict
	// Reason is the denial text for Deny (the texts of Decide and
	// Fallback, "user-denied", or the binding error), and why approval is
	// needed for NeedsApproval.
	Reason string
	// Argv is what to run for Allow: the allowlisted plan (the program for
	// one segment, else /bin/sh -c with the quoted pipeline); nil runs the
	// command as written through the shell.
	Argv []string
	// AllowAlways says whether allow-always may be offered (ask is not
	// always and something can be allowlisted); AllowAlwaysPaths are the
	// executable paths it persists (never a script's content).
	AllowAlways      bool
	AllowAlwaysPaths []string
	// AskFallback is the policy's askFallback and FallbackAllows whether
	// it would run the command when the approval times out.
	AskFallback    string
	FallbackAllows bool
	// Binding is, for NeedsApproval, what the approval is bound to.
	Binding *Binding
	// RunPlan reports that Argv is an allowlisted plan (the host records
	// the allowlist use).
	RunPlan bool
	// Applied reports that the command needed the approval and Decision
	// decided it (allow-always is then persisted with AllowAlwaysPaths).
	Applied bool
	// Evaluation is the allowlist evaluation the verdict came from.
	Evaluation Evaluation
}

// Authorize decides one command on a gateway or node host, in the order
// DESIGN.md §3.4 gives: security deny denies; the command is evaluated
// against the allowlist and safe bins (carriers included); Decide says
// run, ask or deny. When approval is needed and Decision is set, it is
// applied: deny denies ("user-denied"), allow-once and allow-always run
// the command as written if its files still match Approved (else
// "approval no longer matches: <path> changed"), timeout applies
// askFallback. A Decision on a command that needs no approval is ignored.
// The error is only for a Decision Authorize does not know.
//
// Hashing happens only for commands that need approval (to build the
// binding) and when a decision allows one (to check it). Under security
// full with ask off or on-miss the command is not evaluated at all: the
// Authorization is Allow with no Evaluation and no allow-always paths.
func Authorize(req Request) (Authorization, error) {
	switch req.Decision {
	case "", DecisionAllowOnce, DecisionAllowAlways, DecisionDeny, DecisionTimeout:
	default:
		return Authorization{}, fmt.Errorf("%w %q", ErrUnknownDecision, req.Decision)
	}
	p := req.Policy
	if strings.EqualFold(strings.TrimSpace(req.Host), HostSandbox) {
		return Authorization{Verdict: Allow}, nil
	}
	sec, ok := NormalizeSecurity(p.Security)
	if !ok || sec == SecurityDeny {
		return Authorization{Verdict: Deny, Reason: DenySecurity(req.Host)}, nil
	}
	if ask, ok := NormalizeAsk(p.Ask); sec == SecurityFull && ok && ask != AskAlways {
		// Nothing can refuse or ask (Decide allows every command under
		// security full without ask always), so nothing is evaluated:
		// no PATH lookups, no parse. A Decision is ignored, as for any
		// command that needs no approval.
		return Authorization{Verdict: Allow, AskFallback: p.AskFallback}, nil
	}
	home := req.Home
	if home == "" {
		home = req.Env["HOME"]
	}
	opts := EvalOptions{
		Cwd:             req.Cwd,
		PATH:            req.Env["PATH"],
		Home:            home,
		Allowlist:       p.Allowlist,
		SafeBins:        req.SafeBins,
		SafeBinProfiles: req.SafeBinProfiles,
		TrustedDirs:     req.TrustedDirs,
		PTY:             req.PTY,
	}
	ev := Evaluate(req.Command, opts)
	if req.Unconfined != "" && sec == SecurityAllowlist {
		ev.requireSafeBins(req.Unconfined)
	}
	d := Decide(req.Host, p, ev)
	if ev.Reason == ReasonUnconfined {
		switch d.Verdict {
		case Deny:
			d.Reason += " (" + ReasonUnconfined + ": " + ev.Detail + ")"
		case NeedsApproval:
			d.Reason = ReasonUnconfined + ": " + ev.Detail
		}
	}
	fb := Fallback(p, ev)
	a := Authorization{
		Verdict:          d.Verdict,
		Reason:           d.Reason,
		AskFallback:      p.AskFallback,
		FallbackAllows:   fb.Verdict == Allow,
		AllowAlwaysPaths: ev.AllowAlwaysPaths(),
		Evaluation:       ev,
	}
	a.AllowAlways = p.Ask != AskAlways && len(a.AllowAlwaysPaths) > 0
	if d.Verdict == NeedsApproval {
		a.Applied = req.Decision != ""
		switch req.Decision {
		case "":
			b, err := bind(req.Command, ev, opts)
			if err != nil {
				a.Verdict, a.Reason = Deny, err.Error()
				return a, nil
			}
			a.Binding = b
			return a, nil
		case DecisionDeny:
			a.Verdict, a.Reason = Deny, DenyUserDenied
			return a, nil
		case DecisionTimeout:
			d = fb
			a.Verdict, a.Reason = fb.Verdict, fb.Reason
		default: // allow-once, allow-always
			b, err := bind(req.Command, ev, opts)
			if err == nil {
				err = req.Approved.Match(b)
			}
			if err != nil {
				a.Verdict, a.Reason = Deny, err.Error()
				return a, nil
			}
			a.Verdict, a.Reason = Allow, ""
			d = Decision{Verdict: Allow}
		}
	}
	if a.Verdict != Allow {
		return a, nil
	}
	if d.RunPlan {
		a.RunPlan = true
		a.Argv = PlanArgv(ev)
	}
	return a, nil
}

// requireSafeBins turns a satisfied evaluation that runs anything but safe
// bins into a miss: without the kernel's confinement an allowlisted
// program could go on to run anything at all.
func (ev *Evaluation) requireSafeBins(why string) {
	if !ev.Satisfied {
		return
	}
	for _, s := range ev.Segments {
		if s.SatisfiedBy != BySafeBin {
			ev.Satisfied = false
			ev.Reason, ev.Detail = ReasonUnconfined, why
			ev.Argv, ev.Rendered = nil, ""
			return
		}
	}
}

// PlanArgv is the argv that runs an allowlisted plan: the program itself
// for one segment, else the rendered pipeline through /bin/sh (every word
// quoted: no shell sees the original text again). Nil when ev is not
// satisfied.
func PlanArgv(ev Evaluation) []string {
	switch {
	case !ev.Satisfied || len(ev.Argv) == 0:
		return nil
	case len(ev.Argv) == 1:
		return slices.Clone(ev.Argv[0])
	}
	return []string{"/bin/sh", "-c", ev.Rendered}
}
