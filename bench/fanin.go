package main

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// loadResult is what a fixed-duration load produced.
type loadResult struct {
	calls  int
	errors int
	first  error
	lat    []time.Duration
	wall   time.Duration
}

func (l loadResult) rate() float64 { return float64(l.calls) / l.wall.Seconds() }

// load runs callers goroutines, caller i repeating ops[i%len(ops)] until
// the duration is up.
func load(ctx context.Context, callers int, dur time.Duration, ops []func(context.Context) (time.Duration, error)) loadResult {
	lctx, cancel := context.WithTimeout(ctx, dur)
	defer cancel()
	var mu sync.Mutex
	var out loadResult
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := 0; i < callers; i++ {
		op := ops[i%len(ops)]
		wg.Go(func() {
			var lat []time.Duration
			var errs int
			var first error
			for lctx.Err() == nil {
				// Each call gets the parent context: one in flight when
				// the time is up finishes and counts.
				d, err := op(ctx)
				if err != nil {
					if ctx.Err() != nil {
						break
					}
					errs++
					if first == nil {
						first = err
					}
					continue
				}
				lat = append(lat, d)
			}
			mu.Lock()
			out.lat = append(out.lat, lat...)
			out.errors += errs
			if out.first == nil {
				out.first = first
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	out.wall = time.Since(t0)
	out.calls = len(out.lat)
	return out
}

// faninTarget is the bar, calls/s ≥ 0.7× the bare forking
// goroutines', as a cost ratio (baseline ÷ value ≤ 1/0.7 = 1.42857…,
// rounded up in the fourth digit so that exactly 0.7× passes).
const faninTarget = 1.4286

// benchFanIn: many concurrent callers doing exec round trips against one
// gateway and two nodes (section 4).
func benchFanIn(ctx context.Context, c *cluster, nodes []*nodeProc, o *options, res *results) error {
	cl := newClient(c.up.base, o.faninCallers)
	ops := []func(context.Context) (time.Duration, error){
		toolExec(cl, "echo hi", "gateway", "", "hi"),
		toolExec(cl, "echo hi", "node", nodes[0].id, "hi"),
		toolExec(cl, "echo hi", "node", nodes[1].id, "hi"),
	}
	baseDur := min(o.faninDur, 10*time.Second)
	var rate, p99, bRate, bP99 []float64
	for r := 0; r < o.runs; r++ {
		b := load(ctx, o.faninCallers, baseDur, []func(context.Context) (time.Duration, error){c.bareExec("echo hi")})
		if err := ctx.Err(); err != nil {
			return err
		}
		if b.errors > 0 {
			return fmt.Errorf("baseline: %d errors, first: %w", b.errors, b.first)
		}
		l := load(ctx, o.faninCallers, o.faninDur, ops)
		if err := ctx.Err(); err != nil {
			return err
		}
		if l.errors > 0 {
			return fmt.Errorf("%d of %d calls failed, first: %w", l.errors, l.errors+l.calls, l.first)
		}
		rate = append(rate, l.rate())
		p99 = append(p99, ms(percentile(l.lat, 99)))
		bRate = append(bRate, b.rate())
		bP99 = append(bP99, ms(percentile(b.lat, 99)))
		o.progress("fan-in run %d/%d: %.0f calls/s (bare %.0f/s), p99 %.1f ms (bare %.1f ms)", r+1, o.runs,
			rate[r], bRate[r], p99[r], bP99[r])
	}
	note := fmt.Sprintf("%d callers for %v, round-robin over host=gateway and two nodes; baseline: %d goroutines forking for %v; the bar: calls/s at least 0.7× the baseline's", o.faninCallers, o.faninDur, o.faninCallers, baseDur)
	res.add(figure{
		Section: "fan-in", Figure: fmt.Sprintf("exec throughput, %d callers", o.faninCallers),
		Value: median(rate), Unit: "calls/s", Baseline: median(bRate), BaselineName: "bare fork/exec",
		Ratio: costRatio(median(bRate), median(rate)), Target: ratioAtMost(faninTarget), Note: note,
	})
	res.add(figure{
		Section: "fan-in", Figure: fmt.Sprintf("exec latency p99, %d callers", o.faninCallers),
		Value: median(p99), Unit: "ms", Baseline: median(bP99), BaselineName: "bare fork/exec",
	})
	return nil
}
