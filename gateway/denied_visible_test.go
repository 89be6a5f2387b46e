package gateway

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/execmesh/execmesh/protocol"
)

// TestExecDeniedShowsControlBytes: a script whose name carries an ESC,
// a CR and a bidi override, rewritten after the approval was asked, gets
// an Exec denied event whose reason (the path) and command show those
// characters as escapes, not raw.
func TestExecDeniedShowsControlBytes(t *testing.T) {
	tg := startApprovalGateway(t, "", nil)
	cwd, _ := filepath.EvalSymlinks(tg.cwd)
	name := "s\x1b[2K\rok\u202e.sh"
	path := filepath.Join(tg.cwd, name)
	if err := os.WriteFile(path, []byte("#!/bin/sh\necho original\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	command := "sh '" + name + "'"
	res := tg.invoke("exec", map[string]any{"command": command}, "")
	if res.Status() != protocol.StatusApprovalPending {
		t.Fatalf("want approval-pending, got %s %q", res.Status(), res.Text())
	}
	id := res.Details.ApprovalID.Value()
	rewriteInPlace(t, path, "#!/bin/sh\necho rewritten\n")
	if r := tg.decide(id, DecisionAllowOnce); r.Status != 200 {
		t.Fatalf("decide: %d %s", r.Status, r.Raw)
	}
	ev := tg.waitEvent(protocol.EventExecDenied)
	const shown = `s\x1b[2K\rok\u202e.sh`
	want := fmt.Sprintf("Exec denied (gateway id=%s, approval-binding-changed: %s changed): sh '%s'", id, filepath.Join(cwd, shown), shown)
	if ev.Text != want {
		t.Fatalf("denied event %q, want %q", ev.Text, want)
	}
}
