package host

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/execmesh/execmesh/approvals"
	"github.com/execmesh/execmesh/protocol"
)

// run is the host's verdict on one command that may start.
type run struct {
	argv  []string // nil: the command as written, through the shell
	runID string   // the approval id of an approved run

	// What the kernel confinement of a security allowlist run needs.
	allowlistMode bool
	command       string
	plan          [][]string        // the allowlisted plan's segments; nil: as written
	execs         []string          // the plan's programs and kept wrappers
	approved      []string          // executables and scripts an approval fixed
	allowlist     []approvals.Entry // the agent's effective allowlist
}

// policy is the effective approvals policy of one run: the gateway's
// resolved security and ask, capped by the host's own limits
// (Settings.Security and Ask), merged with the agent's entry of the host's
// exec-approvals.json, where unset values restrict nothing. A corrupt or
// unsafe file is not trusted to loosen anything: it counts as empty.
func (l *Local) policy(security, ask, agentID string, s *Settings) approvals.Policy {
	p := approvals.Policy{Security: approvals.SecurityAllowlist, Ask: approvals.AskOnMiss}
	if v, ok := approvals.NormalizeSecurity(security); ok {
		p.Security = v
	}
	if v, ok := approvals.NormalizeAsk(ask); ok {
		p.Ask = v
	}
	p = p.Tighten(s.Security, s.Ask)
	if l.cfg.StateDir == "" {
		p.AskFallback = approvals.SecurityDeny
		return p
	}
	// Read when it changed, not per call (approvals.FileCache).
	f, err := l.approvals.Load()
	if err != nil {
		l.log.Warn("exec approvals file unusable; treating it as empty", "path", l.approvals.Path(), "err", err)
	}
	if f == nil {
		f = approvals.NewFile()
	}
	filePolicy := f.Resolve(agentID, approvals.Policy{Security: approvals.SecurityFull, Ask: approvals.AskOff, AskFallback: approvals.SecurityDeny})
	return approvals.Stricter(p, filePolicy)
}

// hostName is the host kind as approvals and plans name it.
func (l *Local) hostName() string {
	if l.cfg.Kind == KindNode {
		return approvals.HostNode
	}
	return approvals.HostGateway
}

// authorize applies exec approvals to a run through approvals.Authorize:
// deny, run (as written, or as its allowlisted plan, with the allowlist
// environment rule under security allowlist), ask for an approval (an
// *ApprovalNeededError with the plan it would be bound to), or act on the
// operator's signed decision the request carries.
func (l *Local) authorize(req protocol.ExecRequest, workdir string, env []string, s *Settings) (run, error) {
	policy := l.policy(req.Security, req.Ask, req.AgentID, s)
	envMap := protocol.EnvMap(env)
	home := envMap["HOME"]
	if home == "" {
		home, _ = os.UserHomeDir()
	}
	areq := approvals.Request{
		Host:        l.hostName(),
		AgentID:     req.AgentID,
		Command:     req.Args.Command,
		Cwd:         workdir,
		Env:         envMap,
		Home:        home,
		PTY:         req.Args.PTY,
		Policy:      policy,
		SafeBins:    s.SafeBins,
		TrustedDirs: s.SafeBinTrustedDirs,
	}
	if l.confinement.Mode != ModeLandlock {
		areq.Unconfined = l.confinement.Reason
	}
	var dec *protocol.Decision
	if req.Approval != nil {
		d, err := l.verified(req, workdir, env)
		if err != nil {
			return run{}, err
		}
		dec = &d
		areq.Decision = d.Decision
		areq.Approved = &approvals.Binding{Files: d.Plan.Files}
	}
	auth, err := approvals.Authorize(areq)
	if err != nil {
		return run{}, protocol.Errorf(protocol.ErrInvalidRequest, "exec: %v", err)
	}
	switch auth.Verdict {
	case approvals.NeedsApproval:
		return run{}, &ApprovalNeededError{
			Err: protocol.Errorf(protocol.ErrApprovalRequired, "exec on %s needs approval (%s)", l.label(), auth.Reason),
			Request: protocol.ApprovalRequest{
				AllowAlways:    auth.AllowAlways,
				AskFallback:    auth.AskFallback,
				FallbackAllows: auth.FallbackAllows,
				Reason:         auth.Reason,
				Plan:           l.plan(req, workdir, env, auth),
			},
		}
	case approvals.Deny:
		if dec != nil && strings.HasPrefix(auth.Reason, BindingChanged) {
			l.log.Warn("approval no longer matches the run", "approval", dec.ApprovalID, "why", auth.Reason)
		}
		return run{}, protocol.Errorf(protocol.ErrDenied, "%s", auth.Reason)
	}
	r := run{argv: auth.Argv, command: req.Args.Command, allowlist: policy.Allowlist}
	if sec, _ := approvals.NormalizeSecurity(policy.Security); sec == approvals.SecurityAllowlist {
		r.allowlistMode = true
		if auth.RunPlan {
			r.plan = auth.Evaluation.Argv
		}
		for _, seg := range auth.Evaluation.Segments {
			r.execs = append(r.execs, seg.ResolvedPath)
			r.execs = append(r.execs, seg.WrapperPaths...)
		}
		if dec != nil {
			for _, f := range dec.Plan.Files {
				r.approved = append(r.approved, f.Path)
			}
		}
	}
	if dec != nil {
		if !l.claim(dec.ApprovalID, time.UnixMilli(dec.ExpiresAtMs)) {
			return run{}, protocol.Errorf(protocol.ErrConflict, "approval %s was already acted on", dec.ApprovalID)
		}
		r.runID = dec.ApprovalID
		if auth.Applied && dec.Decision == protocol.DecisionAllowAlways {
			l.persistAllowAlways(req.AgentID, auth.AllowAlwaysPaths)
		}
	}
	if auth.RunPlan {
		l.recordUse(req.AgentID, auth.Evaluation)
	}
	return r, nil
}

