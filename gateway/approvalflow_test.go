package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/config"

	"github.com/execmesh/execmesh/approvals"
	"github.com/execmesh/execmesh/protocol"
)

// startApprovalGateway is a gateway with the default policy (allowlist,
// on-miss) and an optional approvals file.
func startApprovalGateway(t *testing.T, file string, mutate func(*config.Config)) *testGateway {
	t.Helper()
	return startGateway(t, func(c *config.Config, _ *Options) {
		c.Tools.Exec.Security = ""
		c.Tools.Exec.Ask = ""
		c.Tools.Exec.ApprovalRunningNoticeMs = 0
		if file != "" {
			if err := os.WriteFile(filepath.Join(c.StateDir, approvals.FileName), []byte(file), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if mutate != nil {
			mutate(c)
		}
	})
}

// waitEvent waits for an event of kind and returns it.
func (tg *testGateway) waitEvent(kind string) protocol.SystemEvent {
	tg.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		for _, ev := range tg.events(DefaultSessionKey, 2*time.Second) {
			if ev.Kind == kind {
				return ev
			}
		}
	}
	tg.t.Fatalf("no %s event", kind)
	return protocol.SystemEvent{}
}

func (tg *testGateway) decide(id, decision string) *response {
	return tg.do("POST", "/v1/approvals/"+id, []byte(`{"decision":"`+decision+`"}`), nil)
}

func TestApprovalAllowOnceRunsAndFinishes(t *testing.T) {
	tg := startApprovalGateway(t, "", nil)
	res := tg.invoke("exec", map[string]any{"command": "echo approved-output"}, "")
	if res.Status() != protocol.StatusApprovalPending {
		t.Fatalf("want approval-pending, got %s %q", res.Status(), res.Text())
	}
	id := res.Details.ApprovalID.Value()
	slug := res.Details.ApprovalSlug.Value()
	if slug != id[:8] || !strings.Contains(res.Text(), "Approval required (id "+slug+", full "+id+").") ||
		!strings.Contains(res.Text(), "```sh\necho approved-output\n```") || res.Details.Host.Value() != "gateway" {
		t.Fatalf("pending result: %q %v", res.Text(), res.Details)
	}
	r := tg.do("GET", "/v1/approvals", nil, nil)
	var list struct{ Approvals []PendingApproval }
	_ = json.Unmarshal(r.Raw, &list)
	if len(list.Approvals) != 1 || list.Approvals[0].ID != id || list.Approvals[0].Command != "echo approved-output" ||
		list.Approvals[0].SessionKey != DefaultSessionKey || list.Approvals[0].Cwd != tg.cwd || list.Approvals[0].AgentID != "main" {
		t.Fatalf("list: %s", r.Raw)
	}
	if r := tg.decide(slug, DecisionAllowOnce); r.Status != 200 {
		t.Fatalf("decide by slug: %d %s", r.Status, r.Raw)
	}
	if r := tg.decide(id, DecisionDeny); r.Status != 409 {
		t.Fatalf("second decision: %d %s", r.Status, r.Raw)
	}
	ev := tg.waitEvent(protocol.EventExecFinished)
	if !strings.HasPrefix(ev.Text, "Exec finished (gateway id="+id+", session=") || !strings.HasSuffix(ev.Text, ", code 0)\napproved-output") {
		t.Fatalf("finished event: %q", ev.Text)
	}
}

func TestApprovalDenyAndErrors(t *testing.T) {
	tg := startApprovalGateway(t, "", nil)
	marker := filepath.Join(tg.cwd, "must-not-exist")
	res := tg.invoke("exec", map[string]any{"command": "touch " + marker}, "")
	id := res.Details.ApprovalID.Value()
	if r := tg.decide(id, "maybe"); r.Status != 400 {
		t.Fatalf("bad decision: %d", r.Status)
	}
	if r := tg.decide("00000000-0000-0000-0000-000000000000", DecisionDeny); r.Status != 404 {
		t.Fatalf("unknown id: %d", r.Status)
	}
	if r := tg.decide(id, DecisionDeny); r.Status != 200 {
		t.Fatalf("deny: %d %s", r.Status, r.Raw)
	}
	ev := tg.waitEvent(protocol.EventExecDenied)
	if ev.Text != fmt.Sprintf("Exec denied (gateway id=%s, user-denied): touch %s", id, marker) {
		t.Fatalf("denied event: %q", ev.Text)
	}
	time.Sleep(200 * time.Millisecond)
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("denied command ran")
	}
	// A client cannot smuggle an approval decision into its request.
	r := tg.invokeRaw("exec", map[string]any{"command": "touch " + marker, "approved": true}, "")
	if r.Status != 400 {
		t.Fatalf("approval field accepted: %d %s", r.Status, r.Raw)
	}
}

