package session

import (
	"context"
	"log/slog"
	"runtime"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// startLeader starts argv as a child registered with r as a session
// leader and returns its pid and the channel its exit status comes on.
func startLeader(t *testing.T, r *Reaper, argv ...string) (int, <-chan exitStatus) {
	t.Helper()
	register := r.spawn()
	pid, err := syscall.ForkExec(argv[0], argv, &syscall.ProcAttr{Sys: &syscall.SysProcAttr{Setpgid: true}})
	if err != nil {
		register(0, nil)
		t.Fatal(err)
	}
	ch := make(chan exitStatus, 1)
	register(pid, ch)
	t.Cleanup(func() { _ = unix.Kill(pid, unix.SIGKILL) })
	return pid, ch
}

func newTestReaper(t *testing.T) *Reaper {
	t.Helper()
	r := NewReaper(ReaperConfig{})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := r.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return r
}

// awaitExit waits up to within for a leader's exit status.
func awaitExit(t *testing.T, ch <-chan exitStatus, within time.Duration, what string) exitStatus {
	t.Helper()
	select {
	case st := <-ch:
		if st.err != nil {
			t.Fatalf("%s: %v", what, st.err)
		}
		return st
	case <-time.After(within):
		t.Fatalf("%s: no exit status within %v", what, within)
	}
	return exitStatus{}
}

// awaitZombie waits until pid has exited and is not reaped yet.
func awaitZombie(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !isZombie(pid); {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d did not become a zombie", pid)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestReaperCollectsHintedExitsWhilePassesPause: while the full pass over
// every child is put off (as it is after a pass over thousands), a leader
// whose output ended is still collected at once, by pid: hinted before
// its exit, or after it and its SIGCHLD.
func TestReaperCollectsHintedExitsWhilePassesPause(t *testing.T) {
	r := newTestReaper(t)
	pause := func() { r.nextWalk.Store(time.Now().Add(time.Hour).UnixNano()) }

	pause()
	pid, ch := startLeader(t, r, "/bin/sleep", "60")
	r.hintExit(pid) // its output ended a moment before it exits
	if err := unix.Kill(pid, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	st := awaitExit(t, ch, 3*time.Second, "leader hinted before its exit")
	if !st.ws.Signaled() || st.ws.Signal() != unix.SIGKILL {
		t.Fatalf("status %v, want killed by SIGKILL", st.ws)
	}

	pause()
	pid, ch = startLeader(t, r, "/bin/sh", "-c", "exit 3")
	awaitZombie(t, pid)
	time.Sleep(20 * time.Millisecond) // its SIGCHLD was handled: the pass was put off
	r.hintExit(pid)
	if st := awaitExit(t, ch, 3*time.Second, "leader hinted after its exit"); st.ws.ExitStatus() != 3 {
		t.Fatalf("exit status %d, want 3", st.ws.ExitStatus())
	}
}

// TestReaperPausedPassStillCollects: an exit nobody hinted waits for the
// put-off full pass, but no longer.
func TestReaperPausedPassStillCollects(t *testing.T) {
	r := newTestReaper(t)
	pause := 300 * time.Millisecond
	r.nextWalk.Store(time.Now().Add(pause).UnixNano())
	t0 := time.Now()
	_, ch := startLeader(t, r, "/bin/true")
	awaitExit(t, ch, pause+3*time.Second, "unhinted leader")
	if d := time.Since(t0); d < pause/2 {
		t.Fatalf("collected after %v, before the paused pass (%v)", d, pause)
	}
}

// TestReaperHintsSettle: the hint of a leader that lives on (it closed its
// output) is dropped by a full pass once it is hintAge old, and that of a
// collected leader at once.
func TestReaperHintsSettle(t *testing.T) {
	r := newTestReaper(t)
	r.nextWalk.Store(time.Now().Add(time.Hour).UnixNano())
	alive, _ := startLeader(t, r, "/bin/sleep", "60")
	ending, ch := startLeader(t, r, "/bin/sleep", "60")
	r.hintExit(alive)
	r.hintExit(ending)
	hinted := func(pid int) bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		_, ok := r.hinted[pid]
		return ok
	}
	if !hinted(alive) || !hinted(ending) {
		t.Fatal("hints not recorded")
	}
	_ = unix.Kill(ending, unix.SIGKILL)
	awaitExit(t, ch, 3*time.Second, "hinted leader")
	if hinted(ending) {
		t.Fatal("the collected leader is still hinted")
	}
	// A full pass keeps a young hint and drops an old one.
	r.nextWalk.Store(0)
	r.wake()
	time.Sleep(50 * time.Millisecond)
	if !hinted(alive) {
		t.Fatal("a full pass dropped a hint younger than hintAge")
	}
	r.mu.Lock()
	r.hinted[alive] = time.Now().Add(-2 * hintAge)
	r.mu.Unlock()
	r.nextWalk.Store(0)
	r.wake()
	for deadline := time.Now().Add(3 * time.Second); hinted(alive); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a full pass kept a hint older than hintAge")
		}
	}
}

// TestReaperStartsDoNotWake: registering a leader wakes the Reaper only
// when a pass waits for a registration, so that starts do not each cost a
// pass over every child (the kernel walks them all for the peek).
func TestReaperStartsDoNotWake(t *testing.T) {
	r := newTestReaper(t)
	walks := func() uint64 {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.walks
	}
	// SIGCHLD is the process's: exits of other tests' children (those
	// an earlier test killed at its end, too) wake this Reaper. And an
	// exited child of an earlier test whose Reaper is closed is a
	// stranger to this one: while one is there, every pass waits for a
	// start's registration, which then wakes it. Such children are
	// collected first, passes over a quiet period of the same length are
	// the baseline, and a try that exits disturbed anyway is made again:
	// starts that woke the Reaper would fail every try.
	const n, tries = 40, 5
	var got, baseline uint64
	for range tries {
		// Until no pass came for 300 ms (the children an earlier test
		// killed have exited), at most 5 s; then collect them.
		for deadline, last := time.Now().Add(5*time.Second), walks(); time.Now().Before(deadline); {
			time.Sleep(300 * time.Millisecond)
			now := walks()
			if now == last {
				break
			}
			last = now
		}
		for {
			pid, ok := peekExited()
			if !ok {
				break
			}
			if reaped, _ := unix.Wait4(pid, nil, unix.WNOHANG, nil); reaped != pid {
				break
			}
		}
		quiet := walks()
		time.Sleep(100 * time.Millisecond)
		baseline = walks() - quiet
		before := walks()
		for range n {
			startLeader(t, r, "/bin/sleep", "60")
		}
		time.Sleep(50 * time.Millisecond)
		if got = walks() - before; got <= n/4+2*baseline {
			return
		}
	}
	t.Fatalf("in each of %d tries %d starts caused more than %d full passes (the last: %d, and %d in a quiet period)",
		tries, n, n/4, got, baseline)
}

// TestReaperLeaderExitedBeforeRegistration: a leader that exits before it
// is registered is collected once it is.
func TestReaperLeaderExitedBeforeRegistration(t *testing.T) {
	r := newTestReaper(t)
	register := r.spawn()
	pid, err := syscall.ForkExec("/bin/sh", []string{"/bin/sh", "-c", "exit 7"}, &syscall.ProcAttr{Sys: &syscall.SysProcAttr{Setpgid: true}})
	if err != nil {
		register(0, nil)
		t.Fatal(err)
	}
	awaitZombie(t, pid)
	time.Sleep(30 * time.Millisecond) // its SIGCHLD's pass found it unregistered
	ch := make(chan exitStatus, 1)
	t0 := time.Now()
	register(pid, ch)
	if st := awaitExit(t, ch, 3*time.Second, "leader registered after its exit"); st.ws.ExitStatus() != 7 {
		t.Fatalf("exit status %d, want 7", st.ws.ExitStatus())
	}
	t.Logf("collected %v after its registration", time.Since(t0))
}

// TestReaperAwaitExit: the reader that saw a leader's output end collects
// its exit itself, on a pidfd, with no pass of the Reaper (this Reaper
// has no run loop, so nothing else takes SIGCHLD); a leader that lives on
// after closing its output is left registered after hintAge.
func TestReaperAwaitExit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		script  string
		exits   bool
		maxWait time.Duration
	}{
		{"exit after closing output", "exec >&- 2>&-; sleep 0.1; exit 3", true, hintAge},
		{"lives on after closing output", "exec >&- 2>&-; sleep 5", false, hintAge + time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := bareReaper()
			var p [2]int
			if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
				t.Fatal(err)
			}
			register := r.spawn()
			pid, err := syscall.ForkExec("/bin/sh", []string{"/bin/sh", "-c", tc.script}, &syscall.ProcAttr{Files: []uintptr{0, uintptr(p[1]), uintptr(p[1])}})
			_ = unix.Close(p[1])
			if err != nil {
				register(0, nil)
				t.Fatal(err)
			}
			ch := make(chan exitStatus, 1)
			register(pid, ch)
			t.Cleanup(func() {
				_ = unix.Kill(pid, unix.SIGKILL)
				var ws unix.WaitStatus
				_, _ = wait4(pid, &ws, 0, nil)
			})
			var buf [16]byte
			for {
				if n, err := unix.Read(p[0], buf[:]); n <= 0 || err != nil {
					break
				}
			}
			_ = unix.Close(p[0])
			t0 := time.Now()
			r.awaitExit(pid)
			if took := time.Since(t0); took > tc.maxWait {
				t.Fatalf("awaitExit took %v, want at most %v", took, tc.maxWait)
			}
			select {
			case st := <-ch:
				if !tc.exits {
					t.Fatalf("collected a leader that lives on: %+v", st)
				}
				if st.err != nil || st.ws.ExitStatus() != 3 {
					t.Fatalf("exit status %d (%v), want 3", st.ws.ExitStatus(), st.err)
				}
			default:
				if tc.exits {
					t.Fatal("awaitExit returned without the leader's exit status")
				}
				r.mu.Lock()
				registered := r.leaders[pid] != nil
				r.mu.Unlock()
				if !registered {
					t.Fatal("a leader that lives on is no longer registered")
				}
			}
		})
	}
}

