package session

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/execmesh/execmesh/internal/cgroup"
	"github.com/execmesh/execmesh/internal/procfs"
)

// Reaper is the part of the session core that belongs to a whole process
// rather than to one Manager: the children of a process, its SIGCHLD, its
// child-subreaper attribute and its place in the cgroup hierarchy are
// process-wide. A daemon creates one Reaper and passes it to each of its
// Managers (Config.Reaper; `execmesh up` runs the gateway's and the local
// node agent's Managers side by side); a Manager given none makes its own
// and closes it with itself.
//
// The Reaper takes the exit statuses of session leaders. At every SIGCHLD
// it peeks at the first child that exited (waitid with WNOWAIT, which
// leaves it unreaped), collects it with wait4 when it is a leader some
// Manager registered, and repeats: one system call pair per exit, no
// thread and no descriptor per session. The kernel walks every child for
// such a peek, so with thousands of sessions a burst of exits would cost
// O(sessions) each: full passes are held to a tenth of the time (at most
// 10 ms apart, and none longer than that; a hundredth of the time after a
// pass that found only hinted exits), and the leaders that are known to
// be ending (their output reached its end, or their session signalled
// them: hintExit) are collected by pid, O(1) each. A child it
// did not register (an os/exec child of other code in the process, waited
// for by its owner) stops the peek; only then are the process's children
// listed, to collect the leaders behind it. When the process is a child
// subreaper (process-group containment, see Config.Containment), orphans
// re-parented to it are reaped as well, once they have been zombies for
// orphanGrace, which leaves other code in the process time to take its own
// children's statuses.
//
// The Reaper also holds the process's cgroup v2 subtree (found, created or
// delegated on first use, see NewManager) and one inotify watcher for the
// cgroup.events of every session group.
type Reaper struct {
	log *slog.Logger

	sigchld chan os.Signal
	kick    chan struct{}
	stop    chan struct{}
	done    chan struct{}

	// spawning counts starts whose leader is not registered yet: an
	// exited child nobody registered is then most likely one of them,
	// and the registration's wake-up collects it without a slow pass.
	spawning atomic.Int32
	deferred int // slow passes put off for spawning, in a row (run's goroutine only)
	// awaitSpawn is set when a pass found an exited child nobody
	// registered while starts were in progress: registrations wake the
	// Reaper then, and only then (a wake-up at every start would cost a
	// pass over every child per start).
	awaitSpawn atomic.Bool

	mu      sync.Mutex
	leaders map[int]chan<- exitStatus
	// busy are leaders whose status a collect is taking now (the reader
	// that saw the output end, or a pass): a peek that finds one of them
	// has found no stranger, and must not list every child for it.
	busy    map[int]bool
	zombies map[int]time.Time // non-leader zombie children: when first seen
	closed  bool
	// hinted are leaders whose output reached its end or that their
	// session signalled: they have exited or are about to, or live on
	// (a closed output, a signal caught). Each pass
	// collects them by pid, O(1) each; a hint goes when its leader is
	// collected, or with a full pass hintAge after it.
	hinted map[int]time.Time
	// awaited are hinted leaders whose reader waits for the exit on a
	// pidfd (awaitExit) and collects it itself: collectHinted leaves
	// them to it, instead of a wait4 for each at every pass.
	awaited map[int]bool
	// walks counts the full passes begun (the peek over every child,
	// under mu); nextWalk is the earliest time for the next (unix ns).
	walks    uint64
	nextWalk atomic.Int64
	// slowPasses counts the passes that listed the children (tests).
	slowPasses uint64

	subreaper bool // a Manager of this Reaper made the process a subreaper

	cgOnce  sync.Once
	cg      *cgroupBase // nil when no writable cgroup v2 subtree exists
	cgErr   error       // why, when cg is nil
	watcher *cgroup.Watcher
}

// ReaperConfig configures a Reaper.
type ReaperConfig struct {
	// Logger receives the Reaper's messages; nil discards them.
	Logger *slog.Logger
}

