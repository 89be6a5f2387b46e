package confine

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// maxRefused bounds the refused paths a supervisor remembers and names.
const maxRefused = 32

// SupervisorOptions configures a Supervisor; the zero value is usable.
type SupervisorOptions struct {
	// Logger receives the supervisor's own failures; nil discards them.
	Logger *slog.Logger
	// Match, when set, is the exact rule inside Spec.ExecDirs: a file
	// beneath one of them may be executed only if Match(its real path).
	// Landlock's tree rule is wider; the supervisor refuses the rest.
	Match func(realPath string) bool
}

// Supervisor watches the execs of one confined tree: it refuses a direct
// run of an ELF interpreter, and names on the session's stderr every path
// whose exec the confinement refuses. Build it with NewSupervisor, call
// Start, give ChildFile to the helper as SupervisorFD, and call
// ReleaseChild once the helper was started or failed to start.
type Supervisor struct {
	log    *slog.Logger
	match  func(string) bool
	parent *os.File // our end of the socket
	child  *os.File // the helper's end, closed by Started

	execAll  bool
	allowed  map[devIno]bool
	interp   map[devIno]bool
	execDirs []string

	done chan struct{}

	mu      sync.Mutex
	refused []string
	stderr  *os.File // the tree's stderr, for the messages
}

type devIno struct{ dev, ino uint64 }

// NewSupervisor prepares the supervisor of spec's tree and sets
// spec.Supervised.
func NewSupervisor(spec *Spec, opts SupervisorOptions) (*Supervisor, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, os.NewSyscallError("socketpair", err)
	}
	s := &Supervisor{
		log:      log,
		match:    opts.Match,
		parent:   os.NewFile(uintptr(fds[0]), "confine-supervisor"),
		child:    os.NewFile(uintptr(fds[1]), "confine-helper"),
		execAll:  spec.ExecAll,
		allowed:  map[devIno]bool{},
		interp:   map[devIno]bool{},
		execDirs: spec.ExecDirs,
		done:     make(chan struct{}),
	}
	for _, f := range spec.Exec {
		if k, ok := statKey(f); ok {
			s.allowed[k] = true
		}
	}
	for _, f := range spec.Interpreters {
		if k, ok := statKey(f); ok {
			s.interp[k] = true
		}
	}
	spec.Supervised = true
	return s, nil
}

// statKey is the inode a File is bound to, or the one its path names.
func statKey(f File) (devIno, bool) {
	if f.Ino != 0 {
		return devIno{f.Dev, f.Ino}, true
	}
	var st unix.Stat_t
	if err := unix.Stat(f.Path, &st); err != nil {
		return devIno{}, false
	}
	return devIno{st.Dev, st.Ino}, true
}

// ChildFile is the helper's end of the supervisor's socket: pass it as the
// child's descriptor SupervisorFD.
func (s *Supervisor) ChildFile() *os.File { return s.child }

// Start starts supervising: from now on the helper's handover is taken,
// and every exec of the tree answered, until no process of it is left.
// The helper's first exec waits for it, so Start comes before the spawn.
func (s *Supervisor) Start() { go s.run() }

// ReleaseChild closes the daemon's copy of the helper's end once the
// helper was started (it has its own) or could not be: a helper that never
// hands over its listener then ends the supervisor.
func (s *Supervisor) ReleaseChild() { s.child.Close() }

// Done is closed when no process of the tree is left (or the helper went
// away before it handed over its listener).
func (s *Supervisor) Done() <-chan struct{} { return s.done }

// Refused returns the paths whose exec was refused, in order.
func (s *Supervisor) Refused() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.refused...)
}

func (s *Supervisor) run() {
	defer close(s.done)
	listener, err := s.receive()
	s.parent.Close()
	if err != nil {
		// The helper failed before its filter existed (it said why on
		// stderr) or went away: nothing to supervise.
		s.log.Debug("confine: no listener from the helper", "err", err)
		return
	}
	defer listener.Close()
	defer func() {
		s.mu.Lock()
		if s.stderr != nil {
			s.stderr.Close()
		}
		s.mu.Unlock()
	}()
	rc, err := listener.SyscallConn()
	if err != nil {
		s.log.Warn("confine: supervisor", "err", err)
		return
	}
	for {
		var n seccompNotif
		var ok, done bool
		var rerr error
		err := rc.Read(func(fd uintptr) bool {
			ok, done, rerr = notifRecv(int(fd), &n)
			return ok || done || rerr != nil
		})
		if err == nil {
			err = rerr
		}
		if err != nil {
			s.log.Warn("confine: supervisor stops", "err", err)
			return
		}
		if done {
			return
		}
		_ = rc.Control(func(fd uintptr) { s.decide(int(fd), &n) })
	}
}

