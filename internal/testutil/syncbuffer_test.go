package testutil

import (
	"strings"
	"sync"
	"testing"
)

// TestSyncBufferConcurrent: writers and a reader at once (run with -race);
// every write ends up in the buffer.
func TestSyncBufferConcurrent(t *testing.T) {
	var b SyncBuffer
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 100 {
				_, _ = b.Write([]byte("x"))
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if got := b.String(); got != strings.Repeat("x", 400) {
		t.Fatalf("got %d bytes, want 400", len(got))
	}
}
