package nodeagent

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
	"github.com/execmesh/execmesh/metrics"
)

// srvStats asks the node's micro service for $SRV.STATS over NATS and
// returns the node's counters, checking that every endpoint carries the
// same node-wide object.
func (h *harness) srvStats() (micro.Stats, Stats) {
	h.t.Helper()
	subj, err := micro.ControlSubject(micro.StatsVerb, bus.NodeServiceName, "")
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(h.t.Context(), 10*time.Second)
	defer cancel()
	m, err := h.nc.RequestWithContext(ctx, subj, nil)
	if err != nil {
		h.t.Fatalf("%s: %v", subj, err)
	}
	var ms micro.Stats
	if err := json.Unmarshal(m.Data, &ms); err != nil {
		h.t.Fatalf("%s: %v: %s", subj, err, m.Data)
	}
	if len(ms.Endpoints) == 0 {
		h.t.Fatalf("%s: no endpoints: %s", subj, m.Data)
	}
	var first Stats
	for i, e := range ms.Endpoints {
		var s Stats
		if err := json.Unmarshal(e.Data, &s); err != nil {
			h.t.Fatalf("endpoint %s data %q: %v", e.Name, e.Data, err)
		}
		if s.NodeID != h.a.ID() {
			h.t.Fatalf("endpoint %s data: node %q, want %q", e.Name, s.NodeID, h.a.ID())
		}
		if i == 0 {
			first = s
		}
	}
	return ms, first
}

// TestNodeStatsOverNATS reads $SRV.STATS of a running node agent and sees
// its counters move after exec calls.
func TestNodeStatsOverNATS(t *testing.T) {
	h := newHarness(t, nil)
	ms, before := h.srvStats()
	if ms.Name != bus.NodeServiceName || before.Instance != h.a.Instance() {
		t.Fatalf("stats of %q instance %q", ms.Name, before.Instance)
	}
	if before.Calls["exec"] != 0 || before.OutputBytes != 0 || before.ExitEventsPublished != 0 || before.SessionsRunning != 0 {
		t.Fatalf("counters before any exec: %+v", before)
	}

	res := h.mustExec(map[string]any{"command": "printf hello-stats; exit 3", "background": true})
	id := res.SessionID()
	h.mustExec(map[string]any{"command": "sleep 30", "background": true})
	var after Stats
	bustest.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		_, after = h.srvStats()
		if after.ExitEventsPublished < 1 || after.SessionsFinished < 1 {
			return fmt.Errorf("session %s: exit not counted yet: %+v", id, after)
		}
		return nil
	})
	if after.Calls["exec"] != 2 || after.SessionsRunning != 1 || after.OutputBytes < uint64(len("hello-stats")) {
		t.Errorf("counters after two execs: %+v", after)
	}
	if after.Calls["which"] < before.Calls["which"] {
		t.Errorf("which calls went down: %d → %d", before.Calls["which"], after.Calls["which"])
	}
	// micro's own per-endpoint counts sit beside ours.
	ms, _ = h.srvStats()
	for _, e := range ms.Endpoints {
		if e.Name == "exec" && e.NumRequests != 2 {
			t.Errorf("micro's exec num_requests %d", e.NumRequests)
		}
	}
	if got := h.a.Stats(); got.Calls["exec"] != 2 || got.OutputBytes != after.OutputBytes {
		t.Errorf("Agent.Stats %+v, $SRV.STATS %+v", got, after)
	}
}

// scrapeNode fetches url and parses it as Prometheus text.
func scrapeNode(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("GET %s: %d %q", url, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing %s: %v", url, err)
	}
	return fams
}

// metricValue is the value of the series of family name with the label
// pair want ("k=v", or "" for none), or -1 when absent.
func metricValue(fams map[string]*dto.MetricFamily, name, want string) float64 {
	f := fams[name]
	if f == nil {
		return -1
	}
	k, v, _ := strings.Cut(want, "=")
	for _, m := range f.GetMetric() {
		match := want == ""
		for _, l := range m.GetLabel() {
			if l.GetName() == k && l.GetValue() == v {
				match = true
			}
		}
		if !match {
			continue
		}
		if m.Counter != nil {
			return m.Counter.GetValue()
		}
		return m.Gauge.GetValue()
	}
	return -1
}

// TestNodeMetricsHTTP serves a running agent's metrics over HTTP, as
// `execmesh node --metrics-addr` does, and sees the counters move.
func TestNodeMetricsHTTP(t *testing.T) {
	h := newHarness(t, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() { served <- metrics.NewNode(h.a.MetricsStats).Serve(ctx, ln) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	url := "http://" + ln.Addr().String() + "/metrics"

	before := scrapeNode(t, url)
	for _, name := range []string{"execmesh_sessions", "execmesh_output_bytes_total", "execmesh_exit_events_published_total", "execmesh_nats_reconnects_total", "go_goroutines"} {
		if before[name] == nil {
			t.Errorf("%s missing", name)
		}
	}
	if got := metricValue(before, "execmesh_node_calls_total", "endpoint=exec"); got != -1 {
		t.Errorf("exec calls before any exec: %v", got)
	}

	h.mustExec(map[string]any{"command": "echo metrics-output; exit 1", "background": true})
	var after map[string]*dto.MetricFamily
	bustest.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		after = scrapeNode(t, url)
		if got := metricValue(after, "execmesh_exit_events_published_total", ""); got != 1 {
			return fmt.Errorf("exit events published %v", got)
		}
		return nil
	})
	for _, tc := range []struct {
		name, label string
		want        func(float64) bool
	}{
		{"execmesh_node_calls_total", "endpoint=exec", func(v float64) bool { return v == 1 }},
		{"execmesh_output_bytes_total", "", func(v float64) bool { return v >= float64(len("metrics-output\n")) }},
		{"execmesh_sessions", "state=finished", func(v float64) bool { return v == 1 }},
		{"execmesh_sessions", "state=running", func(v float64) bool { return v == 0 }},
	} {
		if got := metricValue(after, tc.name, tc.label); !tc.want(got) {
			t.Errorf("%s{%s} = %v", tc.name, tc.label, got)
		}
	}
}