// verified returns the signed decision of req once it verifies with a
// trusted gateway key, is unexpired, and covers this run: the same host,
// agent, command, cwd (the same directory, not one put in its place) and
// environment as when it was asked. The files are checked by
// approvals.Authorize against the plan's binding.
func (l *Local) verified(req protocol.ExecRequest, workdir string, env []string) (protocol.Decision, error) {
	sd := req.Approval
	var trusted []string
	if l.cfg.TrustedKeys != nil {
		trusted = l.cfg.TrustedKeys()
	}
	if err := VerifyDecision(*sd, trusted, time.Now()); err != nil {
		l.log.Warn("approval decision refused", "approval", sd.Decision.ApprovalID, "err", err)
		return protocol.Decision{}, protocol.Errorf(protocol.ErrDenied, "approval refused: %v", err)
	}
	dec := sd.Decision
	switch dec.Decision {
	case protocol.DecisionAllowOnce, protocol.DecisionAllowAlways, protocol.DecisionTimeout:
	default:
		return protocol.Decision{}, protocol.Errorf(protocol.ErrInvalidRequest, "exec: unknown approval decision %q", dec.Decision)
	}
	if why := planMismatch(dec.Plan, l.plan(req, workdir, env, approvals.Authorization{})); why != "" {
		l.log.Warn("approval no longer matches the run", "approval", dec.ApprovalID, "why", why)
		return protocol.Decision{}, protocol.Errorf(protocol.ErrDenied, "%s%s", BindingChanged, why)
	}
	return dec, nil
}

// label names the host in texts.
func (l *Local) label() string {
	if l.cfg.Kind == KindNode {
		return "node " + l.cfg.ID
	}
	return "the gateway host"
}

// BindingChanged starts the denial of an approved run whose command, cwd,
// environment or files changed since the approval was asked; what changed
// follows it.
const BindingChanged = "approval no longer matches: "

// claim records that an approval id was acted on, so that a decision
// replayed before it expires does not run the command again.
func (l *Local) claim(id string, expires time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	for k, exp := range l.used {
		if now.After(exp) {
			delete(l.used, k)
		}
	}
	if _, dup := l.used[id]; dup {
		return false
	}
	l.used[id] = expires
	return true
}

// plan is what an approval of this run binds: host, agent, command (and
// its allowlisted plan), cwd, environment, and the files auth bound (the
// executables, wrappers and scripts with their content hashes).
func (l *Local) plan(req protocol.ExecRequest, workdir string, env []string, auth approvals.Authorization) protocol.Plan {
	p := protocol.Plan{
		Host:       l.hostName(),
		AgentID:    req.AgentID,
		SessionKey: req.SessionKey,
		Command:    req.Args.Command,
		Cwd:        workdir,
		CwdID:      dirID(workdir),
		EnvDigest:  EnvDigest(env),
	}
	if l.cfg.Kind == KindNode {
		p.NodeID = l.cfg.ID
	}
	if auth.Binding != nil {
		p.Files = slices.Clone(auth.Binding.Files)
	}
	return p
}

// planMismatch says what differs between the approved plan and the one
// computed now, "" when they agree. Files are approvals.Binding's to check.
func planMismatch(approved, now protocol.Plan) string {
	switch {
	case approved.Host != now.Host || approved.NodeID != now.NodeID:
		return "host changed"
	case approved.AgentID != now.AgentID || approved.SessionKey != now.SessionKey:
		return "agent changed"
	case approved.Command != now.Command:
		return "command changed"
	case approved.Cwd != now.Cwd || approved.CwdID != now.CwdID:
		return "cwd changed"
	case approved.EnvDigest != now.EnvDigest:
		return "env changed"
	}
	return ""
}

// EnvDigest is the SHA-256 (hex) of an environment list, order ignored.
func EnvDigest(env []string) string {
	sorted := slices.Clone(env)
	slices.Sort(sorted)
	h := sha256.New()
	for _, kv := range sorted {
		io.WriteString(h, kv)
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// dirID identifies a directory by device and inode, so that an approval
// does not follow a path to a directory put in its place.
func dirID(dir string) string {
	fi, err := os.Stat(dir)
	if err != nil {
		return ""
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return ""
	}
	return fmt.Sprintf("%d:%d", st.Dev, st.Ino)
}

var errNoChange = errors.New("no change")

// recordUse notes in the approvals file which entries an allowed plan used.
func (l *Local) recordUse(agentID string, ev approvals.Evaluation) {
	if l.cfg.StateDir == "" {
		return
	}
	if _, err := approvals.Update(approvals.Path(l.cfg.StateDir), func(f *approvals.File) error {
		if f.RecordUse(agentID, ev, ev.Rendered, time.Now()) == 0 {
			return errNoChange
		}
		return nil
	}); err != nil && !errors.Is(err, errNoChange) {
		l.log.Warn("recording allowlist use", "err", err)
	}
}

// persistAllowAlways adds the resolved binaries of an allow-always run to
// the agent's allowlist in the host's approvals file (never a shell or a
// wrapper: AllowAlwaysPaths leaves them out).
func (l *Local) persistAllowAlways(agentID string, paths []string) {
	if l.cfg.StateDir == "" || len(paths) == 0 {
		l.log.Warn("allow-always not persisted: nothing to allow, or no state dir", "paths", len(paths))
		return
	}
	_, err := approvals.Update(approvals.Path(l.cfg.StateDir), func(f *approvals.File) error {
		for _, p := range paths {
			if _, err := f.AddAllowAlways(agentID, p); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		l.log.Warn("allow-always not persisted", "err", err)
	}
}
