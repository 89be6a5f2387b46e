package session

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/execmesh/execmesh/internal/cgroup"
	"github.com/execmesh/execmesh/internal/testutil"
	"github.com/execmesh/execmesh/protocol"
)

// The tree tests run in both containments; cgroup containment is skipped,
// saying why, where no writable cgroup v2 subtree exists.
var containments = []string{ContainmentCgroup, ContainmentProcessGroup}

func forEachContainment(t *testing.T, f func(t *testing.T, mode string)) {
	t.Helper()
	for _, mode := range containments {
		t.Run(mode, func(t *testing.T) {
			if mode == ContainmentCgroup {
				requireCgroups(t)
			}
			f(t, mode)
		})
	}
}

// requireCgroups skips the test where cgroup containment cannot run.
func requireCgroups(t *testing.T) {
	t.Helper()
	cfg := testConfig()
	cfg.Containment = ContainmentCgroup
	m, err := NewManager(cfg)
	if err != nil {
		t.Skipf("cgroup containment unavailable here (%v): these tests need a writable cgroup v2 subtree", err)
	}
	_ = m.Close(context.Background())
}

func token() string { return testutil.SleepToken() }

// procID identifies a process beyond pid reuse.
type procID = testutil.Proc

func procsWith(arg string) []procID { return testutil.ProcsWith(arg) }

func stillAlive(ids []procID) []procID { return testutil.StillAlive(ids) }

// waitProcs waits until n processes with arg run and returns them.
func waitProcs(t *testing.T, arg string, n int) []procID {
	t.Helper()
	var got []procID
	checkFor(t, waitLimit, 5*time.Millisecond, func() error {
		if got = procsWith(arg); len(got) < n {
			return fmt.Errorf("%d processes with %q, want %d", len(got), arg, n)
		}
		return nil
	})
	return got
}

// waitNoneLeft waits until none of ids runs.
func waitNoneLeft(t *testing.T, what string, ids []procID, within time.Duration) {
	t.Helper()
	checkFor(t, within, 10*time.Millisecond, func() error {
		if left := stillAlive(ids); len(left) > 0 {
			return fmt.Errorf("%s: %d processes survive: %v", what, len(left), left)
		}
		return nil
	})
}

// killSession kills a background session and waits for its exit.
func killSession(t *testing.T, m *Manager, scope, id string) {
	t.Helper()
	if r := proc(t, m, scope, protocol.ProcessArgs{Action: "kill", SessionID: id}); r.Status() != protocol.StatusCompleted {
		t.Fatalf("kill %s: %s %q", id, r.Status(), r.Text())
	}
	waitExited(t, m, id)
}

// TestEscapeeAfterOtherSessions is the case that broke the /proc snapshot
// design 7 times in 10: `setsid sleep & sleep` killed after earlier
// sessions of the same Manager left the setsid sleep running. 50 rounds in
// a row, each after other sessions, leave nothing.
func TestEscapeeAfterOtherSessions(t *testing.T) {
	forEachContainment(t, func(t *testing.T, mode string) {
		m := newManager(t, func(c *Config) { c.Containment = mode; c.KillGrace = 3 * time.Second })
		for round := range 50 {
			mustExec(t, m, ExecRequest{Command: "echo earlier " + strconv.Itoa(round)})
			startBackground(t, m, ExecRequest{Command: "true"})
			esc, fg := token(), token()
			id := startBackground(t, m, ExecRequest{Command: "setsid sleep " + esc + " >/dev/null 2>&1 & sleep " + fg})
			procs := append(waitProcs(t, esc, 1), waitProcs(t, fg, 1)...)
			killSession(t, m, "", id)
			// The grace is 3 s; only a survivor stays longer.
			waitNoneLeft(t, "round "+strconv.Itoa(round), procs, 8*time.Second)
		}
	})
}

// TestTreeShapes: the trees a kill must end whole.
func TestTreeShapes(t *testing.T) {
	forEachContainment(t, func(t *testing.T, mode string) {
		t.Parallel()
		m := newManager(t, func(c *Config) { c.Containment = mode; c.KillGrace = 500 * time.Millisecond })
		cases := []struct {
			name    string
			command func(tok string) string
			procs   int
			// cgroupOnly: what process groups cannot follow (see contain.go)
			cgroupOnly bool
		}{
			{"ignores SIGTERM", func(tok string) string {
				return "(trap '' TERM; exec sleep " + tok + ") & trap '' TERM; sleep " + tok + "; wait"
			}, 2, false},
			{"forks while killed", func(tok string) string {
				return "trap 'for i in 1 2 3 4 5; do sleep " + tok + " & done; exit' TERM; while :; do (sleep " + tok + " &); sleep 0.05; done"
			}, 3, false},
			{"setsid escapee forked while killed", func(tok string) string {
				return "trap 'setsid sleep " + tok + " >/dev/null 2>&1 & exit' TERM; sleep " + tok + " & wait"
			}, 1, true},
			{"double-forked daemon", func(tok string) string {
				return "( setsid sh -c 'sleep " + tok + " >/dev/null 2>&1 &' & ); sleep " + tok
			}, 2, true},
			{"pty tree", func(tok string) string { return "setsid sleep " + tok + " & sleep " + tok }, 2, false},
		}
		for _, tc := range cases {
			if tc.cgroupOnly && mode != ContainmentCgroup {
				continue
			}
			tok := token()
			id := startBackground(t, m, ExecRequest{Command: tc.command(tok), PTY: tc.name == "pty tree"})
			procs := waitProcs(t, tok, tc.procs)
			killSession(t, m, "", id)
			time.Sleep(100 * time.Millisecond) // forks in the trap
			procs = append(procs, procsWith(tok)...)
			waitNoneLeft(t, tc.name, procs, 5*time.Second)
			if left := procsWith(tok); len(left) > 0 {
				t.Errorf("%s: processes left: %v", tc.name, left)
			}
		}
	})
}

