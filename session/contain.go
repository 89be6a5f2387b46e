package session

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/execmesh/execmesh/internal/cgroup"
	"github.com/execmesh/execmesh/protocol"
)

// Containment: how a Manager holds each command's process tree, so that
// kill, timeout, remove and Close end all of it and nothing else.
//
// With cgroup containment every command is cloned straight into a cgroup v2
// group of its own (clone3 CLONE_INTO_CGROUP: no moment in which a child
// runs outside it), below the Manager's group in the process's subtree. A
// process cannot leave its group without write access to the hierarchy,
// so the group is the tree: SIGTERM (and SIGCONT) go to every member of
// cgroup.procs, "the tree is gone" is populated 0 in cgroup.events (one
// inotify watch per group on the Reaper's single descriptor), and after
// the grace cgroup.kill ends whatever is left, atomically with respect to
// forks. cpu.stat gives the tree's CPU time; memory.peak, pids.peak and
// the limits need the memory, pids and cpu controllers to be delegated.
//
// Where no writable cgroup v2 subtree exists (or Config.Containment says
// process-group), the process becomes a child subreaper, so that orphans
// of a tree stay below it, and a tree is every process reached from the
// leader, its process group and (PTY sessions) its terminal session by
// parent links. Each pass that signals a tree first stops it: SIGSTOP to
// every member found, then /proc is read again, until a read finds no new
// member; a stopped process can neither fork nor exit, so parent links
// hold while the tree is read, and processes that left group and session
// with setsid are still reached through their parents. Every pass reads
// /proc afresh (concurrent passes share a read that began after they
// asked); the SIGKILL pass never reuses the SIGTERM pass's read. What this
// cannot find is a process whose every ancestor up to the leader ended
// before the kill (a double-forked daemon): it is an orphan of the
// process, ended with the Reaper (Reaper.Close).

// Containment modes (Config.Containment and Containment.Mode).
const (
	// ContainmentAuto uses cgroups where a writable cgroup v2 subtree
	// exists and process groups elsewhere. "" means the same.
	ContainmentAuto = "auto"
	// ContainmentCgroup requires cgroups: NewManager fails without them.
	ContainmentCgroup = "cgroup"
	// ContainmentProcessGroup forces the process-group fallback.
	ContainmentProcessGroup = "process-group"
)

// Containment describes how a Manager holds process trees
// (Manager.Containment).
type Containment struct {
	// Mode is ContainmentCgroup or ContainmentProcessGroup.
	Mode string `json:"mode"`
	// Cgroup is the Manager's cgroup directory; each session's group is
	// a child of it.
	Cgroup string `json:"cgroup,omitempty"`
	// Controllers are the cgroup controllers enabled for session groups
	// (of cpu, memory, pids).
	Controllers []string `json:"controllers,omitempty"`
	// Reason says why cgroups are not used, in process-group mode.
	Reason string `json:"reason,omitempty"`
}

// limitControllers are the controllers the session core enables when its
// subtree offers them: cpu for cpu.max, memory for memory.max and
// memory.peak, pids for pids.max and pids.peak.
var limitControllers = []string{"cpu", "memory", "pids"}

// cgroupBase is the process's own cgroup subtree (see discoverCgroups).
type cgroupBase struct {
	dir         cgroup.Dir
	created     bool     // made by this process; removed by Reaper.Close
	controllers []string // enabled for the groups below dir
}

// cgroups returns the process's cgroup subtree, set up on first use.
func (r *Reaper) cgroups() (*cgroupBase, error) {
	r.cgOnce.Do(func() {
		r.cg, r.cgErr = discoverCgroups(r.log)
	})
	return r.cg, r.cgErr
}

