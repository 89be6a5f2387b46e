package gateway

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/execmesh/execmesh/config"

	"github.com/execmesh/execmesh/protocol"
)

// Carriers and rewritten tools, through the HTTP API: allowlisted
// programs that run other programs through their options or config, and
// tools rewritten after an approval.

// hostTool returns the real path of a tool in /usr/bin or skips the test,
// naming the Debian package (scripts/ensure-deps.sh installs it).
func hostTool(t *testing.T, name string) string {
	t.Helper()
	p, err := filepath.EvalSymlinks("/usr/bin/" + name)
	if err != nil {
		t.Skipf("%s is not installed on this host (Debian package %s)", name, name)
	}
	return p
}

func shellIn(t *testing.T, dir, script string) {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + dir, "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@x", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@x"}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", script, err, out)
	}
}

// TestClassDCarriers: with git (and less) allowlisted and the default ask
// on-miss, no carrier form runs what the allowlist does not allow: the
// kernel confinement refuses the exec and names it (or the command is
// asked for); the env doors are refused; apply_patch cannot plant
// .git/config; a planted repository config runs nothing; a pager in a
// PTY session gives no shell through process write.
func TestClassDCarriers(t *testing.T) {
	git := hostTool(t, "git")
	less := hostTool(t, "less")
	file := fmt.Sprintf(`{"version":1,"agents":{"main":{"allowlist":[{"pattern":%q},{"pattern":%q}]}}}`, git, less)
	tg := startApprovalGateway(t, file, func(c *config.Config) {
		c.Tools.Exec.ApplyPatch.Enabled = true
		c.Tools.Exec.ApplyPatch.WorkspaceOnly = false // any workdir: the .git rule alone must hold
	})
	shellIn(t, tg.cwd, "git init -q . && echo x > f && git add f && git commit -qm init && for i in $(seq 80); do git commit -q --allow-empty -m c$i; done")
	marker := filepath.Join(tg.cwd, "M")
	noMarker := func(what string) {
		t.Helper()
		time.Sleep(200 * time.Millisecond)
		if _, err := os.Stat(marker); err == nil {
			t.Errorf("%s ran a command (M exists)", what)
			os.Remove(marker)
		}
	}
	// Control: plain git is still auto-allowed.
	if res := tg.invoke("exec", map[string]any{"command": "git log -1 --format=%s"}, ""); res.Status() != protocol.StatusCompleted || !strings.Contains(res.Text(), "c80") {
		t.Fatalf("plain git: %s %q", res.Status(), res.Text())
	}
	for _, cmd := range []string{
		"git config alias.pw '!touch M' get",
		"git pw",
		"git clone -u 'touch M;' . ../c1",
		"git clone --upload-pa='touch M;' . ../c2",
		"git ls-remote --upload-pa='touch M;:' .",
		"git grep -O'touch M;:' x",
	} {
		res := tg.invoke("exec", map[string]any{"command": cmd}, "")
		refusedOrAsked(t, cmd, res)
		noMarker(cmd)
	}

	// The environment doors: GIT_TRACE append-writes any file, LESS runs
	// commands from the pager.
	trace := filepath.Join(tg.cwd, "trace-target")
	for _, env := range []map[string]string{{"GIT_TRACE": trace}, {"LESS": "+!touch M\n"}} {
		r := tg.invokeRaw("exec", map[string]any{"command": "git log -1", "env": env, "pty": true}, "")
		if r.Status != 400 || r.Error == nil || r.Error.Type != protocol.ErrSecurityViolation {
			t.Errorf("env %v: %d %.200s", env, r.Status, r.Raw)
		}
	}
	if _, err := os.Stat(trace); err == nil {
		t.Error("GIT_TRACE wrote its file")
	}
	noMarker("LESS")

	// apply_patch plants .git/config with an alias: refused.
	plant := "*** Begin Patch\n*** Add File: .git/evil.cfg\n+[core]\n+\tfsmonitor = touch M; false\n*** End Patch\n"
	r := tg.invokeRaw("apply_patch", map[string]any{"input": plant, "workdir": tg.cwd}, "")
	if r.Status != 400 || r.Error == nil || r.Error.Type != protocol.ErrSecurityViolation {
		t.Errorf("apply_patch into .git: %d %.200s", r.Status, r.Raw)
	}

	// A pager's shell escape in a PTY session, through process write.
	res := tg.invoke("exec", map[string]any{"command": "git log", "pty": true, "yieldMs": 1500}, "")
	if res.Status() == protocol.StatusRunning {
		sid := res.Details.SessionID.Value()
		tg.invoke("process", map[string]any{"action": "write", "sessionId": sid, "data": "!touch M\n"}, "")
		time.Sleep(time.Second)
		tg.invokeRaw("process", map[string]any{"action": "kill", "sessionId": sid}, "")
	}
	noMarker("git log's pager in a PTY")

	// A repository config planted by an earlier command: git is no longer
	// auto-allowed there.
	shellIn(t, tg.cwd, "git config core.fsmonitor 'touch M; false'")
	res = tg.invoke("exec", map[string]any{"command": "git status"}, "")
	if !strings.Contains(res.Text(), "exec refused by policy") && res.Status() != protocol.StatusApprovalPending {
		t.Errorf("git status with a planted fsmonitor: %s %q", res.Status(), res.Text())
	}
	noMarker("git status with a planted core.fsmonitor")
}

