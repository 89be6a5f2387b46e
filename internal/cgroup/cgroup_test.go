package cgroup

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestParseMountinfo(t *testing.T) {
	hybrid := `31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`
	unified := `24 30 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate
`
	bound := `50 40 0:22 /docker/abc /sys/fs/cgroup ro,relatime master:1 - cgroup2 cgroup rw
`
	spaced := `41 31 0:38 / /mnt/my\040cg rw - cgroup2 cgroup2 rw
`
	for _, tc := range []struct{ name, in, mount, root string }{
		{"hybrid", hybrid, "/sys/fs/cgroup/unified", "/"},
		{"unified", unified, "/sys/fs/cgroup", "/"},
		{"bind-mounted subtree", bound, "/sys/fs/cgroup", "/docker/abc"},
		{"escaped", spaced, "/mnt/my cg", "/"},
	} {
		mount, root, err := ParseMountinfo(strings.NewReader(tc.in))
		if err != nil || mount != tc.mount || root != tc.root {
			t.Errorf("%s: %q %q %v", tc.name, mount, root, err)
		}
	}
	if _, _, err := ParseMountinfo(strings.NewReader("35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n")); err != ErrNoV2 {
		t.Errorf("v1 only: %v", err)
	}
}

func TestParseProcCgroupAndResolve(t *testing.T) {
	rel, err := ParseProcCgroup([]byte("9:name=systemd:/\n4:memory:/x\n0::/system.slice/execmesh.service\n"))
	if err != nil || rel != "/system.slice/execmesh.service" {
		t.Fatalf("%q %v", rel, err)
	}
	if _, err := ParseProcCgroup([]byte("4:memory:/x\n")); err == nil {
		t.Error("no v2 line accepted")
	}
	d, err := Resolve("/sys/fs/cgroup", "/", rel)
	if err != nil || d.Path != "/sys/fs/cgroup/system.slice/execmesh.service" || d.Rel != rel {
		t.Errorf("resolve: %+v %v", d, err)
	}
	d, err = Resolve("/sys/fs/cgroup", "/docker/abc", "/docker/abc/sub")
	if err != nil || d.Path != "/sys/fs/cgroup/sub" {
		t.Errorf("resolve below a bound root: %+v %v", d, err)
	}
	if _, err := Resolve("/sys/fs/cgroup", "/docker/abc", "/other"); err == nil {
		t.Error("a group outside the mounted subtree resolved")
	}
	if c := d.Child("s1"); c.Rel != "/docker/abc/sub/s1" || c.Name() != "s1" || c.Parent() != d {
		t.Errorf("child: %+v", c)
	}
}

func TestKeyed(t *testing.T) {
	b := []byte("usage_usec 120\nuser_usec 100\nsystem_usec 20\n")
	if v, ok := keyed(b, "user_usec"); !ok || v != 100 {
		t.Errorf("user_usec %d %v", v, ok)
	}
	if _, ok := keyed(b, "user"); ok {
		t.Error("prefix matched")
	}
}

// testGroup makes a group below the process's own, removed at the end;
// the test is skipped where that is not allowed.
func testGroup(t *testing.T) Dir {
	t.Helper()
	self, err := Self()
	if err != nil {
		t.Skipf("no cgroup v2 here: %v", err)
	}
	d := self.Child("cgtest-" + strings.ReplaceAll(t.Name(), "/", "-") + "-" + time.Now().Format("150405.000000"))
	if err := d.Create(); err != nil {
		t.Skipf("cannot create a cgroup below %s: %v", self.Path, err)
	}
	t.Cleanup(func() {
		_ = d.Kill()
		// Hundreds of killed processes can take seconds to exit on a
		// loaded machine; the group stays busy until the last one has.
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if p, err := d.Populated(); err != nil || !p {
				break
			}
		}
		if err := d.Remove(); err != nil {
			t.Errorf("remove: %v", err)
		}
	})
	return d
}