// discoverCgroups finds the cgroup v2 hierarchy (mountinfo) and the
// process's group in it (/proc/self/cgroup). A group systemd delegated to
// this service (Delegate=yes; marked with the trusted.delegate or
// user.delegate attribute, or, for a service of an unprivileged user,
// owned by that user) becomes the subtree itself: the process moves
// into a leaf "daemon" below it, so that it holds no processes and the
// controllers can be enabled for the sessions beside that leaf. Otherwise
// the process creates a group of its own below its cgroup,
// execmesh-<pid>-<random>, when it may, and uses the controllers the
// parent already offers; several daemons and test processes on one host
// never collide.
func discoverCgroups(log *slog.Logger) (*cgroupBase, error) {
	self, err := cgroup.Self()
	if err != nil {
		return nil, err
	}
	b := &cgroupBase{dir: self}
	uid := os.Geteuid()
	if self.Rel != "/" && (self.Delegated() || (uid != 0 && self.OwnedBy(uid))) {
		leaf := self.Child("daemon")
		if err := leaf.Create(); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("delegated cgroup %s: create the daemon's leaf: %w", self.Path, err)
		}
		if err := leaf.MoveSelf(); err != nil {
			return nil, fmt.Errorf("delegated cgroup %s: move into %s: %w", self.Path, leaf.Path, err)
		}
		log.Debug("moved into the daemon leaf of the delegated cgroup", "cgroup", leaf.Path)
	} else {
		removeStaleCgroups(self, log)
		b.dir = self.Child("execmesh-" + strconv.Itoa(os.Getpid()) + "-" + randomTag())
		if err := b.dir.Create(); err != nil {
			return nil, fmt.Errorf("cannot create a cgroup below %s: %w", self.Path, errors.Unwrap(err))
		}
		b.created = true
	}
	on, err := b.dir.EnableControllers(limitControllers...)
	if err != nil {
		log.Warn("cgroup controllers not enabled for sessions", "cgroup", b.dir.Path, "err", err)
	}
	b.controllers = on
	return b, nil
}

// removeStaleCgroups removes the empty groups that execmesh processes
// which no longer run (killed with SIGKILL, say) left below parent:
// execmesh-<pid>-<tag> whose pid is gone. Groups that still hold
// processes are left alone: their daemon's next run on its state dir ends
// them (records.go).
func removeStaleCgroups(parent cgroup.Dir, log *slog.Logger) {
	ents, err := os.ReadDir(parent.Path)
	if err != nil {
		return
	}
	for _, e := range ents {
		f := strings.Split(e.Name(), "-")
		if !e.IsDir() || len(f) != 3 || f[0] != "execmesh" {
			continue
		}
		pid, err := strconv.Atoi(f[1])
		if err != nil || pid <= 0 {
			continue
		}
		if _, err := os.Stat("/proc/" + f[1]); err == nil {
			continue // alive, or a reused pid: left for later
		}
		d := parent.Child(e.Name())
		if p, err := d.Populated(); err != nil || p {
			continue
		}
		_ = d.RemoveSubtree()
		log.Debug("removed the empty cgroups of an execmesh process that is gone", "cgroup", d.Path)
	}
}

// close removes the subtree if this process created it.
func (b *cgroupBase) close() error {
	if !b.created {
		return nil
	}
	return b.dir.Remove()
}

// watch calls fn after every change of d's cgroup.events, through the
// Reaper's one inotify watcher (started on first use). ok is false when
// inotify is unavailable: the caller then polls.
func (r *Reaper) watch(d cgroup.Dir, fn func()) (stop func(), ok bool) {
	r.mu.Lock()
	if r.watcher == nil && !r.closed {
		w, err := cgroup.NewWatcher()
		if err != nil {
			r.mu.Unlock()
			r.log.Warn("no inotify for cgroup events; polling them", "err", err)
			return func() {}, false
		}
		r.watcher = w
	}
	w := r.watcher
	r.mu.Unlock()
	if w == nil {
		return func() {}, false
	}
	stop, err := w.Watch(d, fn)
	if err != nil {
		return func() {}, false
	}
	return stop, true
}

// cgroupManager is a Manager's group: one child group per session.
//
// Creating a group and removing it cost ~0.1 ms of kernel time per
// session (mkdir and rmdir in cgroupfs, and the first fork into a new
// group), so the empty groups of finished sessions are kept as spares,
// and the next session is cloned into one of those. That is done only
// where it changes nothing a session sees: without the memory and pids
// controllers, whose memory.peak and pids.peak cannot be reset for the
// next session, and with the cpu.max a session set put back. A spare's
// cpu.stat is remembered, and what a session reports is the difference.
// Up to maxSpareGroups are kept for good; in a burst of exits (a kill of
// thousands) every empty group is, and those beyond maxSpareGroups are
// removed once no group was put back or taken for spareTrimIdle: the
// rmdirs wait until the burst is over instead of slowing it down.
type cgroupManager struct {
	dir         cgroup.Dir
	controllers []string

	mu      sync.Mutex
	spares  []spareGroup
	lastUse time.Time   // the last put or take
	trim    *time.Timer // armed while more than maxSpareGroups are kept
	closed  bool
}

