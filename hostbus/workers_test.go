package hostbus

import (
	"sync"
	"testing"
	"time"
)

func TestWorkers(t *testing.T) {
	t.Run("unbounded while busy", func(t *testing.T) {
		// More blocked requests than idle workers are kept: all run at once.
		var w workers
		defer w.close()
		const n = 3 * maxIdleWorkers
		started, release := make(chan struct{}, n), make(chan struct{})
		for range n {
			w.run(func() { started <- struct{}{}; <-release })
		}
		for i := range n {
			select {
			case <-started:
			case <-time.After(10 * time.Second):
				t.Fatalf("%d of %d requests started", i, n)
			}
		}
		close(release)
	})
	t.Run("idle kept up to the bound, ended by close", func(t *testing.T) {
		var w workers
		var wg sync.WaitGroup
		const n = 2 * maxIdleWorkers
		release := make(chan struct{})
		wg.Add(n)
		for range n {
			w.run(func() { defer wg.Done(); <-release })
		}
		close(release)
		wg.Wait()
		deadline := time.Now().Add(10 * time.Second)
		for idle := 0; idle != maxIdleWorkers; {
			w.mu.Lock()
			idle = len(w.idle)
			w.mu.Unlock()
			if time.Now().After(deadline) {
				t.Fatalf("%d idle workers, want %d", idle, maxIdleWorkers)
			}
			time.Sleep(time.Millisecond)
		}
		// An idle worker takes the next request.
		done := make(chan struct{})
		w.run(func() { close(done) })
		<-done
		w.close()
		w.mu.Lock()
		defer w.mu.Unlock()
		if len(w.idle) != 0 || !w.closed {
			t.Fatalf("after close: %d idle, closed %v", len(w.idle), w.closed)
		}
	})
}
