package nodeagent

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/execmesh/execmesh/approvals"
	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/host"
	"github.com/execmesh/execmesh/protocol"
)

// gatewayKey is a gateway signing key pair for tests.
func gatewayKey(t *testing.T) (nkeys.KeyPair, string) {
	t.Helper()
	kp, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	return kp, pub
}

// approvalNeeded sends req and returns the node's approval request.
func (h *harness) approvalNeeded(req protocol.ExecRequest) protocol.ApprovalRequest {
	h.t.Helper()
	m, e := h.call(protocol.NodeEndpointExec, req, nil)
	if e == nil || e.Type != protocol.ErrApprovalRequired {
		h.t.Fatalf("want approval_required: %v", e)
	}
	var data struct {
		Approval *protocol.ApprovalRequest `json:"approval"`
	}
	if err := json.Unmarshal(bus.ReplyError(m).(*bus.ServiceError).Data, &data); err != nil || data.Approval == nil {
		h.t.Fatalf("approval request: %v %s", err, bus.ReplyError(m).(*bus.ServiceError).Data)
	}
	return *data.Approval
}

func sign(t *testing.T, kp nkeys.KeyPair, id, decision string, plan protocol.Plan) *protocol.SignedDecision {
	t.Helper()
	sd, err := host.SignDecision(kp, protocol.Decision{ApprovalID: id, Decision: decision, Plan: plan, ExpiresAtMs: time.Now().Add(time.Minute).UnixMilli()})
	if err != nil {
		t.Fatal(err)
	}
	return &sd
}

