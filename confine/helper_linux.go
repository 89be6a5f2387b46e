package confine

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"syscall"

	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

// helperMain is the helper: set up the confinement on this thread, then
// run the pipeline from it. It returns an exit status only when it could
// not replace itself with the command.
func helperMain(args []string, inUserNS bool) int {
	// Mount namespace changes, Landlock, no_new_privs and the seccomp
	// filter all belong to the calling thread; exec and fork happen from
	// it too. The thread is never unlocked, so the runtime never reuses it.
	runtime.LockOSThread()
	spec, err := decodeSpec(args)
	if err != nil {
		return setupFailed(err)
	}
	if spec.Confine && spec.UserNS && !inUserNS {
		return runInUserNS(args, spec.Supervised)
	}
	if spec.Confine {
		if err := layout(spec); err != nil {
			return setupFailed(err)
		}
		if err := dropCaps(); err != nil {
			return setupFailed(err)
		}
		if err := restrict(spec); err != nil {
			return setupFailed(err)
		}
		// Capabilities the helper needed for its mounts (ambient ones in
		// a user namespace) are not the command's.
		_ = unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
		if spec.Supervised {
			if err := superviseSelf(); err != nil {
				return setupFailed(err)
			}
		}
	}
	if len(spec.Pipeline) == 1 {
		return execInPlace(spec.Pipeline[0], spec.Supervised)
	}
	return runPipeline(spec.Pipeline, spec.Supervised)
}

// runInUserNS runs the helper's confined part in a user and mount
// namespace of its own and exits as it did. This process, started by the
// daemon and dumpable again after its exec, may write the child's id
// maps; the daemon, not dumpable, may not. It stays the session's leader
// in the same process group and terminal; the terminal's signals reach
// both, and it ends with the child's status.
func runInUserNS(args []string, supervised bool) int {
	outliveTerminalSignals()
	c := &exec.Cmd{
		Path:   "/proc/self/exe",
		Args:   append([]string{os.Args[0], nsHelperArg}, args...),
		Stdin:  os.Stdin,
		Stdout: os.Stdout,
		Stderr: os.Stderr,
	}
	c.SysProcAttr = userNSAttr()
	if supervised {
		c.ExtraFiles = []*os.File{os.NewFile(SupervisorFD, "supervisor")}
	}
	if err := c.Start(); err != nil {
		return setupFailed(fmt.Errorf("user namespace: %w", err))
	}
	if supervised {
		c.ExtraFiles[0].Close()
	}
	return exitAs(c.Wait())
}

// outliveTerminalSignals lets the helper outlive the terminal's signals,
// which its children take. They are caught, not ignored: an ignored
// signal would stay ignored in the children.
func outliveTerminalSignals() {
	signal.Notify(make(chan os.Signal, 1), syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTSTP)
}

// exitAs returns the status a process that ended with err exits with,
// after re-raising the signal that killed it, so that the daemon sees
// that signal.
func exitAs(err error) int {
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			signal.Reset(ws.Signal())
			_ = syscall.Kill(os.Getpid(), ws.Signal())
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	case err != nil:
		return ExitRefused
	}
	return 0
}

// setupFailed reports a confinement that could not be set up: nothing ran.
func setupFailed(err error) int {
	fmt.Fprintf(os.Stderr, "%s%v\n", setupErrorTag, err)
	return ExitSetup
}

