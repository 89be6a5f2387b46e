package session

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/protocol"
)

// pidsIn extracts "name=<pid>" values printed by a command.
func pidsIn(t *testing.T, text string, names ...string) []int {
	t.Helper()
	var out []int
	for _, n := range names {
		mm := regexp.MustCompile(n + `=(\d+)`).FindStringSubmatch(text)
		if mm == nil {
			t.Fatalf("no %s= pid in %q", n, text)
		}
		pid, _ := strconv.Atoi(mm[1])
		out = append(out, pid)
	}
	return out
}

// processGone reports whether pid no longer exists at all: not running
// and, if it was our orphan, reaped.
func processGone(pid int) error {
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
		var buf [512]byte
		p, _ := readProcStat(pid, buf[:])
		return fmt.Errorf("process %d still exists (state %c, ppid %d)", pid, p.state, p.ppid)
	}
	return nil
}

func waitGoneAll(t *testing.T, pids []int) {
	t.Helper()
	checkFor(t, waitLimit, 20*time.Millisecond, func() error {
		for _, pid := range pids {
			if err := processGone(pid); err != nil {
				return err
			}
		}
		return nil
	})
}

// markedProcesses lists the live processes left in the Manager's cgroup
// subtree (none in process-group containment: tests check pids there).
func markedProcesses(m *Manager) []int {
	if m.cg == nil {
		return nil
	}
	var out []int
	walk := []string{m.cg.dir.Path}
	for i := 0; i < len(walk); i++ {
		b, _ := os.ReadFile(walk[i] + "/cgroup.procs")
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				out = append(out, pid)
			}
		}
		ents, _ := os.ReadDir(walk[i])
		for _, e := range ents {
			if e.IsDir() {
				walk = append(walk, walk[i]+"/"+e.Name())
			}
		}
	}
	return out
}

// TestTimeoutKillsTree: the timeout ends the whole tree, including a
// process that left the group and session with setsid; the orphan is
// reaped too.
func TestTimeoutKillsTree(t *testing.T) {
	t.Parallel()
	m := newManager(t, nil)
	res := mustExec(t, m, ExecRequest{
		Command:    "setsid sleep 1000 & echo esc=$!; sleep 1000 & echo child=$!; sleep 30",
		TimeoutSec: ptr(1.0),
	})
	if res.Status() != "failed" || res.Details.FailureKind.Value() != "overall-timeout" || res.Details.ExitSignal.Value() != "SIGTERM" {
		t.Fatalf("timeout: %s %v", res.Status(), res.Details)
	}
	waitGoneAll(t, pidsIn(t, res.Text(), "esc", "child"))
}

// TestKillTree: kill ends a background tree; a process that ignores
// SIGTERM gets SIGKILL after the grace period.
func TestKillTree(t *testing.T) {
	t.Parallel()
	rec := newEventRecorder()
	m := newManager(t, func(c *Config) { c.KillGrace = 500 * time.Millisecond; c.OnExit = rec.onExit })
	const scope = "agent:main:main"
	id := startBackground(t, m, ExecRequest{
		Command:  "setsid sleep 1000 & echo esc=$!; (trap '' TERM; exec sleep 1000) & echo ign=$!; wait",
		ScopeKey: scope,
	})
	waitOutput(t, m, id, "ign=")
	pids := pidsIn(t, m.anySession(id).aggregatedForTest(), "esc", "ign")
	r := proc(t, m, scope, protocol.ProcessArgs{Action: "kill", SessionID: id})
	if r.Text() != "Termination requested for session "+id+"." || r.Status() != "completed" {
		t.Fatalf("kill: %s %q", r.Status(), r.Text())
	}
	waitGoneAll(t, pids)
	waitExited(t, m, id)
	r = proc(t, m, scope, protocol.ProcessArgs{Action: "poll", SessionID: id})
	if r.Status() != "completed" || !strings.HasSuffix(r.Text(), "\n\nProcess stopped by request (signal SIGTERM).") || r.Details.ExitReason.Value() != "manual-cancel" {
		t.Errorf("poll after kill: %s %q %v", r.Status(), r.Text(), r.Details)
	}
	ev := rec.next(t)
	if ev.Notify || ev.Status != "completed" || ev.ExitReason != "manual-cancel" || ev.SessionID != id {
		t.Errorf("exit event after kill: %+v", ev)
	}
	if r = proc(t, m, scope, protocol.ProcessArgs{Action: "kill", SessionID: id}); r.Text() != "No active session found for "+id {
		t.Errorf("kill after exit: %q", r.Text())
	}
}

