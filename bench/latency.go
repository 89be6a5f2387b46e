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
// foreground: one round trip that returns the command's output. extra are
// more exec arguments, name and value.
func toolExec(cl *client, command, host, node, want string, extra ...any) func(ctx context.Context) (time.Duration, error) {
	return cl.timed(execBody(command, host, node, false, extra...), func(a *answer) error {
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

// latencyTargets are the bars for `exec echo hi`, as cost ratios:
// against bare os/exec per host and quantile, and against the minimal Go
// HTTP exec server (host=gateway p50: the same HTTP round trip and fork,
// so what is left is execmesh's own work).
var latencyTargets = map[string]float64{
	"host=gateway p50": 1.3, "host=gateway p99": 1.5,
	"host=node p50": 1.6, "host=node p99": 2,
}

const httpExecTarget = 1.15

// benchLatency measures `exec echo hi` round trips (section 1). Every
// path but one is called by the bench's net/http client; the floor of an
// HTTP exec round trip (bench/httpexec -raw) is called by a hand-written
// one (leanConn) as well, since net/http's hand-offs are part of what it
// bounds. Beside bare os/exec there are two baselines of the daemon's
// shape, each a process of its own doing nothing but the call: the
// minimal net/http exec server (host=gateway's) and the minimal HTTP+NATS
// exec pair (bench/natsexec, host=node's). The figures with targets are
// those of the daemon as deployed: `execmesh up` in a process of its own,
// and for host=node a node agent joined to it with `execmesh nodes
// invite` and `execmesh node --join`. The same gateway inside the
// bench's process, beside its client, answered host=gateway ~0.1 ms
// sooner (its wake-ups overlap the client's); its figures, and host=node
// through it, are reported beside them.
func benchLatency(ctx context.Context, c *cluster, node *nodeProc, o *options, res *results) error {
	bin, err := buildBaseline(ctx, c, o, "httpexec")
	if err != nil {
		return err
	}
	hx, err := startHTTPExec(c, bin)
	if err != nil {
		return err
	}
	defer hx.stop()
	rx, err := startHTTPExec(c, bin, "-raw")
	if err != nil {
		return err
	}
	defer rx.stop()
	lean, err := dialLean(ctx, rx.url)
	if err != nil {
		return err
	}
	defer lean.close()
	nbin, err := buildBaseline(ctx, c, o, "natsexec")
	if err != nil {
		return err
	}
	nx, err := startNATSExec(c, nbin)
	if err != nil {
		return err
	}
	defer nx.stop()
	// The reference path: a gateway in this process, a node paired to it.
	if err := c.startInProcess(ctx); err != nil {
		return err
	}
	inode, err := c.addInProcessNode(ctx, "bench-in-process")
	if err != nil {
		return err
	}
	defer func() {
		if err := c.removeNode(inode); err != nil {
			o.progress("latency: %v", err)
		}
	}()
	cl := newClient(c.url, 2)
	ucl := newClient(c.up.base, 2)
	probes := []probe{
		0: {"bare fork/exec", c.bareExec("echo hi")},
		1: {"HTTP exec server", hx.probe(ucl, "echo hi", "hi")},
		2: {"hand-written HTTP exec server", rx.leanProbe(lean, "echo hi", "hi")},
		3: {"host=gateway", toolExec(ucl, "echo hi", "gateway", "", "hi")},
		4: {"host=node", toolExec(ucl, "echo hi", "node", node.id, "hi")},
		5: {"host=gateway in the bench's process", toolExec(cl, "echo hi", "gateway", "", "hi")},
		6: {"host=node through the gateway in the bench's process", toolExec(cl, "echo hi", "node", inode.id, "hi")},
		7: {"hand-written HTTP exec server, net/http client", rx.probe(ucl, "echo hi", "hi")},
		8: {"HTTP+NATS exec pair", nx.probe(ucl, "echo hi", "hi")},
		// The same call under security allowlist (echo allowlisted in the
		// daemon's approvals file): the plan runs in the kernel
		// confinement, through the confinement helper.
		9: {"host=gateway, security allowlist", toolExec(ucl, "echo hi", "gateway", "", "hi", "security", "allowlist", "ask", "off")},
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
		o.progress("latency run %d/%d: p50 bare %.2f ms, HTTP exec server %.2f ms (hand-written %.2f ms, with net/http's client %.2f ms), HTTP+NATS exec pair %.2f ms, gateway %.2f ms, node %.2f ms (through the gateway in the bench's process %.2f ms, %.2f ms)", r+1, o.runs,
			p50[0][r], p50[1][r], p50[2][r], p50[7][r], p50[8][r], p50[3][r], p50[4][r], p50[5][r], p50[6][r])
	}
	quantiles := []struct {
		name string
		v    [][]float64
	}{{"p50", p50}, {"p99", p99}}
	// against adds probe i's figures against bare fork/exec, with the
	// targets of latencyTargets under key (none: reported).
	against := func(i int, figure, key, note string) {
		for _, q := range quantiles {
			f := figureOf(figure+" "+q.name, median(q.v[i]), median(q.v[0]), "bare fork/exec "+q.name, note)
			if t, ok := latencyTargets[key+" "+q.name]; ok {
				f.Target = ratioAtMost(t)
			}
			res.add(f)
			note = ""
		}
	}
	against(1, "exec echo hi, minimal Go HTTP exec server", "",
		"second baseline: bench/httpexec, net/http + os/exec `sh -c` + JSON, a separate process called by the same client as the hosts")
	against(2, "exec echo hi, hand-written HTTP exec server and client", "",
		"the floor of an HTTP exec round trip in Go here: bench/httpexec -raw (a hand-written HTTP/1.1 loop instead of net/http, the same os/exec and JSON) called by a hand-written client on one kept-alive connection (bench/leanclient.go) instead of net/http's")
	against(7, "exec echo hi, hand-written HTTP exec server, net/http client", "",
		"the floor of host=gateway for the client that calls it: the hand-written server of the figure above, called by net/http's client as host=gateway is; no HTTP exec service called by this client answers sooner here")
	against(8, "exec echo hi, minimal Go HTTP+NATS exec pair", "",
		"third baseline, host=node's as the HTTP exec server is host=gateway's: bench/natsexec, net/http + an embedded NATS server in one process, a NATS request to a node process of its own that runs os/exec `sh -c` and replies JSON; called by the same client as the hosts")
	against(3, "exec echo hi host=gateway", "host=gateway",
		fmt.Sprintf("`execmesh up` in its own process, as deployed (NATS, gateway and local node); %d calls × %d runs after %d warm-up calls, the %d paths taking turns in blocks of 10; median over runs", o.latencyCalls, o.runs, o.warmup, len(probes)))
	against(4, "exec echo hi host=node", "host=node",
		"through `execmesh up` and NATS to `execmesh node --join` in a process of its own")
	against(5, "exec echo hi host=gateway, gateway in the bench's process", "",
		"the same gateway run inside the bench, beside its client: the difference to host=gateway is what a process of its own costs the daemon")
	against(6, "exec echo hi host=node, gateway in the bench's process", "",
		"through that gateway and NATS to `execmesh node` in a process of its own")
	res.add(figureOf("exec echo hi host=gateway p50, security allowlist (kernel confinement) against security full", median(p50[9]), median(p50[3]), "host=gateway p50 (security full)",
		"the cost of the confinement: the daemon's binary started again as the helper (mount namespace, Landlock, seccomp supervisor), then the allowlisted program"))
	res.add(figureOf("exec echo hi host=gateway p99, security allowlist (kernel confinement) against security full", median(p99[9]), median(p99[3]), "host=gateway p99 (security full)", ""))
	vsServer := figureOf("exec echo hi host=gateway p50, against the HTTP exec server", median(p50[3]), median(p50[1]), "HTTP exec server p50", "")
	vsServer.Target = ratioAtMost(httpExecTarget)
	res.add(vsServer)
	res.add(figureOf("exec echo hi host=gateway p99, against the HTTP exec server", median(p99[3]), median(p99[1]), "HTTP exec server p99", ""))
	res.add(figureOf("exec echo hi host=node p50, against the HTTP+NATS exec pair", median(p50[4]), median(p50[8]), "HTTP+NATS exec pair p50", ""))
	res.add(figureOf("exec echo hi host=node p99, against the HTTP+NATS exec pair", median(p99[4]), median(p99[8]), "HTTP+NATS exec pair p99", ""))
	return nil
}

// figureOf is an exec latency figure in ms against a baseline in ms.
func figureOf(name string, v, base float64, baseName, note string) figure {
	return figure{Section: "exec latency", Figure: name, Value: v, Unit: "ms", Baseline: base, BaselineName: baseName, Note: note}
}
