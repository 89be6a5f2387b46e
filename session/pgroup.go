package session

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/execmesh/execmesh/protocol"
)

// Process-group containment (see contain.go): the fallback where no
// writable cgroup v2 subtree exists.

// procInfo is one line of /proc/<pid>/stat.
type procInfo struct {
	pid, ppid, pgrp, sid int
	state                byte
	start                uint64 // start time in clock ticks since boot: identifies the process
	cpuTicks             [4]uint64
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times: 100 on every
// Linux architecture.
const clockTicks = 100

// bootTicks is CLOCK_BOOTTIME in clock ticks, the clock and unit of a
// process's start time in /proc/<pid>/stat (the kernel takes the boot
// clock at fork and shows it divided down to USER_HZ; both sides include
// a time namespace's offset). 0 when the clock cannot be read.
func bootTicks() uint64 {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts) != nil {
		return 0
	}
	return uint64(ts.Nano()) / (uint64(time.Second) / clockTicks)
}

// procSnapshot is the process table as one read of /proc found it.
type procSnapshot struct {
	procs    map[int]procInfo
	children map[int][]int
	began    time.Time
}

// readProcSnapshot reads /proc. Processes that exit while it is read are
// simply missing.
func readProcSnapshot(int) (*procSnapshot, error) {
	began := time.Now()
	d, err := os.Open("/proc")
	if err != nil {
		return nil, err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return nil, err
	}
	snap := &procSnapshot{
		procs:    make(map[int]procInfo, len(names)),
		children: make(map[int][]int, len(names)),
		began:    began,
	}
	var buf [512]byte
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		p, ok := readProcStat(pid, buf[:])
		if !ok {
			continue
		}
		snap.procs[pid] = p
		snap.children[p.ppid] = append(snap.children[p.ppid], pid)
	}
	return snap, nil
}

// readProcStat parses /proc/<pid>/stat with buf as scratch space.
func readProcStat(pid int, buf []byte) (procInfo, bool) {
	var pb [32]byte
	path := strconv.AppendInt(append(pb[:0], "/proc/"...), int64(pid), 10)
	b, ok := readRaw(string(append(path, "/stat"...)), buf)
	if !ok {
		return procInfo{}, false
	}
	return parseProcStat(b)
}

// readRaw reads the start of a pseudo-file (up to len(buf) bytes) into
// buf with three system calls: an os.File would also offer the file to
// the poller and take it back, four more per read.
func readRaw(path string, buf []byte) ([]byte, bool) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, false
	}
	n, err := unix.Read(fd, buf)
	_ = unix.Close(fd)
	if err != nil || n <= 0 {
		return nil, false
	}
	return buf[:n], true
}

// parseProcStat parses "pid (comm) state ppid pgrp session … utime stime
// cutime cstime … starttime …"; comm may itself contain spaces and
// parentheses.
func parseProcStat(b []byte) (procInfo, bool) {
	open := bytes.IndexByte(b, '(')
	closing := bytes.LastIndexByte(b, ')')
	if open < 0 || closing < open || closing+2 > len(b) {
		return procInfo{}, false
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(b[:open])))
	if err != nil {
		return procInfo{}, false
	}
	fields := strings.Fields(string(b[closing+1:]))
	// fields[0] state, [1] ppid, [2] pgrp, [3] session, [11..14] utime
	// stime cutime cstime, [19] starttime.
	if len(fields) < 20 || len(fields[0]) != 1 {
		return procInfo{}, false
	}
	p := procInfo{pid: pid, state: fields[0][0]}
	var e1, e2, e3, e4 error
	p.ppid, e1 = strconv.Atoi(fields[1])
	p.pgrp, e2 = strconv.Atoi(fields[2])
	p.sid, e3 = strconv.Atoi(fields[3])
	p.start, e4 = strconv.ParseUint(fields[19], 10, 64)
	if e1 != nil || e2 != nil || e3 != nil || e4 != nil {
		return procInfo{}, false
	}
	for i := range p.cpuTicks {
		p.cpuTicks[i], _ = strconv.ParseUint(fields[11+i], 10, 64)
	}
	return p, true
}

// below returns every process under root (root excluded).
func (s *procSnapshot) below(root int) []int {
	var out []int
	stack := append([]int(nil), s.children[root]...)
	for len(stack) > 0 {
		pid := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		out = append(out, pid)
		stack = append(stack, s.children[pid]...)
	}
	return out
}

// freshSnapshot returns a read of /proc that began after since.
// Concurrent callers share reads: one that finds a read in progress that
// began late enough waits for it, so terminating a thousand trees at once
// costs a few reads of /proc, not a thousand.
func (m *Manager) freshSnapshot(since time.Time) (*procSnapshot, error) {
	for {
		m.snapMu.Lock()
		if m.snap != nil && !m.snap.began.Before(since) {
			snap := m.snap
			m.snapMu.Unlock()
			return snap, nil
		}
		if m.snapReading != nil {
			ch := m.snapReading
			m.snapMu.Unlock()
			<-ch // then use it, or start the next read
			continue
		}
		ch := make(chan struct{})
		m.snapReading = ch
		m.snapMu.Unlock()

		snap, err := readProcSnapshot(0)

		m.snapMu.Lock()
		m.snapReading = nil
		if err == nil {
			m.snap = snap
		}
		close(ch)
		m.snapMu.Unlock()
		return snap, err
	}
}