func TestApprovalTimeoutAppliesAskFallback(t *testing.T) {
	t.Run("deny", func(t *testing.T) {
		tg := startApprovalGateway(t, "", func(c *config.Config) { c.Tools.Exec.ApprovalTimeoutMs = 300 })
		res := tg.invoke("exec", map[string]any{"command": "echo never"}, "")
		id := res.Details.ApprovalID.Value()
		ev := tg.waitEvent(protocol.EventExecDenied)
		if ev.Text != fmt.Sprintf("Exec denied (gateway id=%s, approval-timeout): echo never", id) {
			t.Fatalf("%q", ev.Text)
		}
		if r := tg.decide(id, DecisionAllowOnce); r.Status != 409 && r.Status != 404 {
			t.Fatalf("decision after expiry: %d", r.Status)
		}
	})
	t.Run("full", func(t *testing.T) {
		tg := startApprovalGateway(t, `{"version":1,"defaults":{"askFallback":"full"},"agents":{}}`,
			func(c *config.Config) {
				c.Tools.Exec.ApprovalTimeoutMs = 300
				c.Tools.Exec.Security = "full"
				c.Tools.Exec.Ask = "always"
			})
		tg.invoke("exec", map[string]any{"command": "echo fallback-ran"}, "")
		ev := tg.waitEvent(protocol.EventExecFinished)
		if !strings.HasSuffix(ev.Text, "code 0)\nfallback-ran") {
			t.Fatalf("%q", ev.Text)
		}
	})
}

func TestAllowlistAndAllowAlways(t *testing.T) {
	tg := startApprovalGateway(t, "", nil)
	res := tg.invoke("exec", map[string]any{"command": "echo always"}, "")
	id := res.Details.ApprovalID.Value()
	if r := tg.decide(id, DecisionAllowAlways); r.Status != 200 {
		t.Fatalf("%d %s", r.Status, r.Raw)
	}
	tg.waitEvent(protocol.EventExecFinished)
	f, _, err := approvals.Load(filepath.Join(tg.g.Config().StateDir, approvals.FileName))
	if err != nil {
		t.Fatal(err)
	}
	entries := f.Agents["main"].Allowlist
	if len(entries) != 1 || !strings.HasSuffix(entries[0].Pattern, "/echo") || entries[0].Source != "allow-always" {
		t.Fatalf("allow-always not persisted: %+v", entries)
	}
	// Now allowlisted: runs at once, as the analysed argv.
	res = tg.invoke("exec", map[string]any{"command": "echo now-allowed"}, "")
	if res.Status() != "completed" || res.Text() != "now-allowed" {
		t.Fatalf("allowlisted run: %s %q", res.Status(), res.Text())
	}
	// Chaining is never auto-allowed, even of allowlisted programs.
	res = tg.invoke("exec", map[string]any{"command": "echo a; echo b"}, "")
	if res.Status() != protocol.StatusApprovalPending {
		t.Fatalf("chained command: %s %q", res.Status(), res.Text())
	}
}

func TestAllowlistAskOffDeniesMiss(t *testing.T) {
	tg := startApprovalGateway(t, `{"version":1,"agents":{"main":{"allowlist":[{"pattern":"/usr/bin/printf"}]}}}`,
		func(c *config.Config) { c.Tools.Exec.Ask = "off" })
	r := tg.invokeRaw("exec", map[string]any{"command": "id"}, "")
	if r.Status != 400 || r.Error.Message != "exec denied: allowlist miss" {
		t.Fatalf("%d %s", r.Status, r.Raw)
	}
	r = tg.invokeRaw("exec", map[string]any{"command": "printf ok > /tmp/x"}, "")
	if r.Status != 400 || r.Error.Message != "exec denied: allowlist miss" {
		t.Fatalf("redirect: %d %s", r.Status, r.Raw)
	}
	if res := tg.invoke("exec", map[string]any{"command": "printf 'hello %s' world"}, ""); res.Text() != "hello world" {
		t.Fatalf("allowlisted printf: %q", res.Text())
	}
	// The file tightens: security deny there wins over the config.
	tg2 := startApprovalGateway(t, `{"version":1,"defaults":{"security":"deny"},"agents":{}}`, func(c *config.Config) { c.Tools.Exec.Security = "full" })
	if r := tg2.invokeRaw("exec", map[string]any{"command": "echo"}, ""); r.Status != 400 || r.Error.Message != "exec denied: host=gateway security=deny" {
		t.Fatalf("file deny: %d %s", r.Status, r.Raw)
	}
}

