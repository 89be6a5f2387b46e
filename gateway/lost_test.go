package gateway

import (
	"testing"
	"time"

	"github.com/execmesh/execmesh/index"
	"github.com/execmesh/execmesh/protocol"
)

// TestLostAfterPendingNotice: a session whose exit notice was being
// stored when its host went (the store reached the stream, the mark that
// says so did not: a full disk, a timeout, a crash in between) and that
// is then reported lost is announced once. The lost report is stored
// under the notice's identity, so the stream keeps the notice only; a
// session whose notice was never begun is still told lost.
func TestLostAfterPendingNotice(t *testing.T) {
	tg := startGateway(t, nil)
	g := tg.g
	ctx := t.Context()
	start := func() (string, index.Record) {
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
	countFor := func(evs []protocol.SystemEvent, id string) (exits, lost int) {
		for _, ev := range evs {
			if ev.ContextKey != "exec:"+id {
				continue
			}
			switch ev.Kind {
			case protocol.EventExecExit:
				exits++
			case protocol.EventExecLost:
				lost++
			}
		}
		return exits, lost
	}

	// The notice reached the stream; the record still says pending.
	id, rec := start()
	noticeID := "exit:test:" + id
	if err := g.index.Update(ctx, id, func(r *index.Record) bool {
		r.Notice, r.NoticeID = index.NoticePending, noticeID
		return true
	}); err != nil {
		t.Fatal(err)
	}
	notice := protocol.SystemEvent{SessionKey: DefaultSessionKey, ContextKey: "exec:" + id, Kind: protocol.EventExecExit, Text: "Exec completed (test)"}
	if err := g.events.Push(ctx, notice, noticeID); err != nil {
		t.Fatal(err)
	}
	if err := g.hostLost(ctx, id, DefaultSessionKey, rec.StartedAt, "test restart", index.HostGateway, g.ID()); err != nil {
		t.Fatalf("hostLost: %v", err)
	}
	// A session whose notice was never begun is told lost.
	id2, rec2 := start()
	if err := g.hostLost(ctx, id2, DefaultSessionKey, rec2.StartedAt, "test restart", index.HostGateway, g.ID()); err != nil {
		t.Fatalf("hostLost: %v", err)
	}
	evs := tg.events(DefaultSessionKey, 500*time.Millisecond)
	if exits, lost := countFor(evs, id); exits != 1 || lost != 0 {
		t.Errorf("pending notice stored, then lost: %d exec.exit and %d exec.lost for %s, want the notice alone: %+v", exits, lost, id, evs)
	}
	if exits, lost := countFor(evs, id2); exits != 0 || lost != 1 {
		t.Errorf("no notice, then lost: %d exec.exit and %d exec.lost for %s, want one exec.lost", exits, lost, id2)
	}
	if rec, _ := g.index.Lookup(ctx, id); rec.State != index.StateLost || !rec.LostTold {
		t.Errorf("record after the lost report: %+v, want lost and told", rec)
	}
}