// TestStoppedTree: a tree the command stopped (SIGSTOP) still ends: the
// kill continues it so that it acts on SIGTERM.
func TestStoppedTree(t *testing.T) {
	forEachContainment(t, func(t *testing.T, mode string) {
		t.Parallel()
		m := newManager(t, func(c *Config) { c.Containment = mode; c.KillGrace = 5 * time.Second })
		tok := token()
		id := startBackground(t, m, ExecRequest{Command: "sleep " + tok + " & sleep " + tok + " & wait"})
		procs := waitProcs(t, tok, 2)
		for _, p := range procs {
			_ = syscall.Kill(p.PID, syscall.SIGSTOP)
		}
		_ = syscall.Kill(m.anySession(id).pid, syscall.SIGSTOP)
		start := time.Now()
		killSession(t, m, "", id)
		waitNoneLeft(t, "stopped tree", procs, 4*time.Second)
		if took := time.Since(start); took > 4*time.Second {
			t.Errorf("a stopped tree took %v (the grace is 5 s): SIGTERM did not reach it", took)
		}
	})
}

// TestDoubleForkEndsAtClose: what process-group containment cannot follow
// to its session (a daemon whose ancestors all ended) is an orphan of the
// process, ended when the Reaper closes.
func TestDoubleForkEndsAtClose(t *testing.T) {
	cfg := testConfig()
	cfg.Containment = ContainmentProcessGroup
	m, err := NewManager(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tok := token()
	mustExec(t, m, ExecRequest{Command: "( setsid sh -c 'sleep " + tok + " >/dev/null 2>&1 &' & )"})
	procs := waitProcs(t, tok, 1)
	if err := m.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitNoneLeft(t, "double-forked daemon after Close", procs, 5*time.Second)
}

// TestKillThousand: 1000 sessions killed at once leave no process (pid
// and start time checked in /proc).
func TestKillThousand(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 1000 sessions per containment")
	}
	forEachContainment(t, func(t *testing.T, mode string) {
		m := newManager(t, func(c *Config) { c.Containment = mode; c.KillGrace = 5 * time.Second })
		const n = 1000
		tok := token()
		ids := make([]string, n)
		var wg sync.WaitGroup
		sem := make(chan struct{}, 8)
		for i := range n {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				ids[i] = startBackground(t, m, ExecRequest{Command: "sleep " + tok})
			})
		}
		wg.Wait()
		procs := waitProcs(t, tok, n)
		start := time.Now()
		for _, id := range ids {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				proc(t, m, "", protocol.ProcessArgs{Action: "kill", SessionID: id})
			})
		}
		wg.Wait()
		waitNoneLeft(t, "1000 killed sessions", procs, 60*time.Second)
		t.Logf("%s: %d sessions gone %v after the first kill", mode, n, time.Since(start))
		checkFor(t, waitLimit, 20*time.Millisecond, func() error {
			if running, _ := m.Counts(); running != 0 {
				return fmt.Errorf("%d sessions still running", running)
			}
			return nil
		})
	})
}

