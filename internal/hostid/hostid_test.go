package hostid

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

func TestIDStableAndOpaque(t *testing.T) {
	a, err := ID()
	if err != nil {
		t.Skipf("no /proc boot id or mount namespace here: %v", err)
	}
	b, _ := ID()
	if a != b || !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(a) {
		t.Fatalf("ID() = %q then %q", a, b)
	}
	boot, _ := os.ReadFile(bootIDPath)
	if strings.Contains(a, strings.ReplaceAll(strings.TrimSpace(string(boot)), "-", "")[:8]) {
		t.Errorf("the id shows the boot id: %s", a)
	}
}

func TestOfTellsNamespacesApart(t *testing.T) {
	tests := []struct {
		name     string
		b1, m1   string
		b2, m2   string
		wantSame bool
	}{
		{"same boot and namespace", "boot-1", "mnt:[1]", "boot-1", "mnt:[1]", true},
		{"another mount namespace", "boot-1", "mnt:[1]", "boot-1", "mnt:[2]", false},
		{"another boot", "boot-1", "mnt:[1]", "boot-2", "mnt:[1]", false},
		{"no concatenation ambiguity", "boot-1", "x", "boot-1x", "", false},
	}
	for _, tt := range tests {
		if got := Of(tt.b1, tt.m1) == Of(tt.b2, tt.m2); got != tt.wantSame {
			t.Errorf("%s: same = %v, want %v", tt.name, got, tt.wantSame)
		}
	}
}

// TestIDInAnotherMountNamespace: a process in a new mount namespace (as in
// a container) has another id.
func TestIDInAnotherMountNamespace(t *testing.T) {
	mine, err := ID()
	if err != nil {
		t.Skipf("no host id here: %v", err)
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("unshare(1) is not installed")
	}
	out, err := exec.Command(unshare, "--mount", "readlink", mountNSPath).Output()
	if err != nil {
		t.Skipf("cannot create a mount namespace here: %v", err)
	}
	boot, _ := os.ReadFile(bootIDPath)
	if other := Of(strings.TrimSpace(string(boot)), strings.TrimSpace(string(out))); other == mine {
		t.Fatalf("a new mount namespace has the same id %s", mine)
	}
}
