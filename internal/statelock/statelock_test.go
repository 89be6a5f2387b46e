package statelock

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A helper process: with STATELOCK_HOLD=dir it takes the lock, prints
// "locked" and sleeps until killed.
func TestMain(m *testing.M) {
	if dir := os.Getenv("STATELOCK_HOLD"); dir != "" {
		if _, err := Acquire(dir); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(3)
		}
		os.Stdout.WriteString("locked\n")
		time.Sleep(time.Hour)
	}
	os.Exit(m.Run())
}

// holder starts a helper process that holds dir's lock.
func holder(t *testing.T, dir string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "STATELOCK_HOLD="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	buf := make([]byte, 7)
	if _, err := out.Read(buf); err != nil || string(buf) != "locked\n" {
		t.Fatalf("helper: %q %v", buf, err)
	}
	return cmd
}

func TestSecondHolderIsRefusedWithThePID(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	h := holder(t, dir)
	_, err := Acquire(dir)
	var held *HeldError
	if !errors.As(err, &held) {
		t.Fatalf("Acquire while held: %v", err)
	}
	if held.PID != h.Process.Pid || held.Dir != dir {
		t.Fatalf("HeldError %+v, want pid %d dir %s", held, h.Process.Pid, dir)
	}
	for _, want := range []string{dir, "pid " + strconv.Itoa(h.Process.Pid), "--state-dir"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message %q lacks %q", err, want)
		}
	}
}

// TestKillNineFreesTheLock: the kernel drops the flock of a killed holder;
// the next Acquire succeeds and writes its own pid.
func TestKillNineFreesTheLock(t *testing.T) {
	dir := t.TempDir()
	h := holder(t, dir)
	if err := h.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = h.Wait()
	l, err := Acquire(dir)
	if err != nil {
		t.Fatalf("Acquire after kill -9 of the holder: %v", err)
	}
	defer l.Release()
	b, _ := os.ReadFile(filepath.Join(dir, FileName))
	if strings.TrimSpace(string(b)) != strconv.Itoa(os.Getpid()) {
		t.Errorf("lock file holds %q, want our pid %d", b, os.Getpid())
	}
}

func TestReleaseAndRelock(t *testing.T) {
	dir := t.TempDir()
	l, err := Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	// flock locks are per open file description: a second open in the
	// same process is refused as well.
	if _, err := Acquire(dir); err == nil {
		t.Fatal("a second Acquire in the same process succeeded")
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	l2, err := Acquire(dir)
	if err != nil {
		t.Fatalf("Acquire after Release: %v", err)
	}
	l2.Release()
}