// TestUsageOfCPUBurn: usage reports a known CPU burn of a child of the
// shell (the leader waits for it, so both containments count it).
func TestUsageOfCPUBurn(t *testing.T) {
	forEachContainment(t, func(t *testing.T, mode string) {
		t.Parallel()
		rec := newEventRecorder()
		m := newManager(t, func(c *Config) { c.Containment = mode; c.OnExit = rec.onExit })
		exe, _ := os.Executable()
		const burn = 300
		cmd := fmt.Sprintf("%s=burn HELPER_BURN_MS=%d '%s'; echo done", helperEnv, burn, exe)
		check := func(what string, u protocol.Usage) {
			t.Helper()
			total := u.CPUUserMs + u.CPUSystemMs
			wantScope := protocol.UsageScopeTree
			if mode == ContainmentProcessGroup {
				wantScope = protocol.UsageScopeLeader
			}
			// /proc's times tick every 10 ms.
			if total < burn-20 || total > burn+700 || u.Scope != wantScope {
				t.Errorf("%s: usage %+v (total %d ms), want about %d ms, scope %s", what, u, total, burn, wantScope)
			}
		}
		res := mustExec(t, m, ExecRequest{Command: cmd})
		u, ok := res.Details.Usage.Get()
		if !ok || res.Status() != protocol.StatusCompleted {
			t.Fatalf("foreground result %s %v", res.Status(), res.Details)
		}
		check("foreground exec", u)

		id := startBackground(t, m, ExecRequest{Command: cmd, ScopeKey: "k"})
		ev := rec.next(t)
		if ev.Usage == nil {
			t.Fatalf("exit event without usage: %+v", ev)
		}
		check("exit event", *ev.Usage)
		poll := proc(t, m, "k", protocol.ProcessArgs{Action: "poll", SessionID: id})
		if pu, ok := poll.Details.Usage.Get(); !ok || pu != *ev.Usage {
			t.Errorf("poll usage %v, event %+v", poll.Details.Usage.Value(), *ev.Usage)
		}
		list := proc(t, m, "k", protocol.ProcessArgs{Action: "list"})
		if e := list.Details.Sessions.Value(); len(e) != 1 || e[0].Usage.IsZero() {
			t.Errorf("list entries without usage: %v", e)
		}

		// A running session reports what it used so far.
		id = startBackground(t, m, ExecRequest{Command: cmd + "; sleep " + token(), ScopeKey: "k"})
		waitOutput(t, m, id, "done")
		running := proc(t, m, "k", protocol.ProcessArgs{Action: "poll", SessionID: id})
		if ru, ok := running.Details.Usage.Get(); !ok || running.Status() != protocol.StatusRunning {
			t.Errorf("running poll: %s %v", running.Status(), running.Details)
		} else {
			check("running poll", ru)
		}
		logr := proc(t, m, "k", protocol.ProcessArgs{Action: "log", SessionID: id})
		if _, ok := logr.Details.Usage.Get(); !ok {
			t.Errorf("running log without usage: %v", logr.Details)
		}
		killSession(t, m, "k", id)
	})
}

// TestSessionIDFromCaller: a caller-chosen id is used, seen by the
// command as EXECMESH_SESSION, and refused when taken or malformed.
func TestSessionIDFromCaller(t *testing.T) {
	t.Parallel()
	m := newManager(t, nil)
	res := mustExec(t, m, ExecRequest{SessionID: "fleet-42-a", Command: "echo $EXECMESH_SESSION; sleep 30", Background: true})
	if res.SessionID() != "fleet-42-a" {
		t.Fatalf("session id %q", res.SessionID())
	}
	waitOutput(t, m, "fleet-42-a", "fleet-42-a\n")
	_, err := m.Exec(context.Background(), ExecRequest{SessionID: "fleet-42-a", Command: "true"})
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Type != protocol.ErrConflict || !strings.Contains(pe.Message, "already in use") {
		t.Errorf("taken id: %v", err)
	}
	for _, bad := range []string{"../x", "a/b", ".hidden", "-x", strings.Repeat("a", 65), "a b", "Upper", "a.b"} {
		if _, err := m.Exec(context.Background(), ExecRequest{SessionID: bad, Command: "true"}); !errors.As(err, &pe) || pe.Type != protocol.ErrInvalidRequest {
			t.Errorf("id %q: %v", bad, err)
		}
	}
	// Without one, the slug is the marker too.
	res = mustExec(t, m, ExecRequest{Command: "echo $EXECMESH_SESSION"})
	if !strings.Contains(res.Text(), "-") || strings.Contains(res.Text(), "/") {
		t.Errorf("EXECMESH_SESSION %q", res.Text())
	}
}

