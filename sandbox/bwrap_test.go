package sandbox

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
)

// These tests run real bubblewrap sandboxes. They skip only when bwrap is
// not installed; an installed bwrap that cannot build a sandbox fails them.

// realRuntime returns a bwrap Runtime on the real bwrap with a workspace root
// in a fresh t.TempDir (under /tmp, so the /tmp tmpfs and the workspace bind
// must be mounted in the right order), and the agent "main"'s workspace.
func realRuntime(t *testing.T, cfg Config) (Runtime, string) {
	t.Helper()
	requireBwrap(t)
	cfg.Mode = ModeBwrap
	if cfg.Workspace == "" {
		cfg.Workspace = filepath.Join(t.TempDir(), "workspace")
	}
	rt, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := rt.Available(); err != nil {
		t.Fatalf("bwrap is installed but unusable: %v", err)
	}
	ws, err := rt.Workspace("main")
	if err != nil {
		t.Fatal(err)
	}
	return rt, ws
}

func prepare(t *testing.T, rt Runtime, req Request) Prepared {
	t.Helper()
	p, err := rt.Prepare(req)
	if err != nil {
		t.Fatalf("Prepare(%q): %v", req.Command, err)
	}
	return p
}

// command returns p as an exec.Cmd the way the session core starts it: in
// the host workdir, with the prepared env, in its own process group.
func command(ctx context.Context, p Prepared) *exec.Cmd {
	cmd := exec.CommandContext(ctx, p.Argv[0], p.Argv[1:]...)
	cmd.Dir = p.Workdir
	cmd.Env = p.Env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd
}

// run runs p to completion and returns its combined output and exit code.
func run(t *testing.T, p Prepared) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := command(ctx, p)
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return out.String(), 0
	case errors.As(err, &ee):
		return out.String(), ee.ExitCode()
	}
	t.Fatalf("run %q: %v\n%s", p.Argv[len(p.Argv)-1], err, out.String())
	return "", 0
}

// roots returns workspace parents to run a test in: a t.TempDir, which lies
// under /tmp and so inside the sandbox's private /tmp, and a directory under
// /var/tmp, outside it, where only the masks keep other directories out of
// reach.
func roots(t *testing.T) map[string]func(t *testing.T) string {
	return map[string]func(t *testing.T) string{
		"tmp": func(t *testing.T) string { return t.TempDir() },
		"var-tmp": func(t *testing.T) string {
			d, err := os.MkdirTemp("/var/tmp", "execmesh-sandbox-test-")
			if err != nil {
				t.Skipf("SKIPPED: no /var/tmp to test a workspace outside /tmp: %v", err)
			}
			t.Cleanup(func() { os.RemoveAll(d) })
			return d
		},
	}
}

func marker(t *testing.T) string {
	t.Helper()
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// hostProcs returns the pids of live host processes with an argument equal
// to arg. (Zombies have no arguments. A shell or bwrap whose command text
// merely contains arg does not count.)
func hostProcs(t *testing.T, arg string) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && slices.Contains(strings.Split(string(b), "\x00"), arg) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// waitFor polls cond until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestBwrapWriteConfinement(t *testing.T) {
	t.Parallel()
	for name, parent := range roots(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testWriteConfinement(t, parent(t))
		})
	}
}

