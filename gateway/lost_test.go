package gateway

import (
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/index"
	"github.com/execmesh/execmesh/protocol"
)

// TestEndToldOnce: a session's end reaches its agent once, as an exit
// notice or as a lost report, whichever is stored first, in every order
// the exit feed and the lost tellers can take (a store whose index mark
// was lost to a full disk or a crash, an old run's exit redelivered after
// its host's restart was noticed).
func TestEndToldOnce(t *testing.T) {
	tg := startGateway(t, nil)
	g := tg.g
	ctx := t.Context()
	start := func(t *testing.T) (string, index.Record) {
		t.Helper()
		res := tg.invoke("exec", map[string]any{"command": "sleep 30", "background": true}, "")
		id := res.SessionID()
		if res.Status() != protocol.StatusRunning || id == "" {
			t.Fatalf("start: %s", res.Text())
		}
		rec, ok := g.index.Lookup(ctx, id)
		if !ok {
			t.Fatalf("no index record for %s", id)
		}
		return id, rec
	}
	// exit is the session's exit event as the local host sends it (its
	// StartedAt is the host's own clock, not the index record's).
	exit := func(id string, rec index.Record) protocol.ExitEvent {
		code := 0
		return protocol.ExitEvent{SessionID: id, SessionKey: rec.SessionKey, Command: rec.Command, Status: "completed",
			ExitCode: &code, ExitReason: "exit", StartedAt: rec.StartedAt - 3, EndedAt: time.Now().UnixMilli(),
			Notify: true, Text: "Exec completed (test)", Instance: rec.Instance}
	}
	lost := func(t *testing.T, id string, rec index.Record) {
		t.Helper()
		if err := g.hostLost(ctx, id, rec.SessionKey, rec.StartedAt, "test restart", index.HostGateway, g.ID()); err != nil {
			t.Fatalf("hostLost: %v", err)
		}
	}
	handle := func(t *testing.T, id string, rec index.Record) {
		t.Helper()
		if err := g.handleExit(ctx, exit(id, rec), ""); err != nil {
			t.Fatalf("handleExit: %v", err)
		}
	}
	// storedNoMark is what a teller leaves when its event reached the
	// queue and the index write after it did not.
	storedNoMark := func(t *testing.T, id string, rec index.Record, kind string) {
		t.Helper()
		if kind == protocol.EventExecExit {
			if err := g.index.Update(ctx, id, func(r *index.Record) bool {
				r.Notice = index.NoticePending
				return true
			}); err != nil {
				t.Fatal(err)
			}
		}
		ev := protocol.SystemEvent{SessionKey: rec.SessionKey, ContextKey: "exec:" + id, Kind: kind, Text: "stored before the mark"}
		if err := g.events.Push(ctx, ev, endIdentity(rec.SessionKey, id, rec.StartedAt)); err != nil {
			t.Fatal(err)
		}
	}

	cases := []struct {
		name                string
		run                 func(t *testing.T, id string, rec index.Record)
		wantExits, wantLost int
		wantState           string
	}{
		{"exit, then lost", func(t *testing.T, id string, rec index.Record) {
			handle(t, id, rec)
			lost(t, id, rec)
		}, 1, 0, index.StateFinished},
		{"exit stored without its mark, then lost", func(t *testing.T, id string, rec index.Record) {
			storedNoMark(t, id, rec, protocol.EventExecExit)
			lost(t, id, rec)
		}, 1, 0, index.StateLost},
		// An exit that arrives proves the session ended: the record
		// says finished, and the agent, told lost, hears nothing more.
		{"lost, then the exit redelivered", func(t *testing.T, id string, rec index.Record) {
			lost(t, id, rec)
			handle(t, id, rec)
		}, 0, 1, index.StateFinished},
		{"lost stored without its mark, then the exit", func(t *testing.T, id string, rec index.Record) {
			storedNoMark(t, id, rec, protocol.EventExecLost)
			handle(t, id, rec)
		}, 0, 1, index.StateFinished},
		{"lost alone", func(t *testing.T, id string, rec index.Record) {
			lost(t, id, rec)
		}, 0, 1, index.StateLost},
	}
	ids := make([]string, len(cases))
	for i, tc := range cases {
		id, rec := start(t)
		ids[i] = id
		tc.run(t, id, rec)
	}
	evs := tg.events(DefaultSessionKey, 500*time.Millisecond)
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			exits, lost := 0, 0
			for _, ev := range evs {
				if ev.ContextKey != "exec:"+ids[i] {
					continue
				}
				switch ev.Kind {
				case protocol.EventExecExit:
					exits++
				case protocol.EventExecLost:
					lost++
					// The whole id, as in every notice (DESIGN.md §3.5).
					if strings.HasPrefix(ev.Text, "Exec lost (") && !strings.HasPrefix(ev.Text, "Exec lost ("+ids[i]+"): ") {
						t.Errorf("lost text %q does not name the whole session id %s", ev.Text, ids[i])
					}
				}
			}
			if exits != tc.wantExits || lost != tc.wantLost {
				t.Errorf("%d exec.exit and %d exec.lost, want %d and %d", exits, lost, tc.wantExits, tc.wantLost)
			}
			if rec, _ := g.index.Lookup(ctx, ids[i]); rec.State != tc.wantState {
				t.Errorf("record after both: %+v, want state %s", rec, tc.wantState)
			}
		})
	}
}

