package host

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/execmesh/execmesh/approvals"
	"github.com/execmesh/execmesh/protocol"
)

// gatewayKey is a gateway's signing key pair.
func gatewayKey(t *testing.T) (nkeys.KeyPair, string) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return kp, pub
}

// approvalHost is a host whose commands need approval (security
// allowlist, ask on-miss, nothing allowlisted), trusting pub's
// decisions, with a script in its cwd to run. Exit events go to exits.
type approvalHost struct {
	*Local
	script string
	exits  chan protocol.ExitEvent
}

func newApprovalHost(t *testing.T, kind string, trusted ...string) *approvalHost {
	t.Helper()
	exits := make(chan protocol.ExitEvent, 16)
	l := newLocal(t, kind, func(c *Config) {
		c.TrustedKeys = func() []string { return trusted }
		c.OnExit = func(ev protocol.ExitEvent) { exits <- ev }
	})
	script := filepath.Join(l.cfg.Cwd, "approve-me.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho approved-run\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return &approvalHost{Local: l, script: script, exits: exits}
}

// ask is the exec that needs approval.
func (h *approvalHost) ask() protocol.ExecRequest {
	req := execReq(h.Local, "./approve-me.sh")
	req.Security, req.Ask = "allowlist", "on-miss"
	return req
}

// needApproval runs req and returns the plan the host asks to approve.
func (h *approvalHost) needApproval(t *testing.T, req protocol.ExecRequest) protocol.ApprovalRequest {
	t.Helper()
	_, err := h.Exec(t.Context(), req)
	an, ok := AsApprovalNeeded(err)
	if !ok || an.Err.Type != protocol.ErrApprovalRequired {
		t.Fatalf("exec: %v, want an approval request", err)
	}
	return an.Request
}

func sign(t *testing.T, kp nkeys.KeyPair, d protocol.Decision) *protocol.SignedDecision {
	t.Helper()
	sd, err := SignDecision(kp, d)
	if err != nil {
		t.Fatal(err)
	}
	return &sd
}

// waitExit returns the exit event of an approved run.
func (h *approvalHost) waitExit(t *testing.T) protocol.ExitEvent {
	t.Helper()
	select {
	case ev := <-h.exits:
		return ev
	case <-time.After(30 * time.Second):
		t.Fatal("no exit event for the approved run")
		return protocol.ExitEvent{}
	}
}

// TestApprovedRun: a run that needs approval is refused with the plan a
// decision must cover (host, agent, command, cwd and its inode, the
// environment's digest, the script with its hash); the signed allow-once
// decision runs it once, in the background, its exit carrying the
// approval id; the same decision again is refused.
func TestApprovedRun(t *testing.T) {
	t.Parallel()
	kp, pub := gatewayKey(t)
	for _, kind := range []string{KindGateway, KindNode} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			h := newApprovalHost(t, kind, pub)
			ar := h.needApproval(t, h.ask())
			p := ar.Plan
			wantHost, wantNode := approvals.HostGateway, ""
			if kind == KindNode {
				wantHost, wantNode = approvals.HostNode, h.cfg.ID
			}
			if p.Host != wantHost || p.NodeID != wantNode || p.AgentID != "main" || p.SessionKey != testKey || p.Command != "./approve-me.sh" ||
				p.Cwd != h.cfg.Cwd || p.CwdID == "" || p.EnvDigest == "" || ar.AskFallback != approvals.SecurityDeny {
				t.Fatalf("approval request %+v", ar)
			}
			if !slices.ContainsFunc(p.Files, func(f protocol.BoundFile) bool { return f.Path == h.script && f.SHA256 != "" }) {
				t.Fatalf("plan files %+v do not bind the script", p.Files)
			}
			req := h.ask()
			req.Approval = sign(t, kp, protocol.Decision{ApprovalID: "ap-1", Decision: protocol.DecisionAllowOnce, Plan: p, ExpiresAtMs: time.Now().Add(time.Minute).UnixMilli()})
			rep, err := h.Exec(t.Context(), req)
			if err != nil || rep.Result.Status() != protocol.StatusRunning {
				t.Fatalf("approved run: %+v %v", rep.Result, err)
			}
			ev := h.waitExit(t)
			if ev.RunID != "ap-1" || ev.Status != protocol.StatusCompleted || !strings.Contains(ev.Tail, "approved-run") || ev.Instance != h.Instance() {
				t.Errorf("exit of the approved run: %+v", ev)
			}
			if _, err := h.Exec(t.Context(), req); errType(err) != protocol.ErrConflict || !strings.Contains(err.Error(), "already acted on") {
				t.Errorf("the decision replayed: %v, want a conflict", err)
			}

			// A decision sent several times at once runs once.
			req.Approval = sign(t, kp, protocol.Decision{ApprovalID: "ap-2", Decision: protocol.DecisionAllowOnce, Plan: p, ExpiresAtMs: time.Now().Add(time.Minute).UnixMilli()})
			var ran atomic.Int32
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					_, err := h.Exec(t.Context(), req)
					switch {
					case err == nil:
						ran.Add(1)
					case errType(err) != protocol.ErrConflict:
						t.Errorf("a concurrent replay: %v", err)
					}
				})
			}
			wg.Wait()
			if n := ran.Load(); n != 1 {
				t.Fatalf("one decision sent 8 times at once ran %d times", n)
			}
			if ev := h.waitExit(t); ev.RunID != "ap-2" {
				t.Errorf("exit %+v", ev)
			}
		})
	}
}