func testWriteConfinement(t *testing.T, parent string) {
	rt, ws := realRuntime(t, Config{Workspace: filepath.Join(parent, "workspace")})
	name := "x-" + marker(t)
	out, code := run(t, prepare(t, rt, Request{Command: fmt.Sprintf(
		`touch /etc/%[1]s && echo BAD-etc; touch "$HOME/../%[1]s" && echo BAD-root; `+
			`touch %[2]q/%[1]s && echo BAD-parent; touch /usr/%[1]s && echo BAD-usr; `+
			`touch /tmp/%[1]s && ls /tmp/%[1]s; echo persisted > "$HOME/kept"; pwd`, name, parent)}))
	underTmp := strings.HasPrefix(parent, "/tmp/")
	for _, bad := range []string{"BAD-etc", "BAD-root", "BAD-parent", "BAD-usr"} {
		// Under /tmp the parent lies in the private /tmp: writable, but
		// gone with the sandbox (checked on the host below).
		if strings.Contains(out, bad) && !(bad == "BAD-parent" && underTmp) || code != 0 {
			t.Fatalf("a write outside the workspace succeeded (code %d):\n%s", code, out)
		}
	}
	if n := strings.Count(out, "Read-only file system"); n != 4 && !(n == 3 && underTmp) {
		t.Errorf("want a read-only refusal for each write (%d):\n%s", n, out)
	}
	if !strings.Contains(out, "/tmp/"+name+"\n") {
		t.Errorf("the sandbox's /tmp is not writable:\n%s", out)
	}
	if !strings.Contains(out, ws+"\n") {
		t.Errorf("pwd inside is not the workspace %s:\n%s", ws, out)
	}
	for _, p := range []string{"/etc/" + name, filepath.Join(filepath.Dir(ws), name), filepath.Join(parent, name), "/usr/" + name, "/tmp/" + name} {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s exists on the host (%v)", p, err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(ws, "kept")); err != nil || string(b) != "persisted\n" {
		t.Fatalf("workspace write not on the host: %q %v", b, err)
	}
	// A second run sees the first one's file.
	out, code = run(t, prepare(t, rt, Request{Command: `cat kept`}))
	if code != 0 || out != "persisted\n" {
		t.Fatalf("second run: code %d, %q", code, out)
	}
}

func TestBwrapIsolatesAgentsAndHides(t *testing.T) {
	t.Parallel()
	for name, parent := range roots(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testIsolation(t, parent(t))
		})
	}
}

