package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/execmesh/execmesh/internal/procfs"
)

// userHZ is the unit of utime/stime in /proc/<pid>/stat (USER_HZ, 100 on
// every Linux: the kernel scales its internal HZ to it).
const userHZ = 100

// idleCPUTarget is the design's bar on an idle `execmesh up` with the
// released nats-server, in percent of one CPU.
const idleCPUTarget = 0.1

// upProc is one running `execmesh up` with its own HOME and state
// directory.
type upProc struct {
	cmd     *exec.Cmd
	done    chan struct{}
	url     string        // GET /healthz
	base    string        // http://host:port, the API's root
	state   string        // its --state-dir
	startup time.Duration // from exec to the first 200 of /healthz
	log     tailBuffer
}

// startUp starts `execmesh up` in dir on free loopback ports, with args
// appended to its command line, and waits until /healthz answers 200.
func startUp(ctx context.Context, bin, dir string, args ...string) (*upProc, error) {
	home, state := filepath.Join(dir, "home"), filepath.Join(dir, "state")
	for _, d := range []string{home, state} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	httpAddr, err := freePort()
	if err != nil {
		return nil, err
	}
	natsAddr, err := freePort()
	if err != nil {
		return nil, err
	}
	u := &upProc{done: make(chan struct{}), base: "http://" + httpAddr, state: state}
	u.url = u.base + "/healthz"
	u.cmd = exec.Command(bin, append([]string{"up", "--state-dir", state, "--listen", httpAddr, "--nats-listen", natsAddr, "--log-level", "warn"}, args...)...)
	u.cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + home, "SHELL=" + benchShell, "LANG=C"}
	u.cmd.Dir = home
	u.cmd.Stdout, u.cmd.Stderr = &u.log, &u.log
	u.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	hc := &http.Client{Timeout: time.Second}
	t0 := time.Now()
	if err := u.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s up: %w", bin, err)
	}
	go func() { _ = u.cmd.Wait(); close(u.done) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u.url, nil)
		if res, err := hc.Do(req); err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				u.startup = time.Since(t0)
				hc.CloseIdleConnections()
				return u, nil
			}
		}
		select {
		case <-u.done:
			return nil, fmt.Errorf("execmesh up exited during start-up: %s", u.log.String())
		case <-ctx.Done():
			u.stop()
			return nil, ctx.Err()
		case <-time.After(time.Millisecond):
		}
		if time.Now().After(deadline) {
			u.stop()
			return nil, fmt.Errorf("execmesh up: /healthz not 200 within 30s: %s", u.log.String())
		}
	}
}

// stop ends the daemon gracefully (SIGTERM), then its process group.
func (u *upProc) stop() error {
	pid := u.cmd.Process.Pid
	_ = u.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-u.done:
		return nil
	case <-time.After(nodeStopTimeout):
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		<-u.done
		return fmt.Errorf("execmesh up did not stop within %v; killed", nodeStopTimeout)
	}
}

// freePort returns a loopback address nobody listens on (at the moment).
func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := ln.Addr().String()
	return addr, ln.Close()
}

// treeCPU is the CPU time, in USER_HZ ticks, that pid and every process
// below it have used: utime+stime of each live one plus cutime+cstime
// (children already waited for), and the sum of their VmRSS in KiB.
func treeCPU(pid int) (ticks, rssKiB int64, err error) {
	seen := map[int]bool{}
	var walk func(p int) error
	walk = func(p int) error {
		if seen[p] {
			return nil
		}
		seen[p] = true
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
		if err != nil {
			return err
		}
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			return fmt.Errorf("/proc/%d/stat: no command", p)
		}
		f := strings.Fields(string(b[i+1:]))
		// After the command: state is field 3 of stat; utime, stime,
		// cutime, cstime are 14–17.
		if len(f) < 15 {
			return fmt.Errorf("/proc/%d/stat: %d fields", p, len(f))
		}
		for _, s := range f[11:15] {
			v, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				return fmt.Errorf("/proc/%d/stat: %w", p, err)
			}
			ticks += v
		}
		if rss, _, err := procStatus(p); err == nil {
			rssKiB += rss
		}
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", p))
		for _, t := range tasks {
			cb, err := os.ReadFile(t)
			if err != nil {
				continue
			}
			for _, c := range strings.Fields(string(cb)) {
				if cp, err := strconv.Atoi(c); err == nil {
					// A child may exit between the listing and the read.
					if err := walk(cp); err != nil && !errors.Is(err, os.ErrNotExist) {
						return err
					}
				}
			}
		}
		return nil
	}
	err = walk(pid)
	return ticks, rssKiB, err
}

