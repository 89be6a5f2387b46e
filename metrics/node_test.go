package metrics

import (
	"sync"
	"testing"
)

// TestNode scrapes a node's metrics twice and sees the counters of its
// stats function move, under the gateway's names where they are shared.
func TestNode(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	stats := NodeStats{SessionsRunning: 1, Calls: map[string]uint64{"exec": 1}, OutputBytes: 10}
	n := NewNode(func() NodeStats {
		mu.Lock()
		defer mu.Unlock()
		s := stats
		s.Calls = map[string]uint64{}
		for k, v := range stats.Calls {
			s.Calls[k] = v
		}
		return s
	})
	fams := scrape(t, n.Handler())
	for _, tc := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"execmesh_sessions", []string{"state=running"}, 1},
		{"execmesh_sessions", []string{"state=finished"}, 0},
		{"execmesh_node_calls_total", []string{"endpoint=exec"}, 1},
		{"execmesh_output_bytes_total", nil, 10},
		{"execmesh_exit_events_published_total", nil, 0},
		{"execmesh_nats_reconnects_total", nil, 0},
	} {
		if got := value(fams, tc.name, tc.labels...); got != tc.want {
			t.Errorf("first scrape: %s%v = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
	if fams["go_goroutines"] == nil || fams["execmesh_tool_calls_total"] != nil {
		t.Errorf("node registry: runtime collectors missing or gateway metrics present")
	}

	mu.Lock()
	stats = NodeStats{SessionsFinished: 1, Calls: map[string]uint64{"exec": 2, "process": 3}, OutputBytes: 25, ExitEventsPublished: 1, NATSReconnects: 2}
	mu.Unlock()
	fams = scrape(t, n.Handler())
	for _, tc := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"execmesh_sessions", []string{"state=running"}, 0},
		{"execmesh_sessions", []string{"state=finished"}, 1},
		{"execmesh_node_calls_total", []string{"endpoint=exec"}, 2},
		{"execmesh_node_calls_total", []string{"endpoint=process"}, 3},
		{"execmesh_output_bytes_total", nil, 25},
		{"execmesh_exit_events_published_total", nil, 1},
		{"execmesh_nats_reconnects_total", nil, 2},
	} {
		if got := value(fams, tc.name, tc.labels...); got != tc.want {
			t.Errorf("second scrape: %s%v = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
}