func testIsolation(t *testing.T, state string) {
	if err := os.WriteFile(filepath.Join(state, "token"), []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	rt, _ := realRuntime(t, Config{Workspace: filepath.Join(state, "workspace"), Hide: []string{state}})
	other, err := rt.Workspace("other")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(other, "private"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, code := run(t, prepare(t, rt, Request{Command: fmt.Sprintf(
		`ls -A %q; ls -A %q; cat %q 2>/dev/null && echo BAD-read; touch %q/new 2>/dev/null && echo BAD-write; true`,
		state, filepath.Dir(other), filepath.Join(state, "token"), state)}))
	if code != 0 || strings.Contains(out, "secret") || strings.Contains(out, "private") || strings.Contains(out, "BAD") {
		t.Fatalf("state dir or another agent's workspace reachable (code %d):\n%s", code, out)
	}
	if fields := strings.Fields(out); len(fields) < 2 || fields[0] != "workspace" || fields[1] != "main" {
		t.Errorf("want the state dir to show only the workspace root, and the root only this agent:\n%s", out)
	}
}

// TestBwrapHidesSockets checks the Hide masks with /run and a directory
// holding a listening Unix socket: read-only alone would not stop a
// connect(2).
func TestBwrapHidesSockets(t *testing.T) {
	t.Parallel()
	dir := roots(t)["var-tmp"](t) // outside /tmp, which is private anyway
	sock := filepath.Join(dir, "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	// A file that a kept symlink leads to stays readable in a hidden dir.
	stub := filepath.Join(dir, "resolve", "stub-resolv.conf")
	if err := os.MkdirAll(filepath.Dir(stub), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(stub, []byte("nameserver 192.0.2.53\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.Symlink(stub, link); err != nil {
		t.Fatal(err)
	}
	rt, _ := realRuntime(t, DefaultConfig(dir))
	rt.(*bwrapRuntime).keep = append(rt.(*bwrapRuntime).keep, link)
	out, code := run(t, prepare(t, rt, Request{Command: fmt.Sprintf(
		`[ -e %q ] && echo BAD-socket; echo "run=[$(ls -A /run)]"; cat /etc/resolv.conf >/dev/null && echo resolv-ok; `+
			`cat %q; ls -A %q`, sock, stub, dir)}))
	if !strings.Contains(out, "nameserver 192.0.2.53\nresolve\n") {
		t.Errorf("want the kept file readable and nothing else in its hidden dir:\n%s", out)
	}
	if code != 0 || strings.Contains(out, "BAD") {
		t.Fatalf("socket visible (code %d):\n%s", code, out)
	}
	wantRun := "run=[]"
	if resolved, err := filepath.EvalSymlinks("/etc/resolv.conf"); err == nil && within("/run", resolved) {
		// The resolv.conf target stays, with the directories above it.
		wantRun = "run=[" + strings.Split(strings.TrimPrefix(resolved, "/run/"), "/")[0] + "]"
	}
	if !strings.Contains(out, wantRun+"\n") {
		t.Errorf("/run inside is not empty, want %s:\n%s", wantRun, out)
	}
	if _, err := os.ReadFile("/etc/resolv.conf"); err == nil && !strings.Contains(out, "resolv-ok") {
		t.Errorf("/etc/resolv.conf unreadable inside:\n%s", out)
	}
}

func TestBwrapPIDNamespace(t *testing.T) {
	t.Parallel()
	rt, _ := realRuntime(t, Config{})
	m := "0.0" + hexDigits(marker(t))
	// sleep sums its arguments; the second one marks the process as ours.
	host := exec.Command("sleep", "1000", m)
	if err := host.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Process.Kill(); host.Wait() })
	if len(hostProcs(t, m)) != 1 {
		t.Fatalf("host sleep with marker %s not visible on the host", m)
	}
	out, code := run(t, prepare(t, rt, Request{Command: `ps -e -o pid=,args=; echo "procs=$(ls /proc | grep -c '^[0-9]')"`}))
	if code != 0 {
		t.Fatalf("code %d:\n%s", code, out)
	}
	if strings.Contains(out, m) {
		t.Fatalf("host process visible inside:\n%s", out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	// bwrap's init (pid 1), sh, ps, and the procs line.
	if len(lines) > 6 {
		t.Errorf("ps -e shows %d processes inside, want only the sandbox's own:\n%s", len(lines)-1, out)
	}
	var n int
	if _, err := fmt.Sscanf(lines[len(lines)-1], "procs=%d", &n); err != nil || n < 2 || n > 6 {
		t.Errorf("/proc inside lists %d pids (%v):\n%s", n, err, out)
	}
}

func TestBwrapNetwork(t *testing.T) {
	t.Parallel()
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("SKIPPED: bash (for /dev/tcp) is not installed")
	}
	for _, enabled := range []bool{false, true} {
		t.Run(fmt.Sprintf("network=%v", enabled), func(t *testing.T) {
			t.Parallel()
			rt, _ := realRuntime(t, Config{Network: enabled})
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			var (
				wg       sync.WaitGroup
				mu       sync.Mutex
				accepted int
			)
			wg.Go(func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					mu.Lock()
					accepted++
					mu.Unlock()
					c.Close()
				}
			})
			port := ln.Addr().(*net.TCPAddr).Port
			out, code := run(t, prepare(t, rt, Request{Command: fmt.Sprintf(
				`%s -c 'exec 3<>/dev/tcp/127.0.0.1/%d' && echo connected`, bash, port)}))
			ln.Close()
			wg.Wait()
			connected := code == 0 && strings.Contains(out, "connected")
			if connected != enabled || (accepted == 1) != enabled {
				t.Fatalf("network %v: connected %v, accepted %d (code %d):\n%s", enabled, connected, accepted, code, out)
			}
		})
	}
}

func TestBwrapPathInjection(t *testing.T) {
	t.Parallel()
	rt, ws := realRuntime(t, Config{})
	m := marker(t)
	evil := fmt.Sprintf("$(touch /tmp/pwned-%[1]s)$(touch %[2]s/pwned-%[1]s)`touch %[2]s/bt-%[1]s`", m, ws)
	p := prepare(t, rt, Request{Command: `echo "path=$PATH"; ls -A /tmp "$HOME"`, Env: map[string]string{"PATH": evil}})
	if last := p.Argv[len(p.Argv)-1]; strings.Contains(last, "pwned") || strings.Contains(last, m) {
		t.Fatalf("the command text contains the PATH value: %q", last)
	}
	out, code := run(t, p)
	if code != 0 {
		t.Fatalf("code %d:\n%s", code, out)
	}
	first, rest, _ := strings.Cut(out, "\n")
	if !strings.HasPrefix(first, "path="+evil+":/") || strings.Contains(rest, m) {
		t.Errorf("want the literal value first in PATH and nothing created inside:\n%s", out)
	}
	for _, f := range []string{"/tmp/pwned-" + m, filepath.Join(ws, "pwned-"+m), filepath.Join(ws, "bt-"+m)} {
		if _, err := os.Lstat(f); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s was created (%v)", f, err)
		}
	}
}

func TestBwrapPathPrepend(t *testing.T) {
	t.Parallel()
	rt, _ := realRuntime(t, Config{})
	out, code := run(t, prepare(t, rt, Request{
		Command:     `echo "$PATH"; echo "[${OPENCLAW_PREPEND_PATH-unset}] $OPENCLAW_SHELL $HOME"`,
		Env:         map[string]string{"PATH": "/custom/bin"},
		PathPrepend: []string{"/opt/a/bin", "/opt/b/bin"},
	}))
	lines := strings.Split(out, "\n")
	if code != 0 || len(lines) < 2 {
		t.Fatalf("code %d:\n%s", code, out)
	}
	if !strings.HasPrefix(lines[0], "/opt/a/bin:/opt/b/bin:/custom/bin:") || !strings.Contains(lines[0], ":/usr/bin") {
		t.Errorf("PATH inside = %q, want the entries first, then the profile's PATH", lines[0])
	}
	if !strings.HasPrefix(lines[1], "[unset] exec /") {
		t.Errorf("internal variable or OPENCLAW_SHELL wrong: %q", lines[1])
	}
}

func TestBwrapWorkdir(t *testing.T) {
	t.Parallel()
	rt, ws := realRuntime(t, Config{})
	if err := os.MkdirAll(filepath.Join(ws, "a", "b"), 0o700); err != nil {
		t.Fatal(err)
	}
	p := prepare(t, rt, Request{Command: "pwd; touch here", Workdir: "a/b"})
	out, code := run(t, p)
	if code != 0 || out != p.DisplayCwd+"\n" || p.DisplayCwd != filepath.Join(ws, "a", "b") {
		t.Fatalf("pwd = %q (code %d), DisplayCwd %q", out, code, p.DisplayCwd)
	}
	if _, err := os.Stat(filepath.Join(ws, "a", "b", "here")); err != nil {
		t.Fatal(err)
	}
	m := marker(t)
	for _, w := range []string{"..", "a/../../x", "/etc", filepath.Dir(ws)} {
		_, err := rt.Prepare(Request{Command: "touch /tmp/ran-" + m + "; touch $HOME/ran-" + m, Workdir: w})
		var we *WorkdirError
		want := `workdir "` + w + `" is unavailable or not a directory: command was not executed. workdir is treated as a literal path; shell expansions such as "~" are not applied. Use an existing directory, omit an explicit workdir to use the default cwd, or update the configured default cwd.`
		if !errors.As(err, &we) || err.Error() != want || !errors.Is(err, ErrOutsideWorkspace) {
			t.Errorf("workdir %q: %v", w, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(ws, "ran-"+m)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refused command ran")
	}
}

func TestBwrapKillTree(t *testing.T) {
	t.Parallel()
	rt, _ := realRuntime(t, Config{})
	for _, tc := range []struct {
		name string
		sig  syscall.Signal
		pty  bool
	}{
		{"SIGTERM", syscall.SIGTERM, false},
		{"SIGKILL", syscall.SIGKILL, false},
		{"pty SIGTERM", syscall.SIGTERM, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// "sleep 1000 0.0<digits>": sleep sums its arguments, the marker
			// makes the processes ours to find on the host. One sleep
			// leaves the session with setsid.
			m := "0.0" + hexDigits(marker(t))
			p := prepare(t, rt, Request{PTY: tc.pty,
				Command: fmt.Sprintf(`sleep 1000 %[1]s & setsid sleep 1000 %[1]s & sleep 1000 %[1]s`, m)})
			var exited chan error
			var pid int
			if tc.pty {
				_, _, exited, pid = startPTY(t, p)
			} else {
				cmd := command(t.Context(), p)
				cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				ch := make(chan error, 1)
				go func() { ch <- cmd.Wait() }()
				t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); <-ch })
				exited, pid = ch, cmd.Process.Pid
			}
			waitFor(t, 10*time.Second, "three sleeps inside the sandbox", func() bool { return len(hostProcs(t, m)) == 3 })
			// What the session core does: signal the group of what it started.
			if err := syscall.Kill(-pid, tc.sig); err != nil {
				t.Fatal(err)
			}
			waitExit(t, exited)
			waitFor(t, 10*time.Second, "no sleep left on the host", func() bool { return len(hostProcs(t, m)) == 0 })
		})
	}
}

