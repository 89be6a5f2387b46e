package integration

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/protocol"
)

// fltMountNS is a private mount namespace, held by a sleeping process,
// in which the state dir is a small tmpfs: a daemon runs there (nsenter,
// the same tmpfs over restarts) and the test fills it or makes it
// read-only without touching the machine's mounts.
type fltMountNS struct {
	t      *testing.T
	state  string
	holder *exec.Cmd
}

// newFltMountNS makes the namespace and its tmpfs of size, and returns
// the prefix that runs a daemon there.
func newFltMountNS(t *testing.T, size string) (*fltMountNS, []string) {
	t.Helper()
	fltRoot(t, "a private mount namespace")
	for _, bin := range []string{"unshare", "nsenter", "mount"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("SKIPPING FAULT TEST: %s is not installed", bin)
		}
	}
	m := &fltMountNS{t: t, state: filepath.Join(t.TempDir(), "state")}
	if err := os.MkdirAll(m.state, 0o700); err != nil {
		t.Fatal(err)
	}
	m.holder = exec.Command("unshare", "-m", "--propagation", "private", "sh", "-c",
		fmt.Sprintf(`mount -t tmpfs -o size=%s,mode=0700 execmesh-test %q && echo ready && exec sleep 100000`, size, m.state))
	out, err := m.holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	m.holder.Stderr = os.Stderr
	if err := m.holder.Start(); err != nil {
		t.Skipf("SKIPPING FAULT TEST: cannot make a mount namespace: %v", err)
	}
	t.Cleanup(func() {
		_ = m.holder.Process.Kill()
		_ = m.holder.Wait()
	})
	line := make([]byte, 6)
	if _, err := io.ReadFull(out, line); err != nil || string(line) != "ready\n" {
		t.Skipf("SKIPPING FAULT TEST: cannot mount a tmpfs in a mount namespace: %v %q", err, line)
	}
	return m, []string{"nsenter", "-t", fmt.Sprint(m.holder.Process.Pid), "-m", "--"}
}

// in runs a command in the namespace.
func (m *fltMountNS) in(args ...string) (string, error) {
	out, err := exec.Command("nsenter", append([]string{"-t", fmt.Sprint(m.holder.Process.Pid), "-m", "--"}, args...)...).CombinedOutput()
	return string(out), err
}

// TestFaultStateDirFull: the state dir of `execmesh
// up` (its JetStream store and session records) fills up while
// gateway-host and node sessions run; see testStateDirFault.
func TestFaultStateDirFull(t *testing.T) {
	testStateDirFault(t, "full", fillStateDir, emptyStateDir, false)
}

// TestFaultStateDirFullOverRestarts: as
// TestFaultStateDirFull, but the daemon is restarted once more while the
// state dir is still full, so the reports of what the first run could
// not store cannot be stored either: they must come after the heal.
func TestFaultStateDirFullOverRestarts(t *testing.T) {
	testStateDirFault(t, "full", fillStateDir, emptyStateDir, true)
}

func fillStateDir(m *fltMountNS) (string, error) {
	return m.in("sh", "-c", fmt.Sprintf("dd if=/dev/zero of=%s/fill bs=1M 2>&1; df -h %s", m.state, m.state))
}

func emptyStateDir(m *fltMountNS) (string, error) {
	return m.in("rm", "-f", filepath.Join(m.state, "fill"))
}

// TestFaultStateDirReadOnly: the state dir of `execmesh
// up` becomes read-only while gateway-host and node sessions run; see
// testStateDirFault. The kernel refuses `mount -o remount,ro` of a file
// system with files open for writing (the JetStream blocks), so a
// read-only bind mount of the tmpfs is put over it: every file opened
// from then on (session records, JetStream's new blocks and state files)
// is read-only, files open already stay writable. Removing the bind
// mount heals it.
func TestFaultStateDirReadOnly(t *testing.T) {
	testStateDirFault(t, "read-only",
		func(m *fltMountNS) (string, error) {
			return m.in("sh", "-c", fmt.Sprintf("mount --bind %[1]q %[1]q && mount -o remount,bind,ro %[1]q && grep %[1]q /proc/self/mounts", m.state))
		},
		func(m *fltMountNS) (string, error) { return m.in("umount", m.state) }, false)
}