// TestGroupLifecycle clones a process into a group and watches it: the
// process is a member, populated follows it, a pid elsewhere is never
// signalled, cpu.stat counts, cgroup.kill ends it.
func TestGroupLifecycle(t *testing.T) {
	d := testGroup(t)
	w, err := NewWatcher()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	changed := make(chan struct{}, 10)
	stop, err := w.Watch(d, func() { changed <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	fd, err := d.OpenFD()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; exec sleep 600")
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("no event when the group became populated")
	}
	if !d.Member(cmd.Process.Pid) {
		t.Fatal("the child is not in its group")
	}
	if p, err := d.Populated(); err != nil || !p {
		t.Fatalf("populated %v %v", p, err)
	}
	if d.Member(os.Getpid()) {
		t.Fatal("the test process counts as a member")
	}
	// Signal skips what is not a member; our own pid is never one.
	if n := d.Descendants(); n != 0 || d.HasChildren() {
		t.Errorf("descendants %d, has children %v", n, d.HasChildren())
	}
	if pids, listed, err := d.Signal(nil, 0); err != nil || len(pids) != 1 || pids[0] != cmd.Process.Pid || listed != 1 {
		t.Fatalf("signal 0: %v (%d listed) %v", pids, listed, err)
	}
	time.Sleep(200 * time.Millisecond)
	if u, s, err := d.CPUStat(); err != nil || u+s == 0 {
		t.Errorf("cpu.stat user %d system %d %v", u, s, err)
	}
	if err := d.Kill(); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(10 * time.Second)
	for {
		if p, _ := d.Populated(); !p {
			break
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatal("still populated after cgroup.kill")
		}
	}
	_ = cmd.Wait()
	if pids, _ := d.Procs(); len(pids) != 0 {
		t.Errorf("procs after kill: %v", pids)
	}
}

// TestHasChildren: the link count of a group's directory follows the
// groups created and removed below it, as nr_descendants does.
func TestHasChildren(t *testing.T) {
	d := testGroup(t)
	if d.HasChildren() || d.Descendants() != 0 {
		t.Fatal("a new group has children")
	}
	a, b := d.Child("a"), d.Child("b")
	for _, c := range []Dir{a, b} {
		if err := c.Create(); err != nil {
			t.Fatal(err)
		}
	}
	deep := a.Child("deep")
	if err := deep.Create(); err != nil {
		t.Fatal(err)
	}
	if !d.HasChildren() || d.Descendants() != 3 || !a.HasChildren() || b.HasChildren() {
		t.Fatalf("with children: %v %d %v %v", d.HasChildren(), d.Descendants(), a.HasChildren(), b.HasChildren())
	}
	if err := d.Child("a").RemoveSubtree(); err != nil {
		t.Fatal(err)
	}
	if !d.HasChildren() {
		t.Fatal("one child left, none seen")
	}
	if err := b.Remove(); err != nil {
		t.Fatal(err)
	}
	if d.HasChildren() || d.Descendants() != 0 {
		t.Fatal("children seen after their removal")
	}
	if !d.Child("missing").HasChildren() {
		t.Fatal("an unreadable group does not say look")
	}
}

func TestEnableControllersNeverFails(t *testing.T) {
	d := testGroup(t)
	have, _ := d.Controllers()
	on, err := d.EnableControllers("cpu", "memory", "pids")
	for _, c := range on {
		if !strings.Contains(" "+strings.Join(have, " ")+" ", " "+c+" ") {
			t.Errorf("enabled %s, which the group does not have (%v)", c, have)
		}
	}
	t.Logf("available %v, enabled %v, err %v", have, on, err)
}

// TestFiles: the kept files read what the group's files say now, each
// read renders anew (populated follows a member, cpu.stat grows), the
// directory descriptor clones into the group, and Close closes them.
func TestFiles(t *testing.T) {
	d := testGroup(t)
	f, err := OpenFiles(d)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var buf [256]byte
	populated := func() bool {
		b, err := f.Events(buf[:])
		if err != nil {
			t.Fatal(err)
		}
		return strings.Contains(string(b), "populated 1\n")
	}
	if populated() {
		t.Fatal("a new group is populated")
	}
	u0, s0, err := f.CPUStat()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; exec sleep 600")
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: f.DirFD()}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	if !d.Member(cmd.Process.Pid) || !populated() {
		t.Fatal("the child is not in the group, or the kept cgroup.events does not say so")
	}
	time.Sleep(200 * time.Millisecond)
	if u, s, err := f.CPUStat(); err != nil || u+s <= u0+s0 {
		t.Fatalf("cpu.stat %d+%d after the loop, %d+%d before (%v)", u, s, u0, s0, err)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	for deadline := time.Now().Add(5 * time.Second); populated(); {
		if time.Now().After(deadline) {
			t.Fatal("the kept cgroup.events still says populated after the exit")
		}
		time.Sleep(10 * time.Millisecond)
	}
	f.Close()
	if _, _, err := f.CPUStat(); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("CPUStat after Close: %v", err)
	}
}

