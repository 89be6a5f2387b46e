package metrics

import (
	"context"
	"net"
	"net/http"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// NodeStats are a node agent's counters, read at every scrape. The JSON
// names are those of the agent's $SRV.STATS data (nodeagent.Stats).
type NodeStats struct {
	// SessionsRunning and SessionsFinished are the sessions the node's
	// session core holds: running (foreground ones included), and
	// finished but retained.
	SessionsRunning  int `json:"sessionsRunning"`
	SessionsFinished int `json:"sessionsFinished"`
	// Calls counts the requests the node handled, by endpoint name (exec,
	// process, list, …), refused ones included.
	Calls map[string]uint64 `json:"calls"`
	// OutputBytes counts the bytes of command output received.
	OutputBytes uint64 `json:"outputBytes"`
	// ExitEventsPublished counts the exit events JetStream acknowledged
	// (a retry the stream recognised as a duplicate is not counted again).
	ExitEventsPublished uint64 `json:"exitEventsPublished"`
	// NATSReconnects counts the reconnections to NATS.
	NATSReconnects uint64 `json:"natsReconnects"`
	// Usage holds the histograms of what finished sessions cost
	// (UsageRecorder); zero histograms are not exported.
	Usage UsageStats `json:"usage"`
	// Containment is how the node's session core holds process trees:
	// "cgroup" or "process-group".
	Containment string `json:"containment,omitempty"`
}

// Node holds a node agent's Prometheus metrics in a registry of its own:
// the sessions gauge, output bytes and NATS reconnects under the
// gateway's names (execmesh_sessions, execmesh_output_bytes_total,
// execmesh_nats_reconnects_total), plus execmesh_node_calls_total by
// endpoint and execmesh_exit_events_published_total, and the Go runtime
// and process collectors. Every value is read from the stats function at
// scrape time, so the node keeps a single set of counters.
type Node struct {
	reg *prometheus.Registry
}

// Metric descriptions of a node agent.
var (
	nodeCallsDesc = prometheus.NewDesc("execmesh_node_calls_total",
		"Requests a node agent handled, by endpoint.", []string{"endpoint"}, nil)
	nodeOutputDesc = prometheus.NewDesc("execmesh_output_bytes_total",
		"Bytes of command output received.", nil, nil)
	nodeExitEventsDesc = prometheus.NewDesc("execmesh_exit_events_published_total",
		"Exit events a node agent published to JetStream (acknowledged).", nil, nil)
	nodeReconnectsDesc = prometheus.NewDesc("execmesh_nats_reconnects_total",
		"Reconnections to the NATS servers.", nil, nil)
)

// NewNode returns a node agent's metrics, reading its counters from stats
// at every scrape; stats must be fast and safe for concurrent use.
func NewNode(stats func() NodeStats) *Node {
	n := &Node{reg: prometheus.NewRegistry()}
	n.reg.MustRegister(
		nodeCollector{stats: stats},
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return n
}

// Handler serves the metrics in the Prometheus text format (GET /metrics).
func (n *Node) Handler() http.Handler {
	return promhttp.HandlerFor(n.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// Serve serves GET /metrics on ln until ctx ends (`execmesh node
// --metrics-addr`), then shuts the server down (waiting up to 5 s for
// scrapes in progress) and returns nil.
func (n *Node) Serve(ctx context.Context, ln net.Listener) error {
	return serve(ctx, ln, n.Handler())
}

// nodeCollector exports a node's counters, read at scrape time.
type nodeCollector struct {
	stats func() NodeStats
}

func (c nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- sessionsDesc
	ch <- nodeCallsDesc
	ch <- nodeOutputDesc
	ch <- nodeExitEventsDesc
	ch <- nodeReconnectsDesc
	ch <- nodeUsageCPUDesc
	ch <- nodeUsageMemoryDesc
}

func (c nodeCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	ch <- prometheus.MustNewConstMetric(sessionsDesc, prometheus.GaugeValue, float64(s.SessionsRunning), "running")
	ch <- prometheus.MustNewConstMetric(sessionsDesc, prometheus.GaugeValue, float64(s.SessionsFinished), "finished")
	endpoints := make([]string, 0, len(s.Calls))
	for e := range s.Calls {
		endpoints = append(endpoints, e)
	}
	slices.Sort(endpoints)
	for _, e := range endpoints {
		ch <- prometheus.MustNewConstMetric(nodeCallsDesc, prometheus.CounterValue, float64(s.Calls[e]), e)
	}
	ch <- prometheus.MustNewConstMetric(nodeOutputDesc, prometheus.CounterValue, float64(s.OutputBytes))
	ch <- prometheus.MustNewConstMetric(nodeExitEventsDesc, prometheus.CounterValue, float64(s.ExitEventsPublished))
	ch <- prometheus.MustNewConstMetric(nodeReconnectsDesc, prometheus.CounterValue, float64(s.NATSReconnects))
	if len(s.Usage.CPUSeconds.Bounds) > 0 {
		ch <- s.Usage.CPUSeconds.metric(nodeUsageCPUDesc)
	}
	if len(s.Usage.MemoryPeakBytes.Bounds) > 0 {
		ch <- s.Usage.MemoryPeakBytes.metric(nodeUsageMemoryDesc)
	}
}