// layout makes the command's view of the file system, in the helper's
// own mount namespace (mounts are made private first, so nothing
// propagates back to the daemon's):
//
//   - every directory between a write root and a hidden path beneath it
//     becomes a mount point, which cannot be renamed or removed: moving
//     a parent of the state dir aside would unmask it, and put a policy
//     of the command's own making in its place;
//   - every executable or executable tree the rules allow that lies
//     beneath a write root is bound read-only onto itself: a command
//     cannot change what it, or a later command, may run;
//   - the write roots, and Spec.NoExec (where earlier confined commands
//     wrote), are bound onto themselves noexec: nothing written there
//     can be executed or mapped as code (a planted program through the
//     ELF interpreter, a planted library through dlopen);
//   - the hidden paths are masked, last, on top of all of it;
//   - the helper enters the workdir again, through the new mounts.
func layout(spec *Spec) error {
	if err := unix.Mount("none", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	var roots []string
	for _, w := range spec.Write {
		var st unix.Stat_t
		if unix.Stat(w, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			roots = append(roots, w)
		}
	}
	for _, h := range spec.Hide {
		for _, w := range roots {
			if !Within(h, w) || h == w {
				continue
			}
			for d := filepath.Dir(h); d != w && Within(d, w); d = filepath.Dir(d) {
				if err := bindSelf(d, unix.MS_NOEXEC|unix.MS_NOSUID|unix.MS_NODEV, true); err != nil {
					return fmt.Errorf("pinning %s: %w", d, err)
				}
			}
		}
	}
	var execs []string
	for _, f := range append(append([]File(nil), spec.Exec...), spec.Interpreters...) {
		execs = append(execs, f.Path)
	}
	noexec := append(append([]string(nil), roots...), spec.NoExec...)
	for _, e := range append(execs, spec.ExecDirs...) {
		for _, w := range noexec {
			if !Within(e, w) {
				continue
			}
			if err := bindSelf(e, unix.MS_RDONLY, true); err != nil && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("pinning %s read-only: %w", e, err)
			}
			// A file with another name (a hard link made before) could
			// still be written through that name: it does not run.
			var st unix.Stat_t
			if unix.Stat(e, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG && st.Nlink > 1 {
				spec.linked = append(spec.linked, e)
			}
			break
		}
	}
	for _, w := range noexec {
		if err := bindSelf(w, unix.MS_NOEXEC|unix.MS_NOSUID|unix.MS_NODEV, true); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("making %s noexec: %w", w, err)
		}
	}
	// The masks go last, on top of every bind above: a bind of a parent
	// made after them would show what they hide.
	if err := hide(spec.Hide); err != nil {
		return err
	}
	// The working directory the helper was started in is the one under
	// all of these mounts: enter it again through them.
	workdir := spec.Workdir
	if workdir == "" {
		wd, err := os.Getwd()
		if err != nil {
			return fmt.Errorf("workdir: %w", err)
		}
		workdir = wd
	}
	if err := unix.Chdir(workdir); err != nil {
		return fmt.Errorf("workdir: %w", err)
	}
	wd, err := os.Getwd()
	if err != nil {
		return fmt.Errorf("workdir: %w", err)
	}
	if real, err := filepath.EvalSymlinks(wd); err == nil {
		wd = real
	}
	for _, h := range spec.Hide {
		if Within(wd, h) {
			return fmt.Errorf("workdir %s is inside the daemon's hidden state %s", wd, h)
		}
	}
	return nil
}

// mountFlags are the statfs flags a bind mount's remount must keep (in a
// user namespace the kernel refuses to clear them), as mount flags.
var mountFlags = []struct{ st, ms uintptr }{
	{unix.ST_RDONLY, unix.MS_RDONLY}, {unix.ST_NOSUID, unix.MS_NOSUID}, {unix.ST_NODEV, unix.MS_NODEV},
	{unix.ST_NOEXEC, unix.MS_NOEXEC}, {unix.ST_NOATIME, unix.MS_NOATIME}, {unix.ST_NODIRATIME, unix.MS_NODIRATIME},
	{unix.ST_RELATIME, unix.MS_RELATIME},
}

// bindSelf binds path onto itself (with what is mounted beneath it, rec)
// and remounts the bind with its flags kept and extra added.
func bindSelf(path string, extra uintptr, rec bool) error {
	flags := uintptr(unix.MS_BIND)
	if rec {
		flags |= unix.MS_REC
	}
	if err := unix.Mount(path, path, "", flags, ""); err != nil {
		return err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return err
	}
	keep := uintptr(0)
	for _, f := range mountFlags {
		if uintptr(st.Flags)&f.st != 0 {
			keep |= f.ms
		}
	}
	return unix.Mount("", path, "", unix.MS_REMOUNT|unix.MS_BIND|keep|extra, "")
}

