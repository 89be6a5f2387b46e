package nodes

import (
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestUnreachableErrorSaysWhatHappened: the text of an unreachable node
// says when its last heartbeat came and what made it unreachable, as the
// registry recorded it; "never" only when no heartbeat came since the
// gateway started.
func TestUnreachableErrorSaysWhatHappened(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		name      string
		n         Node
		want, not []string
	}{
		{"no heartbeat since the start", Node{ID: "n1"},
			[]string{"node n1 is unreachable (last heartbeat never since the gateway started); nothing was started. Retry"}, nil},
		{"heartbeats stopped", Node{ID: "n1", Name: "alpha", LastSeen: now.Add(-7 * time.Second), Silent: "stopped sending heartbeats"},
			[]string{"node alpha (n1) is unreachable (last heartbeat 7s ago; then it stopped sending heartbeats); nothing was started."}, []string{"never", "probe"}},
		{"nobody listens", Node{ID: "n1", LastSeen: now.Add(-time.Second), Probed: now.Add(-2 * time.Second), Silent: "was no longer connected to NATS"},
			[]string{"(last heartbeat 1s ago; then it was no longer connected to NATS)"}, []string{"never", "probe"}},
		{"probe unanswered", Node{ID: "n1", LastSeen: now.Add(-time.Second), Silent: "did not answer the liveness probe"},
			[]string{"(last heartbeat 1s ago; then it did not answer the liveness probe)"}, []string{"never"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := UnreachableError(tc.n, now, "nothing was started").Error()
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("%q lacks %q", msg, w)
				}
			}
			for _, w := range tc.not {
				if strings.Contains(msg, w) {
					t.Errorf("%q says %q", msg, w)
				}
			}
		})
	}
}

// TestSilenceIsRecorded: each way a node stops counting as live is
// recorded for its texts, and cleared when it is live again; the last
// heartbeat is kept.
func TestSilenceIsRecorded(t *testing.T) {
	now := time.Now()
	r := &Registry{log: slog.New(slog.DiscardHandler), nodes: map[string]*entry{}, opts: Options{Now: func() time.Time { return now }}}
	e := &entry{rec: record{ID: "n1"}, live: true, lastSeen: now.Add(-time.Second)}
	r.nodes["n1"] = e
	r.markDown("n1")
	n, _ := r.Get("n1")
	if n.Live || n.Silent != "was no longer connected to NATS" || n.LastSeen.IsZero() {
		t.Fatalf("after markDown: live %v, silent %q, last seen %v", n.Live, n.Silent, n.LastSeen)
	}
	e.live, e.silent = true, ""
	r.mu.Lock()
	r.goSilentLocked(e, "stopped sending heartbeats")
	r.mu.Unlock()
	if n, _ := r.Get("n1"); n.Silent != "stopped sending heartbeats" {
		t.Fatalf("after expiry: silent %q", n.Silent)
	}
}
