package approvals

import (
	"bytes"
	"context"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"
)

// The tests in this file run the real tools of this host: they show that
// each refused form really runs a command or writes a file (so the corpus
// is not about imaginary risks), that the rules refuse it with the host's
// real binaries allowlisted, and that AllowlistEnv closes what is closed at
// run time (hooks, pagers). A tool that is not installed is skipped with
// its Debian package named (scripts/ensure-deps.sh installs them).

var toolPackages = map[string]string{"git": "git", "find": "findutils", "tar": "tar", "sed": "sed",
	"awk": "gawk or mawk", "less": "less"}

func realTool(t *testing.T, name string) string {
	t.Helper()
	for _, dir := range []string{"/usr/bin", "/bin"} {
		if p, err := realExecutable(filepath.Join(dir, name)); err == nil {
			return p
		}
	}
	t.Skipf("%s is not installed on this host (Debian package %s)", name, toolPackages[name])
	return ""
}

// realEnv is a small environment for the real tools: no system or global
// git configuration of the machine running the tests.
func realEnv(home string) map[string]string {
	return map[string]string{"PATH": "/usr/bin:/bin", "HOME": home, "LANG": "C", "TERM": "xterm",
		"GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
		"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
}

func envList(m map[string]string) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, k+"="+m[k])
	}
	return out
}

func sh(t *testing.T, dir string, env map[string]string, script string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", script)
	cmd.Dir, cmd.Env = dir, envList(env)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", script, err, out)
	}
}

