package procfs

import (
	"os"
	"os/exec"
	"slices"
	"testing"
)

// TestChildren: a child this process started is listed until it is reaped.
func TestChildren(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(Children(), cmd.Process.Pid) {
		t.Errorf("child %d not in %v", cmd.Process.Pid, Children())
	}
	if got := ChildrenOf(os.Getpid()); !slices.Contains(got, cmd.Process.Pid) {
		t.Errorf("ChildrenOf(self): child %d not in %v", cmd.Process.Pid, got)
	}
	if got := ChildrenOf(cmd.Process.Pid); len(got) != 0 {
		t.Errorf("ChildrenOf(a sleep): %v", got)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if slices.Contains(Children(), cmd.Process.Pid) {
		t.Errorf("reaped child %d still listed", cmd.Process.Pid)
	}
}
