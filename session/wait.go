package session

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Waiting for session leaders. os/exec's Wait blocks an OS thread in
// waitid for as long as the command runs, and keeps a pidfd open: ten
// thousand sleeping background commands would hold ten thousand threads
// (the runtime's limit) and ten thousand descriptors. Instead one reaper
// goroutine per Manager takes the exit statuses: at every SIGCHLD it asks
// each leader that is still running, with a non-blocking wait4, and hands
// the status of those that exited to their sessions. A session's run
// goroutine parks on a channel meanwhile, holding neither a thread nor a
// descriptor. (A pidfd per leader would avoid the scan, but costs a
// descriptor per session, and descriptors are the scarcer resource: see
// README "Performance".)
//
// The session never calls exec.Cmd.Wait: os/exec's process handle is
// released right after the start, and the output pipes are the session's
// own (see startPipes), so the Cmd holds nothing that Wait would release.

// waitingLeaders holds the session leaders of every Manager in this
// process whose exit status is still to be taken. It is process-wide, the
// one piece of package state, because the children of a process are: a
// Manager's orphan reaper must never take the status of another Manager's
// leader (`execmesh up` runs the gateway's and the node agent's Managers
// side by side), and a released leader is held by no pidfd that would say
// whose it is.
var waitingLeaders = struct {
	sync.Mutex
	pids map[int]bool
}{pids: map[int]bool{}}

// registerLeader marks pid as a leader somebody waits for. It must happen
// before os/exec's pidfd, which marks it until then, is released.
func registerLeader(pid int) {
	waitingLeaders.Lock()
	waitingLeaders.pids[pid] = true
	waitingLeaders.Unlock()
}

// unregisterLeader is called once pid was reaped.
func unregisterLeader(pid int) {
	waitingLeaders.Lock()
	delete(waitingLeaders.pids, pid)
	waitingLeaders.Unlock()
}

// isWaitedLeader reports whether some Manager waits for pid.
func isWaitedLeader(pid int) bool {
	waitingLeaders.Lock()
	defer waitingLeaders.Unlock()
	return waitingLeaders.pids[pid]
}

// exitStatus is how a session leader ended.
type exitStatus struct {
	ws  unix.WaitStatus
	err error // the status could not be read; ws is meaningless
}

// reaper takes the exit statuses of the leaders (see above) and reaps
// orphans re-parented to us. It runs until Close, after every session
// ended, closes reapStop.
func (m *Manager) reaper() {
	defer close(m.reapDone)
	for {
		select {
		case <-m.reapStop:
			return
		case <-m.sigchld:
		case <-m.reapKick:
		}
		m.reapLeaders()
		m.reap()
	}
}

// reapLeaders collects the exit status of every registered leader that
// exited. Signals coalesce, so each pass asks every leader.
func (m *Manager) reapLeaders() {
	m.mu.Lock()
	waiting := make([]*session, 0, len(m.waiting))
	for _, s := range m.waiting {
		waiting = append(waiting, s)
	}
	m.mu.Unlock()
	for _, s := range waiting {
		var st exitStatus
		pid, err := unix.Wait4(s.pid, &st.ws, unix.WNOHANG, nil)
		for err == unix.EINTR {
			pid, err = unix.Wait4(s.pid, &st.ws, unix.WNOHANG, nil)
		}
		switch {
		case err != nil:
			// ECHILD: somebody else reaped it (SIGCHLD ignored, say).
			st.err = fmt.Errorf("wait for pid %d: %w", s.pid, err)
		case pid != s.pid:
			continue // still running
		}
		unregisterLeader(s.pid)
		m.mu.Lock()
		delete(m.waiting, s.pid)
		m.mu.Unlock()
		s.exitCh <- st // buffered: the only send
	}
}

// lateDrainMax bounds the wait for output after the leader exited when no
// process of the tree holds the output open any more: the data is then
// only late (a reader starved of CPU), and end-of-file is certain to come.
// The bound only guards against a holder outside the tree (a descriptor
// passed over a socket to an unrelated process).
const lateDrainMax = 30 * time.Second

// drainOutput waits for the output readers after the leader exited.
// Output still unread after DrainWait is waited for as long as only the
// readers are behind; the readers are stopped (closeOutput) when a
// surviving process of the tree holds the output open, as a daemon started
// in the background does, so its lifetime never holds the exit report.
// links returns the /proc link texts of the output's descriptors.
func (s *session) drainOutput(links func() []string, closeOutput func()) {
	t := time.NewTimer(s.m.cfg.DrainWait)
	defer t.Stop()
	select {
	case <-s.readersDone:
		return
	case <-t.C:
	}
	if l := links(); !slices.Contains(l, "") && !s.treeHolds(l) {
		t.Reset(lateDrainMax)
		select {
		case <-s.readersDone:
			return
		case <-t.C:
			s.log.Warn("output still open after the exit with no holder in the process tree; closing it", "waited", s.m.cfg.DrainWait+lateDrainMax)
		}
	}
	closeOutput()
	<-s.readersDone
}

// treeHolds reports whether a live process of the session's tree has a
// descriptor whose /proc link is one of links ("pipe:[inode]", "/dev/pts/N").
func (s *session) treeHolds(links []string) bool {
	for pid := range aliveProcs(s.m.collect(s.treeSpec())) {
		if holdsLink(pid, links) {
			return true
		}
	}
	return false
}

// holdsLink reports whether pid has a descriptor pointing at one of
// links. A process whose descriptors cannot be read counts as a holder:
// closing early is the safe side for the exit report.
func holdsLink(pid int, links []string) bool {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd/"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	for _, e := range ents {
		if l, err := os.Readlink(dir + e.Name()); err == nil && slices.Contains(links, l) {
			return true
		}
	}
	return false
}

// pipeLink returns the /proc/<pid>/fd link text of a pipe ("pipe:[inode]"),
// or "" if it cannot be read.
func pipeLink(f *os.File) string {
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return ""
	}
	return "pipe:[" + strconv.FormatUint(st.Ino, 10) + "]"
}

// ptyLink returns the path of the terminal of the PTY master ptmx
// ("/dev/pts/N"), or "" if it cannot be read.
func ptyLink(ptmx *os.File) string {
	rc, err := ptmx.SyscallConn()
	if err != nil {
		return ""
	}
	n, ierr := -1, error(nil)
	if err := rc.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.TIOCGPTN) }); err != nil || ierr != nil {
		return ""
	}
	return "/dev/pts/" + strconv.Itoa(n)
}