// spareGroup is an empty session group kept for reuse.
type spareGroup struct {
	dir cgroup.Dir
	// stop ends the inotify watch of the session that had it (a kill
	// sets one), when the group is taken or removed: not in the burst.
	stop func()
	// files are its control files, kept open (a foreground session's,
	// for the first maxSpareGroups spares); nil when not.
	files *cgroup.Files
	// measured says cpuUser and cpuSys are its cpu.stat when it was put
	// back, empty, and that it had no groups below it then: nothing runs
	// in it until it is taken, so the next session reports what it adds
	// to them, and taking it costs no system call. A foreground
	// session's group (files kept) is measured when it is put back, off
	// the next start's path; a burst of background sessions' are looked
	// at only if taken (most are trimmed unused).
	measured        bool
	cpuUser, cpuSys uint64
}

const (
	// maxSpareGroups bounds the empty groups a Manager keeps for reuse
	// when it is idle.
	maxSpareGroups = 16
	// maxBurstSpares bounds them in a burst.
	maxBurstSpares = 1 << 16
	// spareTrimIdle is how long no group is put back or taken before
	// the spares beyond maxSpareGroups are removed.
	spareTrimIdle = 200 * time.Millisecond
)

// reusable reports whether finished sessions' groups may be reused.
func (c *cgroupManager) reusable() bool { return c.cpuOnly() }

// cpuOnly reports whether a session's usage is CPU times only: neither
// the memory nor the pids controller (with their peaks) is enabled.
func (c *cgroupManager) cpuOnly() bool {
	return !slices.Contains(c.controllers, "memory") && !slices.Contains(c.controllers, "pids")
}

// takeSpare returns a spare group, if there is one; its cpuUser and
// cpuSys are what the next session's usage is measured from. A spare not
// measured when it was put back is measured now, and removed instead
// when it has groups below it (made by the command that had it).
func (c *cgroupManager) takeSpare() (spareGroup, bool) {
	for {
		c.mu.Lock()
		k := len(c.spares)
		if k == 0 {
			c.mu.Unlock()
			return spareGroup{}, false
		}
		g := c.spares[k-1]
		c.spares = c.spares[:k-1]
		c.lastUse = time.Now()
		c.mu.Unlock()
		if g.stop != nil {
			g.stop()
			g.stop = nil
		}
		if g.measured || g.measure() {
			return g, true
		}
		if g.files != nil {
			g.files.Close()
		}
		_ = g.dir.RemoveSubtree()
	}
}

// measure reads the empty group's cpu.stat, unless groups exist below it;
// it reports whether the group may be passed on.
func (g *spareGroup) measure() bool {
	if g.dir.HasChildren() {
		return false
	}
	var err error
	if g.files != nil {
		g.cpuUser, g.cpuSys, err = g.files.CPUStat()
	} else {
		g.cpuUser, g.cpuSys, err = g.dir.CPUStat()
	}
	g.measured = err == nil
	return g.measured
}

// putSpare keeps an empty group for reuse; false when enough are kept.
func (c *cgroupManager) putSpare(g spareGroup) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || len(c.spares) >= maxBurstSpares {
		return false
	}
	if len(c.spares) >= maxSpareGroups && g.files != nil {
		// Beyond the spares kept for good, a burst's: no descriptors.
		g.files.Close()
		g.files = nil
	}
	c.spares = append(c.spares, g)
	c.lastUse = time.Now()
	if len(c.spares) > maxSpareGroups && c.trim == nil {
		c.trim = time.AfterFunc(spareTrimIdle, c.trimSpares)
	}
	return true
}

// trimSpares removes the spares beyond maxSpareGroups, the oldest first,
// once no group was put back or taken for spareTrimIdle.
func (c *cgroupManager) trimSpares() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	if idle := time.Since(c.lastUse); idle < spareTrimIdle {
		c.trim.Reset(spareTrimIdle - idle)
		c.mu.Unlock()
		return
	}
	c.trim = nil
	var extra []spareGroup
	if k := len(c.spares) - maxSpareGroups; k > 0 {
		extra = slices.Clone(c.spares[:k])
		c.spares = slices.Clone(c.spares[k:])
	}
	c.mu.Unlock()
	for _, g := range extra {
		g.remove()
	}
}