// testStateDirFault: a fault of the state dir of `execmesh up` (its
// JetStream store and session records) comes while gateway-host and node
// sessions run, and their exits happen during it. Nothing accepted is
// lost: /healthz fails while the store does, a start that cannot be
// stored is refused with a retryable error and leaves nothing running,
// never a silent 200, and once the fault is healed and the daemon
// restarted, every accepted session's exit arrives exactly once, as its
// exit or announced lost. With faultyRestart the daemon is also stopped
// and started again before the heal, the fault lasting.
func testStateDirFault(t *testing.T, what string, fault, heal func(*fltMountNS) (string, error), faultyRestart bool) {
	m, prefix := newFltMountNS(t, "64m")
	d := newFltDaemon(t, "up", fltDaemonOpts{StateDir: m.state, Prefix: prefix})
	const key = "agent:f3:main"
	ids := d.startMany(key, "gateway", "sleep 4; echo f3-gw-%d", 3)
	ids = append(ids, d.startMany(key, "node", "sleep 4; echo f3-node-%d", 3)...)
	out, err := fault(m)
	t.Logf("state dir %s: %v %s", what, err, out)
	// While the fault lasts (the sessions above end in it): a start is
	// refused or stored, /healthz fails once something could not be
	// stored.
	var unhealthy string
	var later []string
	refused := 0
	deadline := time.Now().Add(15 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		if st, body := d.healthz(); st != 200 && unhealthy == "" {
			unhealthy = body
		}
		host := []string{"gateway", "node"}[i%2]
		marker := fltMarker()
		r := d.call(key, "exec", map[string]any{"command": "sleep 2; echo f3-during " + marker, "background": true, "host": host})
		t.Logf("start on %s while %s: %d %.300s", host, what, r.Status, r.Raw)
		switch {
		case r.Status == 200 && r.Result != nil && r.Result.SessionID() != "":
			later = append(later, r.Result.SessionID())
		case r.Status == 503 && r.Error != nil && r.Error.Retryable:
			refused++
			// A refused start leaves nothing running.
			clCheckFor(t, "nothing left of a refused start", 5*time.Second, 50*time.Millisecond, func() error {
				if n := fltCountMarker(marker); n > 0 {
					return fmt.Errorf("%d processes of the refused start %s run", n, marker)
				}
				return nil
			})
		default:
			t.Errorf("start on %s while %s: %d %s, want 200 or a retryable 503", host, what, r.Status, r.Raw)
		}
		time.Sleep(time.Second)
	}
	t.Logf("/healthz while %s: %q; %d starts answered 200, %d refused", what, unhealthy, len(later), refused)
	if unhealthy == "" {
		t.Errorf("/healthz stayed 200 while the state dir was %s", what)
	}
	if refused == 0 {
		t.Errorf("no start was refused while the state dir was %s", what)
	}
	if faultyRestart {
		// It may not get healthy: wait until it reported what the first
		// run left (and failed to store it), then stop it.
		if err := d.proc.stop(); err != nil {
			t.Fatal(err)
		}
		d.proc.start()
		clCheckFor(t, "the restarted daemon reports the earlier run's sessions", 60*time.Second, 200*time.Millisecond, func() error {
			if n := strings.Count(d.proc.runLog(), "session lost by an earlier run"); n < len(ids) {
				return fmt.Errorf("%d of %d reported", n, len(ids))
			}
			return nil
		})
		time.Sleep(3 * time.Second) // its attempts to store them fail
		st, body := d.healthz()
		t.Logf("/healthz of the run restarted while %s: %d %s", what, st, body)
		if st == 200 {
			t.Errorf("/healthz of the run restarted while %s: 200", what)
		}
	}
	if out, err := heal(m); err != nil {
		t.Fatalf("heal: %v: %s", err, out)
	}
	if err := d.proc.stop(); err != nil {
		t.Fatal(err)
	}
	d.start()
	if strings.Contains(d.proc.runLog(), "panic") {
		t.Errorf("panic in the log")
	}
	all := append(append([]string{}, ids...), later...)
	c := d.tally(key, all, 30*time.Second, 8*time.Second, protocol.EventExecExit, protocol.EventExecLost)
	for id, evs := range c.ByID {
		for _, ev := range evs {
			t.Logf("%s: %s %q", id, ev.Kind, ev.Text)
		}
	}
	c.exact(t, "after the heal and a restart")
	if st, body := d.healthz(); st != 200 {
		t.Errorf("/healthz after the heal and a restart: %d %s", st, body)
	}
}