// TestLostSessionsAfterKill9: a daemon killed with SIGKILL leaves its
// sessions running; the next Manager on its state dir ends them and
// reports each lost session once.
func TestLostSessionsAfterKill9(t *testing.T) {
	forEachContainment(t, func(t *testing.T, mode string) {
		t.Parallel()
		dir := t.TempDir()
		t.Cleanup(func() {
			// Whatever the test's outcome, nothing of the helper's run
			// outlives it: a Manager on its state dir ends it.
			cfg := testConfig()
			cfg.Containment, cfg.StateDir = mode, dir
			if m, err := NewManager(cfg); err == nil {
				_ = m.Close(context.Background())
			}
		})
		tok := token()
		exe, _ := os.Executable()
		cmd := exec.Command(exe)
		cmd.Env = append(os.Environ(), helperEnv+"=daemon", "HELPER_STATE_DIR="+dir, "HELPER_CONTAINMENT="+mode,
			"HELPER_COMMAND=setsid sleep "+tok+" >/dev/null 2>&1 & sleep "+tok, "HELPER_SESSION=lost-one")
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(out).ReadString('\n')
		if err != nil || line != "started lost-one "+mode+"\n" {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("daemon: %q %v; stderr %s", line, err, stderr.String())
		}
		procs := waitProcs(t, tok, 2)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if left := stillAlive(procs); len(left) != 2 {
			t.Fatalf("after kill -9 of the daemon %d session processes run, want 2 (the test needs them to survive it)", len(left))
		}
		var lost []LostSession
		m := newManager(t, func(c *Config) {
			c.Containment = mode
			c.StateDir = dir
			c.OnLost = func(l LostSession) { lost = append(lost, l) }
		})
		waitNoneLeft(t, "leftovers of the killed daemon", procs, 5*time.Second)
		if len(lost) != 1 || lost[0].SessionID != "lost-one" || lost[0].SessionKey != "agent:lost" || lost[0].Ended != 3 ||
			!strings.Contains(lost[0].Command, tok) || time.Since(lost[0].StartedAt) > time.Minute || !strings.Contains(lost[0].Reason, "3 of its processes") {
			t.Errorf("lost sessions: %+v", lost)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Errorf("state dir after recovery: %v", ents)
		}
		if mode == ContainmentCgroup {
			base := filepath.Dir(filepath.Dir(m.cg.dir.Path))
			if left, _ := filepath.Glob(filepath.Join(base, "execmesh-"+strconv.Itoa(cmd.Process.Pid)+"-*")); len(left) > 0 {
				t.Errorf("the killed daemon's cgroups remain: %v", left)
			}
		}
		// Reported once: a second Manager finds nothing.
		lost = nil
		_ = m.Close(context.Background())
		newManager(t, func(c *Config) {
			c.Containment = mode
			c.StateDir = dir
			c.OnLost = func(l LostSession) { lost = append(lost, l) }
		})
		if len(lost) != 0 {
			t.Errorf("reported again: %+v", lost)
		}
	})
}

// TestRecordsFollowSessions: a record exists while a session's processes
// may run, says "exited" while a finished session's daemon lives on, and
// is gone with its last process.
func TestRecordsFollowSessions(t *testing.T) {
	forEachContainment(t, func(t *testing.T, mode string) {
		t.Parallel()
		dir := t.TempDir()
		m := newManager(t, func(c *Config) { c.Containment = mode; c.StateDir = dir })
		records := func() []record {
			var out []record
			ents, _ := os.ReadDir(dir)
			for _, e := range ents {
				b, _ := os.ReadFile(filepath.Join(dir, e.Name()))
				var r record
				if err := jsonUnmarshal(b, &r); err == nil {
					out = append(out, r)
				}
			}
			return out
		}
		id := startBackground(t, m, ExecRequest{Command: "sleep " + token()})
		if r := records(); len(r) != 1 || r[0].SessionID != id || r[0].Exited || r[0].PID == 0 || (r[0].Cgroup == "") != (mode != ContainmentCgroup) {
			t.Fatalf("records of a running session: %+v", r)
		}
		killSession(t, m, "", id)
		checkFor(t, waitLimit, 10*time.Millisecond, func() error {
			if r := records(); len(r) != 0 {
				return fmt.Errorf("records after the kill: %+v", r)
			}
			return nil
		})
		tok := token()
		daemon := "setsid sleep " + tok + " >/dev/null 2>&1 &"
		if mode == ContainmentProcessGroup {
			// A setsid daemon whose parent ended is nobody's there (an
			// orphan of the process, see TestDoubleForkEndsAtClose); one
			// that stays in the command's group is its session's.
			daemon = "sleep " + tok + " >/dev/null 2>&1 &"
		}
		mustExec(t, m, ExecRequest{Command: daemon})
		procs := waitProcs(t, tok, 1)
		checkFor(t, waitLimit, 10*time.Millisecond, func() error {
			if r := records(); len(r) != 1 || !r[0].Exited {
				return fmt.Errorf("records with a daemon left: %+v", r)
			}
			return nil
		})
		if err := m.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		waitNoneLeft(t, "daemon after Close", procs, 5*time.Second)
		if r := records(); len(r) != 0 {
			t.Errorf("records after Close: %+v", r)
		}
	})
}