// receive takes the listener and the tree's stderr from the helper.
func (s *Supervisor) receive() (*os.File, error) {
	c, err := net.FileConn(s.parent)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return nil, errors.New("not a unix socket")
	}
	buf, oob := make([]byte, 1), make([]byte, unix.CmsgSpace(2*4))
	_, oobn, _, _, err := uc.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, err
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return nil, fmt.Errorf("no descriptors (%v)", err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 2 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, fmt.Errorf("want 2 descriptors (%v)", err)
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, err
	}
	unix.CloseOnExec(fds[0])
	unix.CloseOnExec(fds[1])
	s.mu.Lock()
	s.stderr = os.NewFile(uintptr(fds[1]), "confined-stderr")
	s.mu.Unlock()
	return os.NewFile(uintptr(fds[0]), "seccomp-listener"), nil
}

// decide answers one exec: refused (EACCES, named on stderr) when it runs
// an interpreter directly, a file the confinement does not allow, a
// script whose interpreter it does not allow, or a path that goes through
// /proc (which names the caller's own files, and which the supervisor
// would resolve as its own); else the kernel goes on, and Landlock has
// the last word.
func (s *Supervisor) decide(fd int, n *seccompNotif) {
	t, ok := s.execTarget(n)
	if !notifValid(fd, n.ID) {
		return
	}
	why := ""
	switch {
	case !ok:
		why = "an exec whose path cannot be read"
	case t.viaProc:
		why = t.shown + " (an exec through /proc)"
	default:
		why = s.refusal(t)
	}
	if why == "" {
		_ = notifSend(fd, n.ID, 0)
		return
	}
	s.note(why)
	_ = notifSend(fd, n.ID, syscall.EACCES)
}

// execTarget is the file an exec names: stat is a path that leads to it
// from the supervisor's side (through the caller's /proc/<pid>/cwd or fd
// link), shown the path as the caller wrote it, resolved.
type execTarget struct {
	stat, shown string
	viaProc     bool
}

// refusal says why exec of t is refused, "" when it is not.
func (s *Supervisor) refusal(t execTarget) string {
	var st unix.Stat_t
	if err := unix.Stat(t.stat, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return "" // nothing to run there: the kernel answers
	}
	k := devIno{st.Dev, st.Ino}
	if s.interp[k] && !s.allowed[k] {
		return t.shown + " (an ELF interpreter runs programs only as their interpreter)"
	}
	real, err := filepath.EvalSymlinks(t.stat)
	if err != nil {
		real = t.shown
	}
	if !s.allows(real, k) {
		return t.shown
	}
	if interp := shebang(t.stat); interp != "" {
		var ist unix.Stat_t
		if err := unix.Stat(interp, &ist); err == nil && !s.allows(interp, devIno{ist.Dev, ist.Ino}) {
			return interp + " (the interpreter of " + t.shown + ")"
		}
	}
	return ""
}

func (s *Supervisor) allows(real string, k devIno) bool {
	if s.execAll || s.allowed[k] {
		return true
	}
	for _, d := range s.execDirs {
		if Within(real, d) {
			return s.match == nil || s.match(real)
		}
	}
	return false
}

// shebang returns the interpreter a script names, "" for anything else.
func shebang(path string) string {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return ""
	}
	defer unix.Close(fd)
	buf := make([]byte, 256)
	n, _ := unix.Read(fd, buf)
	if n < 3 || !bytes.HasPrefix(buf[:n], []byte("#!")) {
		return ""
	}
	line, _, _ := bytes.Cut(buf[2:n], []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) == 0 || !filepath.IsAbs(f[0]) {
		return ""
	}
	return f[0]
}

