package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/execmesh/execmesh/internal/httpsrv"
	"github.com/execmesh/execmesh/protocol"
)

// Metrics holds execmesh's Prometheus metrics in a registry of its own.
// Its methods are safe for concurrent use; a nil *Metrics records nothing,
// so callers need no "metrics enabled?" checks.
type Metrics struct {
	reg *prometheus.Registry

	calls          *prometheus.CounterVec
	execDuration   prometheus.Histogram
	outputBytes    prometheus.Counter
	approvals      *prometheus.CounterVec
	natsReconnects prometheus.Counter
	httpRequests   *prometheus.CounterVec
	usageCPU       prometheus.Histogram
	usageMemory    prometheus.Histogram

	mu             sync.Mutex
	running        int
	finished       int
	sessionsFunc   func() (running, finished int)
	connectedNodes func() int
	gatewayID      string
	gateways       func() int
}

// Metric descriptions of the values read at scrape time.
var (
	sessionsDesc = prometheus.NewDesc("execmesh_sessions",
		"Process sessions held, by state (running, or finished and retained).", []string{"state"}, nil)
	nodesDesc = prometheus.NewDesc("execmesh_nodes_connected",
		"Node agents currently connected.", nil, nil)
	gatewayDesc = prometheus.NewDesc("execmesh_gateway_info",
		"This gateway's identity (always 1).", []string{"gateway_id"}, nil)
	gatewaysDesc = prometheus.NewDesc("execmesh_gateways_alive",
		"Gateways of the deployment heart-beating, this one included.", nil, nil)
)

// execBuckets span a quick command (milliseconds) to the longest yield
// window (120 s).
var execBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}

// New returns metrics registered in a new registry, with the Go runtime
// and process collectors.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "execmesh_tool_calls_total",
			Help: "Tool calls by tool, process action and result status (or error type for calls the tool refused).",
		}, []string{"tool", "action", "status"}),
		execDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "execmesh_exec_call_duration_seconds",
			Help:    "Duration of exec calls, until the result or the backgrounding.",
			Buckets: execBuckets,
		}),
		outputBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "execmesh_output_bytes_total",
			Help: "Bytes of command output received.",
		}),
		approvals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "execmesh_approvals_total",
			Help: "Exec approval outcomes by decision.",
		}, []string{"decision"}),
		natsReconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "execmesh_nats_reconnects_total",
			Help: "Reconnections to the NATS servers.",
		}),
		httpRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "execmesh_http_requests_total",
			Help: "HTTP requests by route pattern and status code.",
		}, []string{"route", "code"}),
		usageCPU:    prometheus.NewHistogram(prometheus.HistogramOpts{Name: usageCPUName, Help: usageCPUHelp, Buckets: cpuBuckets}),
		usageMemory: prometheus.NewHistogram(prometheus.HistogramOpts{Name: usageMemoryName, Help: usageMemoryHelp, Buckets: memoryBuckets}),
	}
	m.reg.MustRegister(
		m.calls, m.execDuration, m.outputBytes, m.approvals, m.natsReconnects, m.httpRequests, m.usageCPU, m.usageMemory,
		scrapeCollector{m},
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

// Registry returns the registry, for adding collectors of other parts.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the metrics in the Prometheus text format (GET /metrics).
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// Label values are closed sets: a caller passing something else (a typo, a
// new status) is counted as "other" rather than creating a new series.
var (
	tools     = []string{protocol.ToolExec, protocol.ToolProcess, protocol.ToolApplyPatch}
	statuses  = []string{protocol.StatusRunning, protocol.StatusCompleted, protocol.StatusFailed, protocol.StatusApprovalPending, "error"}
	errTypes  = []protocol.ErrorType{protocol.ErrInvalidRequest, protocol.ErrSecurityViolation, protocol.ErrHostNotAllowed, protocol.ErrDenied, protocol.ErrUnauthorized, protocol.ErrNotFound, protocol.ErrMethodNotAllowed, protocol.ErrConflict, protocol.ErrTooLarge, protocol.ErrRateLimited, protocol.ErrUnavailable, protocol.ErrInternal}
	decisions = []string{"allow-once", "allow-always", "deny", "timeout"}
)

func oneOf(v string, allowed []string) string {
	if slices.Contains(allowed, v) {
		return v
	}
	return "other"
}

// ObserveCall records one tool call: tool is exec or process, action the
// process action ("" for exec), status the result's details.status, or
// the error type of a refused call (protocol.ErrorType, "invalid_request")
// or "error". Exec calls also feed the latency histogram.
func (m *Metrics) ObserveCall(tool, action, status string, d time.Duration) {
	if m == nil {
		return
	}
	tool = oneOf(tool, tools)
	if action != "" {
		action = oneOf(action, protocol.ProcessActions)
	}
	if !slices.Contains(statuses, status) && !slices.Contains(errTypes, protocol.ErrorType(status)) {
		status = "other"
	}
	m.calls.WithLabelValues(tool, action, status).Inc()
	if tool == protocol.ToolExec {
		m.execDuration.Observe(d.Seconds())
	}
}

// SetSessions sets the numbers of running and retained finished sessions
// reported until the next call. RegisterSessionsFunc takes precedence.
func (m *Metrics) SetSessions(running, finished int) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.running, m.finished = running, finished
}

