package nodeagent

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/execmesh/execmesh/approvals"
	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/protocol"
)

// TestNodeApprovalRequired: a run that needs approval is answered
// ErrApprovalRequired with the node's evaluation in the error data; the
// gateway's Approval then decides: allow-always persists the resolved
// binary in the node's own file, timeout applies the node's askFallback,
// an unknown decision is refused.
func TestNodeApprovalRequired(t *testing.T) {
	h := newHarness(t, nil)
	file := `{"version":1,"defaults":{"security":"allowlist","ask":"on-miss","askFallback":"deny"},"agents":{}}`
	if err := os.WriteFile(approvals.Path(h.a.cfg.StateDir), []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(h.a.cfg.Cwd, "m")
	raw, _ := json.Marshal(map[string]any{"command": "touch " + marker})
	req := ExecRequest{SessionKey: "k", AgentID: "main", Args: raw, Security: "full", Ask: "off"}
	m, e := h.call(EndpointExec, req, nil)
	if e == nil || e.Type != ErrApprovalRequired {
		t.Fatalf("want approval_required: %v", e)
	}
	var data struct {
		Approval ApprovalRequired `json:"approval"`
	}
	if err := json.Unmarshal(bus.ReplyError(m).(*bus.ServiceError).Data, &data); err != nil {
		t.Fatal(err)
	}
	s := data.Approval
	if s.Command != "touch "+marker || s.Cwd != h.a.cfg.Cwd || !s.AllowAlways || s.AskFallback != "deny" || s.FallbackAllows {
		t.Fatalf("summary: %+v", s)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("ran without approval")
	}

	req.Approval = &ExecApproval{ID: "a1", Decision: DecisionTimeout}
	if _, e := h.call(EndpointExec, req, nil); e == nil || e.Type != protocol.ErrDenied || e.Message != approvals.DenyApprovalTimeout {
		t.Fatalf("timeout with askFallback deny: %v", e)
	}
	req.Approval = &ExecApproval{ID: "a1", Decision: "sure"}
	if _, e := h.call(EndpointExec, req, nil); e == nil || e.Type != protocol.ErrInvalidRequest {
		t.Fatalf("unknown decision: %v", e)
	}

	if s.Binding == nil || len(s.Binding.Files) == 0 {
		t.Fatalf("summary without a binding: %+v", s)
	}
	req.Approval = &ExecApproval{ID: "a2", Decision: DecisionAllowAlways}
	if _, e := h.call(EndpointExec, req, nil); e == nil || e.Type != protocol.ErrDenied || !strings.HasPrefix(e.Message, "approval no longer matches: ") {
		t.Fatalf("an approval without the binding: %v", e)
	}
	req.Approval = &ExecApproval{ID: "a2", Decision: DecisionAllowAlways, Binding: s.Binding}
	m, e = h.call(EndpointExec, req, nil)
	if e != nil {
		t.Fatal(e)
	}
	var res protocol.Result
	_ = json.Unmarshal(m.Data, &res)
	if res.Status() != protocol.StatusRunning {
		t.Fatalf("approved run is backgrounded: %s %v", res.Text(), res.Details)
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
	if _, e := h.call(EndpointExec, req, nil); e != nil {
		t.Fatalf("after allow-always: %v", e)
	}
}