// TestNodeApprovalRequired: a run that needs approval is answered
// ErrApprovalRequired with the node's plan in the error data; a decision
// the gateway signed over that plan then decides: allow-always persists
// the resolved binary in the node's own file, timeout applies the node's
// askFallback, an unknown decision is refused.
func TestNodeApprovalRequired(t *testing.T) {
	kp, pub := gatewayKey(t)
	h := newHarness(t, func(c *Config) { c.GatewayKeys = []string{pub} })
	file := `{"version":1,"defaults":{"security":"allowlist","ask":"on-miss","askFallback":"deny"},"agents":{}}`
	if err := os.WriteFile(approvals.Path(h.a.cfg.StateDir), []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(h.a.cfg.Cwd, "m")
	req := h.execRequest(map[string]any{"command": "touch " + marker}, "full", "off")
	req.AgentID = "main"
	ar := h.approvalNeeded(req)
	p := ar.Plan
	if p.Command != "touch "+marker || p.Cwd != h.a.cfg.Cwd || p.Host != "node" || p.NodeID != h.a.ID() || p.SessionKey != req.SessionKey ||
		p.EnvDigest == "" || len(p.Files) == 0 || !ar.AllowAlways || ar.AskFallback != "deny" || ar.FallbackAllows {
		t.Fatalf("approval request: %+v", ar)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("ran without approval")
	}

	req.Approval = sign(t, kp, "a1", protocol.DecisionTimeout, p)
	if _, e := h.call(protocol.NodeEndpointExec, req, nil); e == nil || e.Type != protocol.ErrDenied || e.Message != approvals.DenyApprovalTimeout {
		t.Fatalf("timeout with askFallback deny: %v", e)
	}
	req.Approval = sign(t, kp, "a1b", "sure", p)
	if _, e := h.call(protocol.NodeEndpointExec, req, nil); e == nil || e.Type != protocol.ErrInvalidRequest {
		t.Fatalf("unknown decision: %v", e)
	}

	req.Approval = sign(t, kp, "a2", protocol.DecisionAllowAlways, p)
	m, e := h.call(protocol.NodeEndpointExec, req, nil)
	if e != nil {
		t.Fatal(e)
	}
	var reply protocol.ExecReply
	_ = json.Unmarshal(m.Data, &reply)
	if reply.Result.Status() != protocol.StatusRunning {
		t.Fatalf("approved run is backgrounded: %s %v", reply.Result.Text(), reply.Result.Details)
	}
	b, _ := os.ReadFile(approvals.Path(h.a.cfg.StateDir))
	touch, _ := filepath.EvalSymlinks("/usr/bin/touch")
	if touch == "" {
		touch, _ = filepath.EvalSymlinks("/bin/touch")
	}
	if !strings.Contains(string(b), touch) {
		t.Fatalf("allow-always not in the node's file (want %s): %s", touch, b)
	}
	// Now allowlisted: no approval needed.
	req.Approval = nil
	if _, e := h.call(protocol.NodeEndpointExec, req, nil); e != nil {
		t.Fatalf("after allow-always: %v", e)
	}
}

// TestNodeRefusesForgedDecisions: a node acts only on a decision signed by
// a gateway key it trusts, over exactly the plan it computes now, once,
// before it expires. Each forgery is refused with a clear error and runs
// nothing.
func TestNodeRefusesForgedDecisions(t *testing.T) {
	kp, pub := gatewayKey(t)
	h := newHarness(t, func(c *Config) { c.GatewayKeys = []string{pub} })
	marker := filepath.Join(h.a.cfg.Cwd, "forged")
	req := h.execRequest(map[string]any{"command": "touch " + marker}, "allowlist", "on-miss")
	req.AgentID = "main"
	ar := h.approvalNeeded(req)
	other, _ := gatewayKey(t)

	expired := sign(t, kp, "x1", protocol.DecisionAllowOnce, ar.Plan)
	expired.Decision.ExpiresAtMs = time.Now().Add(-time.Second).UnixMilli()
	resigned, _ := host.SignDecision(kp, expired.Decision)
	otherPlan := ar.Plan
	otherPlan.Command = "touch " + marker + "-other"
	tampered := sign(t, kp, "x2", protocol.DecisionAllowOnce, ar.Plan)
	tampered.Decision.Decision = protocol.DecisionAllowAlways // signature no longer covers it

	cases := []struct {
		name string
		sd   *protocol.SignedDecision
		want string
	}{
		{"unsigned", &protocol.SignedDecision{Decision: protocol.Decision{ApprovalID: "forged", Decision: protocol.DecisionAllowOnce, Plan: ar.Plan, ExpiresAtMs: time.Now().Add(time.Minute).UnixMilli()}}, "approval refused: signed by a key this host does not trust"},
		{"untrusted key", sign(t, other, "x3", protocol.DecisionAllowOnce, ar.Plan), "approval refused: signed by a key this host does not trust"},
		{"trusted key named, other signer", func() *protocol.SignedDecision {
			s := sign(t, other, "x4", protocol.DecisionAllowOnce, ar.Plan)
			s.GatewayKey = pub
			return s
		}(), "approval refused: the signature does not verify"},
		{"tampered decision", tampered, "approval refused: the signature does not verify"},
		{"expired", &resigned, "approval refused: the decision expired"},
		{"another plan", sign(t, kp, "x5", protocol.DecisionAllowOnce, otherPlan), "approval no longer matches: command changed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := req
			r.Approval = c.sd
			_, e := h.call(protocol.NodeEndpointExec, r, nil)
			if e == nil || e.Type != protocol.ErrDenied || e.Message != c.want {
				t.Fatalf("got %v, want %q", e, c.want)
			}
		})
	}
	// The genuine decision runs once; a replay of it is refused.
	good := sign(t, kp, "good", protocol.DecisionAllowOnce, ar.Plan)
	r := req
	r.Approval = good
	if _, e := h.call(protocol.NodeEndpointExec, r, nil); e != nil {
		t.Fatalf("genuine decision: %v", e)
	}
	if _, e := h.call(protocol.NodeEndpointExec, r, nil); e == nil || e.Type != protocol.ErrConflict {
		t.Fatalf("replayed decision: %v", e)
	}
	waitFile(t, marker)
	if _, err := os.Stat(marker + "-other"); err == nil {
		t.Fatal("a forged plan ran")
	}
}

// TestNodeApprovalBoundToFiles: a decision binds the content of the
// executable it approved; a file rewritten in place after the approval is
// refused by name.
func TestNodeApprovalBoundToFiles(t *testing.T) {
	kp, pub := gatewayKey(t)
	h := newHarness(t, func(c *Config) { c.GatewayKeys = []string{pub} })
	tool := filepath.Join(h.a.cfg.Cwd, "tool")
	if err := os.WriteFile(tool, []byte("#!/bin/sh\necho approved-content\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	req := h.execRequest(map[string]any{"command": "./tool"}, "allowlist", "on-miss")
	ar := h.approvalNeeded(req)
	f, err := os.OpenFile(tool, os.O_WRONLY|os.O_TRUNC, 0) // same inode
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("#!/bin/sh\necho swapped-content\n")
	f.Close()
	req.Approval = sign(t, kp, "b1", protocol.DecisionAllowOnce, ar.Plan)
	_, e := h.call(protocol.NodeEndpointExec, req, nil)
	if e == nil || e.Type != protocol.ErrDenied || e.Message != "approval no longer matches: "+tool+" changed" {
		t.Fatalf("rewritten tool: %v", e)
	}
}

func waitFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never appeared", path)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