// groupTree is a session's tree in process-group containment.
type groupTree struct {
	m           *Manager
	s           *session
	name        string
	pty         bool
	leader      int
	leaderStart uint64
	pgid, sid   int

	mu    sync.Mutex
	known map[int]uint64 // every process seen in the tree: pid → start time
}

func (t *groupTree) prepare(*syscall.SysProcAttr) (func(int), error) {
	return func(pid int) {
		if pid == 0 {
			return
		}
		t.leader, t.pgid = pid, pid
		if t.pty {
			t.sid = pid
		}
		var buf [512]byte
		if p, ok := readProcStat(pid, buf[:]); ok {
			t.leaderStart = p.start
		}
		t.known[pid] = t.leaderStart
	}, nil
}

// collect adds to known the processes of the tree in snap: the leader, its
// group and terminal session, every known process still the same, and all
// their descendants. It returns the processes added. Never the Manager's
// process or its ancestors.
func (t *groupTree) collect(snap *procSnapshot) map[int]uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var roots []int
	for pid, p := range snap.procs {
		if (t.pgid > 1 && p.pgrp == t.pgid) || (t.sid > 1 && p.sid == t.sid) {
			roots = append(roots, pid)
		}
	}
	for pid, start := range t.known {
		if p, ok := snap.procs[pid]; ok && (start == 0 || p.start == start) {
			roots = append(roots, pid)
		}
	}
	added := map[int]uint64{}
	add := func(pid int) {
		if pid <= 1 || pid == t.m.selfPID {
			return
		}
		if _, ok := t.known[pid]; !ok {
			start := snap.procs[pid].start
			t.known[pid] = start
			added[pid] = start
		}
	}
	for _, root := range roots {
		add(root)
		for _, pid := range snap.below(root) {
			add(pid)
		}
	}
	for pid := t.m.selfPID; pid > 1; {
		delete(t.known, pid)
		delete(added, pid)
		p, ok := snap.procs[pid]
		if !ok {
			break
		}
		pid = p.ppid
	}
	return added
}

// maxStopRounds bounds the reads of one stop pass.
const maxStopRounds = 20

// stopAll stops the tree: SIGSTOP to its group and every member found,
// re-reading /proc until a read after the stops finds no new member (two
// consecutive reads agree). It returns the live members.
func (t *groupTree) stopAll() map[int]uint64 {
	t.signalGroup(unix.SIGSTOP)
	_ = signalSet(t.snapshotKnown(), unix.SIGSTOP)
	for round := 0; round < maxStopRounds; round++ {
		snap, err := t.m.freshSnapshot(time.Now())
		if err != nil {
			t.m.log.Warn("cannot read /proc; signalling the known processes and the group only", "err", err)
			break
		}
		added := t.collect(snap)
		if len(added) == 0 && round > 0 {
			break
		}
		_ = signalSet(added, unix.SIGSTOP)
	}
	return aliveProcs(t.snapshotKnown())
}

func (t *groupTree) snapshotKnown() map[int]uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[int]uint64, len(t.known))
	for k, v := range t.known {
		out[k] = v
	}
	return out
}

// signalGroup signals the process group: never our own, never pgid <= 1
// (kill(0) and kill(-1) mean "everyone").
func (t *groupTree) signalGroup(sig unix.Signal) {
	if t.pgid > 1 && t.pgid != t.m.selfPGID {
		_ = unix.Kill(-t.pgid, sig)
	}
}

// groupLive reports whether the process group still has a member.
func (t *groupTree) groupLive() bool {
	return t.pgid > 1 && t.pgid != t.m.selfPGID && unix.Kill(-t.pgid, 0) == nil
}

func (t *groupTree) term() error {
	set := t.stopAll()
	t.signalGroup(unix.SIGTERM)
	err := signalSet(set, unix.SIGTERM)
	t.signalGroup(unix.SIGCONT)
	_ = signalSet(set, unix.SIGCONT)
	return err
}

func (t *groupTree) kill() error {
	set := t.stopAll()
	t.signalGroup(unix.SIGKILL)
	return signalSet(set, unix.SIGKILL)
}

