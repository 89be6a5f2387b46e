package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/creack/pty"
)

// toolBackground starts command in the background through the HTTP API
// and polls it (every pollEvery) until it reports the exit. The time runs
// from the exec call to the session's end as the host recorded it (its
// list entry's endedAt, set once the command exited and its output was
// read to the end), so that the poll interval does not round the figure
// up; the polling itself runs alongside, as an agent's would. The finished
// session is removed afterwards so that retained output does not pile up.
func toolBackground(cl *client, command, host, node string, pty bool, pollEvery time.Duration) func(ctx context.Context) (time.Duration, error) {
	var extra []any
	if pty {
		extra = append(extra, "pty", true)
	}
	body := execBody(command, host, node, true, extra...)
	list := processBody("list", "")
	return func(ctx context.Context) (time.Duration, error) {
		t0 := time.Now()
		a, err := cl.invoke(ctx, body)
		if err != nil {
			return 0, err
		}
		id := a.Result.Details.SessionID
		if a.status() != "running" || id == "" {
			return 0, fmt.Errorf("background exec on %s: %s", host, a.describe())
		}
		poll := processBody("poll", id)
		for {
			select {
			case <-ctx.Done():
				return 0, ctx.Err()
			case <-time.After(pollEvery):
			}
			a, err := cl.invoke(ctx, poll)
			if err != nil {
				return 0, err
			}
			switch a.status() {
			case "running":
				continue
			case "completed":
				if ec := a.Result.Details.ExitCode; ec != nil && *ec != 0 {
					return 0, fmt.Errorf("%q on %s exited with %d", command, host, *ec)
				}
				l, err := cl.invoke(ctx, list)
				if err != nil {
					return 0, err
				}
				var ended int64
				for _, e := range l.Result.Details.Sessions {
					if e.SessionID == id {
						ended = e.EndedAt
					}
				}
				if ended == 0 {
					return 0, fmt.Errorf("list on %s: no endedAt for %s: %s", host, id, l.describe())
				}
				d := time.UnixMilli(ended).Sub(t0)
				if _, err := cl.invoke(ctx, processBody("remove", id)); err != nil {
					return d, err
				}
				return d, nil
			default:
				return 0, fmt.Errorf("poll %s on %s: %s", id, host, a.describe())
			}
		}
	}
}

// countWriter counts what it is given. As cmd.Stdout it makes os/exec
// create a pipe and copy from it: the least a Go reader of the output
// must do.
type countWriter struct{ n int64 }

func (w *countWriter) Write(p []byte) (int, error) {
	w.n += int64(len(p))
	return len(p), nil
}

// barePipe runs command with its stdout read through a pipe by Go and
// discarded.
func (c *cluster) barePipe(command string, want int64) func(ctx context.Context) (time.Duration, error) {
	return func(ctx context.Context) (time.Duration, error) {
		cmd := exec.Command(benchShell, "-c", command)
		cmd.Env = c.env
		cmd.Dir = c.workdir
		var w countWriter
		cmd.Stdout = &w
		t0 := time.Now()
		err := cmd.Run()
		d := time.Since(t0)
		if err == nil && w.n != want {
			err = fmt.Errorf("read %d bytes, want %d", w.n, want)
		}
		return d, err
	}
}

// barePTY runs command on a PTY whose master Go reads and discards until
// the terminal hangs up: the kernel's PTY cost without execmesh.
func (c *cluster) barePTY(command string, want int64) func(ctx context.Context) (time.Duration, error) {
	return func(ctx context.Context) (time.Duration, error) {
		cmd := exec.Command(benchShell, "-c", command)
		cmd.Env = append(append([]string(nil), c.env...), "TERM=xterm-256color")
		cmd.Dir = c.workdir
		t0 := time.Now()
		ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Cols: 120, Rows: 30})
		if err != nil {
			return 0, err
		}
		n, err := io.CopyBuffer(io.Discard, ptmx, make([]byte, 64<<10))
		if errors.Is(err, syscall.EIO) {
			err = nil // the normal end of a PTY
		}
		werr := cmd.Wait()
		d := time.Since(t0)
		ptmx.Close()
		if err == nil {
			err = werr
		}
		if err == nil && n < want {
			err = fmt.Errorf("read %d bytes, want at least %d", n, want)
		}
		return d, err
	}
}

// Throughput targets: a background session within 1.3× a bare
// Go pipe reader of the same command in the same run; a PTY session at or
// below the bare Go PTY reader. (The old bar against `> /dev/null` is
// retired: no pipe reader reaches it.)
const (
	pipeTarget = 1.3
	ptyTarget  = 1.0
)