// remove ends the group's watch and removes it (with the groups a
// command made below it). A group that is not empty any more (a process
// of the same user moved itself in) is left to the subtree's removal at
// Close, which kills what it holds.
func (g spareGroup) remove() {
	if g.stop != nil {
		g.stop()
	}
	if g.files != nil {
		g.files.Close()
	}
	if g.dir.Remove() != nil && g.dir.HasChildren() {
		_ = g.dir.RemoveSubtree()
	}
}

// close stops the trimming and the spares' watches; the Manager's
// subtree, spares included, is removed by its Close.
func (c *cgroupManager) close() {
	c.mu.Lock()
	c.closed = true
	if c.trim != nil {
		c.trim.Stop()
		c.trim = nil
	}
	spares := c.spares
	c.spares = nil
	c.mu.Unlock()
	for _, g := range spares {
		if g.stop != nil {
			g.stop()
		}
		if g.files != nil {
			g.files.Close()
		}
	}
}

// setupContainment decides the Manager's containment (Config.Containment).
func (m *Manager) setupContainment() error {
	mode := m.cfg.Containment
	switch mode {
	case "", ContainmentAuto, ContainmentCgroup, ContainmentProcessGroup:
	default:
		return fmt.Errorf("session: containment %q: want %s, %s or %s", mode, ContainmentAuto, ContainmentCgroup, ContainmentProcessGroup)
	}
	reason := "forced by configuration"
	if mode != ContainmentProcessGroup {
		cg, err := m.setupCgroups()
		if err == nil {
			m.cg = cg
			m.contain = Containment{Mode: ContainmentCgroup, Cgroup: cg.dir.Path, Controllers: cg.controllers}
			return nil
		}
		if mode == ContainmentCgroup {
			return fmt.Errorf("session: containment cgroup: %w", err)
		}
		reason = "no writable cgroup v2 subtree: " + err.Error()
	}
	if err := m.reaper.becomeSubreaper(); err != nil {
		m.log.Warn("cannot become a child subreaper; escapees of killed commands may survive", "err", err)
	}
	m.contain = Containment{Mode: ContainmentProcessGroup, Reason: reason}
	return nil
}

func (m *Manager) setupCgroups() (*cgroupManager, error) {
	base, err := m.reaper.cgroups()
	if err != nil {
		return nil, err
	}
	dir := base.dir.Child("m-" + m.instance)
	if err := dir.Create(); err != nil {
		return nil, fmt.Errorf("create %s: %w", dir.Path, err)
	}
	on, err := dir.EnableControllers(base.controllers...)
	if err != nil {
		m.log.Warn("cgroup controllers not enabled for sessions", "cgroup", dir.Path, "err", err)
	}
	return &cgroupManager{dir: dir, controllers: on}, nil
}

// Containment reports how the Manager holds process trees.
func (m *Manager) Containment() Containment {
	c := m.contain
	c.Controllers = slices.Clone(c.Controllers)
	return c
}

// CheckLimits reports whether limits can be applied to sessions: nil, or
// an ErrInvalidRequest *protocol.Error naming each limit whose controller
// is missing, and why.
func (m *Manager) CheckLimits(l protocol.Limits) error {
	if l.IsZero() {
		return nil
	}
	var need []string
	for _, c := range []struct {
		set        bool
		name, ctrl string
	}{{l.MemoryMax != 0, "memoryMax", "memory"}, {l.PidsMax != 0, "pidsMax", "pids"}, {l.CPUMax != 0, "cpuMax", "cpu"}} {
		if c.set && (m.cg == nil || !slices.Contains(m.cg.controllers, c.ctrl)) {
			need = append(need, c.name+" needs the "+c.ctrl+" controller")
		}
	}
	if len(need) == 0 {
		return nil
	}
	var where string
	if m.cg == nil {
		where = "this host runs commands in process-group containment (" + m.contain.Reason + "), and limits need a cgroup v2 subtree with controllers"
	} else {
		have := "none"
		if len(m.cg.controllers) > 0 {
			have = strings.Join(m.cg.controllers, ", ")
		}
		where = "the cgroup v2 subtree " + m.cg.dir.Path + " has these controllers enabled for sessions: " + have +
			" (delegate them, e.g. systemd Delegate=yes, on a host whose cgroup v2 hierarchy has them)"
	}
	return protocol.Errorf(protocol.ErrInvalidRequest, "resource limits are not available here: %s; %s", strings.Join(need, ", "), where)
}