// hide masks each path with an empty read-only mount: a tmpfs over a
// directory, /dev/null over anything else.
func hide(paths []string) error {
	for _, p := range paths {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return fmt.Errorf("hiding %s: %w", p, err)
		}
		var err error
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			err = unix.Mount("tmpfs", p, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=4k,nr_inodes=1,mode=0500")
		} else {
			err = unix.Mount("/dev/null", p, "", unix.MS_BIND, "")
		}
		if err != nil {
			return fmt.Errorf("hiding %s: %w", p, err)
		}
	}
	return nil
}

// Access rights the helper handles. Reading is not restricted by Landlock
// (the daemon's state is hidden by mounts instead); everything that
// creates, changes or removes a file is, and so is execution.
const (
	writeDirRights = ll.AccessFSWriteFile | ll.AccessFSRemoveDir | ll.AccessFSRemoveFile |
		ll.AccessFSMakeDir | ll.AccessFSMakeReg | ll.AccessFSMakeSock |
		ll.AccessFSMakeFifo | ll.AccessFSMakeSym | ll.AccessFSRefer |
		ll.AccessFSTruncate
	// Device nodes are made nowhere (a block device made in the workdir
	// would read the disk), so making them is handled and never granted.
	deviceRights    = ll.AccessFSMakeChar | ll.AccessFSMakeBlock
	writeFileRights = ll.AccessFSWriteFile | ll.AccessFSTruncate
)

// MinABI is the oldest Landlock ABI that can hold the rules: version 3
// adds truncation, without which any file the user can write could be
// emptied.
const MinABI = 3