// orphanGrace is how long a zombie child that no Manager registered is left
// to other code in the process (an os/exec Cmd's Wait) before a subreaper
// reaps it as an orphan.
const orphanGrace = 2 * time.Second

// NewReaper starts the Reaper of this process. Close it after every
// Manager using it was closed.
func NewReaper(cfg ReaperConfig) *Reaper {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Reaper{
		log:     log,
		sigchld: make(chan os.Signal, 1),
		kick:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
		leaders: map[int]chan<- exitStatus{},
		busy:    map[int]bool{},
		zombies: map[int]time.Time{},
		hinted:  map[int]time.Time{},
		awaited: map[int]bool{},
	}
	signal.Notify(r.sigchld, syscall.SIGCHLD)
	go r.run()
	return r
}

// exitStatus is how a session leader ended.
type exitStatus struct {
	ws  unix.WaitStatus
	ru  unix.Rusage
	err error // the status could not be read; ws is meaningless
}

// spawn announces a start; the returned function registers its leader
// (pid > 0), handing pid's exit status to ch (buffered, one send) once it
// is taken, or withdraws the announcement (pid 0, the start failed).
// Registration must follow the start at once: a leader that exited
// unregistered is left alone only for orphanGrace.
func (r *Reaper) spawn() func(pid int, ch chan<- exitStatus) {
	r.spawning.Add(1)
	var once sync.Once
	return func(pid int, ch chan<- exitStatus) {
		once.Do(func() {
			if pid > 0 {
				r.mu.Lock()
				r.leaders[pid] = ch
				r.mu.Unlock()
			}
			r.spawning.Add(-1)
			if r.awaitSpawn.Load() {
				if pid > 0 {
					r.hintExit(pid)
				}
				r.wake()
			}
		})
	}
}

// hintExit tells the Reaper that leader pid has probably exited or is
// about to: its output reached its end (or it was registered after its
// exit). The next passes collect it by pid, so that its exit costs O(1)
// however many children the process has, while the full pass over every
// child (the kernel walks them all for a waitid P_ALL peek) is held to a
// small share of the time. Unknown pids are ignored.
func (r *Reaper) hintExit(pid int) {
	r.mu.Lock()
	if r.leaders[pid] == nil {
		r.mu.Unlock()
		return
	}
	r.hinted[pid] = time.Now()
	r.mu.Unlock()
	if time.Now().UnixNano() < r.nextWalk.Load() {
		// Full passes pause, and its SIGCHLD may have come already.
		r.wake()
	}
}

// awaitExit is hintExit for the reader that saw leader pid's output end:
// the exit follows within moments (the kernel closes a process's files
// before it turns it into a zombie), so the reader waits for it on a pidfd
// in the runtime's poller and collects it itself. That takes the exit
// without the detour through SIGCHLD and os/signal, whose thread has to be
// woken first (tens of µs on a quiet machine, the largest wait on a short
// command's path). A leader that lives on after closing its output is
// left to the hint and the Reaper's passes after hintAge, as is any leader
// when no pidfd can be had.
func (r *Reaper) awaitExit(pid int) {
	r.hintExit(pid)
	if pid <= 0 || r.collect(pid) {
		return
	}
	r.awaitPidfd(pid)
}

// awaitPidfd waits up to hintAge for leader pid's exit on a pidfd and
// collects it. Meanwhile pid is awaited: collectHinted leaves it to this
// wait, and a full pass that collects it found nothing for itself.
func (r *Reaper) awaitPidfd(pid int) {
	r.mu.Lock()
	if r.awaited[pid] {
		r.mu.Unlock()
		return // another goroutine waits for it already
	}
	if r.leaders[pid] == nil {
		// Collected already, or being collected by a pass: its pid may
		// be another process's soon.
		r.mu.Unlock()
		return
	}
	r.awaited[pid] = true
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.awaited, pid)
		r.mu.Unlock()
	}()
	// The pid is a leader not yet waited for. Should a pass take it
	// before the pidfd pins it, and its pid be reused, the pidfd names
	// another process: this wait ends at that one's exit or the deadline,
	// and collect finds no exit of its own to take.
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return
	}
	f := os.NewFile(uintptr(fd), "pidfd") // non-blocking, so in the poller
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil || f.SetReadDeadline(time.Now().Add(hintAge)) != nil {
		return
	}
	waited := false
	// A pidfd turns readable when its process exits; the first call only
	// sends Read to the poller.
	if rc.Read(func(uintptr) bool { w := waited; waited = true; return w }) == nil {
		r.collect(pid)
	}
}

