package session

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/execmesh/execmesh/protocol"
)

// BenchmarkExecOutput measures the whole output path (pipe, sanitizer,
// buffers) with a command writing 100 MB of text.
func BenchmarkExecOutput(b *testing.B) {
	cfg := testConfig()
	m, err := NewManager(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close(context.Background())
	const size = 100 << 20
	b.SetBytes(size)
	for b.Loop() {
		res, err := m.Exec(context.Background(), ExecRequest{
			Command:     "yes 'the quick brown fox jumps over the lazy dog' | head -c 104857600",
			Synchronous: true,
		})
		if err != nil || res.Status() != "completed" {
			b.Fatalf("%v %s", err, res.Text())
		}
	}
}

// BenchmarkExecContainment measures one short foreground exec (`echo hi`
// under /bin/sh) in each containment, with and without a state dir: the
// cost of the session's cgroup (mkdir, clone3 into it, rmdir) and of its
// record.
func BenchmarkExecContainment(b *testing.B) {
	for _, mode := range []string{ContainmentCgroup, ContainmentProcessGroup} {
		for _, state := range []bool{false, true} {
			name := mode
			if state {
				name += "+statedir"
			}
			b.Run(name, func(b *testing.B) {
				cfg := testConfig()
				cfg.Shell = "/bin/sh"
				cfg.Containment = mode
				if state {
					cfg.StateDir = b.TempDir()
				}
				m, err := NewManager(cfg)
				if err != nil {
					b.Skipf("containment %s: %v", mode, err)
				}
				defer m.Close(context.Background())
				for b.Loop() {
					if _, err := m.Exec(context.Background(), ExecRequest{Command: "echo hi"}); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkKillAll starts 2000 background `sleep 600` sessions, then kills them all and waits until every one has
// exited: what the Reaper pays per exit while thousands of children are
// left (b.N rounds; reported per session: wall time, CPU time of the
// process, full passes over the children).
func BenchmarkKillAll(b *testing.B) {
	const n = 2000
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil && lim.Cur < lim.Max {
		lim.Cur = lim.Max // two pipes per session
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
	m, err := NewManager(testConfig())
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close(context.Background())
	ctx := context.Background()
	b.ReportAllocs()
	var killing, cpu time.Duration
	for b.Loop() {
		b.StopTimer()
		ids := make([]string, 0, n)
		for range n {
			res, err := m.Exec(ctx, ExecRequest{Command: "sleep 600", Background: true})
			if err != nil || res.Status() != protocol.StatusRunning {
				b.Fatalf("start: %v %s", err, res.Text())
			}
			ids = append(ids, res.SessionID())
		}
		b.StartTimer()
		t0, cpu0 := time.Now(), processCPU(b)
		for _, id := range ids {
			if res := m.Process(ctx, "", protocol.ProcessArgs{Action: "kill", SessionID: id}); res.Status() != protocol.StatusCompleted {
				b.Fatalf("kill: %s", res.Text())
			}
		}
		for {
			if running, _ := m.Counts(); running == 0 {
				break
			}
			time.Sleep(time.Millisecond)
		}
		killing += time.Since(t0)
		cpu += processCPU(b) - cpu0
	}
	m.reaper.mu.Lock()
	b.ReportMetric(float64(m.reaper.walks)/float64(b.N*n), "passes/session")
	m.reaper.mu.Unlock()
	b.ReportMetric(float64(killing.Nanoseconds())/float64(b.N*n), "ns/session")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N*n), "cpu-ns/session")
}

// processCPU is the CPU time (user and system) this process used so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkExecBare is BenchmarkExecContainment's baseline: the same
// command through os/exec with its output captured, in the same process.
func BenchmarkExecBare(b *testing.B) {
	for b.Loop() {
		if out, err := exec.Command("/bin/sh", "-c", "echo hi").Output(); err != nil || string(out) != "hi\n" {
			b.Fatalf("%q %v", out, err)
		}
	}
}

// BenchmarkExecFloodVsBare measures a command flooding its stdout (1 GB
// of NUL bytes, which the sanitizer rewrites, and of text, which passes
// through) through a foreground session against os/exec reading the same
// command's pipe into a counting writer, the two taking turns in each
// iteration so that both see the same machine. It reports the median of
// the per-iteration ratios (x-bare), the figure the flood batch sizes
// (floodReadBuffer, floodWideBuffer) were chosen by; run it with
// -benchtime=20x on a quiet machine.
func BenchmarkExecFloodVsBare(b *testing.B) {
	const size = 1_000_000_000
	for _, bc := range []struct{ name, command string }{
		{"nul", fmt.Sprintf("head -c %d /dev/zero", size)},
		{"text", fmt.Sprintf("yes 'the quick brown fox jumps over the lazy dog' | head -c %d", size)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			cfg := testConfig()
			cfg.Shell = "/bin/sh"
			m, err := NewManager(cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close(context.Background())
			b.SetBytes(size)
			var ratios []float64
			for b.Loop() {
				b.StopTimer()
				cmd := exec.Command("/bin/sh", "-c", bc.command)
				var w countingWriter
				cmd.Stdout = &w
				t0 := time.Now()
				if err := cmd.Run(); err != nil || w.n != size {
					b.Fatalf("bare: %v, %d bytes", err, w.n)
				}
				bare := time.Since(t0)
				b.StartTimer()
				t0 = time.Now()
				res, err := m.Exec(context.Background(), ExecRequest{Command: bc.command, Synchronous: true})
				if err != nil || res.Status() != protocol.StatusCompleted {
					b.Fatalf("%v %s", err, res.Text())
				}
				ratios = append(ratios, float64(time.Since(t0))/float64(bare))
			}
			slices.Sort(ratios)
			b.ReportMetric(ratios[len(ratios)/2], "x-bare")
		})
	}
}

// countingWriter counts what it is given; as cmd.Stdout it makes os/exec
// read the pipe in Go, the least a Go reader of the output does.
type countingWriter struct{ n int64 }

func (w *countingWriter) Write(p []byte) (int, error) {
	w.n += int64(len(p))
	return len(p), nil
}