// RegisterSessionsFunc makes every scrape read the session counts from f,
// which must be fast and safe for concurrent use.
func (m *Metrics) RegisterSessionsFunc(f func() (running, finished int)) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sessionsFunc = f
}

// AddOutputBytes counts n bytes of command output.
func (m *Metrics) AddOutputBytes(n int) {
	if m == nil || n <= 0 {
		return
	}
	m.outputBytes.Add(float64(n))
}

// ObserveApproval counts one approval outcome: allow-once, allow-always,
// deny, or timeout (askFallback applied).
func (m *Metrics) ObserveApproval(decision string) {
	if m == nil {
		return
	}
	m.approvals.WithLabelValues(oneOf(decision, decisions)).Inc()
}

// SetConnectedNodes makes every scrape read the number of connected node
// agents from f; until it is called, the metric is not exported (a node
// agent has none).
func (m *Metrics) SetConnectedNodes(f func() int) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.connectedNodes = f
}

// SetGateway names this gateway (execmesh_gateway_info) and makes every
// scrape read the number of gateways alive from alive.
func (m *Metrics) SetGateway(id string, alive func() int) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gatewayID, m.gateways = id, alive
}

// IncNATSReconnects counts one reconnection to NATS (a nats.ReconnectHandler).
func (m *Metrics) IncNATSReconnects() {
	if m == nil {
		return
	}
	m.natsReconnects.Inc()
}

// scrapeCollector exports the values read at scrape time.
type scrapeCollector struct{ m *Metrics }

func (c scrapeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- sessionsDesc
	ch <- nodesDesc
	ch <- gatewayDesc
	ch <- gatewaysDesc
}

func (c scrapeCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	running, finished, sf, nf := c.m.running, c.m.finished, c.m.sessionsFunc, c.m.connectedNodes
	gwID, gf := c.m.gatewayID, c.m.gateways
	c.m.mu.Unlock()
	// The callbacks run outside the lock: they may be slow or call back.
	if sf != nil {
		running, finished = sf()
	}
	ch <- prometheus.MustNewConstMetric(sessionsDesc, prometheus.GaugeValue, float64(running), "running")
	ch <- prometheus.MustNewConstMetric(sessionsDesc, prometheus.GaugeValue, float64(finished), "finished")
	if nf != nil {
		ch <- prometheus.MustNewConstMetric(nodesDesc, prometheus.GaugeValue, float64(nf()))
	}
	if gwID != "" {
		ch <- prometheus.MustNewConstMetric(gatewayDesc, prometheus.GaugeValue, 1, gwID)
	}
	if gf != nil {
		ch <- prometheus.MustNewConstMetric(gatewaysDesc, prometheus.GaugeValue, float64(gf()))
	}
}

// Instrument counts the requests next serves by route and status code.
// The route is the http.ServeMux pattern that matched ("POST
// /tools/invoke"), which next's mux records on the request; paths never
// become labels, so unknown URLs cannot grow the series.
func (m *Metrics) Instrument(next http.Handler) http.Handler {
	if m == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w}
		defer func() {
			route := r.Pattern
			if route == "" {
				route = "unmatched"
			}
			code := sw.status
			if code == 0 {
				code = http.StatusOK
			}
			m.httpRequests.WithLabelValues(route, strconv.Itoa(code)).Inc()
		}()
		next.ServeHTTP(sw, r)
	})
}

// statusWriter records the status code. It keeps Flush (server-sent
// events need it) and Unwrap (for http.ResponseController).
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

func (w *statusWriter) Flush() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// ListenAndServe serves GET /metrics on addr until ctx ends, for processes
// without an HTTP API of their own.
func (m *Metrics) ListenAndServe(ctx context.Context, addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics listener: %w", err)
	}
	return m.Serve(ctx, ln)
}

// Serve serves GET /metrics on ln until ctx ends, then shuts the server
// down (waiting up to 5 s for scrapes in progress) and returns nil.
func (m *Metrics) Serve(ctx context.Context, ln net.Listener) error {
	return serve(ctx, ln, m.Handler())
}

// serve serves h at GET /metrics on ln until ctx ends, then shuts the
// server down, waiting up to 5 s for scrapes in progress.
func serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", h)
	srv := httpsrv.New(ctx, mux, nil)
	stopped := make(chan error, 1)
	stop := context.AfterFunc(ctx, func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		stopped <- srv.Shutdown(sctx)
	})
	err := srv.Serve(ln)
	if !errors.Is(err, http.ErrServerClosed) {
		stop()
		return fmt.Errorf("metrics server: %w", err)
	}
	if serr := <-stopped; serr != nil {
		return fmt.Errorf("metrics server shutdown: %w", serr)
	}
	return nil
}
