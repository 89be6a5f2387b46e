package gateway

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/config"

	"github.com/execmesh/execmesh/protocol"
	"github.com/execmesh/execmesh/sandbox"
)

// startSandboxGateway is a gateway whose auto host is a bwrap sandbox. It
// skips, loudly, where bubblewrap cannot run.
func startSandboxGateway(t *testing.T, mutate func(*config.Config)) *testGateway {
	t.Helper()
	if _, err := exec.LookPath("bwrap"); err != nil {
		t.Skip("SKIPPED: bubblewrap (bwrap) is not installed; install the Debian package \"bubblewrap\" (make test does this as root)")
	}
	probe, err := sandbox.New(sandbox.Config{Mode: sandbox.ModeBwrap, Workspace: t.TempDir()})
	if err == nil {
		err = probe.Available()
	}
	if err != nil {
		t.Skipf("SKIPPED: bubblewrap cannot create a sandbox here: %v", err)
	}
	return startGateway(t, func(c *config.Config, _ *Options) {
		c.Sandbox.Mode = sandbox.ModeBwrap
		c.Sandbox.Workspace = filepath.Join(t.TempDir(), "ws")
		if err := os.MkdirAll(c.Sandbox.Workspace, 0o700); err != nil {
			t.Fatal(err)
		}
		c.Tools.Exec.Security = ""
		c.Tools.Exec.Ask = ""
		if mutate != nil {
			mutate(c)
		}
	})
}

func TestSandboxHost(t *testing.T) {
	tg := startSandboxGateway(t, nil)
	ws := filepath.Join(tg.g.Config().Sandbox.Workspace, "main")

	res := tg.invoke("exec", map[string]any{"command": "touch /etc/execmesh-x 2>&1; echo rc=$?; pwd; echo data > kept.txt"}, "")
	if res.Status() != "completed" || !strings.Contains(res.Text(), "rc=1") || !strings.Contains(res.Text(), ws) {
		t.Fatalf("sandboxed run: %s %q", res.Status(), res.Text())
	}
	if _, err := os.Stat("/etc/execmesh-x"); err == nil {
		t.Fatal("sandbox wrote to /etc")
	}
	if res := tg.invoke("exec", map[string]any{"command": "cat kept.txt"}, ""); res.Text() != "data" {
		t.Fatalf("workspace did not persist: %q", res.Text())
	}
	// Workdir escapes are failed results; nothing runs.
	res = tg.invoke("exec", map[string]any{"command": "touch escaped", "workdir": "../.."}, "")
	if res.Status() != "failed" || !strings.Contains(res.Text(), "is unavailable or not a directory: command was not executed") {
		t.Fatalf("escape: %s %q", res.Status(), res.Text())
	}
	// The default security for a sandbox-configured host is deny: no way to
	// the gateway host, not even elevated.
	r := tg.invokeRaw("exec", map[string]any{"command": "id", "host": "gateway"}, "")
	if r.Status != 400 || r.Error.Type != protocol.ErrHostNotAllowed {
		t.Fatalf("host=gateway from a sandbox: %d %s", r.Status, r.Raw)
	}
}

func TestSandboxBackgroundKillTimeoutAndEvents(t *testing.T) {
	tg := startSandboxGateway(t, nil)
	marker := fmt.Sprintf("%d", time.Now().UnixNano()%1000000+5000000)
	res := tg.invoke("exec", map[string]any{"command": "sleep " + marker + " & sleep " + marker, "background": true}, "")
	sid := res.SessionID()
	checkFor(t, 10*time.Second, func() error {
		if n := len(pidsWith("sleep " + marker)); n < 2 {
			return fmt.Errorf("%d sleeps running", n)
		}
		return nil
	})
	if k := tg.invoke("process", map[string]any{"action": "kill", "sessionId": sid}, ""); k.Status() != "completed" {
		t.Fatalf("kill: %q", k.Text())
	}
	checkFor(t, 15*time.Second, func() error {
		if left := pidsWith("sleep " + marker); len(left) > 0 {
			return fmt.Errorf("left inside the sandbox after kill: %v", left)
		}
		return nil
	})
	// Timeout inside the sandbox.
	res = tg.invoke("exec", map[string]any{"command": "echo begin; sleep 30", "timeout": 1}, "")
	if res.Status() != "failed" || !strings.Contains(res.Text(), "Command timed out after 1 seconds.") {
		t.Fatalf("timeout: %s %q", res.Status(), res.Text())
	}
	// Exit events for sandboxed background sessions.
	res = tg.invoke("exec", map[string]any{"command": "echo sandboxed-exit; exit 4", "background": true}, "")
	sid = res.SessionID()
	ev := tg.waitEvent(protocol.EventExecExit)
	if ev.Text != fmt.Sprintf("Exec completed (%s, code 4) :: sandboxed-exit", sid) {
		t.Fatalf("event %q", ev.Text)
	}
}

func TestSandboxPTYSendKeys(t *testing.T) {
	tg := startSandboxGateway(t, nil)
	res := tg.invoke("exec", map[string]any{"command": "stty -echo; echo READY; read line; echo got:$line", "pty": true, "background": true}, "")
	sid := res.SessionID()
	checkFor(t, 10*time.Second, func() error {
		p := tg.invoke("process", map[string]any{"action": "log", "sessionId": sid}, "")
		if !strings.Contains(p.Text(), "READY") {
			return fmt.Errorf("no READY yet: %q", p.Text())
		}
		return nil
	})
	if r := tg.invoke("process", map[string]any{"action": "send-keys", "sessionId": sid, "keys": []string{"h", "i", "Enter"}}, ""); r.Status() != "running" {
		t.Fatalf("send-keys: %q", r.Text())
	}
	var seen strings.Builder
	checkFor(t, 15*time.Second, func() error {
		p := tg.invoke("process", map[string]any{"action": "poll", "sessionId": sid, "timeout": 2000}, "")
		seen.WriteString(p.Text())
		if !strings.Contains(seen.String(), "got:hi") {
			return fmt.Errorf("PTY program inside the sandbox: %q", seen.String())
		}
		return nil
	})
}

func TestSandboxPathNotInterpolated(t *testing.T) {
	tg := startSandboxGateway(t, nil)
	canary := filepath.Join(t.TempDir(), "pwned")
	res := tg.invoke("exec", map[string]any{"command": "echo $PATH", "env": map[string]string{"PATH": "$(touch " + canary + ")"}}, "")
	if res.Status() != "completed" || !strings.HasPrefix(res.Text(), "$(touch ") {
		t.Fatalf("%s %q", res.Status(), res.Text())
	}
	if _, err := os.Stat(canary); err == nil {
		t.Fatal("PATH value was executed")
	}
}

// pidsWith lists pids whose command line contains s.
func pidsWith(s string) []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		if strings.Contains(strings.ReplaceAll(string(b), "\x00", " "), s) {
			out = append(out, e.Name())
		}
	}
	return out
}