// TestApprovedRunEndToldOnce: the end of an approved run is one end too:
// its Exec finished event and a lost report of its session are stored
// under the session's end identity, so a run told lost (its host's
// restart noticed) and whose exit comes after gets no Exec finished.
func TestApprovedRunEndToldOnce(t *testing.T) {
	tg := startApprovalGateway(t, "", nil)
	g := tg.g
	ctx := t.Context()
	res := tg.invoke("exec", map[string]any{"command": "sleep 30"}, "")
	if res.Status() != protocol.StatusApprovalPending {
		t.Fatalf("want approval-pending, got %s %q", res.Status(), res.Text())
	}
	aid := res.Details.ApprovalID.Value()
	if r := tg.decide(aid, DecisionAllowOnce); r.Status != 200 {
		t.Fatalf("decide: %d %s", r.Status, r.Raw)
	}
	var id string
	var rec index.Record
	for deadline := time.Now().Add(10 * time.Second); id == "" && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		for _, sid := range g.index.OfHost(index.HostGateway, g.ID()) {
			if r, ok := g.index.Lookup(ctx, sid); ok && r.RunID == aid {
				id, rec = sid, r
			}
		}
	}
	if id == "" {
		t.Fatal("the approved run has no index record")
	}
	if err := g.hostLost(ctx, id, rec.SessionKey, rec.StartedAt, "test restart", index.HostGateway, g.ID()); err != nil {
		t.Fatalf("hostLost: %v", err)
	}
	code := 0
	ev := protocol.ExitEvent{SessionID: id, SessionKey: rec.SessionKey, Command: rec.Command, Status: "completed",
		ExitCode: &code, ExitReason: "exit", StartedAt: rec.StartedAt, EndedAt: time.Now().UnixMilli(),
		RunID: aid, Instance: rec.Instance}
	if err := g.handleExit(ctx, ev, ""); err != nil {
		t.Fatalf("handleExit: %v", err)
	}
	finished, lost := 0, 0
	for _, ev := range tg.events(DefaultSessionKey, 500*time.Millisecond) {
		switch ev.Kind {
		case protocol.EventExecFinished:
			finished++
		case protocol.EventExecLost:
			lost++
		}
	}
	if finished != 0 || lost != 1 {
		t.Errorf("%d exec.finished and %d exec.lost, want the lost report alone", finished, lost)
	}
}