// hexDigits maps a hex marker to decimal digits, as sleep wants a number.
func hexDigits(m string) string {
	var b strings.Builder
	for _, c := range m {
		b.WriteByte(byte('0' + strings.IndexRune("0123456789abcdef", c)%10))
	}
	return b.String()
}

// ptyOutput collects what a PTY's master side reads.
type ptyOutput struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	done chan struct{}
}

func readPTY(f *os.File) *ptyOutput {
	o := &ptyOutput{done: make(chan struct{})}
	go func() {
		defer close(o.done)
		b := make([]byte, 4096)
		for {
			n, err := f.Read(b)
			o.mu.Lock()
			o.buf.Write(b[:n])
			o.mu.Unlock()
			if err != nil { // EIO once the sandbox is gone
				return
			}
		}
	}()
	return o
}

func (o *ptyOutput) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

func (o *ptyOutput) waitFor(t *testing.T, s string) {
	t.Helper()
	waitFor(t, 15*time.Second, fmt.Sprintf("%q in the PTY output", s), func() bool { return strings.Contains(o.String(), s) })
}

// startPTY starts p on a new 120×30 PTY as the session core does, and
// returns the master, its output, the exit and the pid.
func startPTY(t *testing.T, p Prepared) (*os.File, *ptyOutput, chan error, int) {
	t.Helper()
	cmd := exec.Command(p.Argv[0], p.Argv[1:]...)
	cmd.Dir, cmd.Env = p.Workdir, p.Env
	ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 30, Cols: 120})
	if err != nil {
		t.Fatal(err)
	}
	// Non-blocking, so that Close interrupts the reader even when an
	// escaped process still holds the terminal open. (Fd would undo it.)
	rc, err := ptmx.SyscallConn()
	if err == nil {
		err = rc.Control(func(fd uintptr) { err = syscall.SetNonblock(int(fd), true) })
	}
	if err != nil {
		t.Fatal(err)
	}
	out := readPTY(ptmx)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		ptmx.Close()
		<-out.done
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			t.Error("sandbox still running at cleanup")
		}
	})
	return ptmx, out, exited, cmd.Process.Pid
}

