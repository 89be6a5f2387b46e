package gateway

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/index"
	"github.com/execmesh/execmesh/protocol"
)

// Session ids come from the index's reservations (index/reserve.go): a
// yielded session's record is in the bucket before the call answers, a
// foreground run leaves no session record, and exit events of an id that
// is still a reservation wait for it.

func TestYieldedSessionRecordedBeforeAnswer(t *testing.T) {
	a, b := startPair(t, nil)
	agent := a.pairAgent(testAgentConfig(t, a.srv, "n1"))
	b.waitNode(agent.ID(), "connected", "paired")
	const cmd = "echo id=$EXECMESH_SESSION; sleep 30"
	for _, tt := range []struct {
		name         string
		args         map[string]any
		host, hostID string
	}{
		{"yield window", map[string]any{"command": cmd, "yieldMs": 300}, index.HostGateway, a.g.ID()},
		{"background", map[string]any{"command": cmd, "background": true}, index.HostGateway, a.g.ID()},
		{"node yield window", map[string]any{"command": cmd, "yieldMs": 300, "host": "node"}, index.HostNode, agent.ID()},
		{"node background", map[string]any{"command": cmd, "background": true, "host": "node"}, index.HostNode, agent.ID()},
	} {
		t.Run(tt.name, func(t *testing.T) {
			res := a.invoke("exec", tt.args, "")
			id := res.SessionID()
			if res.Status() != protocol.StatusRunning || id == "" {
				t.Fatalf("exec: %s", res.Text())
			}
			// The bucket itself, read at once: no watch lag can hide a
			// record written after the answer.
			rec, ok := b.g.index.Read(t.Context(), id)
			if !ok || rec.State != index.StateRunning || rec.Host != tt.host || rec.HostID != tt.hostID ||
				rec.SessionKey != DefaultSessionKey || rec.Instance == "" {
				t.Fatalf("record of %s right after the answer: %+v %v", id, rec, ok)
			}
			// The id the command saw is the one the agent got.
			checkFor(t, 10*time.Second, func() error {
				if p := b.invoke("process", map[string]any{"action": "log", "sessionId": id}, ""); !strings.Contains(p.Text(), "id="+id+"\n") && !strings.HasSuffix(strings.TrimSpace(p.Text()), "id="+id) {
					return fmt.Errorf("log through B: %q, want id=%s", p.Text(), id)
				}
				return nil
			})
			// The working directory (shown in lists) follows; a yielded
			// session's record has it at once.
			if tt.args["background"] == nil && rec.Cwd == "" {
				t.Fatalf("record of %s right after the answer has no cwd: %+v", id, rec)
			}
			checkFor(t, 10*time.Second, func() error {
				if r, _ := b.g.index.Read(t.Context(), id); r.Cwd == "" {
					return fmt.Errorf("record of %s without cwd: %+v", id, r)
				}
				return nil
			})
			if p := b.invoke("process", map[string]any{"action": "poll", "sessionId": id}, ""); p.Status() != protocol.StatusRunning {
				t.Fatalf("poll through B: %s", p.Text())
			}
			a.invoke("process", map[string]any{"action": "kill", "sessionId": id}, "")
		})
	}
}

// TestForegroundRunWritesNoSession: a command that ends in its yield
// window ran under a fleet-unique id (EXECMESH_SESSION, a reservation of
// its gateway's) that never became a session record, and the id goes
// back to the pool unchanged.
func TestForegroundRunWritesNoSession(t *testing.T) {
	a, b := startPair(t, nil)
	res := a.invoke("exec", map[string]any{"command": `echo "id=$EXECMESH_SESSION"`}, "")
	if res.Status() != protocol.StatusCompleted {
		t.Fatalf("exec: %s", res.Text())
	}
	id := strings.TrimPrefix(strings.TrimSpace(res.Text()), "id=")
	if id == "" || strings.ContainsAny(id, " \n") {
		t.Fatalf("exec output %q: no session id", res.Text())
	}
	if _, ok := b.g.index.Read(t.Context(), id); ok {
		t.Fatalf("a foreground run left a session record for %s", id)
	}
	if !b.g.index.Reserved(t.Context(), id) {
		t.Fatalf("%s is not a reservation any more: its key was rewritten or deleted", id)
	}
	if p := b.invoke("process", map[string]any{"action": "poll", "sessionId": id}, ""); p.Status() != protocol.StatusFailed {
		t.Fatalf("poll of the foreground run's id: %s", p.Text())
	}
}

// TestExitOfReservedIDWaits: the exit event of a session whose call has
// not written its record yet is retried, not dropped; once the record is
// there it is handled.
func TestExitOfReservedIDWaits(t *testing.T) {
	tg := startGateway(t, nil)
	g := tg.g
	r, err := g.index.Take(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	ev := protocol.ExitEvent{SessionID: r.ID, SessionKey: DefaultSessionKey, Command: "true", Status: "completed",
		StartedAt: time.Now().UnixMilli(), EndedAt: time.Now().UnixMilli()}
	if err := g.handleExit(t.Context(), ev, ""); err == nil {
		t.Fatal("exit event of a reserved id handled (dropped) instead of retried")
	}
	rec := index.Record{SessionKey: DefaultSessionKey, Host: index.HostGateway, HostID: g.ID(), State: index.StateRunning}
	if err := g.index.Commit(t.Context(), r, rec); err != nil {
		t.Fatal(err)
	}
	if err := g.handleExit(t.Context(), ev, ""); err != nil {
		t.Fatalf("exit event after the record: %v", err)
	}
	if got, ok := g.index.Read(t.Context(), r.ID); !ok || got.State != index.StateFinished {
		t.Fatalf("record after the exit: %+v %v", got, ok)
	}
}

// TestGoneGatewayReservationsDeleted: what a gateway that died held for
// calls to come is deleted by the gateway that sees it go.
func TestGoneGatewayReservationsDeleted(t *testing.T) {
	a, _ := startPair(t, nil)
	kv, err := bus.OpenKeyValue(t.Context(), a.g.js, a.g.prefix, 1, bus.StreamNamesFor(a.g.prefix).Sessions)
	if err != nil {
		t.Fatal(err)
	}
	left, _ := json.Marshal(index.Record{Host: index.HostGateway, HostID: "deadgatewayid", Instance: "x", State: index.StateReserved})
	var ids []string
	for i := range 3 {
		id := fmt.Sprintf("left-%d", i)
		if _, err := kv.Create(t.Context(), id, left); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	checkFor(t, 10*time.Second, func() error {
		for _, id := range ids {
			if !a.g.index.Reserved(t.Context(), id) {
				return fmt.Errorf("%s not seen yet", id)
			}
		}
		return nil
	})
	a.g.onPeerGone(t.Context(), "deadgatewayid")
	for _, id := range ids {
		if _, err := kv.Get(t.Context(), id); err == nil {
			t.Errorf("reservation %s of the gone gateway left", id)
		}
	}
}
