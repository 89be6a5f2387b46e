package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// goBenchPackages and goBenchPattern select the micro-benchmarks of the
// hot paths (the *_bench_test.go files); each has sub-benchmarks
// ".../execmesh" and ".../baseline".
var (
	goBenchPackages = []string{"./session", "./protocol", "./approvals"}
	goBenchPattern  = `^Benchmark(OutputAppend|Sanitize|LogSlice|EnvFilter|DecodeExecArgs|Allowlist)$`
)

// goBenchLabels describes each benchmark for the table.
var goBenchLabels = map[string]string{
	"OutputAppend":   "session output append with caps",
	"Sanitize":       "ANSI/control stripping",
	"LogSlice":       "process log slicing",
	"EnvFilter":      "env filtering",
	"DecodeExecArgs": "exec args strict decoding",
	"Allowlist":      "allowlist",
}

// goBenchLine is one result line of `go test -bench -benchmem`.
type goBenchLine struct {
	name                 string // without "Benchmark" and the -GOMAXPROCS suffix
	nsOp, allocsOp, bOp  float64
	mbs                  float64
	hasMBs, hasAllocsOps bool
}

func parseGoBench(out []byte) []goBenchLine {
	var lines []goBenchLine
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		name := strings.TrimPrefix(f[0], "Benchmark")
		if i := strings.LastIndexByte(name, '-'); i > 0 {
			if _, err := strconv.Atoi(name[i+1:]); err == nil {
				name = name[:i]
			}
		}
		l := goBenchLine{name: name}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			switch f[i+1] {
			case "ns/op":
				l.nsOp = v
			case "allocs/op":
				l.allocsOp, l.hasAllocsOps = v, true
			case "B/op":
				l.bOp = v
			case "MB/s":
				l.mbs, l.hasMBs = v, true
			}
		}
		lines = append(lines, l)
	}
	return lines
}

// benchGo runs the Go micro-benchmarks and adds one figure per
// execmesh/baseline pair (section 5).
func benchGo(ctx context.Context, o *options, res *results) error {
	args := append([]string{"test", "-run", "^$", "-bench", goBenchPattern, "-benchmem",
		"-count", strconv.Itoa(o.goCount), "-benchtime", o.goBenchtime}, goBenchPackages...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = o.root
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	o.progress("go %s", strings.Join(args, " "))
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("go test -bench: %w\n%s%s", err, out, stderr.Bytes())
	}
	type agg struct{ ns, allocs, mbs []float64 }
	byName := map[string]*agg{}
	var order []string
	for _, l := range parseGoBench(out) {
		a := byName[l.name]
		if a == nil {
			a = &agg{}
			byName[l.name] = a
			order = append(order, l.name)
		}
		a.ns = append(a.ns, l.nsOp)
		if l.hasAllocsOps {
			a.allocs = append(a.allocs, l.allocsOp)
		}
		if l.hasMBs {
			a.mbs = append(a.mbs, l.mbs)
		}
	}
	if len(order) == 0 {
		return fmt.Errorf("go test -bench printed no results:\n%s", out)
	}
	for _, name := range order {
		prefix, ok := strings.CutSuffix(name, "/execmesh")
		if !ok {
			continue
		}
		a := byName[name]
		f := figure{Section: "go micro-benchmarks", Unit: "ns/op", Value: median(a.ns)}
		top, sub, _ := strings.Cut(prefix, "/")
		label := goBenchLabels[top]
		if label == "" {
			label = top
		}
		f.Figure = label + ": " + sub
		if v := median(a.allocs); len(a.allocs) > 0 {
			f.AllocsPerOp = &v
		}
		if b := byName[prefix+"/baseline"]; b != nil {
			f.Baseline = median(b.ns)
			if v := median(b.allocs); len(b.allocs) > 0 {
				f.BaselineAllocsPerOp = &v
			}
		}
		f.BaselineName = goBaselineNames[top]
		if len(a.mbs) > 0 {
			f.Note = fmt.Sprintf("%.0f MB/s", median(a.mbs))
		}
		// STYLE: the output path allocates nothing per call.
		if slices.Contains([]string{"OutputAppend", "Sanitize"}, top) {
			f.Target = allocsAtMost(0)
		}
		res.add(f)
	}
	return nil
}

var goBaselineNames = map[string]string{
	"OutputAppend":   "bytes.Buffer write",
	"Sanitize":       "copy",
	"LogSlice":       "direct scan",
	"EnvFilter":      "copy, unfiltered",
	"DecodeExecArgs": "encoding/json",
	"Allowlist":      "mvdan.cc/sh parse",
}

func allocsAtMost(x float64) string { return fmt.Sprintf("allocs<=%g", x) }
