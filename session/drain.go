package session

import (
	"errors"
	"os"
	"slices"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Output after the exit. The session's exit is reported once its output
// is read to the end, but a process of the tree that lives on (a daemon
// started in the background) may hold the output open for ever: the drain
// waits DrainWait, then looks at who still holds it.

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
	for _, pid := range s.tree.members() {
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
