package gateway

import (
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/execmesh/execmesh/config"

	"github.com/execmesh/execmesh/protocol"
)

// approvalState reads GET /v1/approvals/<id>.
func (tg *testGateway) approvalState(id string) (ApprovalState, int) {
	tg.t.Helper()
	r := tg.do("GET", "/v1/approvals/"+id, nil, nil)
	var st ApprovalState
	if r.Status == http.StatusOK {
		if err := json.Unmarshal(r.Raw, &st); err != nil {
			tg.t.Fatalf("decode %s: %v", r.Raw, err)
		}
	}
	return st, r.Status
}

// waitApprovalState polls the approval until ok accepts it.
func (tg *testGateway) waitApprovalState(id string, ok func(ApprovalState) bool) ApprovalState {
	tg.t.Helper()
	var st ApprovalState
	checkFor(tg.t, 20*time.Second, func() error {
		st, _ = tg.approvalState(id)
		if !ok(st) {
			return errors.New("not yet: " + st.State)
		}
		return nil
	})
	return st
}

// TestApprovalStateAllowOnce: GET /v1/approvals/<id> says pending, then
// decided with the decision and, once the approved command started, its
// session, which process polls to its exit (what `execmesh exec` waits
// for). The sessionKey's events are not read.
func TestApprovalStateAllowOnce(t *testing.T) {
	tg := startApprovalGateway(t, "", nil)
	res := tg.invoke("exec", map[string]any{"command": "echo approved-state"}, "")
	id := res.Details.ApprovalID.Value()
	slug := res.Details.ApprovalSlug.Value()
	for _, key := range []string{id, slug} {
		st, code := tg.approvalState(key)
		if code != 200 || st.State != ApprovalPending || st.ID != id || st.Command != "echo approved-state" || st.SessionID != "" || st.Decision != "" {
			t.Fatalf("pending state by %s: %d %+v", key, code, st)
		}
	}
	if r := tg.decide(slug, DecisionAllowOnce); r.Status != 200 {
		t.Fatalf("decide: %d %s", r.Status, r.Raw)
	}
	st := tg.waitApprovalState(slug, func(st ApprovalState) bool { return st.SessionID != "" })
	if st.State != ApprovalDecided || st.Decision != DecisionAllowOnce || st.DeniedReason != "" {
		t.Fatalf("decided state: %+v", st)
	}
	checkFor(t, 10*time.Second, func() error {
		poll := tg.invoke("process", map[string]any{"action": "poll", "sessionId": st.SessionID, "timeout": 1000}, "")
		if poll.Status() != protocol.StatusCompleted || !contains(poll.Text(), "approved-state") {
			return errors.New(poll.Text())
		}
		return nil
	})
}

// TestApprovalStateDenied: a denial, and a run the binding check refuses,
// are decided with the reason nothing runs.
func TestApprovalStateDenied(t *testing.T) {
	tg := startApprovalGateway(t, "", nil)
	res := tg.invoke("exec", map[string]any{"command": "echo nope"}, "")
	id := res.Details.ApprovalID.Value()
	tg.decide(id, DecisionDeny)
	st := tg.waitApprovalState(id, func(st ApprovalState) bool { return st.DeniedReason != "" })
	if st.State != ApprovalDecided || st.Decision != DecisionDeny || st.DeniedReason != "user-denied" || st.SessionID != "" {
		t.Fatalf("denied state: %+v", st)
	}

	dir := t.TempDir()
	res = tg.invoke("exec", map[string]any{"command": "echo moved", "workdir": dir}, "")
	id = res.Details.ApprovalID.Value()
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	tg.decide(id, DecisionAllowOnce)
	st = tg.waitApprovalState(id, func(st ApprovalState) bool { return st.DeniedReason != "" })
	if st.Decision != DecisionAllowOnce || st.DeniedReason != "approval-binding-changed: cwd changed" {
		t.Fatalf("binding-changed state: %+v", st)
	}
}

// TestApprovalStateExpired: an approval nobody answers expires; with the
// default askFallback (deny) nothing runs, and the state says so.
func TestApprovalStateExpired(t *testing.T) {
	tg := startApprovalGateway(t, "", func(c *config.Config) { c.Tools.Exec.ApprovalTimeoutMs = 200 })
	res := tg.invoke("exec", map[string]any{"command": "echo late"}, "")
	id := res.Details.ApprovalID.Value()
	st := tg.waitApprovalState(id, func(st ApprovalState) bool { return st.DeniedReason != "" })
	if st.State != ApprovalExpired || st.Decision != "" || st.DeniedReason == "" {
		t.Fatalf("expired state: %+v", st)
	}
}

func TestApprovalStateUnknown(t *testing.T) {
	tg := startApprovalGateway(t, "", nil)
	if _, code := tg.approvalState("no-such-approval"); code != http.StatusNotFound {
		t.Fatalf("unknown approval: %d", code)
	}
}
