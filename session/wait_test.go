package session

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/execmesh/execmesh/protocol"
)

// osThreads returns the number of OS threads of this process.
func osThreads(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no Threads line in /proc/self/status")
	return 0
}

// openFDs returns the number of open descriptors of this process.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestRunningSessionsHoldNoThreads: a waiting session parks in the poller
// (pidfd) instead of blocking an OS thread in wait4, so thousands of
// background commands do not mean thousands of threads.
func TestRunningSessionsHoldNoThreads(t *testing.T) {
	m := newManager(t, nil)
	const n = 150
	before, fdsBefore := osThreads(t), openFDs(t)
	for i := 0; i < n; i++ {
		startBackground(t, m, ExecRequest{Command: "sleep 60"})
	}
	// Let every session reach its wait.
	time.Sleep(300 * time.Millisecond)
	after := osThreads(t)
	if grown := after - before; grown > n/3 {
		t.Fatalf("%d sleeping sessions added %d OS threads (%d → %d); the leader wait blocks threads", n, grown, before, after)
	}
	// Two pipes each; no pidfd per session.
	if fds := openFDs(t) - fdsBefore; fds > 2*n+10 {
		t.Fatalf("%d sleeping sessions hold %d descriptors, want about %d", n, fds, 2*n)
	}
	if running, _ := m.Counts(); running != n {
		t.Fatalf("running sessions: %d, want %d", running, n)
	}
	if got := m.Len(); got != n {
		t.Fatalf("Len: %d, want %d", got, n)
	}
}

// TestLateOutputIsDrained: a reader that falls behind (starved of CPU,
// here held up by a slow output hook) still gets every byte after the
// command exited, when no process holds the output open any more.
func TestLateOutputIsDrained(t *testing.T) {
	for _, pty := range []bool{false, true} {
		t.Run("pty="+strconv.FormatBool(pty), func(t *testing.T) {
			var once sync.Once
			m := newManager(t, func(c *Config) {
				c.DrainWait = 50 * time.Millisecond
				c.OnOutput = func(int) { once.Do(func() { time.Sleep(600 * time.Millisecond) }) }
			})
			// 60 000 bytes fit in a pipe: the command exits at once,
			// while the reader still sleeps over its first kilobyte.
			res := mustExec(t, m, ExecRequest{Command: "head -c 60000 /dev/zero | tr '\\0' x; echo; echo END-OF-OUTPUT", PTY: pty})
			if res.Status() != protocol.StatusCompleted {
				t.Fatalf("status %s: %q", res.Status(), res.Text())
			}
			text := res.Text()
			if !strings.Contains(text, "END-OF-OUTPUT") || strings.Count(text, "x") != 60000 {
				t.Fatalf("output cut: %d x's, end marker %v", strings.Count(text, "x"), strings.Contains(text, "END-OF-OUTPUT"))
			}
		})
	}
}

// TestOutputHolderDoesNotHoldExit: a background process that keeps the
// output open (a daemon) does not hold the exit report for its lifetime:
// the report comes after DrainWait, with the output written so far.
func TestOutputHolderDoesNotHoldExit(t *testing.T) {
	for _, pty := range []bool{false, true} {
		t.Run("pty="+strconv.FormatBool(pty), func(t *testing.T) {
			m := newManager(t, func(c *Config) { c.DrainWait = 200 * time.Millisecond })
			start := time.Now()
			res := mustExec(t, m, ExecRequest{Command: "echo before; sleep 30 & echo after", PTY: pty})
			took := time.Since(start)
			if res.Status() != protocol.StatusCompleted || !strings.Contains(res.Text(), "before") || !strings.Contains(res.Text(), "after") {
				t.Fatalf("result %s %q", res.Status(), res.Text())
			}
			if took > 15*time.Second {
				t.Fatalf("exit reported after %v: the holder's lifetime held it", took)
			}
		})
	}
}

// TestManagersShareTheProcess: two Managers in one process (the gateway's
// and the local node agent's under `execmesh up`) never take each other's
// exit statuses: one's orphan reaper leaves the other's leaders alone.
func TestManagersShareTheProcess(t *testing.T) {
	a, b := newManager(t, nil), newManager(t, nil)
	const n = 40
	var wg sync.WaitGroup
	errs := make(chan string, 2*n)
	for i := 0; i < n; i++ {
		for _, m := range []*Manager{a, b} {
			wg.Go(func() {
				res := mustExec(t, m, ExecRequest{Command: "exit 3"})
				if code := res.Details.ExitCode.Value(); res.Status() != protocol.StatusCompleted || code != 3 {
					errs <- res.Status() + ": " + res.Text()
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Errorf("exit status lost: %s", e)
	}
}
