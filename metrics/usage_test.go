package metrics

import (
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/execmesh/execmesh/protocol"
)

// TestUsageHistograms: finished sessions' usage lands in the same
// histograms on the gateway (ObserveUsage) and on a node (UsageRecorder
// read at scrape time); memory only where it was measured.
func TestUsageHistograms(t *testing.T) {
	t.Parallel()
	peak := uint64(64 << 20)
	usages := []protocol.Usage{
		{CPUUserMs: 300, CPUSystemMs: 200, Scope: protocol.UsageScopeTree, MemoryPeakBytes: &peak},
		{CPUUserMs: 1, Scope: protocol.UsageScopeLeader},
	}
	m := New()
	r := NewUsageRecorder()
	for _, u := range usages {
		m.ObserveUsage(u)
		r.Observe(u)
	}
	n := NewNode(func() NodeStats { return NodeStats{Usage: r.Snapshot()} })
	for name, fams := range map[string]map[string]*dtoFamily{"gateway": toFams(scrape(t, m.Handler())), "node": toFams(scrape(t, n.Handler()))} {
		cpu, mem := fams["execmesh_session_cpu_seconds"], fams["execmesh_session_memory_peak_bytes"]
		if cpu == nil || cpu.count != 2 || cpu.sum < 0.500 || cpu.sum > 0.502 {
			t.Errorf("%s: cpu histogram %+v", name, cpu)
		}
		if mem == nil || mem.count != 1 || mem.sum != float64(peak) {
			t.Errorf("%s: memory histogram %+v", name, mem)
		}
	}
	var nilMetrics *Metrics
	nilMetrics.ObserveUsage(usages[0]) // records nothing, no panic
}

type dtoFamily struct {
	count uint64
	sum   float64
}

func toFams(fams map[string]*dto.MetricFamily) map[string]*dtoFamily {
	out := map[string]*dtoFamily{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			if h := m.GetHistogram(); h != nil {
				out[name] = &dtoFamily{count: h.GetSampleCount(), sum: h.GetSampleSum()}
			}
		}
	}
	return out
}