// waitExit waits for the exit and leaves it in the channel for cleanups.
func waitExit(t *testing.T, exited chan error) error {
	t.Helper()
	select {
	case err := <-exited:
		exited <- err
		return err
	case <-time.After(15 * time.Second):
		t.Fatal("sandbox did not exit")
		return nil
	}
}

func TestBwrapPTY(t *testing.T) {
	t.Parallel()
	rt, _ := realRuntime(t, Config{})
	p := prepare(t, rt, Request{PTY: true, Command: `[ -t 0 ] && echo tty-yes; echo "term=$TERM"; echo ready; read line; echo "got:[$line]"`})
	ptmx, out, exited, _ := startPTY(t, p)
	out.waitFor(t, "ready")
	if _, err := ptmx.Write([]byte("hello sandbox\n")); err != nil {
		t.Fatal(err)
	}
	out.waitFor(t, "got:[hello sandbox]")
	if err := waitExit(t, exited); err != nil {
		t.Fatalf("exit: %v\n%s", err, out)
	}
	for _, want := range []string{"tty-yes", "term=xterm-256color"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// TestBwrapPTYInterrupt pins a documented limitation: Ctrl-C in a PTY
// session also reaches the outer bwrap, which dies and ends the sandbox. It
// must still leave nothing behind.
func TestBwrapPTYInterrupt(t *testing.T) {
	t.Parallel()
	rt, _ := realRuntime(t, Config{})
	m := "0.0" + hexDigits(marker(t))
	p := prepare(t, rt, Request{PTY: true, Command: fmt.Sprintf(
		`trap 'echo caught-int' INT; sleep 1000 %s & echo ready; while :; do read x || continue; echo "got:[$x]"; done`, m)})
	ptmx, out, exited, _ := startPTY(t, p)
	out.waitFor(t, "ready")
	if _, err := ptmx.Write([]byte{3}); err != nil { // Ctrl-C
		t.Fatal(err)
	}
	err := waitExit(t, exited)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGINT {
		t.Fatalf("bwrap ended with %v, want death by SIGINT\n%s", err, out)
	}
	waitFor(t, 10*time.Second, "no sleep left on the host", func() bool { return len(hostProcs(t, m)) == 0 })
}
