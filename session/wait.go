package session

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Waiting for a session leader. os/exec's Wait blocks an OS thread in
// waitid for as long as the command runs: ten thousand sleeping background
// commands would hold ten thousand threads (and hit the runtime's thread
// limit). Instead the session opens a pidfd for its leader and parks in the
// runtime's poller until the pidfd becomes readable (the process exited),
// then reaps it with wait4, which no longer blocks. Where pidfds are not
// available (kernels before 5.3, seccomp filters) the wait falls back to a
// blocking wait4 on a thread of its own, as os/exec would.
//
// The session never calls exec.Cmd.Wait: os/exec's process handle is
// released right after the start (freeing the pidfd os/exec keeps), and the
// output pipes are the session's own (see startPipes), so the Cmd holds
// nothing that Wait would release.

// exitStatus is how a session leader ended.
type exitStatus struct {
	ws  unix.WaitStatus
	err error // the status could not be read; ws is meaningless
}

// openLeaderFD opens a pollable pidfd for the leader and releases os/exec's
// handle. Without a pidfd, waitLeader blocks a thread instead.
func (s *session) openLeaderFD() {
	fd, err := unix.PidfdOpen(s.pid, unix.PIDFD_NONBLOCK)
	if err == nil {
		// Non-blocking, so os.NewFile registers it with the poller.
		s.leaderFD = os.NewFile(uintptr(fd), "pidfd:"+strconv.Itoa(s.pid))
	} else {
		s.log.Debug("no pidfd for the leader; its wait holds a thread", "err", err)
	}
	// Nobody calls Cmd.Wait; without Release os/exec's own pidfd would stay
	// open until the garbage collector found the Process.
	_ = s.cmd.Process.Release()
}

// waitLeader waits until the leader exits and reaps it.
func (s *session) waitLeader() exitStatus {
	if f := s.leaderFD; f != nil {
		if err := waitPidfdExit(f); err != nil {
			s.log.Debug("pidfd wait failed; waiting on a thread", "err", err)
		}
	}
	var st exitStatus
	for {
		_, err := unix.Wait4(s.pid, &st.ws, 0, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			st.err = fmt.Errorf("wait for pid %d: %w", s.pid, err)
		}
		break
	}
	// Closed only after the reap, so that the orphan reaper, which skips
	// processes somebody holds a pidfd for, never takes our status.
	if s.leaderFD != nil {
		_ = s.leaderFD.Close()
	}
	return st
}

// waitPidfdExit parks the goroutine until the process of the pidfd f exited.
// It does not reap: WNOWAIT leaves the zombie for wait4.
func waitPidfdExit(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var werr error
	err = rc.Read(func(fd uintptr) bool {
		var info unix.Siginfo
		werr = unix.Waitid(unix.P_PIDFD, int(fd), &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
		switch {
		case errors.Is(werr, unix.EAGAIN), errors.Is(werr, unix.EINTR):
			werr = nil
			return false // still running: wait for the pidfd to become readable
		case werr != nil:
			return true
		}
		return info.Signo != 0 // zero: WNOHANG found no exit yet
	})
	if err != nil {
		return err
	}
	return werr
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