// TestReaperPeekOfLeaderBeingTaken: a pass that peeks at a leader whose
// status another goroutine is taking at that moment (the reader that saw
// its output end) waits for that instead of listing every child: with
// thousands of sessions a listing per such race cost O(sessions) per exit.
func TestReaperPeekOfLeaderBeingTaken(t *testing.T) {
	r := bareReaper()
	// Children that earlier tests' closed Reapers left are strangers to
	// this one: reap them first.
	for stray, ok := peekExited(); ok; stray, ok = peekExited() {
		var ws unix.WaitStatus
		_, _ = wait4(stray, &ws, 0, nil)
	}
	pid, err := syscall.ForkExec("/bin/sh", []string{"/bin/sh", "-c", "exit 5"}, &syscall.ProcAttr{Sys: &syscall.SysProcAttr{Setpgid: true}})
	if err != nil {
		t.Fatal(err)
	}
	awaitZombie(t, pid)
	// Another goroutine's take, between its claim and its wait4.
	r.mu.Lock()
	r.busy[pid] = true
	r.mu.Unlock()
	done := make(chan time.Duration, 1)
	go func() { next, _ := r.walkAll(); done <- next }()
	time.Sleep(2 * time.Millisecond)
	var ws unix.WaitStatus
	if got, err := wait4(pid, &ws, 0, nil); err != nil || got != pid {
		t.Fatalf("wait4: %d, %v", got, err)
	}
	r.mu.Lock()
	delete(r.busy, pid)
	r.mu.Unlock()
	if next := <-done; next != 0 && next != time.Millisecond {
		t.Fatalf("walkAll asked to look again in %v", next)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.slowPasses != 0 {
		t.Fatalf("%d slow passes (listings of every child) for a leader being taken", r.slowPasses)
	}
}

// TestReaperSignalLeader: a leader is signalled by pid only while it is
// registered with the channel of the session asking (a later leader that
// got a reaped one's pid is not that session's) and not being taken.
func TestReaperSignalLeader(t *testing.T) {
	r := newTestReaper(t)
	pid, ch := startLeader(t, r, "/bin/sleep", "60")
	r.mu.Lock()
	own := r.leaders[pid] // the channel its session registered (ch's other end)
	r.mu.Unlock()
	other := make(chan exitStatus, 1)
	if r.signalLeader(pid, other, unix.SIGTERM) {
		t.Fatal("signalled for a session whose leader it is not")
	}
	r.mu.Lock()
	delete(r.leaders, pid)
	r.busy[pid] = true // a take between its claim and its wait4
	r.mu.Unlock()
	if r.signalLeader(pid, own, unix.SIGTERM) {
		t.Fatal("signalled a leader whose status is being taken")
	}
	r.mu.Lock()
	delete(r.busy, pid)
	r.leaders[pid] = own
	r.mu.Unlock()
	if err := unix.Kill(pid, 0); err != nil {
		t.Fatalf("the leader did not survive the refused signals: %v", err)
	}
	if !r.signalLeader(pid, own, unix.SIGTERM) {
		t.Fatal("its own session could not signal the leader")
	}
	if st := awaitExit(t, ch, 3*time.Second, "signalled leader"); !st.ws.Signaled() || st.ws.Signal() != unix.SIGTERM {
		t.Fatalf("status %v, want killed by SIGTERM", st.ws)
	}
	if r.signalLeader(pid, own, unix.SIGTERM) {
		t.Fatal("signalled a collected leader's pid")
	}
}

// TestReaperSignalledLeaderCollectedWhilePassesPause: a leader its
// session signalled is collected by pid while full passes are put off,
// as in a kill of thousands of sessions (a peek per exit walks every
// child); its output may stay open (a child holds it), so no reader
// hints it.
func TestReaperSignalledLeaderCollectedWhilePassesPause(t *testing.T) {
	r := newTestReaper(t)
	r.nextWalk.Store(time.Now().Add(time.Hour).UnixNano())
	pid, ch := startLeader(t, r, "/bin/sleep", "60")
	r.mu.Lock()
	own := r.leaders[pid]
	r.mu.Unlock()
	// By the hint, which the pass of its SIGCHLD takes by pid: no pidfd
	// and no goroutine per signalled leader. (SIGCONT first: it lives
	// on, so that what the signal left can be looked at.)
	if !r.signalLeader(pid, own, unix.SIGCONT) {
		t.Fatal("its own session could not signal the leader")
	}
	r.mu.Lock()
	_, hinted := r.hinted[pid]
	awaited := r.awaited[pid]
	r.mu.Unlock()
	if !hinted || awaited {
		t.Fatalf("signalled leader: hinted %v, awaited %v; want hinted, not awaited", hinted, awaited)
	}
	if !r.signalLeader(pid, own, unix.SIGTERM) {
		t.Fatal("its own session could not signal the leader")
	}
	if st := awaitExit(t, ch, 3*time.Second, "signalled leader"); !st.ws.Signaled() || st.ws.Signal() != unix.SIGTERM {
		t.Fatalf("status %v, want killed by SIGTERM", st.ws)
	}
}

// TestReaperIdlePassesSpacedOut: a full pass that found only announced
// exits (hinted, or awaited by their readers) puts the next off longer
// than one that collected an exit nobody announced: a hundredth of the
// time within maxIdleWalkPause, against a tenth within maxWalkPause.
func TestReaperIdlePassesSpacedOut(t *testing.T) {
	r := bareReaper()
	pauseAfter := func(took time.Duration, useful bool) time.Duration {
		r.walked(time.Now().Add(-took), useful)
		return time.Duration(r.nextWalk.Load() - time.Now().UnixNano())
	}
	for _, c := range []struct {
		took   time.Duration
		useful bool
		want   time.Duration
	}{
		{50 * time.Microsecond, false, time.Duration(float64(50*time.Microsecond) * (1 - idleWalkShare) / idleWalkShare)},
		{50 * time.Microsecond, true, time.Duration(float64(50*time.Microsecond) * (1 - walkShare) / walkShare)},
		{time.Millisecond, false, maxIdleWalkPause}, // 10 000 children
		{time.Millisecond, true, time.Duration(float64(time.Millisecond) * (1 - walkShare) / walkShare)},
		{20 * time.Millisecond, true, maxWalkPause},
	} {
		// The pass's own measure includes the call: a slow machine
		// lengthens an uncapped pause, never a capped one.
		most := c.want + c.want/2
		if c.want == maxWalkPause || c.want == maxIdleWalkPause {
			most = c.want
		}
		if got := pauseAfter(c.took, c.useful); got < c.want-time.Millisecond || got > most {
			t.Errorf("after a pass of %v (useful %v) the next waits %v, want %v", c.took, c.useful, got, c.want)
		}
	}

	// walkAll tells the two apart.
	for stray, ok := peekExited(); ok; stray, ok = peekExited() {
		var ws unix.WaitStatus
		_, _ = wait4(stray, &ws, 0, nil)
	}
	for _, hint := range []bool{true, false} {
		pid, ch := startLeader(t, r, "/bin/sh", "-c", "exit 4")
		awaitZombie(t, pid)
		if hint {
			r.mu.Lock()
			r.hinted[pid] = time.Now()
			r.mu.Unlock()
			// collectHinted, which walkAll runs first, would take it:
			// the reader that holds the hint is taking it (awaited).
			r.mu.Lock()
			r.awaited[pid] = true
			r.mu.Unlock()
		}
		next, useful := r.walkAll()
		r.mu.Lock()
		delete(r.awaited, pid)
		r.mu.Unlock()
		if st := awaitExit(t, ch, time.Second, "leader"); st.ws.ExitStatus() != 4 {
			t.Fatalf("exit status %d, want 4", st.ws.ExitStatus())
		}
		if next != 0 || useful == hint {
			t.Fatalf("hinted %v: walkAll = %v, useful %v", hint, next, useful)
		}
	}
}

// bareReaper is a Reaper without its run loop: nothing takes SIGCHLD, so
// only what a test calls collects exits.
func bareReaper() *Reaper {
	return &Reaper{
		log:     slog.New(slog.DiscardHandler),
		kick:    make(chan struct{}, 1),
		leaders: map[int]chan<- exitStatus{},
		busy:    map[int]bool{},
		zombies: map[int]time.Time{},
		hinted:  map[int]time.Time{},
		awaited: map[int]bool{},
	}
}

// TestReaperIdlePassEndsEarly: a full pass that meets only exits whose
// waiters are collecting them stops after idleWalkTakes of them (each
// further peek walks every child, thousands in a burst of kills), and an
// exit nobody announced behind them is still found by a later pass; a
// pass that found such an exit goes on through the announced ones.
func TestReaperIdlePassEndsEarly(t *testing.T) {
	// A peek finds the children of each thread in the order they were
	// forked: one thread forks and peeks, so that the order is known.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r := bareReaper()
	for stray, ok := peekExited(); ok; stray, ok = peekExited() {
		var ws unix.WaitStatus
		_, _ = wait4(stray, &ws, 0, nil)
	}
	start := func(n int, announced bool) []<-chan exitStatus {
		var chs []<-chan exitStatus
		for range n {
			pid, ch := startLeader(t, r, "/bin/sh", "-c", "exit 3")
			awaitZombie(t, pid)
			if announced {
				r.mu.Lock()
				r.awaited[pid] = true
				r.mu.Unlock()
			}
			chs = append(chs, ch)
		}
		return chs
	}
	collected := func(chs []<-chan exitStatus) int {
		n := 0
		for _, ch := range chs {
			select {
			case st := <-ch:
				if st.ws.ExitStatus() != 3 {
					t.Fatalf("exit status %d, want 3", st.ws.ExitStatus())
				}
				n++
			default:
			}
		}
		return n
	}

	// Announced exits first, one nobody announced behind them.
	announced := start(2*idleWalkTakes+1, true)
	stranger := start(1, false)
	next, useful := r.walkAll()
	if got := collected(announced); got != idleWalkTakes || next == 0 || useful {
		t.Fatalf("first pass: took %d announced exits, next %v, useful %v; want %d, a retry, not useful", got, next, useful, idleWalkTakes)
	}
	taken := idleWalkTakes
	for pass := 2; ; pass++ {
		if pass > 5 {
			t.Fatal("the exit nobody announced was not found within 5 passes")
		}
		r.walkAll()
		taken += collected(announced)
		if collected(stranger) == 1 {
			break
		}
	}
	if taken != len(announced) {
		t.Fatalf("took %d announced exits in all, want %d", taken, len(announced))
	}

	// An exit nobody announced first: the pass is useful and goes on.
	stranger = start(1, false)
	announced = start(2*idleWalkTakes, true)
	next, useful = r.walkAll()
	if got := collected(stranger) + collected(announced); got != 1+2*idleWalkTakes || next != 0 || !useful {
		t.Fatalf("useful pass: took %d exits, next %v, useful %v; want %d, no retry, useful", got, next, useful, 1+2*idleWalkTakes)
	}
}