// tree is one session's process tree, held by its containment.
type tree interface {
	// prepare adjusts the spawn's attributes; after the start (or its
	// failure) the returned function gets the leader's pid (0 on failure).
	prepare(attr *syscall.SysProcAttr) (started func(pid int), err error)
	// term sends SIGTERM, then SIGCONT, to every process of the tree.
	term() error
	// kill sends SIGKILL to every process of the tree.
	kill() error
	// waitGone waits until no process of the tree lives, deadline passes
	// or hurry closes; it reports whether the tree is gone.
	waitGone(deadline time.Time, hurry <-chan struct{}) bool
	// members lists the live processes of the tree.
	members() []int
	// usage is what the tree cost so far; st is the leader's exit status
	// once it was taken.
	usage(st *exitStatus) protocol.Usage
	// oomKilled reports whether the kernel's OOM killer ended a process
	// of the tree.
	oomKilled() bool
	// release is called once the session is over; the tree's resources
	// go when its last process has (at once, or later from a watch).
	release()
	// where describes the tree for the state dir record.
	where(r *record)
	// backgrounded is called when the session turns into a background
	// one, which may run for long: the tree lets go of what it keeps for
	// a short command's exit.
	backgrounded()
}

// newTree makes the containment of a new session.
func (m *Manager) newTree(s *session, limits protocol.Limits) (tree, error) {
	if m.cg != nil {
		return m.newCgroupTree(s, limits)
	}
	return &groupTree{m: m, s: s, name: s.treeName, pty: s.pty, known: map[int]uint64{}}, nil
}

// cgroupTree is a session's cgroup.
type cgroupTree struct {
	m       *Manager
	s       *session
	name    string
	dir     cgroup.Dir
	changed chan struct{} // a cgroup.events change; capacity 1
	limits  protocol.Limits
	// cpuUser and cpuSys are the group's cpu.stat before the session (a
	// reused group's; zero for a new one).
	cpuUser, cpuSys uint64

	mu sync.Mutex
	// files are the group's control files, kept open while the session
	// is a foreground one (a short command's exit reads them four times)
	// and passed on with the group when it becomes a spare. A session
	// that may run for long (background) holds none: its descriptors are
	// its two pipes.
	files *cgroup.Files
	// The inotify watch of cgroup.events is set up on first need (a kill
	// waiting for the tree to go, a tree that outlives its session):
	// most sessions end with their leader and never need it.
	watchSet bool
	watching bool
	// armed: term listed processes in the group after the watch was
	// set, so the group's emptying is reported by an event, and the
	// wait that follows need not read cgroup.events before one comes.
	armed bool
	// hardKilled: cgroup.kill was written. Such a group is never
	// reused: the kernel (6.18 at least) SIGKILLs every process later
	// cloned into a group that was killed once.
	hardKilled bool
	stop       func()
	released   bool
	removed    bool
}

// pollInterval is how often a tree's populated state is read where no
// inotify watch reports it.
const pollInterval = 50 * time.Millisecond

func (m *Manager) newCgroupTree(s *session, l protocol.Limits) (*cgroupTree, error) {
	t := &cgroupTree{m: m, s: s, name: s.treeName, changed: make(chan struct{}, 1), limits: l}
	if g, ok := m.cg.takeSpare(); ok {
		t.dir, t.files, t.cpuUser, t.cpuSys = g.dir, g.files, g.cpuUser, g.cpuSys
	} else {
		t.dir = m.cg.dir.Child(s.treeName)
		if err := t.dir.Create(); err != nil {
			return nil, fmt.Errorf("create the session's cgroup: %w", err)
		}
	}
	if err := t.setLimits(l); err != nil {
		if t.files != nil {
			t.files.Close()
		}
		_ = t.dir.Remove()
		return nil, err
	}
	switch {
	case s.backgrounded:
		t.backgrounded()
	case t.files == nil:
		t.files, _ = cgroup.OpenFiles(t.dir) // best effort: nil reads by path
	}
	return t, nil
}

// backgrounded gives back the kept control files: the session may run
// for long now, and holds no more descriptors than its pipes.
func (t *cgroupTree) backgrounded() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.files != nil {
		t.files.Close()
		t.files = nil
	}
}

// watch sets up the inotify watch of the group's cgroup.events, once;
// callers look at the group after it, so no change is missed.
func (t *cgroupTree) watch() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.watchSet || t.removed {
		return
	}
	t.watchSet = true
	t.stop, t.watching = t.m.reaper.watch(t.dir, t.onEvent)
}

