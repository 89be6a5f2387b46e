package procfs

import (
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
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if slices.Contains(Children(), cmd.Process.Pid) {
		t.Errorf("reaped child %d still listed", cmd.Process.Pid)
	}
}