// TestReadSmall: a pseudo-file is read whole, in one read when it is
// short and in several when it is longer than the buffer.
func TestReadSmall(t *testing.T) {
	for _, path := range []string{"/proc/self/cgroup", "/proc/self/status", "/proc/self/maps", "/proc/self/mountinfo"} {
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		got, err := readSmall(path)
		if err != nil {
			t.Fatal(err)
		}
		// maps and mountinfo can change between the reads; their size
		// is what matters here.
		if len(got) < len(want)/2 || (path == "/proc/self/cgroup" && string(got) != string(want)) {
			t.Errorf("%s: read %d bytes, os.ReadFile %d", path, len(got), len(want))
		}
	}
	if _, err := readSmall("/proc/self/no-such-file"); !os.IsNotExist(err) {
		t.Errorf("missing file: %v", err)
	}
}

// TestProcsLongerThanARead: cgroup.procs of a group with more pids than
// one read of readSmall holds lists every one of them.
func TestProcsLongerThanARead(t *testing.T) {
	d := testGroup(t)
	fd, err := d.OpenFD()
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	// One shell that forks 300 sleeps into the group (pids of 5-7
	// digits: well over 1024 bytes).
	cmd := exec.Command("sh", "-c", "i=0; while [ $i -lt 300 ]; do sleep 600 & i=$((i+1)); done; wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = d.Kill(); _ = cmd.Wait() }()
	var pids []int
	for deadline := time.Now().Add(20 * time.Second); len(pids) < 301; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d processes listed, want 301", len(pids))
		}
		if pids, err = d.Procs(); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := os.ReadFile(d.Path + "/cgroup.procs")
	if n := strings.Count(string(b), "\n"); n != len(pids) || len(b) <= 1024 {
		t.Fatalf("os.ReadFile lists %d pids in %d bytes, Procs %d", n, len(b), len(pids))
	}
}

// TestRemovedGroupIsNotExist: a file of a group opened before the group
// is removed fails with ENODEV, not ENOENT, when it is read or written
// after; the package reports both as fs.ErrNotExist, so that a kill or a
// signal pass racing the group's removal sees "gone", not a failure.
func TestRemovedGroupIsNotExist(t *testing.T) {
	d := testGroup(t)
	files, err := OpenFiles(d)
	if err != nil {
		t.Fatal(err)
	}
	defer files.Close()
	procs, err := unix.Open(d.Path+"/cgroup.procs", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(procs)
	kill, err := unix.Open(d.Path+"/cgroup.kill", unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(kill)
	if err := d.Remove(); err != nil {
		t.Fatal(err)
	}

	// What the kernel says, which the rest relies on.
	var buf [64]byte
	_, rerr := unix.Read(procs, buf[:])
	_, werr := unix.Write(kill, []byte("1"))
	if rerr != unix.ENODEV || werr != unix.ENODEV {
		t.Fatalf("read and write after the rmdir: %v, %v; want ENODEV", rerr, werr)
	}
	for _, err := range []error{
		fileError("read", d.Path+"/cgroup.procs", rerr),
		fileError("write", d.Path+"/cgroup.kill", werr),
		fileError("open", d.Path+"/cgroup.procs", unix.ENODEV),
		osFileError(&os.PathError{Op: "write", Path: d.Path + "/cgroup.kill", Err: werr}),
		func() error { _, _, err := files.CPUStat(); return err }(),
		func() error { _, err := files.Events(buf[:]); return err }(),
	} {
		if !errors.Is(err, fs.ErrNotExist) || !errors.Is(err, unix.ENODEV) || !strings.Contains(err.Error(), d.Path) {
			t.Errorf("%v: not fs.ErrNotExist and ENODEV with the path", err)
		}
	}
	// An open after the removal is ENOENT, as before.
	if _, err := d.Procs(); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Procs of a removed group: %v", err)
	}
	if err := d.Kill(); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Kill of a removed group: %v", err)
	}
	// Other errors are left as they are.
	if err := fileError("read", "x", unix.EIO); errors.Is(err, fs.ErrNotExist) || !errors.Is(err, unix.EIO) {
		t.Errorf("EIO: %v", err)
	}
}
