package main

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// probe is one timed operation.
type probe struct {
	name string
	run  func(ctx context.Context) (time.Duration, error)
}

// bareExec is the baseline of every exec figure: fork/exec of the same
// shell command straight from Go, in this process, output discarded.
func (c *cluster) bareExec(command string) func(ctx context.Context) (time.Duration, error) {
	return func(ctx context.Context) (time.Duration, error) {
		cmd := exec.Command(benchShell, "-c", command)
		cmd.Env = c.env
		cmd.Dir = c.workdir
		t0 := time.Now()
		err := cmd.Run()
		return time.Since(t0), err
	}
}

// toolExec is `exec {command}` through the HTTP API on a host, in the
// foreground: one round trip that returns the command's output.
func toolExec(cl *client, command, host, node, want string) func(ctx context.Context) (time.Duration, error) {
	return cl.timed(execBody(command, host, node, false), func(a *answer) error {
		if a.status() != "completed" || strings.TrimSpace(a.text()) != want {
			return fmt.Errorf("exec %q on %s: %s", command, host, a.describe())
		}
		return nil
	})
}

// interleave runs n calls of every probe in blocks of block calls, the
// probes taking turns, so that a change in machine load affects all of
// them alike. It returns the durations per probe.
func interleave(ctx context.Context, probes []probe, n, block int) ([][]time.Duration, error) {
	out := make([][]time.Duration, len(probes))
	for done := 0; done < n; done += block {
		for i, p := range probes {
			for k := 0; k < block && done+k < n; k++ {
				if err := ctx.Err(); err != nil {
					return nil, err
				}
				d, err := p.run(ctx)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", p.name, err)
				}
				out[i] = append(out[i], d)
			}
		}
	}
	return out, nil
}

// latencyTargets are issue 18's bars for `exec echo hi`, as cost ratios:
// against bare os/exec per host and quantile, and against the minimal Go
// HTTP exec server (host=gateway p50: the same HTTP round trip and fork,
// so what is left is execmesh's own work).
var latencyTargets = map[string]float64{
	"host=gateway p50": 1.3, "host=gateway p99": 1.5,
	"host=node p50": 1.6, "host=node p99": 2,
}

const httpExecTarget = 1.15

// benchLatency measures `exec echo hi` round trips (section 1).
func benchLatency(ctx context.Context, c *cluster, node *nodeProc, o *options, res *results) error {
	hx, err := startHTTPExec(ctx, c, o)
	if err != nil {
		return err
	}
	defer hx.stop()
	cl := newClient(c.url, 2)
	probes := []probe{
		{"bare fork/exec", c.bareExec("echo hi")},
		{"HTTP exec server", hx.probe(cl, "echo hi", "hi")},
		{"host=gateway", toolExec(cl, "echo hi", "gateway", "", "hi")},
		{"host=node", toolExec(cl, "echo hi", "node", node.id, "hi")},
	}
	if _, err := interleave(ctx, probes, o.warmup, 10); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	p50 := make([][]float64, len(probes))
	p99 := make([][]float64, len(probes))
	for r := 0; r < o.runs; r++ {
		ds, err := interleave(ctx, probes, o.latencyCalls, 10)
		if err != nil {
			return err
		}
		for i := range probes {
			p50[i] = append(p50[i], ms(percentile(ds[i], 50)))
			p99[i] = append(p99[i], ms(percentile(ds[i], 99)))
		}
		o.progress("latency run %d/%d: p50 bare %.2f ms, HTTP exec server %.2f ms, gateway %.2f ms, node %.2f ms", r+1, o.runs,
			p50[0][r], p50[1][r], p50[2][r], p50[3][r])
	}
	note := fmt.Sprintf("%d calls × %d runs after %d warm-up calls, the four paths taking turns in blocks of 10; median over runs", o.latencyCalls, o.runs, o.warmup)
	quantiles := []struct {
		name string
		v    [][]float64
	}{{"p50", p50}, {"p99", p99}}
	hxNote := "second baseline: bench/httpexec, net/http + os/exec `sh -c` + JSON, a separate process called by the same client"
	for _, q := range quantiles {
		res.add(figure{
			Section: "exec latency", Figure: "exec echo hi, minimal Go HTTP exec server " + q.name,
			Value: median(q.v[1]), Unit: "ms", Baseline: median(q.v[0]), BaselineName: "bare fork/exec " + q.name,
			Note: hxNote,
		})
		hxNote = ""
	}
	for i := 2; i < len(probes); i++ {
		for _, q := range quantiles {
			key := probes[i].name + " " + q.name
			res.add(figure{
				Section:      "exec latency",
				Figure:       "exec echo hi " + key,
				Value:        median(q.v[i]),
				Unit:         "ms",
				Baseline:     median(q.v[0]),
				BaselineName: "bare fork/exec " + q.name,
				Target:       ratioAtMost(latencyTargets[key]),
				Note:         note,
			})
			note = ""
		}
	}
	res.add(figure{
		Section: "exec latency", Figure: "exec echo hi host=gateway p50, against the HTTP exec server",
		Value: median(p50[2]), Unit: "ms", Baseline: median(p50[1]), BaselineName: "HTTP exec server p50",
		Target: ratioAtMost(httpExecTarget),
	})
	res.add(figure{
		Section: "exec latency", Figure: "exec echo hi host=gateway p99, against the HTTP exec server",
		Value: median(p99[2]), Unit: "ms", Baseline: median(p99[1]), BaselineName: "HTTP exec server p99",
	})
	return nil
}