// benchThroughput: a command writing a lot to stdout, run through exec in
// the background and polled to completion, against a bare Go reader of
// the same command's pipe (or PTY) in the same run (section 2).
func benchThroughput(ctx context.Context, c *cluster, node *nodeProc, o *options, res *results) error {
	cl := newClient(c.up.base, 2)
	commands := func(n int64) (zero, text string) {
		return fmt.Sprintf("head -c %d /dev/zero", n), fmt.Sprintf("yes 'the quick brown fox jumps over the lazy dog' | head -c %d", n)
	}
	probesOf := func(n int64) []probe {
		zero, text := commands(n)
		return []probe{
			{"NUL pipe", c.barePipe(zero, n)},
			{"NUL gateway", toolBackground(cl, zero, "gateway", "", false, o.pollEvery)},
			{"NUL node", toolBackground(cl, zero, "node", node.id, false, o.pollEvery)},
			{"text pipe", c.barePipe(text, n)},
			{"text gateway", toolBackground(cl, text, "gateway", "", false, o.pollEvery)},
			{"text node", toolBackground(cl, text, "node", node.id, false, o.pollEvery)},
			{"NUL pty", c.barePTY(zero, n)},
			{"NUL gateway pty", toolBackground(cl, zero, "gateway", "", true, o.pollEvery)},
			{"NUL exec attach gateway", c.cliExec(zero, "--host", "gateway")},
			{"NUL exec attach node", c.cliExec(zero, "--node", node.id)},
		}
	}
	// One untimed round of a tenth of the bytes first, as the latency
	// section warms up: the first flood of each path after the section
	// before meets cold caches and buffers and, in this process, the
	// garbage that section left (a bare reader of 1 GB took 0.73–0.77 s
	// instead of 0.22 s as the first figure after the fan-in).
	n := o.tputBytes
	if _, err := interleave(ctx, probesOf(max(n/10, 1)), 1, 1); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	zero, _ := commands(n)
	probes := probesOf(n)
	secs := make([][]float64, len(probes))
	for r := 0; r < o.runs; r++ {
		ds, err := interleave(ctx, probes, 1, 1)
		if err != nil {
			return err
		}
		var parts []string
		for i, d := range ds {
			secs[i] = append(secs[i], d[0].Seconds())
			parts = append(parts, fmt.Sprintf("%s %.2fs", probes[i].name, d[0].Seconds()))
		}
		o.progress("throughput run %d/%d: %s", r+1, o.runs, strings.Join(parts, ", "))
	}
	nul := humanBytes(n) + " of NUL bytes"
	txt := humanBytes(n) + " of text"
	add := func(i int, fig string, base int, baseName, target, note string) {
		res.add(figure{
			Section: "throughput", Figure: fig,
			Value: median(secs[i]), Unit: "s", Baseline: median(secs[base]), BaselineName: baseName,
			Target: target, Note: note,
		})
	}
	pipeNote := fmt.Sprintf("`%s` with background:true, polled every %v until it exits, timed from the exec call to the session's endedAt (ms); baseline: os/exec reading the same command's stdout pipe into a counting writer; NUL bytes are shown to agents as \\x00", zero, o.pollEvery)
	add(1, nul+", host=gateway", 0, "bare Go pipe reader", ratioAtMost(pipeTarget), pipeNote)
	add(2, nul+", host=node", 0, "bare Go pipe reader", ratioAtMost(pipeTarget), "")
	add(4, txt+", host=gateway", 3, "bare Go pipe reader", ratioAtMost(pipeTarget),
		"`yes 'the quick brown fox…' | head -c N`: printable text, the sanitizer's fast path")
	add(5, txt+", host=node", 3, "bare Go pipe reader", ratioAtMost(pipeTarget), "")
	add(7, nul+", host=gateway pty", 6, "bare Go PTY reader", ratioAtMost(ptyTarget),
		"pty:true; baseline: the same command on a PTY (creack/pty) whose master Go reads and discards")
	add(8, nul+" through `execmesh exec` to /dev/null, host=gateway", 0, "bare Go pipe reader", ratioAtMost(attachTarget),
		"the execmesh client streaming the command's stdout over GET /v1/exec/attach, its start included; the agents' capped buffer is fed alongside")
	add(9, nul+" through `execmesh exec` to /dev/null, host=node", 0, "bare Go pipe reader", ratioAtMost(attachTarget),
		"the same across NATS, with credit flow control")
	return benchAttachRTT(ctx, c, node, res)
}

func humanBytes(n int64) string {
	switch {
	case n >= 1_000_000_000 && n%1_000_000_000 == 0:
		return fmt.Sprintf("%d GB", n/1_000_000_000)
	case n >= 1_000_000:
		return fmt.Sprintf("%g MB", float64(n)/1e6)
	}
	return fmt.Sprintf("%d B", n)
}
