package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/config"

	"github.com/execmesh/execmesh/approvals"
	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/gateway"
	"github.com/execmesh/execmesh/protocol"
)

// TestNodeApprovalFlow: a real `execmesh node` process whose own
// exec-approvals.json asks (allowlist, on-miss, askFallback deny): the
// exec is approval-pending on the gateway; approved over HTTP it runs on
// the node and its Exec finished event arrives once; denied, nothing runs.
func TestNodeApprovalFlow(t *testing.T) {
	ns := startNodeServer(t, bus.ServerConfig{})
	gw := startItGateway(t, ns, "", bus.ClientConfig{}, func(c *config.Config) { c.Tools.Exec.ApprovalRunningNoticeMs = 0 })
	np := newNodeProc(t, "asker", "--nats-url", ns.url())
	file := `{"version":1,"defaults":{"security":"allowlist","ask":"on-miss","askFallback":"deny"},"agents":{}}`
	if err := os.WriteFile(approvals.Path(np.stateDir), []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	np.start()
	gw.waitNode(np.id, "connected", "")
	gw.approve(np.id)

	// The commands run in a workdir of their own: under security
	// allowlist a command writes beneath its workdir, never in the
	// node's state dir.
	work := t.TempDir()
	pending := func(command string) string {
		t.Helper()
		var res protocol.Result
		waitFor(t, 30*time.Second, func() error {
			r := gw.invokeRaw("exec", map[string]any{"command": command, "host": "node", "workdir": work})
			if r.Result == nil {
				return fmt.Errorf("%d %s", r.Status, r.Raw)
			}
			res = *r.Result
			return nil
		})
		id := res.Details.ApprovalID.Value()
		if res.Status() != protocol.StatusApprovalPending || id == "" || res.Details.NodeID.Value() != np.id ||
			!strings.Contains(res.Text(), "Host: node") || !strings.Contains(res.Text(), "Node: "+np.id) {
			t.Fatalf("want approval-pending on node %s: %s %v", np.id, res.Text(), res.Details)
		}
		return id
	}
	decide := func(id, decision string) {
		t.Helper()
		if r := gw.do("POST", "/v1/approvals/"+id, map[string]any{"decision": decision}); r.Status != 200 {
			t.Fatalf("decide: %d %s", r.Status, r.Raw)
		}
	}
	collect := func(total time.Duration, kind string) []protocol.SystemEvent {
		var out []protocol.SystemEvent
		deadline := time.Now().Add(total)
		found := time.Time{}
		for time.Now().Before(deadline) && (found.IsZero() || time.Since(found) < time.Second) {
			for _, ev := range gw.events(500 * time.Millisecond) {
				out = append(out, ev)
				if ev.Kind == kind && found.IsZero() {
					found = time.Now()
				}
			}
		}
		return out
	}

	marker := filepath.Join(work, "approved-marker")
	id := pending("touch " + marker + " && echo approved-on-node")
	decide(id, gateway.DecisionAllowOnce)
	evs := collect(30*time.Second, protocol.EventExecFinished)
	var finished []string
	for _, ev := range evs {
		if ev.Kind == protocol.EventExecFinished {
			finished = append(finished, ev.Text)
		}
	}
	if len(finished) != 1 || !strings.HasPrefix(finished[0], fmt.Sprintf("Exec finished (node=%s id=%s, session=", np.id, id)) ||
		!strings.Contains(finished[0], "code 0)\napproved-on-node") {
		t.Fatalf("finished events: %q (all %+v)\n%s", finished, evs, np.out.String())
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatal(err)
	}

	denied := filepath.Join(work, "denied-marker")
	id = pending("touch " + denied)
	decide(id, gateway.DecisionDeny)
	evs = collect(20*time.Second, protocol.EventExecDenied)
	want := fmt.Sprintf("Exec denied (node=%s id=%s, user-denied): touch %s", np.id, id, denied)
	ok := false
	for _, ev := range evs {
		ok = ok || ev.Kind == protocol.EventExecDenied && ev.Text == want
	}
	if !ok {
		t.Fatalf("no %q in %+v", want, evs)
	}
	if _, err := os.Stat(denied); err == nil {
		t.Fatal("a denied command ran")
	}
}