func TestApprovalBindingChange(t *testing.T) {
	tg := startApprovalGateway(t, "", nil)
	dir := filepath.Join(tg.cwd, "work")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	res := tg.invoke("exec", map[string]any{"command": "pwd", "workdir": dir}, "")
	id := res.Details.ApprovalID.Value()
	// Replace the directory between approval request and spawn.
	if err := os.Rename(dir, dir+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	tg.decide(id, DecisionAllowOnce)
	ev := tg.waitEvent(protocol.EventExecDenied)
	if !strings.Contains(ev.Text, "approval-binding-changed: cwd changed") {
		t.Fatalf("%q", ev.Text)
	}
}

// TestApprovalSlugAndNotice covers spec §23.9 case 88.
func TestApprovalSlugAndNotice(t *testing.T) {
	tg := startApprovalGateway(t, "", nil)
	res := tg.invoke("exec", map[string]any{"command": "echo slug"}, "")
	id, slug := res.Details.ApprovalID.Value(), res.Details.ApprovalSlug.Value()
	if slug != id[:8] || len(id) != 36 {
		t.Fatalf("slug %q of id %q", slug, id)
	}
	for ms, want := range map[int]int{10000: 10, 400: 1, 1499: 1, 1500: 2} {
		if got := noticeSeconds(ms); got != want {
			t.Errorf("noticeSeconds(%d) = %d, want %d", ms, got, want)
		}
	}
}

func TestApprovalRunningNotice(t *testing.T) {
	tg := startApprovalGateway(t, "", func(c *config.Config) { c.Tools.Exec.ApprovalRunningNoticeMs = 200 })
	res := tg.invoke("exec", map[string]any{"command": "sleep 1; echo slow"}, "")
	id := res.Details.ApprovalID.Value()
	tg.decide(id, DecisionAllowOnce)
	ev := tg.waitEvent(protocol.EventExecRunning)
	if !strings.HasPrefix(ev.Text, "Exec running (gateway id="+id+", session=") || !strings.HasSuffix(ev.Text, ", >1s): sleep 1; echo slow") {
		t.Fatalf("%q", ev.Text)
	}
	tg.waitEvent(protocol.EventExecFinished)
}

// TestApprovalDecisionNeedsToken: a forged decision, without the token or
// with a wrong one, is refused with 401 and decides nothing; the pending
// approval stays until a caller with the token decides it.
func TestApprovalDecisionNeedsToken(t *testing.T) {
	tg := startApprovalGateway(t, "", func(c *config.Config) { c.Gateway.Auth.Token = "approver-token" })
	res := tg.invoke("exec", map[string]any{"command": "echo forged-approval"}, "")
	if res.Status() != protocol.StatusApprovalPending {
		t.Fatalf("want approval-pending, got %s %q", res.Status(), res.Text())
	}
	id := res.Details.ApprovalID.Value()
	body := []byte(`{"decision":"allow-always"}`)

	noToken, err := http.Post(tg.srv.URL+"/v1/approvals/"+id, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	noToken.Body.Close()
	if noToken.StatusCode != http.StatusUnauthorized {
		t.Fatalf("decision without a token: %d", noToken.StatusCode)
	}
	if r := tg.do("POST", "/v1/approvals/"+id, body, http.Header{"Authorization": {"Bearer forged"}}); r.Status != http.StatusUnauthorized {
		t.Fatalf("decision with a wrong token: %d %s", r.Status, r.Raw)
	}
	if left := tg.g.PendingApprovals(); len(left) != 1 || left[0].ID != id {
		t.Fatalf("pending after forged decisions: %+v", left)
	}
	if r := tg.decide(id, DecisionDeny); r.Status != 200 {
		t.Fatalf("decision with the token: %d %s", r.Status, r.Raw)
	}
	if ev := tg.waitEvent(protocol.EventExecDenied); !strings.Contains(ev.Text, "user-denied") {
		t.Fatalf("denied event: %q", ev.Text)
	}
}