// hintAge is how long a hint is kept for a leader that has not exited
// (its output may have ended a moment before its exit; or it closed its
// output and lives on, and only a full pass finds its exit).
const hintAge = time.Second

func (r *Reaper) wake() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

func (r *Reaper) run() {
	defer close(r.done)
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	for {
		select {
		case <-r.stop:
			retry.Stop()
			return
		case <-r.sigchld:
		case <-r.kick:
		case <-retry.C:
		}
		if again := r.reapAll(); again > 0 {
			retry.Reset(again)
		}
	}
}

// reapAll collects every exited leader: the hinted ones by pid, then,
// unless the last full pass was too recent, every other; it returns when
// to look again (a full pass put off, orphans still within their grace, a
// slow pass put off; 0: no need).
func (r *Reaper) reapAll() time.Duration {
	r.collectHinted()
	now := time.Now()
	if wait := time.Duration(r.nextWalk.Load() - now.UnixNano()); wait > 0 {
		return wait
	}
	r.mu.Lock()
	r.walks++
	r.mu.Unlock()
	next, useful := r.walkAll()
	r.walked(now, useful)
	return next
}

// walkShare bounds the time full passes take, as a share of all time:
// the next may begin once (1-walkShare)/walkShare times as long as the
// last one took has passed, and at most maxWalkPause after it; a pass
// stops after maxWalkPause (exits keep coming in a burst, and each peek
// walks the children again). A pass over a few children takes
// microseconds, so this matters only with thousands, where hinted exits
// are collected meanwhile. A pass that found nothing for itself (every
// exit it saw was announced, as in a burst of kills, where passes by pid
// and the leaders' readers collect them) holds the next to
// idleWalkShare, within maxIdleWalkPause: with 10 000 children a pass
// that finds nothing walks them all in a third of a millisecond, and
// after it an exit nobody announced waits at most that long.
const (
	walkShare        = 0.1
	idleWalkShare    = 0.01
	maxWalkPause     = 10 * time.Millisecond
	maxIdleWalkPause = 50 * time.Millisecond
)

// idleWalkTakes ends a full pass that has found nothing but announced
// exits (hinted: a signalled leader, or one whose output ended; or
// awaited by its reader on a pidfd): after that many, the pass stops.
// In a burst of kills every peek finds such an exit near the front, and
// each walks the children up to it (a third of a millisecond with
// 10 000 of them when it walks them all): a pass that went on for its
// maxWalkPause spent half of a core on exits that are collected by pid
// in microseconds each. An exit nobody announced behind them is found by
// the next pass, after the pause of an idle one, once the front is
// cleared.
const idleWalkTakes = 4

// walked records a full pass that began at start; useful tells whether
// it collected an exit no hint announced.
func (r *Reaper) walked(start time.Time, useful bool) {
	end := time.Now()
	share, most := walkShare, maxWalkPause
	if !useful {
		share, most = idleWalkShare, maxIdleWalkPause
	}
	pause := min(time.Duration(float64(end.Sub(start))*(1-share)/share), most)
	r.nextWalk.Store(end.Add(pause).UnixNano())
	// Hints older than hintAge before this pass are settled: had their
	// leader exited, the pass would have collected it.
	r.mu.Lock()
	for pid, at := range r.hinted {
		if start.Sub(at) > hintAge {
			delete(r.hinted, pid)
		}
	}
	r.mu.Unlock()
}

