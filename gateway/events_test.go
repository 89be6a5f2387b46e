package gateway

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/execmesh/execmesh/protocol"
)

func TestEventQueuePersists(t *testing.T) {
	path := filepath.Join(t.TempDir(), "events.json")
	q := openEventQueue(path, discardLogger())
	q.push(protocol.SystemEvent{SessionKey: "agent:a:x", ContextKey: "exec:one", Kind: protocol.EventExecExit, Text: "one"})
	q.push(protocol.SystemEvent{ID: "node1:s:1:exit", SessionKey: "agent:a:x", ContextKey: "exec:two", Kind: protocol.EventExecExit, Text: "two"})
	q.acknowledge("agent:a:x", "exec:gone")

	// A new queue on the same file (a restarted gateway) has everything.
	q2 := openEventQueue(path, discardLogger())
	if q2.push(protocol.SystemEvent{ID: "node1:s:1:exit", SessionKey: "agent:a:x", Text: "two again"}) {
		t.Fatal("a redelivered event with a seen id was queued again")
	}
	if q2.push(protocol.SystemEvent{SessionKey: "agent:a:x", ContextKey: "exec:gone", Text: "late"}) {
		t.Fatal("an acknowledged context key was queued again")
	}
	got := q2.take(context.Background(), "agent:a:x", 0)
	if len(got) != 2 || got[0].Text != "one" || got[1].Text != "two" {
		t.Fatalf("after restart: %+v", got)
	}
	// Taking removed them durably.
	if got := openEventQueue(path, discardLogger()).take(context.Background(), "agent:a:x", 0); len(got) != 0 {
		t.Fatalf("taken events came back: %+v", got)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("file mode: %v %v", st, err)
	}
}

func TestEventQueueCorruptFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "events.json")
	if err := os.WriteFile(path, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	q := openEventQueue(path, discardLogger())
	if got := q.take(context.Background(), "agent:a:x", 0); len(got) != 0 {
		t.Fatalf("%+v", got)
	}
	if _, err := os.Stat(path + ".corrupt"); err != nil {
		t.Fatalf("corrupt file not set aside: %v", err)
	}
}

// Exit events queued but not read survive a gateway restart.
func TestGatewayRestartKeepsQueuedEvents(t *testing.T) {
	state := t.TempDir()
	tg := startGateway(t, func(c *Config, _ *Options) { c.StateDir = state })
	res := tg.invoke("exec", map[string]any{"command": "echo kept; exit 1", "background": true}, "")
	sid := res.SessionID()
	checkFor(t, 10*time.Second, func() error {
		b, err := os.ReadFile(filepath.Join(state, "events.json"))
		if err != nil || !contains(string(b), sid[:8]) {
			return os.ErrNotExist
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tg.g.Close(ctx); err != nil {
		t.Fatal(err)
	}
	tg2 := startGateway(t, func(c *Config, _ *Options) { c.StateDir = state })
	evs := tg2.events(DefaultSessionKey, 0)
	if len(evs) != 1 || evs[0].Text != "Exec completed ("+sid[:8]+", code 1) :: kept" {
		t.Fatalf("after restart: %+v", evs)
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
