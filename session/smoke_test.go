package session

import (
	"testing"

	"github.com/execmesh/execmesh/protocol"
)

func TestSmoke(t *testing.T) {
	m := newManager(t, nil)
	res := mustExec(t, m, ExecRequest{Command: "echo hello; exit 3"})
	t.Logf("%q %v", res.Text(), res.Details)
	id := startBackground(t, m, ExecRequest{Command: "echo start; sleep 0.3; echo end", ScopeKey: "a"})
	r := proc(t, m, "a", protocol.ProcessArgs{Action: "poll", SessionID: id, Timeout: ptr(2000)})
	t.Logf("%q %v", r.Text(), r.Details)
	r = proc(t, m, "a", protocol.ProcessArgs{Action: "poll", SessionID: id, Timeout: ptr(2000)})
	t.Logf("%q %v", r.Text(), r.Details)
	r = proc(t, m, "a", protocol.ProcessArgs{Action: "list"})
	t.Logf("%q", r.Text())
	id = startBackground(t, m, ExecRequest{Command: "stty -echo; echo READY; read line; echo got:$line", ScopeKey: "a", PTY: true})
	waitOutput(t, m, id, "READY")
	r = proc(t, m, "a", protocol.ProcessArgs{Action: "write", SessionID: id, Data: ptr("hé😀")})
	t.Logf("%q %v", r.Text(), r.Details)
	r = proc(t, m, "a", protocol.ProcessArgs{Action: "submit", SessionID: id})
	waitExited(t, m, id)
	r = proc(t, m, "a", protocol.ProcessArgs{Action: "poll", SessionID: id})
	t.Logf("%q %v", r.Text(), r.Details)
	res = mustExec(t, m, ExecRequest{Command: "echo start; sleep 5", TimeoutSec: ptr(1.0)})
	t.Logf("%q %v", res.Text(), res.Details)
}