func (t *groupTree) waitGone(deadline time.Time, hurry <-chan struct{}) bool {
	for {
		alive := aliveProcs(t.snapshotKnown())
		if len(alive) == 0 && !t.groupLive() {
			return true
		}
		if len(alive) == 0 {
			// kill(-pgid, 0) counts zombies (an orphan waiting for its
			// reaper's grace): only a live member of the group matters,
			// and a new one joins the known ones.
			snap, err := t.m.freshSnapshot(time.Now())
			if err == nil {
				t.collect(snap)
				if len(aliveProcs(t.snapshotKnown())) == 0 && !t.liveInGroup(snap) {
					return true
				}
			}
		}
		if !time.Now().Before(deadline) || closedChan(hurry) {
			return false
		}
		if alive = aliveProcs(t.snapshotKnown()); len(alive) > 0 {
			until := time.Now().Add(100 * time.Millisecond)
			if deadline.Before(until) {
				until = deadline
			}
			waitGone(alive, until, hurry)
			continue
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// liveInGroup reports whether snap has a live (not zombie) member of the
// tree's process group or terminal session.
func (t *groupTree) liveInGroup(snap *procSnapshot) bool {
	for pid, p := range snap.procs {
		if p.state != 'Z' && pid != t.m.selfPID && ((t.pgid > 1 && p.pgrp == t.pgid) || (t.sid > 1 && p.sid == t.sid)) {
			return true
		}
	}
	return false
}

func (t *groupTree) members() []int {
	if snap, err := t.m.freshSnapshot(time.Now()); err == nil {
		t.collect(snap)
	}
	var out []int
	for pid := range aliveProcs(t.snapshotKnown()) {
		out = append(out, pid)
	}
	return out
}

func (t *groupTree) usage(st *exitStatus) protocol.Usage {
	u := protocol.Usage{Scope: protocol.UsageScopeLeader}
	if st != nil && st.err == nil {
		u.CPUUserMs = st.ru.Utime.Sec*1000 + st.ru.Utime.Usec/1000
		u.CPUSystemMs = st.ru.Stime.Sec*1000 + st.ru.Stime.Usec/1000
		return u
	}
	var buf [512]byte
	if p, ok := readProcStat(t.leader, buf[:]); ok && p.start == t.leaderStart {
		// utime + cutime, stime + cstime: the leader and the children it
		// waited for, as wait4's rusage counts them at the exit.
		u.CPUUserMs = int64(p.cpuTicks[0]+p.cpuTicks[2]) * 1000 / clockTicks
		u.CPUSystemMs = int64(p.cpuTicks[1]+p.cpuTicks[3]) * 1000 / clockTicks
	}
	return u
}

func (t *groupTree) oomKilled() bool { return false }

func (t *groupTree) release() {
	live := len(aliveProcs(t.snapshotKnown())) > 0
	if !live && t.groupLive() {
		// Only a /proc read tells a live member from a zombie one.
		if snap, err := t.m.freshSnapshot(time.Now()); err != nil || t.liveInGroup(snap) {
			live = true
		}
	}
	if live {
		t.m.addLeftover(t, t.name, t.s)
		return
	}
	t.m.treeGone(t.name)
}

func (t *groupTree) where(r *record) { r.PGID, r.SID = t.pgid, t.sid }

// backgrounded: a process group keeps nothing open for its exit.
func (t *groupTree) backgrounded() {}

// signalSet sends sig to every process of set that is still the same
// process (same start time). ESRCH (already gone) is not an error.
func signalSet(set map[int]uint64, sig syscall.Signal) error {
	var errs []error
	var buf [512]byte
	for pid, start := range set {
		p, ok := readProcStat(pid, buf[:])
		if !ok || (start != 0 && p.start != start) {
			continue // gone, or the pid was reused
		}
		if err := unix.Kill(pid, sig); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// aliveProcs returns the members of set that still run (zombies count as
// gone: they only wait to be reaped).
func aliveProcs(set map[int]uint64) map[int]uint64 {
	out := map[int]uint64{}
	var buf [512]byte
	for pid, start := range set {
		if p, ok := readProcStat(pid, buf[:]); ok && p.state != 'Z' && (start == 0 || p.start == start) {
			out[pid] = start
		}
	}
	return out
}

func closedChan(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// waitGone waits until every process of set has exited, deadline passed
// or hurry closed. It waits on pidfds, which become readable when their
// process exits, so it returns as soon as the last one is gone; the
// descriptors are held only while it waits.
func waitGone(set map[int]uint64, deadline time.Time, hurry <-chan struct{}) {
	var fds []unix.PollFd
	for pid, start := range set {
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue // gone already
		}
		// The pid may have been reused since it was read.
		var buf [512]byte
		if p, ok := readProcStat(pid, buf[:]); !ok || (start != 0 && p.start != start) || p.state == 'Z' {
			unix.Close(fd)
			continue
		}
		fds = append(fds, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
	}
	defer func() {
		for _, p := range fds {
			unix.Close(int(p.Fd))
		}
	}()
	for len(fds) > 0 {
		left := time.Until(deadline)
		if left <= 0 || closedChan(hurry) {
			return
		}
		// Wake at least every 100 ms to notice hurry.
		ms := int(min(left, 100*time.Millisecond) / time.Millisecond)
		n, err := unix.Poll(fds, max(ms, 1))
		if err != nil && !errors.Is(err, unix.EINTR) {
			return
		}
		if n <= 0 {
			continue
		}
		live := fds[:0]
		for _, p := range fds {
			if p.Revents != 0 {
				unix.Close(int(p.Fd))
				continue
			}
			live = append(live, p)
		}
		fds = live
	}
}