// TestShortSessionsLeakNothing: 10 000 short sessions leave goroutines,
// descriptors and cgroups as they were.
func TestShortSessionsLeakNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 10000 sessions")
	}
	// Not parallel: it counts the process's goroutines and descriptors.
	m := newManager(t, nil)
	mustExec(t, m, ExecRequest{Command: "true"})
	time.Sleep(100 * time.Millisecond)
	// Spare groups keep their control files open (bounded by
	// maxSpareGroups); those are not counted as left behind.
	g0, f0 := runtime.NumGoroutine(), countFDs(t)-spareFDs(m)
	var wg sync.WaitGroup
	var failed atomic.Int64
	for w := range 4 {
		wg.Go(func() {
			for i := w; i < 10000; i += 4 {
				res, err := m.Exec(context.Background(), ExecRequest{Command: "true", Background: i%10 == 0})
				if err != nil || (res.Status() != protocol.StatusCompleted && res.Status() != protocol.StatusRunning) {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of 10000 sessions failed", n)
	}
	checkFor(t, waitLimit, 50*time.Millisecond, func() error {
		if running, _ := m.Counts(); running != 0 {
			return fmt.Errorf("%d sessions still running", running)
		}
		g, f := runtime.NumGoroutine(), countFDs(t)-spareFDs(m)
		if g > g0+2 || f > f0 {
			return fmt.Errorf("goroutines %d (before %d), fds %d (before %d)", g, g0, f, f0)
		}
		if m.cg != nil {
			// Spare groups kept for reuse are bounded; nothing else stays.
			m.cg.mu.Lock()
			spare := map[string]bool{}
			for _, g := range m.cg.spares {
				spare[g.dir.Name()] = true
			}
			m.cg.mu.Unlock()
			ents, _ := os.ReadDir(m.cg.dir.Path)
			for _, e := range ents {
				if e.IsDir() && !spare[e.Name()] {
					return fmt.Errorf("session cgroup %s left", e.Name())
				}
			}
			if len(spare) > maxSpareGroups {
				return fmt.Errorf("%d spare cgroups kept, at most %d", len(spare), maxSpareGroups)
			}
		}
		return nil
	})
}

// TestCheckLimitsDecision: which limits are refused, and what the error
// names, for each state of the controllers (the decision, on any host).
func TestCheckLimitsDecision(t *testing.T) {
	t.Parallel()
	pg := &Manager{contain: Containment{Mode: ContainmentProcessGroup, Reason: "forced by configuration"}}
	none := &Manager{cg: &cgroupManager{dir: cgroupDirForTest("/sys/fs/cgroup/x/m-1")}, contain: Containment{Mode: ContainmentCgroup}}
	mem := &Manager{cg: &cgroupManager{dir: cgroupDirForTest("/sys/fs/cgroup/x/m-1"), controllers: []string{"memory"}}, contain: Containment{Mode: ContainmentCgroup}}
	all := &Manager{cg: &cgroupManager{dir: cgroupDirForTest("/sys/fs/cgroup/x/m-1"), controllers: []string{"cpu", "memory", "pids"}}, contain: Containment{Mode: ContainmentCgroup}}
	memL := protocol.Limits{MemoryMax: 1 << 30}
	allL := protocol.Limits{MemoryMax: 1 << 30, PidsMax: 64, CPUMax: 0.5}
	for _, tc := range []struct {
		name string
		m    *Manager
		l    protocol.Limits
		want []string // substrings of the error; nil: allowed
	}{
		{"no limits in process-group mode", pg, protocol.Limits{}, nil},
		{"process-group mode", pg, memL, []string{"memoryMax needs the memory controller", "process-group containment (forced by configuration)"}},
		{"cgroup without controllers", none, allL, []string{"memoryMax needs the memory controller", "pidsMax needs the pids controller", "cpuMax needs the cpu controller", "/sys/fs/cgroup/x/m-1", "enabled for sessions: none"}},
		{"memory only: memory limit", mem, memL, nil},
		{"memory only: pids limit", mem, protocol.Limits{PidsMax: 10}, []string{"pidsMax needs the pids controller", "enabled for sessions: memory"}},
		{"all controllers", all, allL, nil},
	} {
		err := tc.m.CheckLimits(tc.l)
		if tc.want == nil {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		var pe *protocol.Error
		if !errors.As(err, &pe) || pe.Type != protocol.ErrInvalidRequest {
			t.Errorf("%s: %v, want an invalid_request error", tc.name, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(pe.Message, w) {
				t.Errorf("%s: %q lacks %q", tc.name, pe.Message, w)
			}
		}
	}
	// Exec refuses before running anything.
	m := newManager(t, func(c *Config) { c.Containment = ContainmentProcessGroup })
	tok := token()
	if _, err := m.Exec(context.Background(), ExecRequest{Command: "sleep " + tok, Limits: memL}); err == nil {
		t.Error("a memory limit in process-group mode was accepted")
	}
	if len(procsWith(tok)) != 0 {
		t.Error("the refused command ran")
	}
}

// TestLimitsForReal applies limits where the controllers are delegated:
// an OOM ends the session failed with reason oom, a fork bomb stops at
// pids.max and stays killable, cpu.max is written.
func TestLimitsForReal(t *testing.T) {
	requireCgroups(t)
	m := newManager(t, func(c *Config) { c.Containment = ContainmentCgroup; c.KillGrace = 500 * time.Millisecond })
	for _, need := range []string{"memory", "pids", "cpu"} {
		if !slices.Contains(m.cg.controllers, need) {
			t.Skipf("the %s controller is not enabled for session cgroups here (%s has %v): limits are tested on hosts whose cgroup v2 hierarchy delegates memory, pids and cpu; TestCheckLimitsDecision covers the refusal", need, m.cg.dir.Path, m.cg.controllers)
		}
	}
	res := mustExec(t, m, ExecRequest{Command: "head -c 200000000 /dev/zero | tail > /dev/null", Limits: protocol.Limits{MemoryMax: 32 << 20}})
	if res.Status() != protocol.StatusFailed || res.Details.ExitReason.Value() != "oom" || !strings.Contains(res.Text(), "memoryMax=32M") {
		t.Errorf("OOM: %s %q %v", res.Status(), res.Text(), res.Details)
	}
	tok := token()
	id := startBackground(t, m, ExecRequest{Command: "bomb() { sleep " + tok + " & bomb & }; bomb; sleep " + tok, Limits: protocol.Limits{PidsMax: 20, CPUMax: 0.5}})
	checkFor(t, waitLimit, 20*time.Millisecond, func() error {
		if n := len(procsWith(tok)); n < 5 {
			return fmt.Errorf("%d bomb processes", n)
		}
		return nil
	})
	s := m.anySession(id)
	if v, ok := s.tree.(*cgroupTree).dir.Uint("pids.peak"); ok && v > 20 {
		t.Errorf("pids.peak %d above pids.max 20", v)
	}
	if b, err := os.ReadFile(s.tree.(*cgroupTree).dir.Path + "/cpu.max"); err != nil || string(b) != "50000 100000\n" {
		t.Errorf("cpu.max %q %v", b, err)
	}
	procs := procsWith(tok)
	killSession(t, m, "", id)
	waitNoneLeft(t, "fork bomb", procs, 10*time.Second)
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

func cgroupDirForTest(path string) cgroup.Dir {
	return cgroup.Dir{Path: path, Rel: strings.TrimPrefix(path, "/sys/fs/cgroup")}
}

// TestForeignChildrenKeepTheirStatus: children other code in the process
// starts with os/exec keep their exit statuses, in both containments
// (the process-group one makes the process a subreaper that reaps
// orphans), while sessions come and go.
func TestForeignChildrenKeepTheirStatus(t *testing.T) {
	forEachContainment(t, func(t *testing.T, mode string) {
		m := newManager(t, func(c *Config) { c.Containment = mode })
		var wg sync.WaitGroup
		errs := make(chan string, 200)
		for i := range 40 {
			wg.Go(func() {
				err := exec.Command("sh", "-c", "sleep 0.0"+strconv.Itoa(i%10)+"; exit 7").Run()
				var ee *exec.ExitError
				if !errors.As(err, &ee) || ee.ExitCode() != 7 {
					errs <- fmt.Sprintf("os/exec child: %v", err)
				}
			})
			wg.Go(func() {
				res := mustExec(t, m, ExecRequest{Command: "(sleep 0.01 &); exit 3"})
				if code := res.Details.ExitCode.Value(); code != 3 {
					errs <- "session: " + res.Status() + " " + res.Text()
				}
			})
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Error(e)
		}
	})
}

// TestStaleCgroupsRemoved: the empty groups of an execmesh process that
// is gone (killed before it could remove them) are removed by the next
// process that sets up its subtree beside them; populated ones and those
// of live processes stay.
func TestStaleCgroupsRemoved(t *testing.T) {
	requireCgroups(t)
	self, err := cgroup.Self()
	if err != nil {
		t.Fatal(err)
	}
	// A pid that is surely gone: a child that exited and was reaped.
	c := exec.Command("true")
	if err := c.Run(); err != nil {
		t.Fatal(err)
	}
	dead := strconv.Itoa(c.Process.Pid)
	stale := self.Child("execmesh-" + dead + "-deadbeef")
	live := self.Child("execmesh-" + strconv.Itoa(os.Getpid()) + "-cafe0000")
	for _, d := range []cgroup.Dir{stale, stale.Child("m-1"), stale.Child("m-1").Child("3-x"), live} {
		if err := d.Create(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = live.Remove() })
	removeStaleCgroups(self, slog.New(slog.DiscardHandler))
	if stale.Exists() {
		t.Error("the empty groups of a dead process remain")
	}
	if !live.Exists() {
		t.Error("the group of a live process was removed")
	}
}

// reusingManager is a cgroup-contained Manager whose session groups may
// be reused (no memory or pids controller); the test is skipped where
// they may not.
func reusingManager(t *testing.T) *Manager {
	t.Helper()
	requireCgroups(t)
	t.Parallel()
	m := newManager(t, func(c *Config) { c.Containment = ContainmentCgroup })
	if !m.cg.reusable() {
		t.Skipf("session groups have controllers %v: not reused", m.cg.controllers)
	}
	return m
}

// TestSpareGroupReuse: where groups may be reused (no memory or pids
// controller), the next session is cloned into the empty group of the
// last one, and reports only its own CPU time.
func TestSpareGroupReuse(t *testing.T) {
	m := reusingManager(t)
	spares := func() []string {
		m.cg.mu.Lock()
		defer m.cg.mu.Unlock()
		var out []string
		for _, g := range m.cg.spares {
			out = append(out, g.dir.Path)
		}
		return out
	}
	exe, _ := os.Executable()
	burn := mustExec(t, m, ExecRequest{Command: fmt.Sprintf("%s=burn HELPER_BURN_MS=300 '%s'", helperEnv, exe)})
	if u := burn.Details.Usage.Value(); u.CPUUserMs+u.CPUSystemMs < 250 {
		t.Fatalf("burn: usage %+v", u)
	}
	var first []string
	checkFor(t, waitLimit, 10*time.Millisecond, func() error {
		if first = spares(); len(first) != 1 {
			return fmt.Errorf("spare groups %v after one session, want its group", first)
		}
		return nil
	})
	res := mustExec(t, m, ExecRequest{Command: "echo $$; cat /proc/self/cgroup"})
	if u := res.Details.Usage.Value(); u.CPUUserMs+u.CPUSystemMs > 100 {
		t.Errorf("the next session in the reused group reports %+v: the last one's CPU time", u)
	}
	if rel := filepath.Base(first[0]); !strings.Contains(res.Text(), "0::/") || !strings.HasSuffix(strings.TrimSpace(res.Text()), "/"+rel) {
		t.Errorf("next session ran in %q, want the spare %s", res.Text(), first[0])
	}
}

// TestGroupWithChildrenNotReused: a command that made a group below its
// own leaves no spare: its group goes, with the one below, when it ends,
// and the next session runs in a group of its own.
func TestGroupWithChildrenNotReused(t *testing.T) {
	m := reusingManager(t)
	base := m.cg.dir.Path
	res := mustExec(t, m, ExecRequest{Command: fmt.Sprintf(`g=$(sed -n 's|^0::.*/||p' /proc/self/cgroup); mkdir '%s'/"$g"/sub && echo "$g"`, base)})
	made := strings.TrimSpace(res.Text())
	if made == "" || strings.Contains(made, "/") {
		t.Fatalf("the command's group: %q", res.Text())
	}
	checkFor(t, waitLimit, 10*time.Millisecond, func() error {
		if _, err := os.Stat(filepath.Join(base, made)); !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("group %s with a group below it still there (%v)", made, err)
		}
		m.cg.mu.Lock()
		defer m.cg.mu.Unlock()
		if len(m.cg.spares) != 0 {
			return fmt.Errorf("%d spare groups, want none", len(m.cg.spares))
		}
		return nil
	})
	next := mustExec(t, m, ExecRequest{Command: `sed -n 's|^0::.*/||p' /proc/self/cgroup`})
	if got := strings.TrimSpace(next.Text()); got == made || got == "" {
		t.Errorf("next session ran in %q (the first ran in %q)", got, made)
	}
}

// TestBackgroundSessionsHoldOnlyPipes: a session that may run for long
// (background from the start, or a foreground one that yielded) holds its
// two pipes and nothing more: the control files a short command's group
// keeps open for its exit are given back, so the descriptor limit alone
// bounds the sessions.
func TestBackgroundSessionsHoldOnlyPipes(t *testing.T) {
	m := newManager(t, nil)
	if m.cg == nil {
		t.Skip("no cgroup containment here")
	}
	for range 8 { // leave spare groups, with their files, to be reused
		mustExec(t, m, ExecRequest{Command: "true"})
	}
	// The groups of the runs above are released after their calls
	// answered: wait until each is a spare (or gone).
	checkFor(t, waitLimit, 10*time.Millisecond, func() error {
		m.cg.mu.Lock()
		spares := len(m.cg.spares)
		m.cg.mu.Unlock()
		ents, _ := os.ReadDir(m.cg.dir.Path)
		if dirs := len(slices.DeleteFunc(ents, func(e os.DirEntry) bool { return !e.IsDir() })); dirs != spares {
			return fmt.Errorf("%d session groups, %d of them spares", dirs, spares)
		}
		return nil
	})
	f0 := countFDs(t) - spareFDs(m)
	const n = 12
	var ids []string
	for i := range n {
		req := ExecRequest{Command: "sleep 60", Background: true}
		if i%2 == 1 {
			y := 10.0
			req = ExecRequest{Command: "sleep 60", YieldMs: &y}
		}
		res, err := m.Exec(t.Context(), req)
		if err != nil || res.Status() != protocol.StatusRunning {
			t.Fatalf("%v %s", err, res.Status())
		}
		ids = append(ids, res.SessionID())
	}
	if got := countFDs(t) - spareFDs(m) - f0; got != 2*n {
		t.Errorf("%d background sessions hold %d descriptors, want %d (two pipes each)", n, got, 2*n)
	}
	for _, id := range ids {
		m.Process(t.Context(), "", protocol.ProcessArgs{Action: "kill", SessionID: id})
	}
}

// spareFDs counts the descriptors m keeps open for reuse (its spare
// groups' control files, the files of its free record slots), which tests
// counting descriptors leave out.
func spareFDs(m *Manager) int {
	m.records.mu.Lock()
	n := len(m.records.freeOpen)
	m.records.mu.Unlock()
	if m.cg == nil {
		return n
	}
	m.cg.mu.Lock()
	defer m.cg.mu.Unlock()
	for _, g := range m.cg.spares {
		if g.files != nil {
			n += cgroup.FilesOpen
		}
	}
	return n
}

// TestKillEndsAtEmptying: the termination of a cgroup tree that SIGTERM
// ends is over when the group empties (an inotify event; the wait reads
// cgroup.events only after one), not at the grace's end.
func TestKillEndsAtEmptying(t *testing.T) {
	requireCgroups(t)
	m := newManager(t, func(c *Config) { c.Containment = ContainmentCgroup; c.KillGrace = 20 * time.Second })
	for _, cmd := range []string{"sleep %s & sleep %s; wait", "exec sleep %s", "(trap '' TERM; sleep 0.3) & sleep %s; wait"} {
		tok := token()
		id := startBackground(t, m, ExecRequest{Command: strings.ReplaceAll(cmd, "%s", tok)})
		waitProcs(t, tok, 1)
		s := m.anySession(id)
		start := time.Now()
		killSession(t, m, "", id)
		select {
		case <-s.termDone:
		case <-time.After(5 * time.Second):
			t.Fatalf("%q: the termination still waits %v after the kill (grace 20 s)", cmd, time.Since(start))
		}
		t.Logf("%q: termination over %v after the kill", cmd, time.Since(start))
	}
}

// TestSparesKeptInABurst: the empty groups of a burst of killed sessions
// are all kept as spares at first (no rmdir while the burst goes on),
// and those beyond maxSpareGroups are removed once the burst is over.
func TestSparesKeptInABurst(t *testing.T) {
	requireCgroups(t)
	m := newManager(t, func(c *Config) { c.Containment = ContainmentCgroup })
	if !m.cg.reusable() {
		t.Skipf("session groups have controllers %v: not reused", m.cg.controllers)
	}
	const n = 3 * maxSpareGroups
	tok := token()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = startBackground(t, m, ExecRequest{Command: "sleep " + tok})
	}
	waitProcs(t, tok, n)
	spares := func() int {
		m.cg.mu.Lock()
		defer m.cg.mu.Unlock()
		return len(m.cg.spares)
	}
	groups := func() int {
		ents, _ := os.ReadDir(m.cg.dir.Path)
		k := 0
		for _, e := range ents {
			if e.IsDir() {
				k++
			}
		}
		return k
	}
	for _, id := range ids {
		killSession(t, m, "", id)
	}
	if k := spares(); k <= maxSpareGroups {
		t.Fatalf("%d spares right after %d kills, want more than %d (the burst's groups kept)", k, n, maxSpareGroups)
	}
	checkFor(t, waitLimit, 20*time.Millisecond, func() error {
		if k, g := spares(), groups(); k != maxSpareGroups || g != maxSpareGroups {
			return fmt.Errorf("%d spares, %d groups after the burst, want %d", k, g, maxSpareGroups)
		}
		return nil
	})
	// The spares are used again.
	id := startBackground(t, m, ExecRequest{Command: "sleep " + tok})
	if k := spares(); k != maxSpareGroups-1 {
		t.Errorf("%d spares after a start, want %d", k, maxSpareGroups-1)
	}
	killSession(t, m, "", id)
}

// TestKilledGroupNotReused: the group of a tree that needed cgroup.kill
// is not kept as a spare (the kernel kills what is cloned into a group
// killed once), and the next session runs.
func TestKilledGroupNotReused(t *testing.T) {
	requireCgroups(t)
	m := newManager(t, func(c *Config) { c.Containment = ContainmentCgroup; c.KillGrace = 200 * time.Millisecond })
	if !m.cg.reusable() {
		t.Skipf("session groups have controllers %v: not reused", m.cg.controllers)
	}
	tok := token()
	id := startBackground(t, m, ExecRequest{Command: "trap '' TERM; sleep " + tok})
	waitProcs(t, tok, 1)
	dir := m.anySession(id).tree.(*cgroupTree).dir
	killSession(t, m, "", id)
	checkFor(t, waitLimit, 10*time.Millisecond, func() error {
		if dir.Exists() {
			return fmt.Errorf("the killed group %s is still there", dir.Path)
		}
		return nil
	})
	m.cg.mu.Lock()
	for _, g := range m.cg.spares {
		if g.dir == dir {
			t.Errorf("the killed group %s is a spare", dir.Path)
		}
	}
	m.cg.mu.Unlock()
	tok2 := token()
	id2 := startBackground(t, m, ExecRequest{Command: "sleep " + tok2})
	waitProcs(t, tok2, 1)
	time.Sleep(100 * time.Millisecond)
	if len(procsWith(tok2)) != 1 {
		t.Fatal("the next session's process died")
	}
	killSession(t, m, "", id2)
}
