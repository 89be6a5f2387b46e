package host

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/confine"
	"github.com/execmesh/execmesh/protocol"
	"github.com/execmesh/execmesh/session"
)

// TestMain lets the test binary be the confinement helper of its hosts
// (ConfineConfig.Helper "/proc/self/exe").
func TestMain(m *testing.M) {
	confine.RunHelperIfRequested()
	os.Exit(m.Run())
}

const testKey = "agent:main:main"

// testPath is the PATH the test hosts inherit.
const testPath = "/usr/local/bin:/usr/bin:/bin"

// newLocal builds a Local of kind with a fixed environment, a fresh cwd
// (symbolic links resolved, as pwd prints it) and a state dir, closed at
// the end of the test. mutate may change the configuration first.
func newLocal(t *testing.T, kind string, mutate func(*Config)) *Local {
	t.Helper()
	cwd, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	scfg := session.DefaultConfig()
	scfg.KillGrace = time.Second
	scfg.DrainWait = 500 * time.Millisecond
	cfg := Config{
		Kind:     kind,
		ID:       "test-" + kind,
		Session:  scfg,
		StateDir: t.TempDir(),
		Environ:  []string{"PATH=" + testPath, "HOME=" + cwd, "SHELL=/bin/sh", "LANG=C", "KEEP_ME=kept"},
		Cwd:      cwd,
		// Confined as in production: this test binary is the helper.
		Confine: ConfineConfig{Helper: "/proc/self/exe"},
	}
	if mutate != nil {
		mutate(&cfg)
	}
	l, err := NewLocal(cfg)
	if err != nil {
		t.Fatalf("NewLocal: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := l.Close(ctx); err != nil {
			t.Errorf("Local.Close: %v", err)
		}
	})
	return l
}

// target is the exec target a host of kind serves.
func target(l *Local) string {
	if l.cfg.Kind == KindNode {
		return protocol.TargetNode
	}
	return protocol.TargetGateway
}

// execReq is a foreground exec of command under security full, ask off.
func execReq(l *Local, command string) protocol.ExecRequest {
	return protocol.ExecRequest{
		SessionKey: testKey, AgentID: "main", Target: target(l),
		Args:     protocol.ExecArgs{Command: command},
		Security: "full", Ask: "off",
	}
}

// runCmd execs req and returns the output of a command that completed.
func runCmd(t *testing.T, l *Local, req protocol.ExecRequest) (string, error) {
	t.Helper()
	rep, err := l.Exec(t.Context(), req)
	if err != nil {
		return "", err
	}
	if st := rep.Result.Status(); st != protocol.StatusCompleted {
		return rep.Result.Text(), errStatus(st)
	}
	return strings.TrimRight(rep.Result.Text(), "\n"), nil
}

type errStatus string

func (e errStatus) Error() string { return "status " + string(e) }

// errType returns the protocol error type of err ("" for none).
func errType(err error) protocol.ErrorType {
	if pe := protocol.AsError(err); pe != nil {
		return pe.Type
	}
	return ""
}