// note remembers a refusal and writes it to the tree's stderr, once per
// path.
func (s *Supervisor) note(why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.refused {
		if r == why {
			return
		}
	}
	if len(s.refused) >= maxRefused {
		return
	}
	s.refused = append(s.refused, why)
	if s.stderr != nil {
		_, _ = s.stderr.WriteString("execmesh: exec refused by policy: " + why + "\n")
	}
}

// execTarget reads the path an execve or execveat names and finds where
// it leads for the caller: a relative path from the caller's working
// directory or directory descriptor (/proc/<pid>/cwd, /proc/<pid>/fd/N,
// which lead to the caller's own), an absolute one from the root. A path
// that is, or whose links lead, under /proc is marked viaProc: /proc/self
// would name the supervisor's files, not the caller's.
func (s *Supervisor) execTarget(n *seccompNotif) (execTarget, bool) {
	pid := strconv.Itoa(int(n.Pid))
	var ptr uint64
	base := "/proc/" + pid + "/cwd"
	emptyPath := false
	switch int(n.Data.Nr) {
	case unix.SYS_EXECVE:
		ptr = n.Data.Args[0]
	case unix.SYS_EXECVEAT:
		ptr = n.Data.Args[1]
		if dfd := int32(n.Data.Args[0]); dfd != unix.AT_FDCWD {
			base = "/proc/" + pid + "/fd/" + strconv.Itoa(int(dfd))
		}
		emptyPath = n.Data.Args[4]&unix.AT_EMPTY_PATH != 0
	default:
		return execTarget{}, false
	}
	p, err := readString(int(n.Pid), ptr)
	if err != nil {
		return execTarget{}, false
	}
	if p == "" && emptyPath {
		// The descriptor's own file: its link leads to it.
		shown, _ := os.Readlink(base)
		return execTarget{stat: base, shown: shown}, true
	}
	dir := "/"
	if !filepath.IsAbs(p) {
		// The directory by its path: the supervisor sees the same files
		// there (the caller's mounts only mask the daemon's state), and
		// ".." and links resolve from it as for the caller.
		d, err := os.Readlink(base)
		if err != nil || !filepath.IsAbs(d) {
			return execTarget{}, false
		}
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			return execTarget{}, false
		}
		dir = d
	}
	final, via := resolve(dir, p)
	return execTarget{stat: final, shown: final, viaProc: via}, true
}

// resolve follows rel from dir as the kernel does for an exec (every
// link, the last one too, and ".." after the links before it) and
// returns where it leads, and whether it met /proc on the way: rel under
// /proc, or a link whose target is. More than 40 links count as meeting
// /proc (the exec fails anyway).
func resolve(dir, rel string) (string, bool) {
	todo := strings.Split(rel, "/")
	cur := dir
	for hops := 0; len(todo) > 0; {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			cur = filepath.Dir(cur)
			continue
		}
		next := filepath.Join(cur, c)
		if next == "/proc" || strings.HasPrefix(next, "/proc/") {
			return next, true
		}
		fi, err := os.Lstat(next)
		if err != nil || fi.Mode()&os.ModeSymlink == 0 {
			cur = next
			continue
		}
		if hops++; hops > 40 {
			return next, true
		}
		target, err := os.Readlink(next)
		if err != nil {
			return next, true
		}
		if filepath.IsAbs(target) {
			cur = "/"
		}
		todo = append(strings.Split(target, "/"), todo...)
	}
	return cur, false
}

// readString reads a NUL-terminated string of at most PATH_MAX bytes from
// another process's memory, a page at a time (a read across an unmapped
// page fails).
func readString(pid int, addr uint64) (string, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/mem")
	if err != nil {
		return "", err
	}
	defer f.Close()
	const pageSize = 4096
	var out []byte
	for len(out) < unix.PathMax {
		n := pageSize - int(addr%pageSize)
		buf := make([]byte, n)
		got, err := f.ReadAt(buf, int64(addr))
		if i := bytes.IndexByte(buf[:got], 0); i >= 0 {
			return string(append(out, buf[:i]...)), nil
		}
		if err != nil {
			return "", err
		}
		out = append(out, buf[:got]...)
		addr += uint64(got)
	}
	return "", errors.New("path too long")
}