// TestKillPTY: kill of interactive programs behind a PTY; an interactive
// shell ignores SIGTERM and is stopped with SIGKILL after the grace.
func TestKillPTY(t *testing.T) {
	t.Parallel()
	m := newManager(t, func(c *Config) { c.KillGrace = 300 * time.Millisecond })
	for _, tc := range []struct{ command, signal string }{
		{"cat", "SIGTERM"},
		{"exec sh -i", "SIGKILL"},
	} {
		id := startBackground(t, m, ExecRequest{Command: tc.command, PTY: true})
		if tc.signal == "SIGKILL" {
			waitOutput(t, m, id, " ") // the prompt: its signal handlers are set
		}
		proc(t, m, "", protocol.ProcessArgs{Action: "kill", SessionID: id})
		waitExited(t, m, id)
		r := proc(t, m, "", protocol.ProcessArgs{Action: "poll", SessionID: id})
		if r.Status() != "completed" || !strings.HasSuffix(r.Text(), "Process stopped by request (signal "+tc.signal+").") {
			t.Errorf("%s: poll after kill: %s %q", tc.command, r.Status(), r.Text())
		}
	}
}

// TestRemoveKeepsBlockerUntilGone: a removed session is hidden at once but
// blocks a restart until its process is gone.
func TestRemoveKeepsBlockerUntilGone(t *testing.T) {
	t.Parallel()
	m := newManager(t, func(c *Config) { c.KillGrace = 700 * time.Millisecond })
	id := startBackground(t, m, ExecRequest{Command: "trap '' TERM; echo up; sleep 1000", ScopeKey: "k"})
	waitOutput(t, m, id, "up")
	if b := m.Blockers(); len(b) != 1 || b[0].SessionID != id || b[0].Removed || b[0].ScopeKey != "k" || b[0].PID == 0 {
		t.Fatalf("blockers: %+v", b)
	}
	r := proc(t, m, "k", protocol.ProcessArgs{Action: "remove", SessionID: id})
	if r.Text() != "Removed session "+id+" (termination requested)." || r.Details.Name.Value() != "trap TERM;" {
		t.Errorf("remove: %q %v", r.Text(), r.Details)
	}
	if m.Has("k", id) {
		t.Errorf("removed session still visible")
	}
	if r = proc(t, m, "k", protocol.ProcessArgs{Action: "poll", SessionID: id}); r.Text() != "No session found for "+id {
		t.Errorf("poll after remove: %q", r.Text())
	}
	if b := m.Blockers(); len(b) != 1 || !b[0].Removed {
		t.Errorf("blockers right after remove: %+v", b)
	}
	checkFor(t, waitLimit, 20*time.Millisecond, func() error {
		if b := m.Blockers(); len(b) != 0 {
			return fmt.Errorf("still blocked by %+v", b)
		}
		return nil
	})
	if m.anySession(id) != nil {
		t.Errorf("removed session retained after exit")
	}
}

