package gateway

import (
	"context"
	"testing"
	"time"
)

func TestNodeReloadGate(t *testing.T) {
	g := newReloadGate()
	g.markReady()
	epoch, err := g.enter(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	reloaded := make(chan time.Time, 1)
	go func() {
		_ = g.reload(context.Background(), func() error { reloaded <- time.Now(); return nil })
	}()
	// The reload waits for the request in flight.
	select {
	case <-reloaded:
		t.Fatal("reload ran while a request was in flight")
	case <-time.After(200 * time.Millisecond):
	}
	exited := time.Now()
	g.exit()
	at := <-reloaded
	if at.Before(exited) {
		t.Fatal("reload before exit")
	}
	if !g.reloaded(epoch) || g.current() != epoch+1 {
		t.Fatalf("epoch %d → %d", epoch, g.current())
	}
	// A request waits while a reload runs, and gives up with its context.
	release := make(chan struct{})
	started := make(chan struct{})
	go func() {
		_ = g.reload(context.Background(), func() error { close(started); <-release; return nil })
	}()
	<-started
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if _, err := g.enter(ctx); err == nil {
		t.Fatal("entered during a reload")
	}
	close(release)
	if _, err := g.enter(t.Context()); err != nil {
		t.Fatal(err)
	}
	g.exit()
}