// collectHinted collects the hinted leaders that exited.
func (r *Reaper) collectHinted() {
	r.mu.Lock()
	if len(r.hinted) == 0 {
		r.mu.Unlock()
		return
	}
	pids := make([]int, 0, len(r.hinted))
	for pid := range r.hinted {
		if r.leaders[pid] == nil {
			delete(r.hinted, pid)
			continue
		}
		if !r.awaited[pid] {
			pids = append(pids, pid)
		}
	}
	r.mu.Unlock()
	for _, pid := range pids {
		r.collect(pid)
	}
}

// walkAll is the full pass: it peeks at exited children one at a time.
// It reports when to look again (see reapAll) and whether it collected
// an exit no hint announced, or listed the children (useful).
func (r *Reaper) walkAll() (next time.Duration, useful bool) {
	r.awaitSpawn.Store(false)
	start := time.Now()
	recheck := 0   // a child that take found no leader, peeked at again
	announced := 0 // exits taken that a hint or a waiter announced
	for {
		if time.Since(start) > maxWalkPause {
			return time.Millisecond, useful // a burst: go on after a pause (walked)
		}
		r.collectHinted()
		pid, ok := peekExited()
		if !ok {
			r.deferred = 0
			return 0, useful
		}
		r.mu.Lock()
		_, hinted := r.hinted[pid]
		awaited := r.awaited[pid]
		r.mu.Unlock()
		res := r.take(pid)
		if res == taken && !hinted && !awaited {
			useful = true
		} else if res == taken || res == taking {
			if announced++; !useful && announced >= idleWalkTakes {
				return time.Millisecond, false // the rest after a pause (walked)
			}
		}
		switch res {
		case taken:
			continue
		case taking:
			// Another goroutine is reaping it this moment: peek again
			// once it has (not a stranger, no listing of the children).
			runtime.Gosched()
			continue
		case notLeader:
			if pid != recheck {
				// Another goroutine may have taken it between the
				// peek and take: a stranger is still there at the
				// next peek.
				recheck = pid
				continue
			}
		}
		// A start that is not registered yet (a quick command can end
		// first) wakes the Reaper when it is: wait for that a little
		// before listing the children. A registration that did not see
		// awaitSpawn set came before it, so the leader is found now.
		r.awaitSpawn.Store(true)
		if res := r.take(pid); res == taken || res == taking {
			useful = useful || res == taken
			continue
		}
		if r.spawning.Load() > 0 && r.deferred < maxDeferred {
			r.deferred++
			return deferWait, true
		}
		r.deferred = 0
		return r.slowPass(), true
	}
}

// A slow pass is put off at most maxDeferred times in a row, deferWait
// each, while starts are being registered.
const (
	maxDeferred = 3
	deferWait   = 5 * time.Millisecond
)

// collect takes the exit status of pid if it is a registered leader.
func (r *Reaper) collect(pid int) bool { return r.take(pid) == taken }

// What take did with a pid.
type takeResult int

const (
	notLeader takeResult = iota // no registered leader (or its status was taken)
	running                     // a leader that has not exited
	taken                       // its status was taken and sent
	taking                      // another goroutine is taking its status now
)

// take takes the exit status of pid if it is a registered leader that
// exited.
func (r *Reaper) take(pid int) takeResult {
	r.mu.Lock()
	ch := r.leaders[pid]
	if ch == nil {
		busy := r.busy[pid]
		r.mu.Unlock()
		if busy {
			return taking
		}
		return notLeader
	}
	delete(r.leaders, pid)
	r.busy[pid] = true
	r.mu.Unlock()
	var st exitStatus
	got, err := wait4(pid, &st.ws, unix.WNOHANG, &st.ru)
	if err == nil && got != pid {
		// Not exited (yet: a hinted leader); keep waiting.
		r.mu.Lock()
		r.leaders[pid] = ch
		delete(r.busy, pid)
		r.mu.Unlock()
		return running
	}
	if err != nil {
		st.err = fmt.Errorf("wait for pid %d: %w", pid, err)
	}
	r.mu.Lock()
	delete(r.hinted, pid)
	delete(r.busy, pid)
	r.mu.Unlock()
	ch <- st
	return taken
}

