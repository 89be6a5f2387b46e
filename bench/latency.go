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

// benchLatency measures `exec echo hi` round trips (section 1).
func benchLatency(ctx context.Context, c *cluster, node *nodeProc, o *options, res *results) error {
	cl := newClient(c.url, 2)
	probes := []probe{
		{"bare fork/exec", c.bareExec("echo hi")},
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
		o.progress("latency run %d/%d: p50 bare %.2f ms, gateway %.2f ms, node %.2f ms", r+1, o.runs,
			p50[0][r], p50[1][r], p50[2][r])
	}
	note := fmt.Sprintf("%d calls × %d runs after %d warm-up calls; median over runs", o.latencyCalls, o.runs, o.warmup)
	targets := []float64{0, 1.5, 2} // DESIGN.md §6
	for i := 1; i < len(probes); i++ {
		for _, q := range []struct {
			name string
			v    [][]float64
		}{{"p50", p50}, {"p99", p99}} {
			res.add(figure{
				Section:      "exec latency",
				Figure:       fmt.Sprintf("exec echo hi %s %s", probes[i].name, q.name),
				Value:        median(q.v[i]),
				Unit:         "ms",
				Baseline:     median(q.v[0]),
				BaselineName: "bare fork/exec " + q.name,
				Target:       ratioAtMost(targets[i]),
				Note:         note,
			})
			note = ""
		}
	}
	return nil
}
