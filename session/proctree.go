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

	"github.com/execmesh/execmesh/internal/procfs"
)

// Process trees. A command may start processes that leave its process
// group or session (setsid, daemons). To end all of them, the Manager makes
// its process a child subreaper, so every orphan of a command stays below
// it in the process tree instead of moving to init, and at signal time it
// collects a session's processes from /proc:
//
//   - the leader and all its descendants (parent links);
//   - every process in the leader's process group, and for PTY sessions
//     every process in its terminal session;
//   - every process below the Manager whose environment carries the
//     session's marker variable (EXECMESH_SESSION), which catches escapees
//     whose parent already died and that left group and session;
//   - the descendants of all of the above.
//
// Nothing is tracked between signals: a tree is read when it is signalled.

// procInfo is one line of /proc/<pid>/stat.
type procInfo struct {
	pid, ppid, pgrp, sid int
	state                byte
	start                uint64 // start time in clock ticks since boot: identifies the process
}

// procSnapshot is the process table at one moment.
type procSnapshot struct {
	procs    map[int]procInfo
	children map[int][]int
	self     int
	taken    time.Time

	mu      sync.Mutex
	markers map[int]string // lazily read EXECMESH_SESSION values
}

// readProcSnapshot reads /proc. Processes that exit while it is read are
// simply missing.
func readProcSnapshot(self int) (*procSnapshot, error) {
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
		self:     self,
		taken:    time.Now(),
		markers:  map[int]string{},
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
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procInfo{}, false
	}
	n, _ := f.Read(buf)
	f.Close()
	return parseProcStat(buf[:n])
}

// parseProcStat parses "pid (comm) state ppid pgrp session … starttime …";
// comm may itself contain spaces and parentheses.
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
	// fields[0] state, [1] ppid, [2] pgrp, [3] session, …, [19] starttime.
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
	return p, true
}

// marker returns the EXECMESH_SESSION value of pid ("" if none or unreadable).
func (s *procSnapshot) marker(pid int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m, ok := s.markers[pid]; ok {
		return m
	}
	m := readEnvMarker(pid)
	s.markers[pid] = m
	return m
}

// readEnvMarker reads EXECMESH_SESSION from /proc/<pid>/environ, the
// environment the process was started with.
func readEnvMarker(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return ""
	}
	prefix := []byte(envSessionMarker + "=")
	for len(b) > 0 {
		var kv []byte
		kv, b, _ = bytes.Cut(b, []byte{0})
		if v, ok := bytes.CutPrefix(kv, prefix); ok {
			return string(v)
		}
	}
	return ""
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

// treeSpec identifies a session's processes.
type treeSpec struct {
	leader      int    // the command's pid
	leaderStart uint64 // its start time, 0 if unknown
	pgid        int    // process group to include (> 1)
	sid         int    // terminal session to include (PTY sessions), 0 for none
	marker      string // EXECMESH_SESSION value
}

// collect returns the processes of a session as pid → start time. It never
// includes the Manager's own process or an ancestor of it.
//
// Markers are read only from orphans: processes whose parent died were
// re-parented to us (the subreaper), so they are our direct children, and
// anything else is reached through parent links from one of them or from
// the leader. leaders lists our children that are session leaders, whose
// environment need not be read; this keeps a kill cheap when thousands of
// sessions run.
func (s *procSnapshot) collect(spec treeSpec, leaders map[int]bool) map[int]uint64 {
	found := map[int]uint64{}
	var roots []int
	if p, ok := s.procs[spec.leader]; ok && (spec.leaderStart == 0 || p.start == spec.leaderStart) {
		roots = append(roots, spec.leader)
	}
	for pid, p := range s.procs {
		if (spec.pgid > 1 && p.pgrp == spec.pgid) || (spec.sid > 1 && p.sid == spec.sid) {
			roots = append(roots, pid)
		}
	}
	if spec.marker != "" {
		for _, pid := range s.children[s.self] {
			if !leaders[pid] && s.marker(pid) == spec.marker {
				roots = append(roots, pid)
			}
		}
	}
	for _, root := range roots {
		if _, dup := found[root]; dup {
			continue
		}
		found[root] = s.procs[root].start
		for _, pid := range s.below(root) {
			found[pid] = s.procs[pid].start
		}
	}
	// Never the Manager's process or its ancestors (a command cannot make
	// us its descendant, but a marker could be forged).
	for pid := s.self; pid > 1; {
		delete(found, pid)
		p, ok := s.procs[pid]
		if !ok {
			break
		}
		pid = p.ppid
	}
	delete(found, 0)
	delete(found, 1)
	return found
}

// signalProcs sends sig to every process of set that is still the same
// process (same start time), and to the process group when it still has
// members. ESRCH (already gone) is not an error.
func signalProcs(set map[int]uint64, pgid, selfPGID int, sig syscall.Signal) error {
	var errs []error
	var buf [512]byte
	groupLive := false
	for pid, start := range set {
		p, ok := readProcStat(pid, buf[:])
		if !ok || (start != 0 && p.start != start) {
			continue // gone, or the pid was reused
		}
		groupLive = groupLive || p.pgrp == pgid
		if err := unix.Kill(pid, sig); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, err)
		}
	}
	// The group catches processes forked since the snapshot, which needs a
	// live member to fork them; without one the group id may even have
	// been reused. Never our own group, and never pgid <= 1 (kill(0) and
	// kill(-1) mean "everyone").
	if groupLive && pgid > 1 && pgid != selfPGID {
		if err := unix.Kill(-pgid, sig); err != nil && !errors.Is(err, unix.ESRCH) {
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

// pidfdPIDs returns the processes this process holds a pidfd for. os/exec
// (via os.StartProcess) keeps a pidfd for every child it started until
// Wait has reaped it, so these are exactly the children that someone in
// this process will still wait for.
func pidfdPIDs() map[int]bool {
	out := map[int]bool{}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return out
	}
	for _, e := range ents {
		link, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil || link != "anon_inode:[pidfd]" {
			continue
		}
		info, err := os.ReadFile("/proc/self/fdinfo/" + e.Name())
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(info), "\n") {
			if v, ok := strings.CutPrefix(line, "Pid:"); ok {
				if pid, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && pid > 0 {
					out[pid] = true
				}
			}
		}
	}
	return out
}

// reapOrphans waits for zombie children that nobody else will wait for:
// orphans of commands that were re-parented to us as subreaper. A blanket
// wait4(-1) would also take the exit status of children started with
// os/exec (whose Wait would then fail), so only zombies that are neither
// held by a pidfd (os/exec children anywhere in this process) nor listed in
// skip (our own session leaders) are reaped, each by pid.
func reapOrphans(skip map[int]bool) int {
	var zombies []int
	var buf [512]byte
	for _, pid := range procfs.Children() {
		if skip[pid] || isWaitedLeader(pid) {
			continue // a session leader: its Manager's reaper takes it
		}
		if p, ok := readProcStat(pid, buf[:]); ok && p.state == 'Z' {
			zombies = append(zombies, pid)
		}
	}
	if len(zombies) == 0 {
		return 0
	}
	// Read the pidfds after the zombies: a child started after the zombie
	// scan cannot be among them, and one reaped meanwhile by its owner
	// just makes wait4 fail with ECHILD.
	held := pidfdPIDs()
	n := 0
	for _, pid := range zombies {
		// Asked again after the pidfds were read: a leader is registered
		// before os/exec's pidfd for it is released, so one of the two
		// marks it.
		if held[pid] || isWaitedLeader(pid) {
			continue
		}
		var ws unix.WaitStatus
		if got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil); err == nil && got == pid {
			n++
		}
	}
	return n
}