// signalLeader sends each of sigs to pid if it is the leader registered
// with ch and its status is not being taken: the Reaper's lock keeps it
// unreaped meanwhile, so its pid names it and no other process (kill(2)
// suffices, no pidfd). It reports whether it did; an exited leader not
// yet reaped takes the signals as a zombie, harmlessly. (ch tells this
// leader from a later one that got the pid of a reaped one.) The leader
// is about to exit: it is hinted, so that the pass its SIGCHLD starts
// collects it by pid, where the peek of a full pass costs O(children) (a
// kill of thousands of sessions would pay that per exit; a leader whose
// child holds its output open has no reader to collect it). A goroutine
// waiting on a pidfd (awaitExit) would take the exit sooner, but a kill
// needs no microseconds, and the pidfd, its registration with the poller
// and the goroutine were a tenth of the CPU of a kill of thousands.
func (r *Reaper) signalLeader(pid int, ch chan<- exitStatus, sigs ...unix.Signal) bool {
	r.mu.Lock()
	if cur := r.leaders[pid]; cur == nil || cur != ch {
		r.mu.Unlock()
		return false
	}
	for _, sig := range sigs {
		_ = unix.Kill(pid, sig)
	}
	r.hinted[pid] = time.Now()
	r.mu.Unlock()
	return true
}

// slowPass runs when the first exited child is not a registered leader:
// it lists the children and collects the leaders among them, and, in a
// subreaper, reaps zombies nobody registered once their grace passed.
func (r *Reaper) slowPass() time.Duration {
	r.mu.Lock()
	r.slowPasses++
	r.mu.Unlock()
	subreaper := isSubreaper()
	now := time.Now()
	var next time.Duration
	seen := map[int]bool{}
	for _, pid := range procfs.Children() {
		r.mu.Lock()
		leader := r.leaders[pid] != nil
		r.mu.Unlock()
		if leader {
			r.collect(pid)
			continue
		}
		if !subreaper || !isZombie(pid) {
			continue
		}
		seen[pid] = true
		r.mu.Lock()
		first, ok := r.zombies[pid]
		if !ok {
			r.zombies[pid], first = now, now
		}
		r.mu.Unlock()
		if left := orphanGrace - now.Sub(first); left > 0 {
			if next == 0 || left < next {
				next = left
			}
			continue
		}
		var ws unix.WaitStatus
		if got, err := wait4(pid, &ws, unix.WNOHANG, nil); err == nil && got == pid {
			r.log.Debug("reaped orphan", "pid", pid)
		}
	}
	r.mu.Lock()
	for pid := range r.zombies {
		if !seen[pid] {
			delete(r.zombies, pid)
		}
	}
	r.mu.Unlock()
	return next
}

// siginfoChild is the start of the kernel's siginfo_t for SIGCHLD.
type siginfoChild struct {
	Signo, Errno, Code int32
	_                  [unsafe.Sizeof(uintptr(0)) - 4]byte // union alignment
	Pid                int32
	_                  [112 - (unsafe.Sizeof(uintptr(0)) - 4)]byte // to the kernel's 128 bytes
}

// peekExited returns a child that exited and is not yet reaped, leaving it
// so (waitid P_ALL with WNOWAIT).
func peekExited() (int, bool) {
	for {
		var info siginfoChild
		_, _, e := unix.Syscall6(unix.SYS_WAITID, unix.P_ALL, 0, uintptr(unsafe.Pointer(&info)),
			unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, 0, 0)
		if e == unix.EINTR {
			continue
		}
		if e != 0 || info.Pid <= 0 {
			return 0, false // ECHILD: no children; Pid 0: none exited
		}
		return int(info.Pid), true
	}
}

func wait4(pid int, ws *unix.WaitStatus, options int, ru *unix.Rusage) (int, error) {
	for {
		got, err := unix.Wait4(pid, ws, options, ru)
		if err != unix.EINTR {
			return got, err
		}
	}
}

func isSubreaper() bool {
	var v int32
	if err := unix.Prctl(unix.PR_GET_CHILD_SUBREAPER, uintptr(unsafe.Pointer(&v)), 0, 0, 0); err != nil {
		return false
	}
	return v != 0
}