// restrict applies the Landlock ruleset of spec to this thread.
func restrict(spec *Spec) error {
	abi, err := ll.LandlockGetABIVersion()
	if err != nil {
		return fmt.Errorf("landlock: %w", err)
	}
	if abi < MinABI {
		return fmt.Errorf("landlock ABI %d is older than %d", abi, MinABI)
	}
	handled := uint64(writeDirRights | deviceRights)
	if !spec.ExecAll {
		handled |= ll.AccessFSExecute
	}
	if abi >= 5 {
		// ioctl on a device opened by path (TIOCSTI into another
		// terminal) only where a write root allows it: the sinks and
		// the command's own terminal.
		handled |= ll.AccessFSIoctlDev
	}
	attr := ll.RulesetAttr{HandledAccessFS: handled}
	if abi >= 6 {
		// Signals only within the tree: no signal to the daemon or to
		// anything else outside the confinement.
		attr.Scoped = ll.ScopeSignal
	}
	rs, err := ll.LandlockCreateRuleset(&attr, 0)
	if err != nil {
		return fmt.Errorf("landlock: create ruleset: %w", err)
	}
	defer unix.Close(rs)
	if !spec.ExecAll {
		for _, f := range append(append([]File(nil), spec.Exec...), spec.Interpreters...) {
			if slices.Contains(spec.linked, f.Path) {
				fmt.Fprintf(os.Stderr, "execmesh: exec refused by policy: %s (it has another name a command may write)\n", f.Path)
				continue
			}
			if err := addRule(rs, f, ll.AccessFSExecute, false); err != nil {
				return err
			}
		}
		for _, d := range spec.ExecDirs {
			if err := addRule(rs, File{Path: d}, ll.AccessFSExecute, true); err != nil {
				return err
			}
		}
	}
	for _, w := range spec.Write {
		if err := addRule(rs, File{Path: w, exact: true}, (writeDirRights|ll.AccessFSIoctlDev)&handled, true); err != nil {
			return err
		}
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	if err := ll.LandlockRestrictSelf(rs, 0); err != nil {
		return fmt.Errorf("landlock: restrict: %w", err)
	}
	return nil
}

// addRule grants rights on one file or directory tree. A file bound to an
// inode that its path no longer names gets no rule: a file put in the
// place of an approved one is not approved. A missing path gets none
// either (nothing there to run or write). Directory rights on a file are
// cut to the file's.
func addRule(rs int, f File, rights uint64, tree bool) error {
	fd, err := unix.Open(f.Path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("landlock: %s: %w", f.Path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("landlock: %s: %w", f.Path, err)
	}
	if f.Ino != 0 && (st.Dev != f.Dev || st.Ino != f.Ino) {
		return nil
	}
	if f.exact && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		// The daemon checked this directory by its real path; a rename
		// in that path since (a directory swapped for a link to /etc by
		// a command racing the check) must not move the rule elsewhere.
		// The rule is bound to the descriptor, so its real path is what
		// is granted.
		real, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
		if err != nil {
			return fmt.Errorf("landlock: %s: %w", f.Path, err)
		}
		if real != filepath.Clean(f.Path) {
			return fmt.Errorf("write root %s leads to %s now; it changed since it was checked", f.Path, real)
		}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		if tree {
			rights &= writeFileRights | ll.AccessFSExecute | ll.AccessFSIoctlDev
		}
		if rights == 0 {
			return nil
		}
	}
	attr := ll.PathBeneathAttr{ParentFd: fd, AllowedAccess: rights}
	if err := ll.LandlockAddPathBeneathRule(rs, &attr, 0); err != nil {
		return fmt.Errorf("landlock: rule for %s: %w", f.Path, err)
	}
	return nil
}

// execInPlace replaces the helper with the command.
func execInPlace(argv []string, supervised bool) int {
	err := syscall.Exec(argv[0], argv, os.Environ())
	return execFailed(argv[0], err, supervised)
}

// execFailed reports an exec that failed and returns the shell's status
// for it. Under a supervisor the refusal was already named on stderr.
func execFailed(path string, err error, supervised bool) int {
	switch {
	case errors.Is(err, syscall.ENOENT):
		fmt.Fprintf(os.Stderr, "execmesh: %s: not found\n", path)
		return ExitNotFound
	case errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM):
		if !supervised {
			fmt.Fprintf(os.Stderr, "execmesh: exec refused by policy: %s\n", path)
		}
		return ExitRefused
	}
	fmt.Fprintf(os.Stderr, "execmesh: %s: %v\n", path, err)
	return ExitRefused
}

// runPipeline runs the segments with pipes between them, as a shell runs
// a pipeline, and exits as the last segment did (re-raising its signal).
// Every child is forked from this locked thread, so it inherits the
// confinement.
func runPipeline(segs [][]string, supervised bool) int {
	// The children take the terminal's signals themselves (one process
	// group); the helper outlives them only to report the last.
	outliveTerminalSignals()
	cmds := make([]*exec.Cmd, len(segs))
	lastCode := 0
	prev := os.Stdin
	for i, argv := range segs {
		last := i == len(segs)-1
		stdout, next := os.Stdout, (*os.File)(nil)
		if !last {
			r, w, err := os.Pipe()
			if err != nil {
				return setupFailed(err)
			}
			stdout, next = w, r
		}
		c := &exec.Cmd{Path: argv[0], Args: argv, Stdin: prev, Stdout: stdout, Stderr: os.Stderr}
		err := c.Start()
		// The children hold their ends now; the helper keeps none, so
		// each reader sees EOF when its writer is gone.
		if i > 0 {
			prev.Close()
		}
		if !last {
			stdout.Close()
		}
		if err != nil {
			// A segment that cannot start reads and writes nothing, as
			// in a shell: its neighbours see EOF and a closed pipe.
			lastCode = execFailed(argv[0], err, supervised)
			c = nil
		}
		cmds[i], prev = c, next
	}
	for _, c := range cmds[:len(cmds)-1] {
		if c != nil {
			_ = c.Wait()
		}
	}
	last := cmds[len(cmds)-1]
	if last == nil {
		return lastCode
	}
	return exitAs(last.Wait())
}
