package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/execmesh/execmesh/protocol"
)

// fltCrashSessions starts, on host, n sleeping sessions and one
// file-writing loop, each with marker in its command line, and returns
// their ids and the file the loop appends to.
func fltCrashSessions(t *testing.T, d *fltDaemon, key, host, marker string, n int) ([]string, string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "loop.out")
	t.Cleanup(func() { // should the test fail, leave nothing running
		for _, pid := range processesWith(marker) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	ids := d.startMany(key, host, "echo crash-%d; sleep "+marker, n)
	ids = append(ids, d.background(key, host, fmt.Sprintf("while :; do echo %s >> %s; sleep 0.1; done", marker, file)))
	clCheckFor(t, "session processes running", 20*time.Second, 100*time.Millisecond, func() error {
		if got := fltCountMarker(marker); got < n+1 {
			return fmt.Errorf("%d of at least %d running", got, n+1)
		}
		return nil
	})
	return ids, file
}

// fltNoneLeft checks that no process of marker runs and that file stopped
// growing.
func fltNoneLeft(t *testing.T, marker, file string) {
	t.Helper()
	clCheckFor(t, "no session process of the crashed run left", 30*time.Second, 200*time.Millisecond, func() error {
		if pids := processesWith(marker); len(pids) > 0 {
			return fmt.Errorf("still running: %v", pids)
		}
		return nil
	})
	size := func() int64 {
		fi, err := os.Stat(file)
		if err != nil {
			return -1
		}
		return fi.Size()
	}
	before := size()
	time.Sleep(time.Second)
	if after := size(); after != before {
		t.Errorf("the file-writing loop still writes: %d → %d bytes", before, after)
	}
}

// fltAfterCrash checks that a session process survived the crash (the
// fault is real: nothing ended them yet) and that the loop still writes.
func fltAfterCrash(t *testing.T, marker, file string) {
	t.Helper()
	time.Sleep(500 * time.Millisecond)
	if fltCountMarker(marker) == 0 {
		t.Fatalf("no session process outlived the crash: the test would prove nothing")
	}
	fi1, _ := os.Stat(file)
	time.Sleep(500 * time.Millisecond)
	fi2, _ := os.Stat(file)
	if fi1 == nil || fi2 == nil || fi2.Size() <= fi1.Size() {
		t.Logf("the loop did not write after the crash (%v, %v)", fi1, fi2)
	}
}

// fltLostOnce checks that each session had exactly one exec.lost (or
// exit) event, and that lost events say what is known.
func fltLostOnce(t *testing.T, d *fltDaemon, key string, ids []string, what string) {
	t.Helper()
	c := d.tally(key, ids, 30*time.Second, 2*time.Second, protocol.EventExecLost, protocol.EventExecExit)
	c.exact(t, what)
	lost := 0
	for _, id := range ids {
		for _, ev := range c.ByID[id] {
			if ev.Kind == protocol.EventExecLost {
				lost++
				if !strings.Contains(ev.Text, "Exec lost") || !strings.Contains(ev.Text, "restart") && !strings.Contains(ev.Text, "crash") && !strings.Contains(ev.Text, "ended") {
					t.Errorf("session %s: lost event does not say what happened: %q", id, ev.Text)
				}
			}
		}
	}
	if lost == 0 && len(ids) > 0 {
		t.Errorf("%s: no exec.lost event at all (%s)", what, c)
	}
}

// TestFaultNodeAgentKilled: kill -9 of a node agent
// with sleeping sessions and a file-writing loop running. The restarted
// agent ends every process its crashed run left (none runs after it, the
// loop stops writing), and each session's agent gets exactly one event
// saying the session is lost.
func TestFaultNodeAgentKilled(t *testing.T) {
	e := newFltExternal(t, 500*time.Millisecond, nil, "alpha")
	gw, node := e.gw, e.nodes[0]
	const key = "agent:f5n:main"
	marker := fltMarker()
	ids, file := fltCrashSessions(t, gw, key, "node", marker, 5)
	node.proc.kill()
	fltAfterCrash(t, marker, file)
	node.proc.start()
	gw.waitNode(node.id, "connected", 30*time.Second)
	fltNoneLeft(t, marker, file)
	fltLostOnce(t, gw, key, ids, "6 node sessions of a node agent killed with SIGKILL")
}

// TestFaultUpKilled: kill -9 of `execmesh up` with
// gateway-host and local-node sessions running (sleeps and a
// file-writing loop each). After the restart no process of the crashed
// run is left and each session's agent is told exactly once.
func TestFaultUpKilled(t *testing.T) {
	d := newFltDaemon(t, "up", fltDaemonOpts{})
	const key = "agent:f5u:main"
	marker := fltMarker()
	gwIDs, gwFile := fltCrashSessions(t, d, key, "gateway", marker, 3)
	nodeMarker := fltMarker() + "1"
	nodeIDs, nodeFile := fltCrashSessions(t, d, key, "node", nodeMarker, 3)
	d.proc.kill()
	fltAfterCrash(t, marker, gwFile)
	fltAfterCrash(t, nodeMarker, nodeFile)
	d.start()
	fltNoneLeft(t, marker, gwFile)
	fltNoneLeft(t, nodeMarker, nodeFile)
	fltLostOnce(t, d, key, append(append([]string{}, gwIDs...), nodeIDs...), "8 sessions of execmesh up killed with SIGKILL")
}