// becomeSubreaper makes the process a child subreaper, for process-group
// containment: orphans of a command's tree stay below the process instead
// of moving to init. The attribute is process-wide and never reverted.
func (r *Reaper) becomeSubreaper() error {
	r.mu.Lock()
	r.subreaper = true
	r.mu.Unlock()
	if isSubreaper() {
		return nil
	}
	return unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
}

func isZombie(pid int) bool {
	var buf [512]byte
	p, ok := readProcStat(pid, buf[:])
	return ok && p.state == 'Z'
}

// Close stops the Reaper. When one of its Managers made the process a
// subreaper, processes that were re-parented to it and still run in its
// own cgroup are ended: SIGTERM, then SIGKILL after a second or as soon as
// ctx ends; in a subreaper the orphans that ended are reaped before Close
// returns (waiting out their grace, within ctx). The process's cgroup
// subtree is removed if the Reaper created it. Managers using the Reaper
// must be closed first.
func (r *Reaper) Close(ctx context.Context) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	r.mu.Unlock()
	var errs []error
	if r.subreaper {
		errs = append(errs, endAdoptees(ctx, r))
	}
	close(r.stop)
	<-r.done
	signal.Stop(r.sigchld)
	// In a subreaper, orphans that ended (those just killed included)
	// are still to be reaped; their grace is waited out, within ctx.
	if isSubreaper() {
	final:
		for {
			next := r.reapAll()
			if next == 0 {
				break
			}
			select {
			case <-time.After(next):
			case <-ctx.Done():
				break final
			}
		}
	}
	if r.watcher != nil {
		errs = append(errs, r.watcher.Close())
	}
	if r.cg != nil {
		errs = append(errs, r.cg.close())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("session: reaper: %w", err)
	}
	return nil
}

// endAdoptees ends the orphans this process adopted as subreaper that are
// still alive, with everything below them. An adoptee is a child that is
// no registered leader, lies in the process's own cgroup (those in other
// groups belong to cgroup-contained sessions) and is not in the process's
// own process group: children that other code in the process started
// with os/exec share that group, while every session tree runs in groups
// of its own.
func endAdoptees(ctx context.Context, r *Reaper) error {
	self := ""
	if d, err := cgroup.Self(); err == nil {
		self = d.Rel
	}
	snap, err := readProcSnapshot(os.Getpid())
	if err != nil {
		return err
	}
	selfPGID := syscall.Getpgrp()
	r.mu.Lock()
	set := map[int]uint64{}
	for _, pid := range snap.children[os.Getpid()] {
		p := snap.procs[pid]
		if r.leaders[pid] != nil || p.state == 'Z' || p.pgrp == selfPGID || (self != "" && !inCgroup(pid, self)) {
			continue
		}
		set[pid] = p.start
		for _, d := range snap.below(pid) {
			set[d] = snap.procs[d].start
		}
	}
	r.mu.Unlock()
	if len(set) == 0 {
		return nil
	}
	r.log.Debug("ending adopted processes", "count", len(set))
	hurry := make(chan struct{})
	stop := context.AfterFunc(ctx, func() { close(hurry) })
	defer stop()
	errs := []error{signalSet(set, unix.SIGTERM), signalSet(set, unix.SIGCONT)}
	waitGone(set, time.Now().Add(time.Second), hurry)
	if left := aliveProcs(set); len(left) > 0 {
		errs = append(errs, signalSet(left, unix.SIGKILL))
		waitGone(left, time.Now().Add(time.Second), nil)
	}
	r.wake() // their zombies
	return errors.Join(errs...)
}

// inCgroup reports whether pid's cgroup v2 path is rel.
func inCgroup(pid int, rel string) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return false
	}
	got, err := cgroup.ParseProcCgroup(b)
	return err == nil && got == rel
}

// randomTag returns 8 hex digits.
func randomTag() string {
	var tag [4]byte
	_, _ = rand.Read(tag[:])
	return hex.EncodeToString(tag[:])
}
