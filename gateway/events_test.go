package gateway

import (
	"context"
	"testing"
	"time"

	"github.com/execmesh/execmesh/config"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
	"github.com/execmesh/execmesh/protocol"
)

// onServer makes a test gateway use srv (so that a restarted gateway finds
// what the first one stored).
func onServer(t *testing.T, srv *bus.Server, state string) func(*config.Config, *Options) {
	return func(c *config.Config, o *Options) {
		c.StateDir = state
		o.Conn = bustest.Connect(t, srv, bus.ClientConfig{Name: "gateway"})
		o.Server = srv
	}
}

// Exit events queued but not read survive a gateway restart, even on an
// empty state dir: the queues live in JetStream.
func TestGatewayRestartKeepsQueuedEvents(t *testing.T) {
	srv := bustest.StartServer(t)
	tg := startGateway(t, onServer(t, srv, t.TempDir()))
	res := tg.invoke("exec", map[string]any{"command": "echo kept; exit 1", "background": true}, "")
	sid := res.SessionID()
	checkFor(t, 10*time.Second, func() error {
		if p := tg.invoke("process", map[string]any{"action": "list"}, ""); p.Details.Sessions.Value()[0].Status.Value() == protocol.StatusRunning {
			return context.DeadlineExceeded
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tg.g.Close(ctx); err != nil {
		t.Fatal(err)
	}
	tg2 := startGateway(t, onServer(t, srv, t.TempDir()))
	evs := tg2.events(DefaultSessionKey, 5*time.Second)
	if len(evs) != 1 || evs[0].Text != "Exec completed ("+sid+", code 1) :: kept" {
		t.Fatalf("after restart: %+v", evs)
	}
}

// TestEventsConfirmOnTheNextRequest: a long poll's answer is confirmed by
// the next request of the key, or exactly up to its ack; the SSE stream
// resumes after Last-Event-ID.
func TestEventsConfirmOnTheNextRequest(t *testing.T) {
	tg := startGateway(t, nil)
	for _, cmd := range []string{"echo one; exit 3", "echo two; exit 4"} {
		tg.invoke("exec", map[string]any{"command": cmd, "background": true}, "")
	}
	var evs []protocol.SystemEvent
	checkFor(t, 10*time.Second, func() error {
		evs = tg.takeEvents(DefaultSessionKey, "0")
		if len(evs) != 2 {
			return context.DeadlineExceeded
		}
		return nil
	})
	// A client that handled only the first says so; the second comes again.
	if again := tg.takeEvents(DefaultSessionKey, evs[0].ID); len(again) != 1 || again[0].ID != evs[1].ID {
		t.Fatalf("after ack of the first: %+v", again)
	}
	// A plain next request confirms what the previous one returned.
	if rest := tg.events(DefaultSessionKey, 0); len(rest) != 0 {
		t.Fatalf("after the next request: %+v", rest)
	}
	if r := tg.do("GET", "/v1/events?sessionKey="+DefaultSessionKey+"&ack=nope", nil, nil); r.Status != 400 {
		t.Fatalf("bad ack: %d %s", r.Status, r.Raw)
	}
}

func (tg *testGateway) takeEvents(sessionKey, ack string) []protocol.SystemEvent {
	tg.t.Helper()
	evs, err := tg.g.TakeEvents(tg.t.Context(), sessionKey, 0, ack)
	if err != nil {
		tg.t.Fatal(err)
	}
	return evs
}