// setLimits writes the limits into the group's control files.
func (t *cgroupTree) setLimits(l protocol.Limits) error {
	var errs []error
	if l.MemoryMax > 0 {
		errs = append(errs, t.dir.Write("memory.max", strconv.FormatInt(l.MemoryMax, 10)))
		// The limit means memory, not memory plus swap; and an OOM kill
		// ends the whole session, not one process of it.
		if _, err := os.Stat(t.dir.Path + "/memory.swap.max"); err == nil {
			errs = append(errs, t.dir.Write("memory.swap.max", "0"))
		}
		if _, err := os.Stat(t.dir.Path + "/memory.oom.group"); err == nil {
			errs = append(errs, t.dir.Write("memory.oom.group", "1"))
		}
	}
	if l.PidsMax > 0 {
		errs = append(errs, t.dir.Write("pids.max", strconv.FormatInt(l.PidsMax, 10)))
	}
	if l.CPUMax > 0 {
		const period = 100000
		quota := max(int64(l.CPUMax*period), 1000)
		errs = append(errs, t.dir.Write("cpu.max", strconv.FormatInt(quota, 10)+" "+strconv.Itoa(period)))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("apply limits %s: %w", l, err)
	}
	return nil
}

// onEvent runs on the watcher's goroutine at every cgroup.events change.
func (t *cgroupTree) onEvent() {
	select {
	case t.changed <- struct{}{}:
	default:
	}
	t.mu.Lock()
	released := t.released
	t.mu.Unlock()
	if released {
		t.tryRemove()
	}
}

func (t *cgroupTree) prepare(attr *syscall.SysProcAttr) (func(int), error) {
	t.mu.Lock()
	if t.files != nil {
		// t.mu is held across the fork, so that the descriptor stays
		// open until the child is in the group.
		attr.UseCgroupFD = true
		attr.CgroupFD = t.files.DirFD()
		return func(int) { t.mu.Unlock() }, nil
	}
	t.mu.Unlock()
	fd, err := t.dir.OpenFD()
	if err != nil {
		return nil, err
	}
	attr.UseCgroupFD = true
	attr.CgroupFD = fd
	return func(int) { unix.Close(fd) }, nil
}

// dirs returns the group and any groups below it (a command with write
// access to its group may create some).
func (t *cgroupTree) dirs() []cgroup.Dir {
	if !t.dir.HasChildren() {
		return []cgroup.Dir{t.dir}
	}
	return t.dir.Subtree()
}

// maxSignalRounds bounds the re-reads of cgroup.procs in one signal pass:
// each round signals the processes forked since the last.
const maxSignalRounds = 8

func (t *cgroupTree) term() error {
	// The watch first: a process term finds is then in the group after
	// it, so the group's emptying makes an event (waitGone).
	t.watch()
	sent := map[int]bool{}
	// The leader needs neither a pidfd nor a look at its cgroup: while
	// the Reaper holds it unreaped its pid cannot be reused, and it is
	// the session's whatever group it is in.
	if pid := t.s.pid; pid > 0 && t.s.exitCh != nil && t.m.reaper.signalLeader(pid, t.s.exitCh, unix.SIGTERM, unix.SIGCONT) {
		sent[pid] = true
	}
	var errs []error
	dirs := t.dirs()
	listed := 0
	for range maxSignalRounds {
		n := 0
		for _, d := range dirs {
			pids, l, err := d.Signal(sent, unix.SIGTERM, unix.SIGCONT)
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
			for _, p := range pids {
				sent[p] = true
			}
			n += len(pids)
			listed += l
		}
		if n == 0 {
			break
		}
	}
	if listed > 0 {
		// A process was in the group after the watch was set.
		t.mu.Lock()
		t.armed = t.watching
		t.mu.Unlock()
	}
	return errors.Join(errs...)
}

func (t *cgroupTree) kill() error {
	t.mu.Lock()
	t.hardKilled = true
	t.mu.Unlock()
	if err := t.dir.Kill(); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

func (t *cgroupTree) gone() bool {
	populated, err := t.dir.Populated()
	return err != nil || !populated
}

func (t *cgroupTree) waitGone(deadline time.Time, hurry <-chan struct{}) bool {
	t.watch()
	t.mu.Lock()
	watching, look := t.watching, !t.armed
	t.armed = false
	t.mu.Unlock()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		if look && t.gone() {
			return true
		}
		left := time.Until(deadline)
		if left <= 0 {
			return !look && t.gone()
		}
		look = true
		if !watching {
			left = min(left, pollInterval)
		}
		timer.Reset(left)
		select {
		case <-t.changed:
		case <-timer.C:
		case <-hurry:
			return t.gone()
		}
	}
}

