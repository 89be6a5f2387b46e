package events

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
	"github.com/execmesh/execmesh/protocol"
)

func newQueue(t *testing.T, max int) (*Queue, *bus.Server) {
	t.Helper()
	srv := bustest.StartServer(t)
	nc := bustest.Connect(t, srv, bus.ClientConfig{})
	q, err := New(Options{Conn: nc, JS: bustest.JetStream(t, nc), MaxPerKey: max})
	if err != nil {
		t.Fatal(err)
	}
	return q, srv
}

func push(t *testing.T, q *Queue, key, text, dedupe string) {
	t.Helper()
	if err := q.Push(t.Context(), protocol.SystemEvent{SessionKey: key, ContextKey: "exec:" + text, Kind: protocol.EventExecExit, Text: text}, dedupe); err != nil {
		t.Fatalf("push %s: %v", text, err)
	}
}

func texts(evs []protocol.SystemEvent) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.Text)
	}
	return out
}

// A long poll returns what is queued and confirms it only when the same
// sessionKey asks again; queues of different keys are apart; an id pushed
// twice is stored once.
func TestTakeConfirmsOnTheNextRequest(t *testing.T) {
	q, _ := newQueue(t, 0)
	ctx := t.Context()
	push(t, q, "agent:a:x", "one", "d1")
	push(t, q, "agent:a:x", "two", "d2")
	push(t, q, "agent:a:x", "two-again", "d2") // same identity: dropped
	push(t, q, "agent:b:x", "other", "")
	got, err := q.Take(ctx, "agent:a:x", 0, "")
	if err != nil || !slices.Equal(texts(got), []string{"one", "two"}) {
		t.Fatalf("first take %v %v", texts(got), err)
	}
	if got[0].ID == "" || got[0].SessionKey != "agent:a:x" || got[0].TS == 0 {
		t.Fatalf("event %+v", got[0])
	}
	// Not confirmed yet: a client that crashed before reading asks again
	// with the last id it handled.
	again, err := q.Take(ctx, "agent:a:x", 0, got[0].ID)
	if err != nil || !slices.Equal(texts(again), []string{"two"}) {
		t.Fatalf("take with ack of the first: %v %v", texts(again), err)
	}
	// The next request confirms the previous answer.
	if rest, err := q.Take(ctx, "agent:a:x", 0, ""); err != nil || len(rest) != 0 {
		t.Fatalf("after confirm: %v %v", texts(rest), err)
	}
	if other, _ := q.Take(ctx, "agent:b:x", 0, ""); !slices.Equal(texts(other), []string{"other"}) {
		t.Fatalf("other key: %v", texts(other))
	}
}

// A waiting long poll wakes for an event pushed meanwhile.
func TestTakeWaits(t *testing.T) {
	q, _ := newQueue(t, 0)
	done := make(chan []protocol.SystemEvent, 1)
	go func() {
		evs, _ := q.Take(context.Background(), "agent:a:x", 5*time.Second, "")
		done <- evs
	}()
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	push(t, q, "agent:a:x", "late", "")
	select {
	case evs := <-done:
		if !slices.Equal(texts(evs), []string{"late"}) || time.Since(start) > 2*time.Second {
			t.Fatalf("woke with %v after %s", texts(evs), time.Since(start))
		}
	case <-time.After(6 * time.Second):
		t.Fatal("long poll did not wake")
	}
}

// An overflowing queue keeps what it holds and announces the rest.
func TestOverflowIsAnnounced(t *testing.T) {
	q, _ := newQueue(t, 3)
	for i := range 5 {
		push(t, q, "agent:a:x", fmt.Sprint(i), "")
	}
	got, err := q.Take(t.Context(), "agent:a:x", 0, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 || got[3].Kind != KindDropped || !slices.Equal(texts(got[:3]), []string{"0", "1", "2"}) {
		t.Fatalf("got %v", got)
	}
	if want := "2 system event(s)"; got[3].Text[:len(want)] != want {
		t.Fatalf("announcement %q", got[3].Text)
	}
}

// Drop removes one context's events; Stream resumes after an id and
// confirms what came before it; Follow confirms what it sent.
func TestDropStreamFollow(t *testing.T) {
	q, _ := newQueue(t, 0)
	ctx := t.Context()
	for _, s := range []string{"a", "b", "c"} {
		push(t, q, "agent:a:x", s, "")
	}
	if err := q.Drop(ctx, "agent:a:x", "exec:b"); err != nil {
		t.Fatal(err)
	}
	var seen []protocol.SystemEvent
	sctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_ = q.Stream(sctx, "agent:a:x", "", func(ev protocol.SystemEvent) error { seen = append(seen, ev); return nil })
	cancel()
	if !slices.Equal(texts(seen), []string{"a", "c"}) {
		t.Fatalf("stream saw %v", texts(seen))
	}
	// Resume after "a": "a" is confirmed, "c" comes again.
	var resumed []string
	sctx, cancel = context.WithTimeout(ctx, 500*time.Millisecond)
	_ = q.Stream(sctx, "agent:a:x", seen[0].ID, func(ev protocol.SystemEvent) error { resumed = append(resumed, ev.Text); return nil })
	cancel()
	if !slices.Equal(resumed, []string{"c"}) {
		t.Fatalf("resumed %v", resumed)
	}
	var mu sync.Mutex
	var followed []string
	fctx, fcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- q.Follow(fctx, "agent:a:x", func(ev protocol.SystemEvent) error {
			mu.Lock()
			followed = append(followed, ev.Text)
			mu.Unlock()
			return nil
		})
	}()
	push(t, q, "agent:a:x", "d", "")
	bustest.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		mu.Lock()
		defer mu.Unlock()
		if !slices.Equal(followed, []string{"c", "d"}) {
			return fmt.Errorf("followed %v", followed)
		}
		return nil
	})
	fcancel()
	<-done
	if rest, _ := q.Take(ctx, "agent:a:x", 0, ""); len(rest) != 0 {
		t.Fatalf("after follow: %v", texts(rest))
	}
}

// TestDroppedEventsLoggedOncePerInterval: events pushed to a full queue
// are each counted for the announcement, but the log gets one line per
// sessionKey for the burst (with dropped=1, the count of the rest coming
// when the interval ends), not one per event.
func TestDroppedEventsLoggedOncePerInterval(t *testing.T) {
	srv := bustest.StartServer(t)
	nc := bustest.Connect(t, srv, bus.ClientConfig{})
	var out syncBuffer
	log := slog.New(slog.NewTextHandler(&out, nil))
	q, err := New(Options{Logger: log, Conn: nc, JS: bustest.JetStream(t, nc), MaxPerKey: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"agent:a:x", "agent:b:x"} {
		for i := range 30 {
			push(t, q, key, fmt.Sprint(i), "")
		}
	}
	lines := strings.Count(out.String(), "events dropped")
	if lines != 2 || strings.Count(out.String(), "dropped=1") != 2 {
		t.Errorf("%d lines about dropped events for 56 events dropped under 2 keys, want 2:\n%s", lines, out.String())
	}
	got, err := q.Take(t.Context(), "agent:a:x", 0, "")
	if err != nil || len(got) != 3 || !strings.HasPrefix(got[2].Text, "28 system event(s)") {
		t.Fatalf("take: %v, %v; want 2 events and 28 announced", texts(got), err)
	}
}

// syncBuffer is a log's output written from several goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