// threadsRunTime is the run time, in ns, of every live thread of pid
// (the first field of /proc/<pid>/task/<tid>/schedstat, the scheduler's
// exact sum, where utime+stime are in ticks of 10 ms), by thread id.
func threadsRunTime(pid int) (map[int]int64, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil, err
	}
	out := make(map[int]int64, len(tasks))
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/schedstat", pid, tid))
		if err != nil {
			continue // the thread exited meanwhile: see idleRunTime
		}
		if f := strings.Fields(string(b)); len(f) > 0 {
			if ns, err := strconv.ParseInt(f[0], 10, 64); err == nil {
				out[tid] = ns
			}
		}
	}
	return out, nil
}

// idleRunTime is the run time between two threadsRunTime snapshots; ok
// is false when a thread of the first is gone from the second (its time
// is lost to schedstat), or when a process of the tree is not pid itself.
func idleRunTime(before, after map[int]int64) (ns int64, ok bool) {
	for tid, b := range before {
		a, live := after[tid]
		if !live {
			return 0, false
		}
		ns += a - b
	}
	for tid, a := range after {
		if _, old := before[tid]; !old {
			ns += a // a thread started during the window
		}
	}
	return ns, true
}

// benchIdle: the cost of an idle `execmesh up` (section idle): start-up
// time to /healthz (median over runs, each in a fresh state directory),
// then CPU over -idle-duration after -idle-settle, and RSS.
func benchIdle(ctx context.Context, o *options, res *results) error {
	dir, err := os.MkdirTemp("", "execmesh-bench-idle-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var startups []float64
	var u *upProc
	for r := 0; r < o.runs; r++ {
		if u != nil {
			if err := u.stop(); err != nil {
				return err
			}
		}
		if u, err = startUp(ctx, o.bin, filepath.Join(dir, strconv.Itoa(r))); err != nil {
			return err
		}
		startups = append(startups, ms(u.startup))
		o.progress("idle: execmesh up answered /healthz after %.1f ms (run %d/%d)", ms(u.startup), r+1, o.runs)
	}
	defer func() {
		if err := u.stop(); err != nil {
			o.progress("idle: %v", err)
		}
	}()
	pid := u.cmd.Process.Pid
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(o.idleSettle):
	}
	c0, _, err := treeCPU(pid)
	if err != nil {
		return err
	}
	rt0, rtErr := threadsRunTime(pid)
	w0 := time.Now()
	o.progress("idle: measuring the CPU of execmesh up (pid %d) over %v", pid, o.idleDur)
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-u.done:
		return fmt.Errorf("execmesh up exited while idle: %s", u.log.String())
	case <-time.After(o.idleDur):
	}
	rt1, rtErr1 := threadsRunTime(pid)
	c1, rss, err := treeCPU(pid)
	if err != nil {
		return err
	}
	wall := time.Since(w0)
	pct := float64(c1-c0) / userHZ / wall.Seconds() * 100
	note := fmt.Sprintf("utime+stime of `execmesh up` and its children from /proc/<pid>/stat, %d ticks of 1/%d s in %.1f s, after %v of settling (one tick over 60 s is 0.017 %%)",
		c1-c0, userHZ, wall.Seconds(), o.idleSettle)
	tree := procfs.ChildrenOf(pid)
	if ns, ok := idleRunTime(rt0, rt1); ok && rtErr == nil && rtErr1 == nil && len(tree) == 0 {
		// The scheduler's exact run time, not ticks that round each
		// thread's share to 10 ms.
		pct = float64(ns) / float64(wall) * 100
		note = fmt.Sprintf("run time of the threads of `execmesh up` from /proc/<pid>/task/*/schedstat (ns), %.1f ms in %.1f s, after %v of settling (no child process; utime+stime: %d ticks of 1/%d s)",
			float64(ns)/1e6, wall.Seconds(), o.idleSettle, c1-c0, userHZ)
	}
	res.add(figure{Section: "idle", Figure: fmt.Sprintf("idle execmesh up, CPU over %v", o.idleDur.Round(time.Second)),
		Value: pct, Unit: "% CPU", Target: valueAtMost(idleCPUTarget), Note: note})
	res.add(figure{Section: "idle", Figure: "idle execmesh up, RSS", Value: float64(rss) / 1024, Unit: "MiB",
		Note: "VmRSS of `execmesh up` (NATS, gateway and local node in one process) and any children"})
	res.add(figure{Section: "idle", Figure: "execmesh up start-up to /healthz 200", Value: median(startups), Unit: "ms",
		Note: "from exec of `execmesh up` (fresh HOME and state directory) to the first 200 of GET /healthz, polled every 1 ms; median over runs"})
	return nil
}

// tailBuffer keeps the last few KB written to it (a daemon's log).
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
	n   int // lines written, all of them (soak counts them)
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.n += bytes.Count(p, []byte{'\n'})
	t.buf = append(t.buf, p...)
	if len(t.buf) > 8192 {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-4096:]...)
	}
	return len(p), nil
}

// lines is the number of lines written.
func (t *tailBuffer) lines() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.buf) == 0 {
		return "(no log output)"
	}
	return strings.TrimSpace(string(t.buf))
}