// refusedOrAsked: a carrier either was asked for, or ran in the
// confinement, which refused what it tried to run (or it tried nothing:
// git config only writes the repository's config, which is the
// workdir's).
func refusedOrAsked(t *testing.T, cmd string, res protocol.Result) {
	t.Helper()
	switch {
	case res.Status() == protocol.StatusApprovalPending:
	case strings.Contains(res.Text(), "exec refused by policy"):
	case strings.HasPrefix(cmd, "git config ") && res.Status() == protocol.StatusCompleted:
	case strings.Contains(cmd, "../"):
		// Writes outside the workdir are refused before anything runs.
		if !strings.Contains(res.Text(), "Permission denied") {
			t.Errorf("%s: %s %q", cmd, res.Status(), res.Text())
		}
	default:
		t.Errorf("%s: neither asked nor refused by the confinement: %s %q", cmd, res.Status(), res.Text())
	}
}

// rewriteInPlace replaces a file's content keeping its inode.
func rewriteInPlace(t *testing.T, path, content string) {
	t.Helper()
	before, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(content); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	after, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if before.Sys().(*syscall.Stat_t).Ino != after.Sys().(*syscall.Stat_t).Ino {
		t.Fatal("the rewrite changed the inode")
	}
}

// TestClassEApprovalBinding: `./tool` (and `sh script.sh`) goes
// approval-pending; the file is rewritten in place (same inode); allow-once
// is refused with the binding error as an exec.denied event, and nothing
// runs. An untouched tool still runs once approved.
func TestClassEApprovalBinding(t *testing.T) {
	tg := startApprovalGateway(t, "", nil)
	cwd, _ := filepath.EvalSymlinks(tg.cwd)
	marker := filepath.Join(tg.cwd, "M")
	for _, c := range []struct{ command, file string }{
		{"./tool", "tool"},
		{"sh script.sh", "script.sh"},
	} {
		path := filepath.Join(tg.cwd, c.file)
		if err := os.WriteFile(path, []byte("#!/bin/sh\necho original\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		res := tg.invoke("exec", map[string]any{"command": c.command}, "")
		if res.Status() != protocol.StatusApprovalPending {
			t.Fatalf("%s: want approval-pending, got %s %q", c.command, res.Status(), res.Text())
		}
		id := res.Details.ApprovalID.Value()
		rewriteInPlace(t, path, "#!/bin/sh\ntouch "+marker+"\necho rewritten\n")
		if r := tg.decide(id, DecisionAllowOnce); r.Status != 200 {
			t.Fatalf("decide: %d %s", r.Status, r.Raw)
		}
		ev := tg.waitEvent(protocol.EventExecDenied)
		want := fmt.Sprintf("Exec denied (gateway id=%s, approval-binding-changed: %s changed): %s", id, filepath.Join(cwd, c.file), c.command)
		if ev.Text != want {
			t.Fatalf("denied event %q, want %q", ev.Text, want)
		}
		time.Sleep(200 * time.Millisecond)
		if _, err := os.Stat(marker); err == nil {
			t.Fatalf("%s: the rewritten file ran", c.command)
		}
	}
	// Untouched: approved and run, confined: the approval fixed ./tool
	// and its shell, not the touch inside it, which the kernel refuses.
	res := tg.invoke("exec", map[string]any{"command": "./tool"}, "")
	id := res.Details.ApprovalID.Value()
	tg.decide(id, DecisionAllowOnce)
	if ev := tg.waitEvent(protocol.EventExecFinished); !strings.Contains(ev.Text, "code 0)") || !strings.HasSuffix(ev.Text, "rewritten") ||
		!strings.Contains(ev.Text, "exec refused by policy: /usr/bin/touch") {
		t.Fatalf("finished %q", ev.Text)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the approved tool ran a program its approval did not fix")
	}
}

// TestClassEApprovalBindingNode: the same on host=node through a real node
// agent: the node binds the approval, the gateway carries the binding
// back with the decision, and the node refuses the rewritten tool.
func TestClassEApprovalBindingNode(t *testing.T) {
	env, cfg, a := startNodeApproval(t, nodeAskFile, nil)
	cwd, _ := filepath.EvalSymlinks(cfg.Cwd)
	path := filepath.Join(cfg.Cwd, "tool")
	marker := filepath.Join(cfg.Cwd, "M")
	if err := os.WriteFile(path, []byte("#!/bin/sh\necho original\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	id := pendingOnNode(t, env, a.ID(), "./tool")
	rewriteInPlace(t, path, "#!/bin/sh\ntouch "+marker+"\n")
	decide(t, env, id, DecisionAllowOnce)
	ev := env.waitEvent(protocol.EventExecDenied)
	want := fmt.Sprintf("Exec denied (node=%s id=%s, approval-binding-changed: %s changed): ./tool", a.ID(), id, filepath.Join(cwd, "tool"))
	if ev.Text != want {
		t.Fatalf("denied event %q, want %q", ev.Text, want)
	}
	time.Sleep(300 * time.Millisecond)
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the rewritten tool ran on the node")
	}
}
