package metrics

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape fetches /metrics through Handler and parses it with Prometheus's
// own text parser.
func scrape(t *testing.T, h http.Handler) map[string]*dto.MetricFamily {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", rec.Code, rec.Body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	return fams
}

// value returns the value of the series of family name whose labels
// include want ("k=v" pairs), or -1 when absent.
func value(fams map[string]*dto.MetricFamily, name string, want ...string) float64 {
	f := fams[name]
	if f == nil {
		return -1
	}
next:
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		for _, kv := range want {
			k, v, _ := strings.Cut(kv, "=")
			if labels[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	return -1
}

func TestRecordAndScrape(t *testing.T) {
	t.Parallel()
	m := New()
	h := m.Handler()
	before := scrape(t, h)
	if v := value(before, "execmesh_tool_calls_total", "tool=exec"); v != -1 {
		t.Errorf("calls before any call: %v", v)
	}
	if before["go_goroutines"] == nil || before["process_cpu_seconds_total"] == nil {
		t.Errorf("runtime/process collectors missing")
	}

	m.ObserveCall("exec", "", "completed", 20*time.Millisecond)
	m.ObserveCall("exec", "", "completed", 3*time.Second)
	m.ObserveCall("exec", "", "invalid_request", time.Millisecond)
	m.ObserveCall("process", "poll", "running", time.Second)
	m.ObserveCall("process", "bogus-action", "weird-status", time.Second)
	m.ObserveCall("rm", "", "completed", time.Second)
	m.SetSessions(3, 7)
	m.AddOutputBytes(1000)
	m.AddOutputBytes(24)
	m.AddOutputBytes(-5)
	m.ObserveApproval("allow-once")
	m.ObserveApproval("deny")
	m.ObserveApproval("deny")
	m.ObserveApproval("maybe")
	m.IncNATSReconnects()

	fams := scrape(t, h)
	for _, tc := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"execmesh_tool_calls_total", []string{"tool=exec", "action=", "status=completed"}, 2},
		{"execmesh_tool_calls_total", []string{"tool=exec", "status=invalid_request"}, 1},
		{"execmesh_tool_calls_total", []string{"tool=process", "action=poll", "status=running"}, 1},
		{"execmesh_tool_calls_total", []string{"tool=process", "action=other", "status=other"}, 1},
		{"execmesh_tool_calls_total", []string{"tool=other"}, 1},
		{"execmesh_exec_call_duration_seconds", nil, 3},
		{"execmesh_sessions", []string{"state=running"}, 3},
		{"execmesh_sessions", []string{"state=finished"}, 7},
		{"execmesh_output_bytes_total", nil, 1024},
		{"execmesh_approvals_total", []string{"decision=allow-once"}, 1},
		{"execmesh_approvals_total", []string{"decision=deny"}, 2},
		{"execmesh_approvals_total", []string{"decision=other"}, 1},
		{"execmesh_nats_reconnects_total", nil, 1},
		{"execmesh_nodes_connected", nil, -1}, // not set: not exported
	} {
		if got := value(fams, tc.name, tc.labels...); got != tc.want {
			t.Errorf("%s%v = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
	// The 3 s exec call lands above the 2.5 s bucket.
	for _, b := range fams["execmesh_exec_call_duration_seconds"].GetMetric()[0].GetHistogram().GetBucket() {
		if b.GetUpperBound() == 2.5 && b.GetCumulativeCount() != 2 {
			t.Errorf("le=2.5 bucket: %d, want 2", b.GetCumulativeCount())
		}
	}

	// Callbacks are read at every scrape and win over SetSessions.
	nodes, running := 2, 5
	m.SetConnectedNodes(func() int { return nodes })
	m.RegisterSessionsFunc(func() (int, int) { return running, 1 })
	fams = scrape(t, h)
	if v := value(fams, "execmesh_nodes_connected"); v != 2 {
		t.Errorf("nodes = %v", v)
	}
	if v := value(fams, "execmesh_sessions", "state=running"); v != 5 {
		t.Errorf("running sessions = %v", v)
	}
	nodes, running = 0, 9
	fams = scrape(t, h)
	if value(fams, "execmesh_nodes_connected") != 0 || value(fams, "execmesh_sessions", "state=running") != 9 {
		t.Errorf("callbacks not re-read")
	}
}

func TestSeparateRegistries(t *testing.T) {
	t.Parallel()
	a, b := New(), New()
	a.IncNATSReconnects()
	if v := value(scrape(t, b.Handler()), "execmesh_nats_reconnects_total"); v != 0 {
		t.Errorf("second Metrics sees the first's counter: %v", v)
	}
}

func TestNilMetrics(t *testing.T) {
	t.Parallel()
	var m *Metrics
	m.ObserveCall("exec", "", "completed", time.Second)
	m.SetSessions(1, 1)
	m.RegisterSessionsFunc(nil)
	m.AddOutputBytes(1)
	m.ObserveApproval("deny")
	m.SetConnectedNodes(nil)
	m.IncNATSReconnects()
	h := http.NotFoundHandler()
	if got := m.Instrument(h); fmt.Sprintf("%p", got) != fmt.Sprintf("%p", h) {
		t.Errorf("nil Instrument wraps the handler")
	}
}

func TestInstrument(t *testing.T) {
	t.Parallel()
	m := New()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /tools/invoke", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
	})
	mux.HandleFunc("GET /v1/events/stream", func(w http.ResponseWriter, r *http.Request) {
		// Server-sent events need Flush through the wrapper.
		f, ok := w.(http.Flusher)
		if !ok {
			http.Error(w, "no flusher", http.StatusInternalServerError)
			return
		}
		io.WriteString(w, "data: x\n\n")
		f.Flush()
	})
	srv := httptest.NewServer(m.Instrument(mux))
	t.Cleanup(srv.Close)
	for range 2 {
		resp, err := http.Post(srv.URL+"/tools/invoke", "application/json", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	resp, err := http.Get(srv.URL + "/v1/events/stream")
	if err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(resp.Body).ReadString('\n')
	resp.Body.Close()
	if line != "data: x\n" {
		t.Errorf("stream: %q", line)
	}
	for _, p := range []string{"/nope/1", "/nope/2"} {
		resp, err := http.Get(srv.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	// A request is counted when its handler returns. The stream's
	// handler may still be returning after its client read the flushed
	// line and moved on (the connection is not reused), so the counts
	// are awaited, not read once.
	want := []struct {
		labels []string
		want   float64
	}{
		{[]string{"route=POST /tools/invoke", "code=400"}, 2},
		{[]string{"route=GET /v1/events/stream", "code=200"}, 1},
		{[]string{"route=unmatched", "code=404"}, 2},
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		fams := scrape(t, m.Handler())
		var wrong []string
		for _, tc := range want {
			if got := value(fams, "execmesh_http_requests_total", tc.labels...); got != tc.want {
				wrong = append(wrong, fmt.Sprintf("requests%v = %v, want %v", tc.labels, got, tc.want))
			}
		}
		if len(wrong) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(strings.Join(wrong, "; "))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestServe(t *testing.T) {
	t.Parallel()
	m := New()
	m.IncNATSReconnects()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- m.Serve(ctx, ln) }()
	resp, err := http.Get("http://" + ln.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "execmesh_nats_reconnects_total 1") {
		t.Errorf("served metrics:\n%s", body)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
	if err := m.ListenAndServe(t.Context(), "256.0.0.1:1"); err == nil {
		t.Errorf("ListenAndServe on a bad address: no error")
	}
}
