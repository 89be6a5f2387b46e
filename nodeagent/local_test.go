package nodeagent

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/approvals"
	"github.com/execmesh/execmesh/host"
	"github.com/execmesh/execmesh/protocol"
)

// TestNodeStartLocal: without NATS the agent's host runs commands, the
// exit of a background session goes to Config.OnExit (and its record is
// released), and which and the approvals file work for another protocol.
func TestNodeStartLocal(t *testing.T) {
	exits := make(chan protocol.ExitEvent, 4)
	cfg := DefaultConfig()
	cfg.StateDir = t.TempDir()
	cfg.Cwd = t.TempDir()
	cfg.Environ = []string{"PATH=" + ownPath, "HOME=" + cfg.Cwd, "LANG=C"}
	cfg.Session.Shell = "/bin/sh"
	cfg.Confine = host.ConfineConfig{Helper: "/proc/self/exe"}
	cfg.OnExit = func(ev protocol.ExitEvent) { exits <- ev }
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.StartLocal(); err != nil {
		t.Fatal(err)
	}
	if err := a.StartLocal(); err == nil {
		t.Error("a second start was accepted")
	}
	rep, err := a.Host().Exec(t.Context(), protocol.ExecRequest{SessionKey: "openclaw:s", Target: protocol.TargetNode,
		Security: "full", Ask: "off", Args: protocol.ExecArgs{Command: "echo bg", Background: true}})
	if err != nil || rep.Result.Status() != protocol.StatusRunning {
		t.Fatalf("exec: %v %v", rep.Result, err)
	}
	select {
	case ev := <-exits:
		if ev.SessionID != rep.Result.SessionID() || ev.SessionKey != "openclaw:s" || ev.NodeID != a.ID() {
			t.Errorf("exit event %+v", ev)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no exit event")
	}
	if got := a.Which([]string{"sh", "no-such-bin-x", "../sh"}); got["sh"] == "" || len(got) != 1 {
		t.Errorf("Which = %v", got)
	}
	var view struct {
		Exists bool   `json:"exists"`
		Hash   string `json:"hash"`
		Path   string `json:"path"`
	}
	raw, err := a.ApprovalsGet()
	if err != nil || json.Unmarshal(raw, &view) != nil || view.Exists || view.Path != approvals.Path(cfg.StateDir) {
		t.Fatalf("ApprovalsGet = %s, %v", raw, err)
	}
	raw, err = a.ApprovalsSet(json.RawMessage(`{"version":1,"agents":{"main":{"security":"allowlist","allowlist":[{"pattern":"/usr/bin/id"}]}}}`), "")
	if err != nil || json.Unmarshal(raw, &view) != nil || !view.Exists || view.Hash == "" {
		t.Fatalf("ApprovalsSet = %s, %v", raw, err)
	}
	if data, _ := os.ReadFile(approvals.Path(cfg.StateDir)); !strings.Contains(string(data), "/usr/bin/id") {
		t.Errorf("file %s", data)
	}
	if _, err := a.ApprovalsSet(json.RawMessage(`{"version":1}`), "stale"); err == nil {
		t.Error("a stale base hash was accepted")
	}

	// The session's record was released when its exit was told: the next
	// run on the state dir finds nothing lost.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.StartLocal(); err != nil {
		t.Fatal(err)
	}
	defer b.Close(ctx)
	select {
	case ev := <-exits:
		t.Errorf("the next run reported %+v", ev)
	case <-time.After(300 * time.Millisecond):
	}
}