// TestApprovalRefused: a signed decision is acted on only when it verifies
// with a trusted key, is unexpired, is a decision the host knows, and
// covers this run field by field: host, agent, sessionKey, command, cwd
// (the same directory, not one put in its place), environment and the
// files it runs. Each refusal says what changed and runs nothing.
func TestApprovalRefused(t *testing.T) {
	t.Parallel()
	kp, pub := gatewayKey(t)
	other, _ := gatewayKey(t)
	for _, tc := range []struct {
		name string
		// edit changes the decision (before signing) and the request.
		edit func(t *testing.T, h *approvalHost, d *protocol.Decision, req *protocol.ExecRequest)
		// after changes the signed decision.
		after   func(sd *protocol.SignedDecision)
		signer  nkeys.KeyPair
		errType protocol.ErrorType
		text    string
	}{
		{name: "untrusted key", signer: other, errType: protocol.ErrDenied, text: "approval refused: " + ErrUntrustedKey.Error()},
		{name: "tampered", after: func(sd *protocol.SignedDecision) { sd.Decision.Plan.Command = "rm -rf /" }, errType: protocol.ErrDenied, text: ErrBadSignature.Error()},
		{name: "garbled signature", after: func(sd *protocol.SignedDecision) { sd.Signature = "!!" }, errType: protocol.ErrDenied, text: ErrBadSignature.Error()},
		{name: "expired", edit: func(_ *testing.T, _ *approvalHost, d *protocol.Decision, _ *protocol.ExecRequest) {
			d.ExpiresAtMs = time.Now().Add(-time.Second).UnixMilli()
		}, errType: protocol.ErrDenied, text: ErrDecisionExpired.Error()},
		{name: "unknown decision", edit: func(_ *testing.T, _ *approvalHost, d *protocol.Decision, _ *protocol.ExecRequest) {
			d.Decision = "maybe"
		}, errType: protocol.ErrInvalidRequest, text: `unknown approval decision "maybe"`},
		{name: "deny", edit: func(_ *testing.T, _ *approvalHost, d *protocol.Decision, _ *protocol.ExecRequest) {
			d.Decision = protocol.DecisionDeny
		}, errType: protocol.ErrInvalidRequest, text: "unknown approval decision"},
		{name: "timeout under askFallback deny", edit: func(_ *testing.T, _ *approvalHost, d *protocol.Decision, _ *protocol.ExecRequest) {
			d.Decision = protocol.DecisionTimeout
		}, errType: protocol.ErrDenied},
		{name: "host", edit: func(_ *testing.T, _ *approvalHost, d *protocol.Decision, _ *protocol.ExecRequest) {
			d.Plan.Host, d.Plan.NodeID = approvals.HostNode, "elsewhere"
		}, errType: protocol.ErrDenied, text: BindingChanged + "host changed"},
		{name: "agent", edit: func(_ *testing.T, _ *approvalHost, _ *protocol.Decision, req *protocol.ExecRequest) {
			req.AgentID = "other"
		}, errType: protocol.ErrDenied, text: BindingChanged + "agent changed"},
		{name: "sessionKey", edit: func(_ *testing.T, _ *approvalHost, _ *protocol.Decision, req *protocol.ExecRequest) {
			req.SessionKey = "agent:main:other"
		}, errType: protocol.ErrDenied, text: BindingChanged + "agent changed"},
		{name: "command", edit: func(_ *testing.T, _ *approvalHost, _ *protocol.Decision, req *protocol.ExecRequest) {
			req.Args.Command = "./approve-me.sh --more"
		}, errType: protocol.ErrDenied, text: BindingChanged + "command changed"},
		{name: "cwd path", edit: func(t *testing.T, _ *approvalHost, _ *protocol.Decision, req *protocol.ExecRequest) {
			req.Args.Workdir = t.TempDir()
		}, errType: protocol.ErrDenied, text: BindingChanged + "cwd changed"},
		{name: "cwd replaced", edit: func(t *testing.T, h *approvalHost, _ *protocol.Decision, _ *protocol.ExecRequest) {
			// The same path, another directory (the old one kept, so
			// its inode is not reused), the same script in it.
			cwd := h.cfg.Cwd
			if err := os.Rename(cwd, cwd+".old"); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(cwd, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(h.script, []byte("#!/bin/sh\necho approved-run\n"), 0o755); err != nil {
				t.Fatal(err)
			}
		}, errType: protocol.ErrDenied, text: BindingChanged + "cwd changed"},
		{name: "cwd gone", edit: func(t *testing.T, h *approvalHost, _ *protocol.Decision, _ *protocol.ExecRequest) {
			if err := os.Rename(h.cfg.Cwd, h.cfg.Cwd+".old"); err != nil {
				t.Fatal(err)
			}
		}, errType: protocol.ErrDenied, text: BindingChanged + "cwd changed"},
		{name: "env", edit: func(_ *testing.T, _ *approvalHost, _ *protocol.Decision, req *protocol.ExecRequest) {
			req.Args.Env = map[string]string{"TZ": "UTC"} // a key allowlist runs may set
		}, errType: protocol.ErrDenied, text: BindingChanged + "env changed"},
		{name: "script content", edit: func(t *testing.T, h *approvalHost, _ *protocol.Decision, _ *protocol.ExecRequest) {
			if err := os.WriteFile(h.script, []byte("#!/bin/sh\necho something else\n"), 0o755); err != nil {
				t.Fatal(err)
			}
		}, errType: protocol.ErrDenied, text: BindingChanged},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newApprovalHost(t, KindGateway, pub)
			ar := h.needApproval(t, h.ask())
			d := protocol.Decision{ApprovalID: "ap-" + tc.name, Decision: protocol.DecisionAllowOnce, Plan: ar.Plan, ExpiresAtMs: time.Now().Add(time.Minute).UnixMilli()}
			req := h.ask()
			if tc.edit != nil {
				tc.edit(t, h, &d, &req)
			}
			signer := kp
			if tc.signer != nil {
				signer = tc.signer
			}
			req.Approval = sign(t, signer, d)
			if tc.after != nil {
				tc.after(req.Approval)
			}
			rep, err := h.Exec(t.Context(), req)
			if err == nil {
				t.Fatalf("ran: %+v", rep.Result)
			}
			if errType(err) != tc.errType || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("%v (%s), want a %s error mentioning %q", err, errType(err), tc.errType, tc.text)
			}
			select {
			case ev := <-h.exits:
				t.Fatalf("something ran: %+v", ev)
			default:
			}
		})
	}
}

