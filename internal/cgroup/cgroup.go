// Package cgroup is the part of the cgroup v2 file system that the session
// core uses: finding the v2 hierarchy and this process's place in it
// (/proc/self/mountinfo, /proc/self/cgroup, so hybrid layouts with v2 at
// /sys/fs/cgroup/unified work too), creating and removing groups, enabling
// controllers in a subtree, reading cgroup.events, cgroup.procs, cpu.stat,
// memory.peak, pids.peak and memory.events, writing limits, cgroup.kill,
// and watching many groups' cgroup.events with one inotify descriptor.
//
// It never writes to a cgroup v1 hierarchy: every path it touches lies
// below the cgroup2 mount it found.
//
// Why not a library: opencontainers/cgroups assumes a unified hierarchy at
// /sys/fs/cgroup (its fs2 package refuses or misplaces paths elsewhere),
// and containerd/cgroups' cgroup2 manager enables controllers in every
// ancestor up to the mount root (outside a delegated subtree) and watches
// events with an inotify descriptor and a goroutine per group; both bring
// eBPF, D-Bus and protobuf dependencies. What the session core needs is a
// few dozen lines of file I/O.
package cgroup

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrNoV2 means no cgroup v2 hierarchy is mounted.
var ErrNoV2 = errors.New("no cgroup v2 hierarchy is mounted")

// removedError is what a read or write of a group's file opened before
// the group was removed fails with: kernfs answers ENODEV where an open
// made after the rmdir would have answered ENOENT. It is fs.ErrNotExist
// (and unix.ENODEV), so that one test covers "the group is gone" however
// the removal fell between the open and the read.
type removedError struct{}

func (removedError) Error() string { return "group removed (no such device)" }

func (removedError) Is(target error) bool {
	return target == fs.ErrNotExist || target == unix.ENODEV
}

// fileError is the *os.PathError of op on path, with ENODEV made a
// removedError. An open can fail so too: kernfs refuses it once the
// group is removed, even when the path was still found.
func fileError(op, path string, err error) error {
	if errors.Is(err, unix.ENODEV) {
		err = removedError{}
	}
	return &os.PathError{Op: op, Path: path, Err: err}
}

// osFileError is fileError for an error of the os package.
func osFileError(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return fileError(pe.Op, pe.Path, pe.Err)
	}
	return err
}

// Dir is a cgroup v2 directory: its path in the file system and its path
// relative to the hierarchy's root as /proc/<pid>/cgroup shows it.
type Dir struct {
	Path string // absolute file system path, e.g. /sys/fs/cgroup/unified/execmesh-1
	Rel  string // hierarchy path, e.g. /execmesh-1
}

// Self finds the cgroup v2 mount and returns the calling process's own
// cgroup directory.
func Self() (Dir, error) {
	mi, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return Dir{}, err
	}
	defer mi.Close()
	mountpoint, root, err := ParseMountinfo(mi)
	if err != nil {
		return Dir{}, err
	}
	cg, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return Dir{}, err
	}
	rel, err := ParseProcCgroup(cg)
	if err != nil {
		return Dir{}, err
	}
	return Resolve(mountpoint, root, rel)
}

// Resolve maps a hierarchy path (from /proc/<pid>/cgroup) onto the file
// system, given the cgroup2 mount point and the mount's root (the fourth
// field of its mountinfo line: "/" unless a subtree is bind-mounted).
func Resolve(mountpoint, root, rel string) (Dir, error) {
	rel = path.Clean("/" + rel)
	root = path.Clean("/" + root)
	sub := rel
	if root != "/" {
		if rel != root && !strings.HasPrefix(rel, root+"/") {
			return Dir{}, fmt.Errorf("cgroup %s lies outside the mounted cgroup2 subtree %s", rel, root)
		}
		sub = "/" + strings.TrimPrefix(strings.TrimPrefix(rel, root), "/")
	}
	return Dir{Path: filepath.Join(mountpoint, sub), Rel: rel}, nil
}