func (t *cgroupTree) members() []int {
	var out []int
	for _, d := range t.dirs() {
		pids, _ := d.Procs()
		out = append(out, pids...)
	}
	return out
}

func (t *cgroupTree) usage(*exitStatus) protocol.Usage {
	u := protocol.Usage{Scope: protocol.UsageScopeTree}
	if user, sys, err := t.cpuStat(); err == nil {
		u.CPUUserMs, u.CPUSystemMs = int64((user-min(user, t.cpuUser))/1000), int64((sys-min(sys, t.cpuSys))/1000)
	}
	if t.has("memory") {
		if v, ok := t.dir.Uint("memory.peak"); ok {
			u.MemoryPeakBytes = &v
		}
	}
	if t.has("pids") {
		if v, ok := t.dir.Uint("pids.peak"); ok {
			u.PidsPeak = &v
		}
	}
	return u
}

// cpuStat reads cpu.stat, on the kept file when there is one.
func (t *cgroupTree) cpuStat() (user, sys uint64, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.files != nil {
		return t.files.CPUStat()
	}
	return t.dir.CPUStat()
}

// has reports whether controller is enabled for the session groups.
func (t *cgroupTree) has(controller string) bool {
	return slices.Contains(t.m.cg.controllers, controller)
}

func (t *cgroupTree) oomKilled() bool {
	if !t.has("memory") {
		return false
	}
	n, ok := t.dir.Event("memory.events", "oom_kill")
	return ok && n > 0
}

func (t *cgroupTree) release() {
	if t.recycle() {
		return
	}
	t.backgrounded() // the group is not passed on: its files go
	if t.tryRemove() {
		return
	}
	// Processes of a finished command live on (a daemon it started):
	// the group goes when they do (the watch removes it), or at Close.
	t.watch()
	t.m.addLeftover(t, t.name, t.s)
	t.mu.Lock()
	t.released = true
	t.mu.Unlock()
	t.tryRemove() // it may have emptied meanwhile
}

// recycle keeps the group as a spare for the next session when it may
// be reused (cgroupManager) and is empty: no live process, not frozen
// (groups below it are looked for when it is taken). It reports whether
// it did.
func (t *cgroupTree) recycle() bool {
	cg := t.m.cg
	if !cg.reusable() {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.removed || t.hardKilled {
		return false
	}
	var buf [128]byte
	var b []byte
	var ok bool
	if f := t.files; f != nil {
		var err error
		b, err = f.Events(buf[:])
		ok = err == nil
	} else {
		b, ok = readRaw(t.dir.Path+"/cgroup.events", buf[:])
	}
	if !ok || !bytes.Contains(b, []byte("populated 0\n")) || !bytes.Contains(b, []byte("frozen 0\n")) {
		return false
	}
	if t.limits.CPUMax > 0 && t.dir.Write("cpu.max", "max") != nil {
		return false
	}
	g := spareGroup{dir: t.dir, stop: t.stop, files: t.files}
	// A foreground session's group (its files kept) is measured now, off
	// the next start's path; groups the command made below its own are
	// not passed on: the group is removed instead (they are empty, as it
	// is).
	if t.files != nil && !g.measure() {
		return false
	}
	// The group's watch (a kill sets one) is ended when it is taken or
	// removed, after a burst of exits.
	if !cg.putSpare(g) {
		return false
	}
	t.files = nil // the spare's now
	t.removed = true
	t.m.treeGone(t.name)
	return true
}

// tryRemove removes the group if no process is left in it. rmdir itself
// refuses a group with live processes or child groups, so the common case
// costs one system call.
func (t *cgroupTree) tryRemove() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.removed {
		return true
	}
	err := t.dir.Remove()
	if err != nil && t.dir.HasChildren() && t.gone() {
		err = t.dir.RemoveSubtree() // groups a command created below its own
	}
	if err != nil {
		return false
	}
	t.removed = true
	if t.stop != nil {
		t.stop()
	}
	t.m.treeGone(t.name)
	return true
}

func (t *cgroupTree) where(r *record) { r.Cgroup = t.dir.Path }