// TestAllowAlwaysPersisted: an allow-always decision runs the command and
// adds its resolved executable to the agent's allowlist in the host's
// approvals file, so the next run needs no approval.
func TestAllowAlwaysPersisted(t *testing.T) {
	t.Parallel()
	kp, pub := gatewayKey(t)
	h := newApprovalHost(t, KindNode, pub)
	req := h.ask()
	req.Args.Command = "printenv KEEP_ME"
	ar := h.needApproval(t, req)
	if !ar.AllowAlways {
		t.Fatalf("allow-always not offered for printenv: %+v", ar)
	}
	req.Approval = sign(t, kp, protocol.Decision{ApprovalID: "ap-always", Decision: protocol.DecisionAllowAlways, Plan: ar.Plan, ExpiresAtMs: time.Now().Add(time.Minute).UnixMilli()})
	if _, err := h.Exec(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	if ev := h.waitExit(t); ev.RunID != "ap-always" || !strings.Contains(ev.Tail, "kept") {
		t.Errorf("exit %+v", ev)
	}
	f, _, err := approvals.Load(approvals.Path(h.cfg.StateDir))
	if err != nil || f.Agents["main"] == nil || !slices.ContainsFunc(f.Agents["main"].Allowlist, func(e approvals.Entry) bool {
		return strings.HasSuffix(e.Pattern, "/printenv") && e.Source == "allow-always"
	}) {
		t.Fatalf("approvals file after allow-always: %+v %v", f, err)
	}
	req.Approval = nil
	if got, err := runCmd(t, h.Local, req); err != nil || got != "kept" {
		t.Errorf("the next run: %q %v, want it allowlisted", got, err)
	}
}

// TestVerifyDecision covers VerifyDecision alone.
func TestVerifyDecision(t *testing.T) {
	t.Parallel()
	kp, pub := gatewayKey(t)
	now := time.Now()
	d := protocol.Decision{ApprovalID: "x", Decision: protocol.DecisionAllowOnce, Plan: protocol.Plan{Command: "ls"}, ExpiresAtMs: now.UnixMilli()}
	good := *sign(t, kp, d)
	for _, tc := range []struct {
		name    string
		sd      func() protocol.SignedDecision
		trusted []string
		at      time.Time
		want    error
	}{
		{"valid", func() protocol.SignedDecision { return good }, []string{"UOTHER", pub}, now, nil},
		{"valid in its last millisecond", func() protocol.SignedDecision { return good }, []string{pub}, time.UnixMilli(d.ExpiresAtMs).Add(999 * time.Microsecond), nil},
		{"expired", func() protocol.SignedDecision { return good }, []string{pub}, now.Add(time.Second), ErrDecisionExpired},
		{"untrusted", func() protocol.SignedDecision { return good }, []string{"UOTHER"}, now, ErrUntrustedKey},
		{"no key", func() protocol.SignedDecision { s := good; s.GatewayKey = ""; return s }, []string{""}, now, ErrUntrustedKey},
		{"not a key", func() protocol.SignedDecision { s := good; s.GatewayKey = "bogus"; return s }, []string{"bogus"}, now, ErrUntrustedKey},
		{"changed", func() protocol.SignedDecision { s := good; s.Decision.ExpiresAtMs++; return s }, []string{pub}, now, ErrBadSignature},
		{"not base64", func() protocol.SignedDecision { s := good; s.Signature = "%%"; return s }, []string{pub}, now, ErrBadSignature},
	} {
		if err := VerifyDecision(tc.sd(), tc.trusted, tc.at); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}
