package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// settle is how long memory and thread counts are left to settle before
// they are read.
const settle = 2 * time.Second

// listPage is the limit of the paged process list the scale section
// times.
const listPage = 50

// listWarmup whole lists at the full size go untimed before listCalls
// are timed.
const (
	listWarmup = 3
	listCalls  = 15
)

// fdsPerSession is what a pipe session must hold open on its node: its
// stdout and stderr pipes. reachedShare is the bar on sessions reached
// as a share of what the descriptor limit allows ("limited only by the
// descriptor limit").
const (
	fdsPerSession = 2
	reachedShare  = 0.99
)

// scaleSample is what is read from a node agent's /proc entry.
type scaleSample struct {
	rss, threads int64
	fds          int
}

func sampleProc(pid int) (scaleSample, error) {
	rss, th, err := procStatus(pid)
	if err != nil {
		return scaleSample{}, err
	}
	fds, err := fdCount(pid)
	return scaleSample{rss: rss, threads: th, fds: fds}, err
}

// startedSession is a background session and its process.
type startedSession struct {
	id   string
	proc procRef
}

// benchScale: many background sessions on one node agent (section 3).
func benchScale(ctx context.Context, c *cluster, o *options, res *results) error {
	n := o.sessions
	if soft, err := raiseSoftLimit(syscall.RLIMIT_NOFILE); err == nil {
		o.progress("scale: RLIMIT_NOFILE soft limit %d", soft)
	}
	var nproc unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NPROC, &nproc); err == nil && nproc.Cur < nproc.Max {
		nproc.Cur = nproc.Max
		_ = unix.Setrlimit(unix.RLIMIT_NPROC, &nproc)
	}
	pidMax := readIntFile("/proc/sys/kernel/pid_max")
	if nproc.Cur != unix.RLIM_INFINITY && int64(nproc.Cur) < int64(2*n) || pidMax > 0 && pidMax < int64(2*n+2000) {
		o.progress("scale: warning: %d sessions need about %d tasks (a process each, plus agent threads); RLIMIT_NPROC %d, pid_max %d",
			n, 2*n, nproc.Cur, pidMax)
	}

	// The baseline first, while nothing else runs: what a bare Go
	// supervisor (os/exec, two pipes read by Go, one Wait per child)
	// pays per child.
	bare, err := bareSupervisor(ctx, c, min(n, 1000), o.scaleConc)
	if err != nil {
		return fmt.Errorf("bare supervisor baseline: %w", err)
	}
	o.progress("scale: bare os/exec supervisor: %.0f starts/s, %.0f kills/s, %.2f fds and %.2f threads per child",
		bare.startRate, bare.killRate, bare.fdsPer, bare.threadsPer)

	node, err := c.addNode(ctx, "bench-scale")
	if err != nil {
		return err
	}
	defer func() {
		if err := c.removeNode(node); err != nil {
			o.progress("scale: %v", err)
		}
		if n := c.killStrays(); n > 0 {
			o.progress("scale: killed %d processes the node agent left behind", n)
		}
	}()
	var hardFDs int64
	if _, hard, err := limit(node.pid(), "Max open files"); err == nil && hard > 0 {
		hardFDs = hard
		res.add(figure{Section: "scale", Figure: "descriptor limit of the agent (ulimit -Hn)", Value: float64(hard), Unit: "files",
			Note: "RLIMIT_NOFILE hard limit; raising it needs CAP_SYS_RESOURCE"})
		if hard < int64(fdsPerSession*n+200) {
			o.progress("scale: warning: the agent may open %d files; %d sessions with two pipes each need about %d",
				hard, n, fdsPerSession*n+200)
		}
	}
	cl := newClient(c.up.base, o.scaleConc)
	startBody := execBody("sleep 600", "node", node.id, true)

	// Poll and list with one session: the baselines of the figures at N.
	probe, err := startOne(ctx, cl, startBody)
	if err != nil {
		return err
	}
	pollOnce := func(id string) func(ctx context.Context) (time.Duration, error) {
		return cl.timed(processBody("poll", id), func(a *answer) error {
			if a.status() != "running" {
				return fmt.Errorf("poll %s: %s", id, a.describe())
			}
			return nil
		})
	}
	// process list: a page of listPage (the figure with a target) and the
	// whole list (report only). A paged answer names the size of the whole
	// list in details.total.
	listOnce := func(paged bool, want int) func(ctx context.Context) (time.Duration, error) {
		if !paged {
			return cl.timed(processBody("list", ""), func(a *answer) error {
				if got := len(a.Result.Details.Sessions); got < want {
					return fmt.Errorf("list: %d sessions, want at least %d (%s)", got, want, a.describe())
				}
				return nil
			})
		}
		return cl.timed(processBody("list", "", "limit", listPage), func(a *answer) error {
			got, total := len(a.Result.Details.Sessions), a.Result.Details.Total
			if total == nil {
				return fmt.Errorf("list page: no total (%s)", a.describe())
			}
			if *total < want || got != min(listPage, *total) {
				return fmt.Errorf("list page: %d sessions of %d, want %d of at least %d (%s)", got, *total, min(listPage, want), want, a.describe())
			}
			return nil
		})
	}
	pollCalls := max(o.latencyCalls, 100)
	if _, err := repeat(ctx, 20, pollOnce(probe.id)); err != nil {
		return err
	}
	poll1, err := repeat(ctx, pollCalls, pollOnce(probe.id))
	if err != nil {
		return err
	}
	list1, err := repeat(ctx, 20, listOnce(true, 1))
	if err != nil {
		return err
	}
	listFull1, err := repeat(ctx, 20, listOnce(false, 1))
	if err != nil {
		return err
	}

	time.Sleep(settle)
	before, err := sampleProc(node.pid())
	if err != nil {
		return err
	}

	// Start n sessions with scaleConc callers; stop at the first failure.
	o.progress("scale: starting %d background sessions on node %s (pid %d)", n, node.id, node.pid())
	sessions := make([]startedSession, n)
	var next, started atomic.Int64
	var failMu sync.Mutex
	var failure error
	t0 := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < o.scaleConc; w++ {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				failMu.Lock()
				stop := failure != nil
				failMu.Unlock()
				if stop {
					return
				}
				s, err := startOne(ctx, cl, startBody)
				if err != nil {
					failMu.Lock()
					if failure == nil {
						failure = fmt.Errorf("session %d: %w", i+1, err)
					}
					failMu.Unlock()
					return
				}
				sessions[i] = s
				if k := started.Add(1); k%1000 == 0 {
					o.progress("scale: %d sessions started (%.0f/s)", k, float64(k)/time.Since(t0).Seconds())
				}
			}
		})
	}
	wg.Wait()
	startDur := time.Since(t0)
	if err := ctx.Err(); err != nil {
		return err
	}
	live := make([]startedSession, 0, n)
	for _, s := range sessions {
		if s.id != "" {
			live = append(live, s)
		}
	}
	got := len(live)
	startNote := fmt.Sprintf("%d callers through the HTTP API", o.scaleConc)
	if failure != nil {
		startNote = fmt.Sprintf("stopped after %d: %v", got, failure)
		o.progress("scale: %s", startNote)
		select {
		case <-node.done:
			startNote += "; the agent exited: " + node.log()
		default:
		}
	}
	res.add(figure{Section: "scale", Figure: "background sessions started on one node agent",
		Value: float64(got), Unit: "sessions", Note: startNote})
	// Sessions reached as a share of what the descriptor limit allows: a
	// pipe session needs two descriptors (stdout and stderr stay apart),
	// on top of what the agent held before the first one.
	if hardFDs > 0 {
		allowed := min(int64(n), (hardFDs-int64(before.fds))/fdsPerSession)
		res.add(figure{Section: "scale", Figure: "sessions reached, as a share of what the limits allow",
			Value: float64(got), Unit: "sessions", Baseline: float64(allowed), BaselineName: "allowed",
			Ratio: costRatio(float64(allowed), float64(got)), Target: valueAtLeast(math.Ceil(reachedShare * float64(allowed))),
			Note: fmt.Sprintf("allowed = min(-sessions %d, (ulimit -Hn %d − %d descriptors the agent held before) / %d per session); the bar is %.0f %% of it",
				n, hardFDs, before.fds, fdsPerSession, reachedShare*100)})
	}
	if got == 0 {
		return failure
	}
	startRate := float64(got) / startDur.Seconds()
	res.add(figure{Section: "scale", Figure: "session start rate", Value: startRate, Unit: "sessions/s",
		Baseline: bare.startRate, BaselineName: "bare os/exec Start", Ratio: costRatio(bare.startRate, startRate)})

	time.Sleep(settle)
	after, err := sampleProc(node.pid())
	if err != nil {
		return fmt.Errorf("agent gone after %d sessions: %w; log: %s", got, err, node.log())
	}
	var pss []float64
	for i := 0; i < len(live) && len(pss) < 50; i += max(1, len(live)/50) {
		if p, err := procPss(live[i].proc.pid); err == nil {
			pss = append(pss, float64(p))
		}
	}
	perKiB := float64(after.rss-before.rss) / float64(got)
	res.add(figure{Section: "scale", Figure: fmt.Sprintf("agent memory per session (RSS delta / %d)", got),
		Value: perKiB, Unit: "KiB", Baseline: median(pss), BaselineName: "PSS of one `sleep` child",
		Target: ratioAtMost(1),
		Note: fmt.Sprintf("RSS of the `execmesh node` process %d → %d MiB, children excluded (separate processes)",
			before.rss>>10, after.rss>>10)})
	res.add(figure{Section: "scale", Figure: "agent threads per session",
		Value: float64(after.threads-before.threads) / float64(got), Unit: "threads",
		Baseline: bare.threadsPer, BaselineName: "bare os/exec + Wait",
		Note: fmt.Sprintf("%d → %d threads; sessions wait in one SIGCHLD reaper, not a thread each", before.threads, after.threads)})
	res.add(figure{Section: "scale", Figure: "agent file descriptors per session",
		Value: float64(after.fds-before.fds) / float64(got), Unit: "fds",
		Baseline: bare.fdsPer, BaselineName: "bare os/exec, 2 pipes",
		Note: fmt.Sprintf("%d → %d open files", before.fds, after.fds)})

	// Poll and list at this size.
	pollN := make([]time.Duration, 0, pollCalls)
	for range pollCalls {
		s := live[rand.IntN(len(live))]
		d, err := pollOnce(s.id)(ctx)
		if err != nil {
			return err
		}
		pollN = append(pollN, d)
	}
	listN, err := repeat(ctx, 20, listOnce(true, got))
	if err != nil {
		return err
	}
	// The first whole lists after thousands of starts are the cold ones
	// of three processes (the node reads every session's cpu.stat for
	// the first time, the megabytes of the answer meet fresh pages and a
	// garbage collector that has not paced itself to them): they are
	// warm-up, as the latency section's first calls are.
	if _, err := repeat(ctx, listWarmup, listOnce(false, got)); err != nil {
		return err
	}
	listFullN, err := repeat(ctx, listCalls, listOnce(false, got))
	if err != nil {
		return err
	}
	res.add(figure{Section: "scale", Figure: fmt.Sprintf("process poll p50 at %d sessions", got),
		Value: ms(percentile(pollN, 50)), Unit: "ms", Baseline: ms(percentile(poll1, 50)), BaselineName: "at 1 session",
		Target: valueBelow(1), Note: fmt.Sprintf("%d polls of random sessions through HTTP → gateway → NATS → node", pollCalls)})
	res.add(figure{Section: "scale", Figure: fmt.Sprintf("process poll p99 at %d sessions", got),
		Value: ms(percentile(pollN, 99)), Unit: "ms", Baseline: ms(percentile(poll1, 99)), BaselineName: "at 1 session"})
	res.add(figure{Section: "scale", Figure: fmt.Sprintf("process list (whole list) p50 at %d sessions", got),
		Value: ms(percentile(listFullN, 50)), Unit: "ms", Baseline: ms(percentile(listFull1, 50)), BaselineName: "at 1 session",
		Target: valueAtMost(50), Note: fmt.Sprintf("every entry, as OpenClaw answers without offset/limit, through HTTP → gateway → NATS → node; %d calls after %d of warm-up", listCalls, listWarmup)})
	res.add(figure{Section: "scale", Figure: fmt.Sprintf("process list (a page of %d) p50 at %d sessions", listPage, got),
		Value: ms(percentile(listN, 50)), Unit: "ms", Baseline: ms(percentile(list1, 50)), BaselineName: "at 1 session",
		Note: fmt.Sprintf(`{"action":"list","limit":%d}, newest first, with details.total`, listPage)})

	// Kill every session, then check /proc until each process is gone.
	o.progress("scale: killing %d sessions", got+1)
	all := append(live, probe)
	t0 = time.Now()
	var kidx atomic.Int64
	var killErr error
	var kmu sync.Mutex
	for w := 0; w < o.scaleConc; w++ {
		wg.Go(func() {
			for {
				i := kidx.Add(1) - 1
				if i >= int64(len(all)) || ctx.Err() != nil {
					return
				}
				a, err := cl.invoke(ctx, processBody("kill", all[i].id))
				if err == nil && !a.OK {
					err = errors.New(a.describe())
				}
				if err != nil {
					kmu.Lock()
					if killErr == nil {
						killErr = fmt.Errorf("kill %s: %w", all[i].id, err)
					}
					kmu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	callsDur := time.Since(t0)
	left := waitGone(ctx, all, o.killWait)
	killDur := time.Since(t0)
	killRate := float64(len(all)-left) / killDur.Seconds()
	res.add(figure{Section: "scale", Figure: fmt.Sprintf("kill all %d sessions (until gone from /proc)", len(all)),
		Value: killRate, Unit: "sessions/s", Baseline: bare.killRate, BaselineName: "bare SIGTERM + Wait",
		Ratio: costRatio(bare.killRate, killRate), Target: valueAtLeast(2000),
		Note: fmt.Sprintf("%d of %d gone %.2f s after the first of the kill calls (%d callers; the calls took %.2f s)", len(all)-left, len(all), killDur.Seconds(), o.scaleConc, callsDur.Seconds())})
	leftNote := fmt.Sprintf("counted in /proc by pid and start time once all had exited, or after -kill-wait %v", o.killWait)
	if killErr != nil {
		leftNote += "; " + killErr.Error()
	}
	res.add(figure{Section: "scale", Figure: "processes left after kill", Value: float64(left), Unit: "processes",
		Target: valueAtMost(0), Note: leftNote})
	return nil
}

func valueAtLeast(x float64) string { return fmt.Sprintf("value>=%g", x) }

// startOne starts one background session and records its process.
func startOne(ctx context.Context, cl *client, body []byte) (startedSession, error) {
	a, err := cl.invoke(ctx, body)
	if err != nil {
		return startedSession{}, err
	}
	d := a.Result.Details
	if a.status() != "running" || d.SessionID == "" || d.PID <= 0 {
		return startedSession{}, errors.New(a.describe())
	}
	st, _, ok := procStart(d.PID)
	if !ok {
		return startedSession{}, fmt.Errorf("session %s: pid %d not in /proc", d.SessionID, d.PID)
	}
	return startedSession{id: d.SessionID, proc: procRef{pid: d.PID, start: st}}, nil
}

// repeat runs f n times and returns the durations.
func repeat(ctx context.Context, n int, f func(context.Context) (time.Duration, error)) ([]time.Duration, error) {
	out := make([]time.Duration, 0, n)
	for range n {
		d, err := f(ctx)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

// waitGone waits until every process has exited and returns how many
// still exist when the time is up. It blocks on one pidfd at a time (a
// pidfd becomes readable when its process exits), so it costs neither CPU
// nor many descriptors while the agent does the killing; a final pass
// counts what /proc still shows, zombies included.
func waitGone(ctx context.Context, ss []startedSession, within time.Duration) int {
	deadline := time.Now().Add(within)
	for _, s := range ss {
		if ctx.Err() != nil || time.Now().After(deadline) {
			break
		}
		fd, err := unix.PidfdOpen(s.proc.pid, 0)
		if err != nil {
			continue // gone
		}
		if s.proc.present() { // the pidfd is ours, not a recycled pid's
			for {
				left := time.Until(deadline)
				if left <= 0 || ctx.Err() != nil {
					break
				}
				fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
				n, err := unix.Poll(fds, int(min(left, 100*time.Millisecond)/time.Millisecond)+1)
				if n > 0 || (err != nil && !errors.Is(err, unix.EINTR)) {
					break
				}
			}
		}
		unix.Close(fd)
	}
	// Exited processes are reaped by the agent right away; give it a
	// moment, then count what is left.
	left := 0
	for range 50 {
		left = 0
		for _, s := range ss {
			if s.proc.present() {
				left++
			}
		}
		if left == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return left
}

// bareResult is the cost of supervising children with nothing but os/exec.
type bareResult struct {
	startRate, killRate float64
	fdsPer, threadsPer  float64
}

// bareSupervisor starts m `sleep 600` children from this process as a
// minimal Go supervisor would (two pipes read by Go, one goroutine in Wait
// per child), measures the start rate and the fds and threads it holds,
// then ends them with SIGTERM and measures how fast they are gone.
func bareSupervisor(ctx context.Context, c *cluster, m, conc int) (bareResult, error) {
	self := os.Getpid()
	time.Sleep(settle / 2)
	before, err := sampleProc(self)
	if err != nil {
		return bareResult{}, err
	}
	cmds := make([]*exec.Cmd, m)
	waited := make(chan struct{}, m)
	var next atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	t0 := time.Now()
	for w := 0; w < conc; w++ {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= int64(m) {
					return
				}
				cmd := exec.Command(benchShell, "-c", "sleep 600")
				cmd.Env, cmd.Dir = c.env, c.workdir
				cmd.Stdout, cmd.Stderr = &countWriter{}, &countWriter{}
				cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
				if err := cmd.Start(); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
				cmds[i] = cmd
				go func() {
					_ = cmd.Wait()
					waited <- struct{}{}
				}()
			}
		})
	}
	wg.Wait()
	startDur := time.Since(t0)
	running := 0
	for _, cmd := range cmds {
		if cmd != nil {
			running++
		}
	}
	var r bareResult
	if running > 0 {
		r.startRate = float64(running) / startDur.Seconds()
		time.Sleep(settle / 2)
		if after, err := sampleProc(self); err == nil {
			r.fdsPer = float64(after.fds-before.fds) / float64(running)
			r.threadsPer = float64(after.threads-before.threads) / float64(running)
		}
	}
	t0 = time.Now()
	for _, cmd := range cmds {
		if cmd != nil {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		}
	}
	for range running {
		<-waited
	}
	r.killRate = float64(running) / time.Since(t0).Seconds()
	if running == 0 {
		r.killRate = math.NaN()
	}
	if first != nil {
		return r, first
	}
	return r, ctx.Err()
}
