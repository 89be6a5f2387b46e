package metrics

import (
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/execmesh/execmesh/protocol"
)

// What finished sessions cost (details.usage), as two histograms under the
// same names on the gateway and on node agents:
// execmesh_session_cpu_seconds (user + system CPU of the session's
// processes) and execmesh_session_memory_peak_bytes (only sessions whose
// cgroup has the memory controller).
const (
	usageCPUName    = "execmesh_session_cpu_seconds"
	usageCPUHelp    = "CPU time (user + system) of finished sessions' processes: the whole tree in cgroup containment, the leader and the children it waited for in process-group containment."
	usageMemoryName = "execmesh_session_memory_peak_bytes"
	usageMemoryHelp = "Peak memory of finished sessions' cgroups (only where the memory controller is enabled)."
)

// Bucket bounds of the usage histograms.
var (
	cpuBuckets    = []float64{.001, .01, .1, .5, 1, 5, 10, 60, 300, 1800, 3600}
	memoryBuckets = []float64{1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30, 4 << 30, 16 << 30}
)

// ObserveUsage records the usage of a finished session
// (session.Config.OnUsage).
func (m *Metrics) ObserveUsage(u protocol.Usage) {
	if m == nil {
		return
	}
	m.usageCPU.Observe(cpuSeconds(u))
	if u.MemoryPeakBytes != nil {
		m.usageMemory.Observe(float64(*u.MemoryPeakBytes))
	}
}

func cpuSeconds(u protocol.Usage) float64 { return float64(u.CPUUserMs+u.CPUSystemMs) / 1000 }

// Histogram is a histogram's state: cumulative counts per bucket bound
// (Buckets[i] counts the observations <= Bounds[i]), the observation
// count and sum. It travels in a node's $SRV.STATS (NodeStats.Usage).
type Histogram struct {
	Bounds  []float64 `json:"bounds"`
	Buckets []uint64  `json:"buckets"`
	Count   uint64    `json:"count"`
	Sum     float64   `json:"sum"`
}

func (h *Histogram) observe(v float64) {
	for i, b := range h.Bounds {
		if v <= b {
			h.Buckets[i]++
		}
	}
	h.Count++
	h.Sum += v
}

func (h Histogram) clone() Histogram {
	h.Bounds = slices.Clone(h.Bounds)
	h.Buckets = slices.Clone(h.Buckets)
	return h
}

func (h Histogram) metric(desc *prometheus.Desc) prometheus.Metric {
	buckets := make(map[float64]uint64, len(h.Bounds))
	for i, b := range h.Bounds {
		if i < len(h.Buckets) {
			buckets[b] = h.Buckets[i]
		}
	}
	return prometheus.MustNewConstHistogram(desc, h.Count, h.Sum, buckets)
}

// UsageStats are the usage histograms of a node agent.
type UsageStats struct {
	CPUSeconds      Histogram `json:"cpuSeconds"`
	MemoryPeakBytes Histogram `json:"memoryPeakBytes"`
}

// UsageRecorder accumulates UsageStats for a node agent, whose metrics are
// read at scrape time (NodeStats.Usage). Safe for concurrent use.
type UsageRecorder struct {
	mu sync.Mutex
	s  UsageStats
}

// NewUsageRecorder returns an empty recorder.
func NewUsageRecorder() *UsageRecorder {
	return &UsageRecorder{s: UsageStats{
		CPUSeconds:      Histogram{Bounds: cpuBuckets, Buckets: make([]uint64, len(cpuBuckets))},
		MemoryPeakBytes: Histogram{Bounds: memoryBuckets, Buckets: make([]uint64, len(memoryBuckets))},
	}}
}

// Observe records the usage of a finished session.
func (r *UsageRecorder) Observe(u protocol.Usage) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.s.CPUSeconds.observe(cpuSeconds(u))
	if u.MemoryPeakBytes != nil {
		r.s.MemoryPeakBytes.observe(float64(*u.MemoryPeakBytes))
	}
}

// Snapshot returns a copy of the histograms.
func (r *UsageRecorder) Snapshot() UsageStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return UsageStats{CPUSeconds: r.s.CPUSeconds.clone(), MemoryPeakBytes: r.s.MemoryPeakBytes.clone()}
}

var (
	nodeUsageCPUDesc    = prometheus.NewDesc(usageCPUName, usageCPUHelp, nil, nil)
	nodeUsageMemoryDesc = prometheus.NewDesc(usageMemoryName, usageMemoryHelp, nil, nil)
)
