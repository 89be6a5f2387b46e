package sandbox

import (
	"fmt"
	"os"
	"os/exec"
	"testing"

	"go.uber.org/goleak"
)

const installHint = `bubblewrap (bwrap) is not installed: install the Debian/Ubuntu package "bubblewrap" (apt-get install -y bubblewrap) to run the sandbox tests`

func TestMain(m *testing.M) {
	// The bwrap tests skip without bwrap; say so even without -v.
	if _, err := exec.LookPath("bwrap"); err != nil {
		fmt.Fprintln(os.Stderr, "sandbox: SKIPPING every real-sandbox test: "+installHint)
	}
	goleak.VerifyTestMain(m)
}

// requireBwrap skips t, loudly, when bwrap is missing. When bwrap is present
// the test runs, and fails if bwrap cannot build a sandbox.
func requireBwrap(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("bwrap"); err != nil {
		t.Skip("SKIPPED: " + installHint)
	}
}