// ParseMountinfo returns the mount point and root of the first cgroup2
// mount in a /proc/<pid>/mountinfo listing.
func ParseMountinfo(r io.Reader) (mountpoint, root string, err error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source superopts
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if sep < 5 || sep+1 >= len(fields) || fields[sep+1] != "cgroup2" {
			continue
		}
		return unescapeMount(fields[4]), unescapeMount(fields[3]), nil
	}
	if err := sc.Err(); err != nil {
		return "", "", err
	}
	return "", "", ErrNoV2
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// ParseProcCgroup returns the cgroup v2 path ("0::<path>") of a
// /proc/<pid>/cgroup file.
func ParseProcCgroup(b []byte) (string, error) {
	for line := range bytes.Lines(b) {
		if rest, ok := bytes.CutPrefix(line, []byte("0::")); ok {
			return string(bytes.TrimRight(rest, "\n")), nil
		}
	}
	return "", errors.New("no cgroup v2 entry (0::) in /proc/self/cgroup")
}

// Child returns the directory of the child group name (not created).
func (d Dir) Child(name string) Dir {
	return Dir{Path: filepath.Join(d.Path, name), Rel: path.Join(d.Rel, name)}
}

// Subtree returns the group and every group below it, parents before
// their children (remove them in reverse order).
func (d Dir) Subtree() []Dir {
	out := []Dir{d}
	for i := 0; i < len(out); i++ {
		ents, err := os.ReadDir(out[i].Path)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if e.IsDir() {
				out = append(out, out[i].Child(e.Name()))
			}
		}
	}
	return out
}

// RemoveSubtree removes the group and the groups below it, deepest first.
func (d Dir) RemoveSubtree() error {
	dirs := d.Subtree()
	var errs []error
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := dirs[i].Remove(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Parent returns the directory of the parent group.
func (d Dir) Parent() Dir {
	return Dir{Path: filepath.Dir(d.Path), Rel: path.Dir(d.Rel)}
}

// Name returns the last element of the group's path.
func (d Dir) Name() string { return path.Base(d.Rel) }

// Create makes the group (mode 0755). An existing group is an error
// wrapping fs.ErrExist.
func (d Dir) Create() error { return os.Mkdir(d.Path, 0o755) }

// Remove removes the group, which must have neither live processes nor
// children. A group that is already gone is not an error.
func (d Dir) Remove() error {
	err := unix.Rmdir(d.Path)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	return &os.PathError{Op: "rmdir", Path: d.Path, Err: err}
}

// Exists reports whether the group's directory exists.
func (d Dir) Exists() bool {
	_, err := os.Stat(filepath.Join(d.Path, "cgroup.procs"))
	return err == nil
}

// OpenFD opens the group's directory for clone3's CLONE_INTO_CGROUP
// (syscall.SysProcAttr.CgroupFD). The caller closes it.
func (d Dir) OpenFD() (int, error) {
	fd, err := unix.Open(d.Path, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: d.Path, Err: err}
	}
	return fd, nil
}

// read returns the contents of one of the group's files.
func (d Dir) read(file string) ([]byte, error) {
	return readSmall(d.Path + "/" + file)
}

// readSmall reads a small pseudo-file with three system calls (os.ReadFile
// also stats it and offers it to the poller, and a read loop asks once
// more to see the end), which matters on the kill path of thousands of
// sessions. The files it reads (cgroupfs and /proc) are seq_files, which
// fill a read up to its size while records remain: a read shorter than
// the buffer (of less than a page, with records of a few dozen bytes) is
// the end. Longer files are read whole.
func readSmall(path string) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	for err == unix.EINTR {
		fd, err = unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return nil, fileError("open", path, err)
	}
	defer unix.Close(fd)
	var buf [1024]byte
	var out []byte
	for {
		n, err := unix.Read(fd, buf[:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, fileError("read", path, err)
		}
		if n == 0 {
			return out, nil
		}
		if out == nil && n < len(buf) {
			// The common case: all of it in one read.
			return append(make([]byte, 0, n), buf[:n]...), nil
		}
		out = append(out, buf[:n]...)
	}
}

// Write writes value to one of the group's files (limits, cgroup.kill,
// cgroup.subtree_control, cgroup.procs).
func (d Dir) Write(file, value string) error {
	f, err := os.OpenFile(filepath.Join(d.Path, file), os.O_WRONLY, 0)
	if err != nil {
		return osFileError(err)
	}
	_, werr := f.WriteString(value)
	cerr := f.Close()
	if werr != nil {
		return fmt.Errorf("write %q: %w", value, osFileError(werr))
	}
	return cerr
}

// Populated reads "populated" from cgroup.events: whether a live process
// is in the group or any group below it. Zombies do not count.
func (d Dir) Populated() (bool, error) {
	b, err := d.read("cgroup.events")
	if err != nil {
		return false, err
	}
	v, ok := keyed(b, "populated")
	if !ok {
		return false, fmt.Errorf("%s/cgroup.events has no populated line", d.Path)
	}
	return v != 0, nil
}

// Procs lists the processes of the group itself (not of groups below).
func (d Dir) Procs() ([]int, error) {
	b, err := d.read("cgroup.procs")
	if err != nil {
		return nil, err
	}
	var out []int
	for line := range bytes.Lines(b) {
		if pid, err := strconv.Atoi(string(bytes.TrimSpace(line))); err == nil && pid > 0 {
			out = append(out, pid)
		}
	}
	return out, nil
}

// Kill writes cgroup.kill: SIGKILL to every process of the group and the
// groups below it, atomically with respect to forks (kernel 5.14+).
func (d Dir) Kill() error { return d.Write("cgroup.kill", "1") }

// MoveSelf moves the calling process (all its threads) into the group.
func (d Dir) MoveSelf() error { return d.Write("cgroup.procs", "0") }

// Controllers lists the controllers available to the group
// (cgroup.controllers).
func (d Dir) Controllers() ([]string, error) {
	b, err := d.read("cgroup.controllers")
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(b)), nil
}

