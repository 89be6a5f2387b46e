package host

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
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
	path := approvals.Path(l.cfg.StateDir)
	f, _, err := approvals.Load(path)
	if err != nil {
		l.log.Warn("exec approvals file unusable; treating it as empty", "path", path, "err", err)
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

// authorize applies exec approvals to a run: deny, run (as written, or as
// its allowlisted plan), ask for an approval (an *ApprovalNeededError with
// the plan), or act on the operator's signed decision the request carries.
func (l *Local) authorize(req protocol.ExecRequest, workdir string, env []string, s *Settings) (run, error) {
	host := l.hostName()
	policy := l.policy(req.Security, req.Ask, req.AgentID, s)
	if policy.Security == approvals.SecurityDeny {
		return run{}, protocol.Errorf(protocol.ErrDenied, "%s", approvals.DenySecurity(host))
	}
	envMap := protocol.EnvMap(env)
	home := envMap["HOME"]
	if home == "" {
		home, _ = os.UserHomeDir()
	}
	ev := approvals.Evaluate(req.Args.Command, approvals.EvalOptions{
		Cwd:         workdir,
		PATH:        envMap["PATH"],
		Home:        home,
		Allowlist:   policy.Allowlist,
		SafeBins:    s.SafeBins,
		TrustedDirs: s.SafeBinTrustedDirs,
	})
	d := approvals.Decide(host, policy, ev)
	if d.Verdict == approvals.NeedsApproval {
		if req.Approval != nil {
			return l.approved(req, policy, ev, l.plan(req, workdir, env, ev))
		}
		fb := approvals.Fallback(policy, ev)
		return run{}, &ApprovalNeededError{
			Err: protocol.Errorf(protocol.ErrApprovalRequired, "exec on %s needs approval (%s)", l.label(), d.Reason),
			Request: protocol.ApprovalRequest{
				AllowAlways:    policy.Ask != approvals.AskAlways && len(ev.AllowAlwaysPaths()) > 0,
				AskFallback:    policy.AskFallback,
				FallbackAllows: fb.Verdict == approvals.Allow,
				Reason:         d.Reason,
				Plan:           l.plan(req, workdir, env, ev),
			},
		}
	}
	switch {
	case d.Verdict == approvals.Deny:
		return run{}, protocol.Errorf(protocol.ErrDenied, "%s", d.Reason)
	case d.RunPlan:
		l.recordUse(req.AgentID, ev)
		return run{argv: planArgv(ev)}, nil
	}
	return run{}, nil
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

// approved acts on the signed decision of a run that needs approval: it
// must verify with a trusted gateway key, be unexpired and unused, and
// cover exactly the plan the host computes now (the same command, cwd,
// environment and file contents as when it was asked).
func (l *Local) approved(req protocol.ExecRequest, policy approvals.Policy, ev approvals.Evaluation, now protocol.Plan) (run, error) {
	sd := req.Approval
	var trusted []string
	if l.cfg.TrustedKeys != nil {
		trusted = l.cfg.TrustedKeys()
	}
	if err := VerifyDecision(*sd, trusted, time.Now()); err != nil {
		l.log.Warn("approval decision refused", "approval", sd.Decision.ApprovalID, "err", err)
		return run{}, protocol.Errorf(protocol.ErrDenied, "approval refused: %v", err)
	}
	dec := sd.Decision
	if why := planMismatch(dec.Plan, now); why != "" {
		l.log.Warn("approval no longer matches the run", "approval", dec.ApprovalID, "why", why)
		return run{}, protocol.Errorf(protocol.ErrDenied, "%s%s", BindingChanged, why)
	}
	if !l.claim(dec.ApprovalID, time.UnixMilli(dec.ExpiresAtMs)) {
		return run{}, protocol.Errorf(protocol.ErrConflict, "approval %s was already acted on", dec.ApprovalID)
	}
	r := run{runID: dec.ApprovalID}
	switch dec.Decision {
	case protocol.DecisionAllowOnce:
	case protocol.DecisionAllowAlways:
		l.persistAllowAlways(req.AgentID, ev)
	case protocol.DecisionTimeout:
		fb := approvals.Fallback(policy, ev)
		if fb.Verdict != approvals.Allow {
			return run{}, protocol.Errorf(protocol.ErrDenied, "%s", fb.Reason)
		}
		if fb.RunPlan {
			r.argv = planArgv(ev)
		}
	default:
		return run{}, protocol.Errorf(protocol.ErrInvalidRequest, "exec: unknown approval decision %q", dec.Decision)
	}
	// An approved command runs as written (DESIGN.md §7).
	return r, nil
}

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

// plan is what an approval of this run binds: command, cwd, environment
// and the contents of the files it runs.
func (l *Local) plan(req protocol.ExecRequest, workdir string, env []string, ev approvals.Evaluation) protocol.Plan {
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
	seen := map[string]bool{}
	for _, seg := range ev.Segments {
		for _, path := range append([]string{seg.ResolvedPath}, seg.WrapperPaths...) {
			if path == "" || seen[path] {
				continue
			}
			seen[path] = true
			p.Files = append(p.Files, protocol.PlanFile{Path: path, SHA256: fileDigest(path)})
		}
	}
	return p
}

// planMismatch says what differs between the approved plan and the one
// computed now, "" when they agree.
func planMismatch(approved, now protocol.Plan) string {
	switch {
	case approved.Host != now.Host || approved.NodeID != now.NodeID:
		return "host changed"
	case approved.AgentID != now.AgentID || approved.SessionKey != now.SessionKey:
		return "agent changed"
	case approved.Command != now.Command || !slices.Equal(approved.Argv, now.Argv):
		return "command changed"
	case approved.Cwd != now.Cwd || approved.CwdID != now.CwdID:
		return "cwd changed"
	case approved.EnvDigest != now.EnvDigest:
		return "env changed"
	}
	nowFiles := map[string]string{}
	for _, f := range now.Files {
		nowFiles[f.Path] = f.SHA256
	}
	for _, f := range approved.Files {
		if h, ok := nowFiles[f.Path]; !ok || h != f.SHA256 {
			return f.Path + " changed"
		}
		delete(nowFiles, f.Path)
	}
	for path := range nowFiles {
		return path + " changed" // resolves to a file it did not before
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

// fileDigest is the SHA-256 (hex) of a file's content, or a marker when it
// cannot be read (a file that becomes readable later no longer matches).
func fileDigest(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return "unreadable"
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "unreadable"
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

// planArgv is the argv that runs an allowlisted plan: the program itself
// for one segment, else the rendered pipeline through /bin/sh (every word
// quoted: no shell sees the original text again).
func planArgv(ev approvals.Evaluation) []string {
	if len(ev.Argv) == 1 {
		return slices.Clone(ev.Argv[0])
	}
	return []string{"/bin/sh", "-c", ev.Rendered}
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
func (l *Local) persistAllowAlways(agentID string, ev approvals.Evaluation) {
	paths := ev.AllowAlwaysPaths()
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

// workspaceDir resolves a workdir inside a sandbox workspace: empty is the
// workspace, relative paths are joined, absolute paths must lie inside.
func workspaceDir(ws, workdir string) (string, bool) {
	dir := ws
	if w := strings.TrimSpace(workdir); w != "" {
		if filepath.IsAbs(w) {
			dir = filepath.Clean(w)
		} else {
			dir = filepath.Join(ws, w)
		}
	}
	rel, err := filepath.Rel(ws, dir)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", false
	}
	st, err := os.Stat(dir)
	return dir, err == nil && st.IsDir()
}