// TestCloseLeavesNoProcess: Close ends running trees (pipes and PTYs, with
// setsid escapees) and escapees of sessions that already finished.
func TestCloseLeavesNoProcess(t *testing.T) {
	t.Parallel()
	m, err := NewManager(testConfig())
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	id := startBackground(t, m, ExecRequest{Command: "setsid sleep 1000 & echo esc=$!; sleep 1000"})
	waitOutput(t, m, id, "esc=")
	pids = append(pids, pidsIn(t, m.anySession(id).aggregatedForTest(), "esc")...)
	pty := startBackground(t, m, ExecRequest{Command: "echo pid=$$; cat", PTY: true})
	waitOutput(t, m, pty, "pid=")
	pids = append(pids, pidsIn(t, m.anySession(pty).aggregatedForTest(), "pid")...)
	// A finished command that left a daemon behind.
	res := mustExec(t, m, ExecRequest{Command: "setsid sleep 1000 >/dev/null 2>&1 & echo daemon=$!"})
	pids = append(pids, pidsIn(t, res.Text(), "daemon")...)
	fg := make(chan error, 1)
	go func() {
		_, err := m.Exec(context.Background(), ExecRequest{Command: "sleep 1000", Synchronous: true})
		fg <- err
	}()
	checkFor(t, waitLimit, 10*time.Millisecond, func() error {
		if n := len(m.Blockers()); n != 3 {
			return fmt.Errorf("%d blockers", n)
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := m.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-fg; err != nil {
		t.Errorf("foreground exec during Close: %v", err)
	}
	if left := markedProcesses(m); len(left) != 0 {
		var buf [512]byte
		for _, pid := range left {
			p, _ := readProcStat(pid, buf[:])
			t.Errorf("process %d of the closed Manager remains: %+v (self %d, pids %v)", pid, p, os.Getpid(), pids)
		}
	}
	waitGoneAll(t, pids)
	if b := m.Blockers(); len(b) != 0 {
		t.Errorf("blockers after Close: %+v", b)
	}
}

// TestManySessions runs 200 concurrent sessions and checks that Close
// releases every goroutine and file descriptor.
func TestManySessions(t *testing.T) {
	// Not parallel: it counts the process's goroutines and descriptors.
	warm, err := NewManager(testConfig())
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, warm, ExecRequest{Command: "true"})
	if err := warm.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	baseGoroutines := runtime.NumGoroutine()
	baseFDs := countFDs(t)

	m, err := NewManager(testConfig())
	if err != nil {
		t.Fatal(err)
	}
	const n = 200
	start := time.Now()
	ids := make(chan string, n)
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() {
			res, err := m.Exec(context.Background(), ExecRequest{
				Command:    "echo start " + strconv.Itoa(i) + "; sleep 30",
				PTY:        i%4 == 0,
				Background: true,
				ScopeKey:   "many",
			})
			if err != nil {
				errs <- err
				return
			}
			ids <- res.SessionID()
		}()
	}
	seen := map[string]bool{}
	for i := 0; i < n; i++ {
		select {
		case id := <-ids:
			if seen[id] {
				t.Errorf("duplicate session id %s", id)
			}
			seen[id] = true
		case err := <-errs:
			t.Fatalf("Exec: %v", err)
		case <-time.After(waitLimit):
			t.Fatalf("only %d sessions started", i)
		}
	}
	t.Logf("%d sessions started after %v", n, time.Since(start))
	if got := len(m.Blockers()); got != n {
		t.Errorf("%d blockers, want %d", got, n)
	}
	list := proc(t, m, "many", protocol.ProcessArgs{Action: "list"})
	if got := len(list.Details.Sessions.Value()); got != n {
		t.Errorf("list has %d sessions", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start = time.Now()
	if err := m.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	t.Logf("Close took %v", time.Since(start))
	if left := markedProcesses(m); len(left) != 0 {
		t.Errorf("%d processes remain", len(left))
	}
	checkFor(t, waitLimit, 20*time.Millisecond, func() error {
		if g, f := runtime.NumGoroutine(), countFDs(t); g > baseGoroutines || f > baseFDs {
			return fmt.Errorf("goroutines %d (before %d), fds %d (before %d)", g, baseGoroutines, f, baseFDs)
		}
		return nil
	})
}

func countFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func TestProcSnapshotParsing(t *testing.T) {
	p, ok := parseProcStat([]byte("42 (a (weird) name) S 1 42 42 0 -1 4194304 1 0 0 0 0 0 0 0 20 0 1 0 123456 1 2 3\n"))
	if !ok || p.pid != 42 || p.ppid != 1 || p.pgrp != 42 || p.sid != 42 || p.state != 'S' || p.start != 123456 {
		t.Errorf("parse: %+v %v", p, ok)
	}
	if _, ok := parseProcStat([]byte("garbage")); ok {
		t.Errorf("garbage parsed")
	}
	snap, err := readProcSnapshot(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	self := snap.procs[os.Getpid()]
	// Our own process and its ancestors are never part of a tree, whatever
	// its group and session say.
	m := &Manager{selfPID: os.Getpid()}
	tr := &groupTree{m: m, leader: os.Getpid(), pgid: self.pgrp, sid: self.sid, known: map[int]uint64{}}
	tr.collect(snap)
	got := tr.known
	for pid := os.Getpid(); pid > 1; pid = snap.procs[pid].ppid {
		if _, bad := got[pid]; bad {
			t.Fatalf("collect included %d, an ancestor of the test", pid)
		}
		if _, ok := snap.procs[pid]; !ok {
			break
		}
	}
}
