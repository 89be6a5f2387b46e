package nodeagent

import (
	"context"
	"maps"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/execmesh/execmesh/hostbus"
	"github.com/execmesh/execmesh/metrics"
)

// Stats are a node agent's counters. The micro service's $SRV.STATS answer
// carries them as the data of every endpoint (the same node-wide object
// each time: micro asks for data per endpoint), and `execmesh node
// --metrics-addr` exports them to Prometheus (MetricsStats).
//
// Calls leaves out requests refused because the agent is closing.
type Stats struct {
	NodeID   string `json:"nodeId"`
	Instance string `json:"instance"`
	metrics.NodeStats
}

// counters are the agent's own counts. The zero value is ready.
type counters struct {
	outputBytes   atomic.Uint64
	exitPublished atomic.Uint64
	usage         *metrics.UsageRecorder // set by New

	mu    sync.Mutex
	calls map[string]uint64 // by endpoint
}

// addOutput counts n bytes of command output (session.Config.OnOutput).
func (c *counters) addOutput(n int) {
	if n > 0 {
		c.outputBytes.Add(uint64(n))
	}
}

// exitEventPublished counts one exit event JetStream acknowledged.
func (c *counters) exitEventPublished(ack *jetstream.PubAck) {
	if ack != nil && !ack.Duplicate {
		c.exitPublished.Add(1)
	}
}

// counted wraps an endpoint's handler to count its calls.
func (c *counters) counted(endpoint string, fn hostbus.HandlerFunc) hostbus.HandlerFunc {
	return func(ctx context.Context, req micro.Request) ([]byte, error) {
		c.mu.Lock()
		if c.calls == nil {
			c.calls = map[string]uint64{}
		}
		c.calls[endpoint]++
		c.mu.Unlock()
		return fn(ctx, req)
	}
}

func (c *counters) callCounts() map[string]uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := maps.Clone(c.calls)
	if out == nil {
		out = map[string]uint64{}
	}
	return out
}

// Stats returns a snapshot of the agent's counters.
func (a *Agent) Stats() Stats { return a.stats(a.Conn()) }

// stats builds the snapshot; nc may be nil (before Start). It takes no
// lock of the agent: micro calls it with its service lock held.
func (a *Agent) stats(nc *nats.Conn) Stats {
	running, finished := a.mgr.Counts()
	s := Stats{NodeID: a.id.NodeID, Instance: a.instance, NodeStats: metrics.NodeStats{
		SessionsRunning:     running,
		SessionsFinished:    finished,
		Calls:               a.counters.callCounts(),
		OutputBytes:         a.counters.outputBytes.Load(),
		ExitEventsPublished: a.counters.exitPublished.Load(),
		Containment:         a.mgr.Containment().Mode,
	}}
	if a.counters.usage != nil {
		s.Usage = a.counters.usage.Snapshot()
	}
	if nc != nil {
		s.NATSReconnects = nc.Stats().Reconnects
	}
	return s
}

// statsHandler is the micro service's StatsHandler: every endpoint's data
// in $SRV.STATS is the node's Stats.
func (a *Agent) statsHandler(nc *nats.Conn) func(*micro.Endpoint) any {
	return func(*micro.Endpoint) any { return a.stats(nc) }
}

// MetricsStats returns the agent's counters for metrics.NewNode:
//
//	m := metrics.NewNode(agent.MetricsStats)
func (a *Agent) MetricsStats() metrics.NodeStats { return a.Stats().NodeStats }