// SubtreeControl lists the controllers enabled for the group's children.
func (d Dir) SubtreeControl() ([]string, error) {
	b, err := d.read("cgroup.subtree_control")
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(b)), nil
}

// EnableControllers enables each of names that the group has for its
// children, one at a time so that one refusal does not stop the others,
// and returns the controllers enabled afterwards.
func (d Dir) EnableControllers(names ...string) ([]string, error) {
	have, err := d.Controllers()
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, n := range names {
		if !slices.Contains(have, n) {
			continue
		}
		if err := d.Write("cgroup.subtree_control", "+"+n); err != nil {
			errs = append(errs, err)
		}
	}
	on, err := d.SubtreeControl()
	if err != nil {
		errs = append(errs, err)
	}
	return on, errors.Join(errs...)
}

// Delegated reports whether the group was delegated to its owner by
// systemd (Delegate=yes): systemd 251 and later mark such groups with the
// trusted.delegate (system services) or user.delegate (user services)
// extended attribute "1".
func (d Dir) Delegated() bool {
	for _, attr := range []string{"trusted.delegate", "user.delegate"} {
		var buf [8]byte
		if n, err := unix.Getxattr(d.Path, attr, buf[:]); err == nil && string(buf[:n]) == "1" {
			return true
		}
	}
	return false
}

// OwnedBy reports whether the group's directory belongs to uid, as a
// group delegated to an unprivileged user's service does (systemd chowns
// it; such a process cannot read trusted.* attributes).
func (d Dir) OwnedBy(uid int) bool {
	var st unix.Stat_t
	return unix.Stat(d.Path, &st) == nil && int(st.Uid) == uid
}

// CPUStat reads user_usec and system_usec from cpu.stat, which exists in
// every v2 group even without the cpu controller.
func (d Dir) CPUStat() (userUsec, systemUsec uint64, err error) {
	b, err := d.read("cpu.stat")
	if err != nil {
		return 0, 0, err
	}
	return parseCPUStat(d, b)
}