// runIgnoringStatus runs argv and ignores how it exits: several carrier
// forms run their payload and then fail.
func runIgnoringStatus(t *testing.T, dir string, env map[string]string, script string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", script)
	cmd.Dir, cmd.Env = dir, envList(env)
	cmd.Stdin = strings.NewReader("x\n")
	_ = cmd.Run()
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// realRepo makes a work tree holding a git repository with one commit
// (f contains "x") and a home directory, and the environment for both.
func realRepo(t *testing.T) (dir, home string, env map[string]string) {
	t.Helper()
	root := t.TempDir()
	dir, home = filepath.Join(root, "w"), filepath.Join(root, "home")
	for _, d := range []string{dir, home} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	env = realEnv(home)
	newGitRepo(t, dir, env)
	return dir, home, env
}

func newGitRepo(t *testing.T, dir string, env map[string]string) {
	t.Helper()
	sh(t, dir, env, "git init -q . && echo x > f && git add f && git commit -qm init")
}

func TestRealCarriers(t *testing.T) {
	cases := []struct {
		tool  string
		setup string // shell script run first (not judged)
		cmd   string // the carrier form; it (or then) creates ./M
		then  string // run after cmd, not judged
	}{
		{"git", "git config alias.pw '!touch M' get", "git pw", ""},
		{"git", "", "git config alias.pw '!touch M' get", "git pw"}, // the write itself is refused
		{"git", "", "git clone -q -u 'touch M;' . ../clone", ""},
		{"git", "", "git ls-remote --upload-pa='touch M;:' .", ""},
		{"git", "", "git grep -O'touch M;:' x", ""},
		{"git", "git config core.fsmonitor 'touch M; false'", "git status", ""},
		{"git", "printf '[alias]\\n\\tst2 = !touch M\\n' > ../inc.cfg && git config include.path ../../inc.cfg", "git st2", ""},
		{"find", "", `find . -maxdepth 0 -exec touch M \;`, ""},
		{"find", "", "find . -maxdepth 0 -fprint M", ""},
		{"tar", "tar -cf a.tar f", "tar --to-c='touch M' -xf a.tar", ""},
		{"tar", "", "tar -cf /dev/null --checkpoint=1 --checkpoint-action=exec='touch M' f", ""},
		{"tar", "tar -cf a.tar f", `tar -I 'sh -c "touch M; cat"' -xf a.tar`, ""},
		{"sed", "", "sed 'e touch M' f", ""},
		{"sed", "", "sed 's/x/touch M/e' f", ""},
		{"sed", "", "sed -n 'w M' f", ""},
		{"awk", "", `awk 'BEGIN{system("touch M")}'`, ""},
		{"awk", "", `awk 'BEGIN{print "x" > "M"}'`, ""},
		{"awk", "", `awk 'BEGIN{print "touch M" | "sh"}'`, ""},
	}
	for _, c := range cases {
		t.Run(c.cmd, func(t *testing.T) {
			realTool(t, c.tool)
			realTool(t, "git") // the fixture is a repository
			dir, home, env := realRepo(t)
			if c.setup != "" {
				sh(t, dir, env, c.setup)
			}
			opts := EvalOptions{Cwd: dir, PATH: env["PATH"], Home: home,
				Allowlist: []Entry{{Pattern: "/usr/bin/*"}, {Pattern: "/bin/*"}}}
			ev := Evaluate(c.cmd, opts)
			if ev.Satisfied || ev.Reason != ReasonCommandCarrier {
				t.Fatalf("not refused as a carrier: satisfied=%v %s (%s)", ev.Satisfied, ev.Reason, ev.Detail)
			}
			marker := filepath.Join(dir, "M")
			if exists(marker) {
				t.Fatal("marker exists before the command ran")
			}
			runIgnoringStatus(t, dir, env, c.cmd)
			if c.then != "" {
				runIgnoringStatus(t, dir, env, c.then)
			}
			if !exists(marker) {
				t.Fatalf("%s did not create M: the corpus case would not be a real carrier on this host", c.cmd)
			}
		})
	}
}

// TestRealGitHooksClosedByEnv: a hook planted as a file is no
// configuration, so `git commit` is auto-allowed; AllowlistEnv's
// core.hooksPath=/dev/null keeps it from running.
func TestRealGitHooksClosedByEnv(t *testing.T) {
	realTool(t, "git")
	dir, home, env := realRepo(t)
	marker := filepath.Join(dir, "M")
	hook := filepath.Join(dir, ".git", "hooks", "pre-commit")
	if err := os.WriteFile(hook, []byte("#!/bin/sh\ntouch "+marker+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	opts := EvalOptions{Cwd: dir, PATH: env["PATH"], Home: home, Allowlist: []Entry{{Pattern: "/usr/bin/*"}}}
	ev := Evaluate("git commit -q --allow-empty -m x", opts)
	if !ev.Satisfied {
		t.Fatalf("plain commit not allowed: %s %s", ev.Reason, ev.Detail)
	}
	run := func(env map[string]string) {
		t.Helper()
		cmd := exec.Command(ev.Argv[0][0], ev.Argv[0][1:]...)
		cmd.Dir, cmd.Env = dir, envList(env)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
	}
	withRule := maps.Clone(env)
	maps.Copy(withRule, AllowlistEnv(env))
	run(withRule)
	if exists(marker) {
		t.Fatal("the planted hook ran under AllowlistEnv")
	}
	run(env)
	if !exists(marker) {
		t.Fatal("control: the hook did not run without AllowlistEnv, so the test shows nothing")
	}
}

// ptyRun starts argv in a terminal, types input once want appears in the
// output (or at once when want is ""), and reports the output and whether
// the program ended by itself within wait.
func ptyRun(t *testing.T, dir string, env map[string]string, argv []string, want, input string, wait time.Duration) (string, bool) {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir, cmd.Env = dir, envList(env)
	f, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 30, Cols: 120})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var out bytes.Buffer
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		buf := make([]byte, 4096)
		for {
			n, err := f.Read(buf)
			mu.Lock()
			out.Write(buf[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	text := func() string { mu.Lock(); defer mu.Unlock(); return out.String() }
	deadline := time.Now().Add(10 * time.Second)
	for want != "" && !strings.Contains(text(), want) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	_, _ = io.WriteString(f, input)
	ended := false
	select {
	case <-done:
		ended = true
	case <-time.After(wait):
		_ = cmd.Process.Kill()
		<-done
	}
	f.Close()
	<-copied
	return text(), ended
}

// TestRealPagerEscapeClosedByEnv: less started in a terminal with
// LESSSECURE=1 refuses "!cmd"; git under AllowlistEnv pages through cat and
// never leaves a pager waiting for keys. Without the rule both run the
// command typed in.
func TestRealPagerEscapeClosedByEnv(t *testing.T) {
	lessPath := realTool(t, "less")
	root := t.TempDir()
	home := filepath.Join(root, "home")
	if err := os.MkdirAll(home, 0o755); err != nil {
		t.Fatal(err)
	}
	env := realEnv(home)
	file := filepath.Join(root, "f")
	var lines strings.Builder
	for i := range 200 {
		lines.WriteString("line " + strings.Repeat("x", i%50) + "\n")
	}
	if err := os.WriteFile(file, []byte(lines.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	secure := maps.Clone(env)
	maps.Copy(secure, AllowlistEnv(env))
	marker := filepath.Join(root, "M")
	out, _ := ptyRun(t, root, secure, []string{lessPath, file}, "line", "!touch "+marker+"\nq", 1500*time.Millisecond)
	if exists(marker) {
		t.Fatalf("less ran ! under LESSSECURE: %q", out)
	}
	ptyRun(t, root, env, []string{lessPath, file}, "line", "!touch "+marker+"\nq", 2*time.Second)
	checkFor(t, 5*time.Second, func() bool { return exists(marker) })

	realTool(t, "git")
	dir := filepath.Join(root, "w")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	newGitRepo(t, dir, env)
	sh(t, dir, env, "for i in $(seq 60); do git commit -q --allow-empty -m c$i; done")
	_ = os.Remove(marker)
	gitEnv := maps.Clone(secure)
	gitEnv["PATH"] = env["PATH"]
	if _, ended := ptyRun(t, dir, gitEnv, []string{"/usr/bin/git", "log"}, "", "", 10*time.Second); !ended {
		t.Fatal("git log under AllowlistEnv waited in a pager")
	}
	pagerEnv := maps.Clone(env)
	pagerEnv["PAGER"] = lessPath
	ptyRun(t, dir, pagerEnv, []string{"/usr/bin/git", "log"}, "commit", "!touch "+marker+"\nq", 2*time.Second)
	checkFor(t, 5*time.Second, func() bool { return exists(marker) })
}

// checkFor fails the test unless cond becomes true within d.
func checkFor(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("control: the command typed into the pager did not run, so the test shows nothing")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