func parseCPUStat(d Dir, b []byte) (userUsec, systemUsec uint64, err error) {
	u, ok1 := keyed(b, "user_usec")
	s, ok2 := keyed(b, "system_usec")
	if !ok1 || !ok2 {
		return 0, 0, fmt.Errorf("%s/cpu.stat lacks user_usec or system_usec", d.Path)
	}
	return u, s, nil
}

// Uint reads a file holding one number (memory.peak, pids.peak,
// pids.current); ok is false when the file is missing (the controller is
// not enabled, or the kernel is too old) or holds "max".
func (d Dir) Uint(file string) (v uint64, ok bool) {
	b, err := d.read(file)
	if err != nil {
		return 0, false
	}
	v, err = strconv.ParseUint(string(bytes.TrimSpace(b)), 10, 64)
	return v, err == nil
}

// Event reads one counter of a keyed file such as memory.events
// ("oom_kill"); ok is false when the file or key is missing.
func (d Dir) Event(file, key string) (v uint64, ok bool) {
	b, err := d.read(file)
	if err != nil {
		return 0, false
	}
	return keyed(b, key)
}

// keyed finds "key value" in a flat-keyed cgroup file.
func keyed(b []byte, key string) (uint64, bool) {
	for line := range bytes.Lines(b) {
		k, v, ok := bytes.Cut(bytes.TrimSpace(line), []byte(" "))
		if !ok || string(k) != key {
			continue
		}
		n, err := strconv.ParseUint(string(v), 10, 64)
		return n, err == nil
	}
	return 0, false
}

// Member reports whether process pid is in the group itself, by its
// /proc/<pid>/cgroup.
func (d Dir) Member(pid int) bool {
	b, err := readSmall("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return false
	}
	rel, err := ParseProcCgroup(b)
	return err == nil && rel == d.Rel
}

// Descendants returns the number of live groups below the group
// (nr_descendants in cgroup.stat); an unreadable file counts as one, so
// that callers look.
func (d Dir) Descendants() uint64 {
	n, ok := d.Event("cgroup.stat", "nr_descendants")
	if !ok {
		return 1
	}
	return n
}

// HasChildren reports whether groups exist below the group, from the
// link count of its directory (a directory of cgroupfs counts 2 plus its
// subdirectories, and only groups are subdirectories): one stat, where
// Descendants reads and formats cgroup.stat. An unreadable directory
// counts as having some, so that callers look.
func (d Dir) HasChildren() bool {
	var st unix.Stat_t
	for {
		err := unix.Stat(d.Path, &st)
		if err == unix.EINTR {
			continue
		}
		return err != nil || st.Nlink != 2
	}
}

// Signal sends each of sigs, in order, to every process of the group
// itself, skipping the pids in skip. Each pid read from cgroup.procs is
// pinned with a pidfd and checked to be in the group still before it is
// signalled, so a pid reused meanwhile by a process elsewhere is never
// hit. It returns the pids signalled and how many cgroup.procs listed
// (those in skip included).
func (d Dir) Signal(skip map[int]bool, sigs ...unix.Signal) (sent []int, listed int, err error) {
	pids, err := d.Procs()
	if err != nil {
		return nil, 0, err
	}
	var errs []error
	for _, pid := range pids {
		if skip[pid] {
			continue
		}
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue // gone
		}
		if d.Member(pid) {
			for i, sig := range sigs {
				err := unix.PidfdSendSignal(fd, sig, nil, 0)
				switch {
				case err == nil && i == 0:
					sent = append(sent, pid)
				case err != nil && !errors.Is(err, unix.ESRCH):
					errs = append(errs, fmt.Errorf("signal %d: %w", pid, err))
				}
			}
		}
		unix.Close(fd)
	}
	return sent, len(pids), errors.Join(errs...)
}
