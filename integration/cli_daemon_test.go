package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/execmesh/execmesh/internal/testutil"
)

// The tests of this file drive the built binary as a user would: a daemon
// started without a prepared configuration, and the
// client commands run from other directories, with their exit statuses.

// bareDaemon is a daemon started with nothing but a state dir, ports and
// extra flags; its stdout (the start-up lines) is kept.
type bareDaemon struct {
	t        *testing.T
	cmd      *exec.Cmd
	url      string
	stateDir string
	home     string
	stdout   *testutil.SyncBuffer
	stderr   *testutil.SyncBuffer
	done     chan error
}

// daemonCmd builds `execmesh <mode> --state-dir … --listen … --nats-listen
// …` (unless extra names a --nats-listen of its own) with HOME in a fresh
// directory and no EXECMESH_* variables, run in dir.
func daemonCmd(t *testing.T, mode, stateDir, listen, dir string, extra ...string) *exec.Cmd {
	t.Helper()
	bin, err := execmeshBinary()
	if err != nil {
		t.Fatal(err)
	}
	args := []string{mode, "--state-dir", stateDir, "--listen", listen}
	if !strings.Contains(strings.Join(extra, " "), "--nats-listen") {
		args = append(args, "--nats-listen", freeAddr(t))
	}
	cmd := exec.Command(bin, append(args, extra...)...)
	cmd.Dir = dir
	cmd.Env = cleanEnv(map[string]string{"HOME": filepath.Dir(stateDir)})
	return cmd
}

// cleanEnv is the test process's environment without EXECMESH_* and with
// the given variables.
func cleanEnv(set map[string]string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "EXECMESH_") || set[k] != "" {
			continue
		}
		env = append(env, kv)
	}
	for k, v := range set {
		env = append(env, k+"="+v)
	}
	return env
}

// startBareDaemon starts a daemon in dir and waits for /healthz.
func startBareDaemon(t *testing.T, mode, stateDir, dir string, extra ...string) *bareDaemon {
	t.Helper()
	listen := freeAddr(t)
	cmd := daemonCmd(t, mode, stateDir, listen, dir, extra...)
	d := &bareDaemon{t: t, cmd: cmd, url: "http://" + listen, stateDir: stateDir, home: filepath.Dir(stateDir),
		stdout: &testutil.SyncBuffer{}, stderr: &testutil.SyncBuffer{}, done: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = d.stdout, d.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.done <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState != nil {
			return
		}
		// SIGTERM: the daemon ends the process trees of its sessions.
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Signal(syscall.SIGKILL)
			<-d.done
		}
	})
	waitHealthy(t, d.url, d.done, d.stderr)
	return d
}

// stop ends the daemon with SIGTERM and waits for it.
func (d *bareDaemon) stop() {
	d.t.Helper()
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(30 * time.Second):
		d.t.Fatalf("daemon did not stop\n%s", d.stderr.String())
	}
}

// cliResult is one run of the client binary.
type cliResult struct {
	code           int
	stdout, stderr string
}

// cli runs the client binary in dir against the daemon, with its state
// dir, and returns what it did.
func (d *bareDaemon) cli(dir string, args ...string) cliResult {
	d.t.Helper()
	return runBinary(d.t, dir, map[string]string{"HOME": d.home, "EXECMESH_GATEWAY_URL": d.url, "EXECMESH_STATE_DIR": d.stateDir}, "", args...)
}

// runBinary runs the execmesh binary with env (on a clean environment),
// stdin and args, in dir, within a minute.
func runBinary(t *testing.T, dir string, env map[string]string, stdin string, args ...string) cliResult {
	t.Helper()
	bin, err := execmeshBinary()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	cmd.Env = cleanEnv(env)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	var ee *exec.ExitError
	code := 0
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("execmesh %q: %v", args, err)
	}
	return cliResult{code: code, stdout: out.String(), stderr: errOut.String()}
}

// TestCLIReloadsConfigCreatedAfterStart: a daemon started without a
// configuration file picks up the one `execmesh config set` creates when
// it gets SIGHUP.
func TestCLIReloadsConfigCreatedAfterStart(t *testing.T) {
	state := filepath.Join(t.TempDir(), ".execmesh")
	d := startBareDaemon(t, "gateway", state, t.TempDir())
	// Out of the box: allowlist + on-miss, so echo waits for approval.
	if r := d.cli(t.TempDir(), "exec", "--no-wait", "--", "echo", "hi"); r.code != 0 || !strings.Contains(r.stdout, "Approval required") {
		t.Fatalf("before the reload: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	for _, kv := range [][2]string{{"tools.exec.security", "full"}, {"tools.exec.ask", "off"}} {
		if r := d.cli(t.TempDir(), "config", "set", kv[0], kv[1]); r.code != 0 {
			t.Fatalf("config set %s: %d %s", kv[0], r.code, r.stderr)
		}
	}
	if _, err := os.Stat(filepath.Join(state, "config.json")); err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		r := d.cli(t.TempDir(), "exec", "--", "echo", "reloaded")
		if r.code == 0 && r.stdout == "reloaded\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the new configuration is not in force: exit %d, stdout %q, stderr %q\n%s", r.code, r.stdout, r.stderr, d.stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if log := d.stderr.String(); strings.Contains(log, "reload failed") || !strings.Contains(log, "configuration reloaded") {
		t.Fatalf("daemon log:\n%s", log)
	}
}

// TestCLIOneDaemonPerStateDir: a second `up`, `gateway` or `node` on a
// state dir in use exits at once, non-zero, naming the dir and the
// holder's pid; kill -9 of the holder frees the dir.
func TestCLIOneDaemonPerStateDir(t *testing.T) {
	state := filepath.Join(t.TempDir(), ".execmesh")
	first := startBareDaemon(t, "up", state, t.TempDir())
	for _, mode := range []string{"up", "gateway"} {
		start := time.Now()
		r := runDaemonToExit(t, daemonCmd(t, mode, state, freeAddr(t), t.TempDir()))
		if r.code == 0 || !strings.Contains(r.stderr, state) || !strings.Contains(r.stderr, "pid "+strconv.Itoa(first.cmd.Process.Pid)) {
			t.Fatalf("second %s on the same state dir: exit %d, stderr %q", mode, r.code, r.stderr)
		}
		if time.Since(start) > 10*time.Second {
			t.Errorf("second %s took %v to give up", mode, time.Since(start))
		}
	}
	// The first one is unharmed.
	if r := first.cli(t.TempDir(), "admin", "blockers"); r.code != 0 {
		t.Fatalf("first daemon after the refusals: %d %s", r.code, r.stderr)
	}
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-first.done
	startBareDaemon(t, "up", state, t.TempDir())

	// Node agents: one per state dir as well (the first one waits for a
	// NATS server that is not there; the lock comes first).
	nodeState := filepath.Join(t.TempDir(), "node-state")
	bin, _ := execmeshBinary()
	node := exec.Command(bin, "node", "--state-dir", nodeState, "--nats-url", "nats://"+freeAddr(t))
	node.Env = cleanEnv(map[string]string{"HOME": t.TempDir()})
	nodeErr := &testutil.SyncBuffer{}
	node.Stderr = nodeErr
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = node.Process.Kill(); _ = node.Wait() }()
	waitFile(t, filepath.Join(nodeState, "daemon.lock"), strconv.Itoa(node.Process.Pid))
	second := exec.Command(bin, "node", "--state-dir", nodeState, "--nats-url", "nats://"+freeAddr(t))
	second.Env = node.Env
	r := runDaemonToExit(t, second)
	if r.code == 0 || !strings.Contains(r.stderr, nodeState) || !strings.Contains(r.stderr, "pid "+strconv.Itoa(node.Process.Pid)) {
		t.Fatalf("second node on the same state dir: exit %d, stderr %q (first: %s)", r.code, r.stderr, nodeErr.String())
	}
}

// runDaemonToExit runs a daemon command that must exit by itself within
// 20 s.
func runDaemonToExit(t *testing.T, cmd *exec.Cmd) cliResult {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("%q did not exit\n%s", cmd.Args, errOut.String())
	}
	return cliResult{code: cmd.ProcessState.ExitCode(), stdout: out.String(), stderr: errOut.String()}
}

// waitFile waits until path holds want (trimmed).
func waitFile(t *testing.T, path, want string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		b, _ := os.ReadFile(path)
		if strings.TrimSpace(string(b)) == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s holds %q, want %q", path, b, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// trustedUp starts `up` with security full and ask off, in dir, and a
// yield window of half a second (so that a command "outlives the yield
// window" in tests that do not last ten seconds).
func trustedUp(t *testing.T, dir string, extra ...string) *bareDaemon {
	t.Helper()
	state := filepath.Join(t.TempDir(), ".execmesh")
	if err := os.MkdirAll(state, 0o700); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(map[string]any{"tools": map[string]any{"exec": map[string]any{
		"security": "full", "ask": "off", "killGraceMs": 1000, "backgroundMs": 500}}})
	if err := os.WriteFile(filepath.Join(state, "config.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	return startBareDaemon(t, "up", state, dir, extra...)
}

// TestCLIExecRunsInTheCallersDirectory: with a local gateway, exec runs
// in the caller's working directory; --workdir wins; a node run gets no
// directory from the CLI.
func TestCLIExecRunsInTheCallersDirectory(t *testing.T) {
	daemonDir, callerDir, explicit := t.TempDir(), t.TempDir(), t.TempDir()
	d := trustedUp(t, daemonDir)
	if r := d.cli(callerDir, "exec", "--", "pwd"); r.code != 0 || r.stdout != callerDir+"\n" {
		t.Fatalf("exec -- pwd from %s: exit %d, stdout %q, stderr %q", callerDir, r.code, r.stdout, r.stderr)
	}
	if r := d.cli(callerDir, "exec", "--workdir", explicit, "--", "pwd"); r.code != 0 || r.stdout != explicit+"\n" {
		t.Fatalf("--workdir: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	// The local node runs in its own default directory (the daemon's),
	// not the caller's.
	waitLocalNode(t, d)
	if r := d.cli(callerDir, "exec", "--host", "node", "--", "pwd"); r.code != 0 || r.stdout != daemonDir+"\n" {
		t.Fatalf("--host node: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	// A gateway reached through another address is local all the same:
	// the host id decides, not the URL.
	if r := runBinary(t, callerDir, map[string]string{"HOME": d.home, "EXECMESH_GATEWAY_URL": strings.Replace(d.url, "127.0.0.1", "localhost", 1)}, "", "exec", "--", "pwd"); r.code != 0 || r.stdout != callerDir+"\n" {
		t.Fatalf("via localhost: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

// waitLocalNode waits until up's local node is connected and paired, and
// returns its name.
func waitLocalNode(t *testing.T, d *bareDaemon) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		nodes := httpGetJSON(t, d.url+"/v1/nodes")["nodes"].([]any)
		if len(nodes) == 1 {
			n := nodes[0].(map[string]any)
			if n["status"] == "connected" && n["paired"] == true {
				return n["name"].(string)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no connected local node: %v", nodes)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestCLIExecLikeSSH: exec waits for the command, prints its output and
// takes its exit status: 127, 126, 128+N, 124 for a timeout, the command's
// code; --background and --no-wait return at once.
func TestCLIExecLikeSSH(t *testing.T) {
	dir := t.TempDir()
	d := trustedUp(t, dir)
	plain := filepath.Join(dir, "plain.txt")
	if err := os.WriteFile(plain, []byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args   []string
		code   int
		stdout string // exact when set
		stderr string // substring
	}{
		{args: []string{"--", "sh", "-c", "echo out; exit 7"}, code: 7, stdout: "out\n"},
		// Past the yield window (500 ms here, 10 s by default): exec
		// still waits for it.
		{args: []string{"sleep 1.5; echo late"}, stdout: "late\n"},
		{args: []string{"--", "execmesh-no-such-cmd"}, code: 127},
		{args: []string{"--", plain}, code: 126},
		{args: []string{"kill -TERM $$"}, code: 128 + 15, stderr: "signal SIGTERM"},
		{args: []string{"--timeout", "1", "--", "sleep", "20"}, code: 124, stderr: "timed out"},
		{args: []string{"--background", "--", "sleep", "5"}, stdout: "", stderr: ""},
		{args: []string{"--no-wait", "--yield-ms", "200", "--", "sh", "-c", "sleep 5"}, stderr: ""},
	}
	for _, tt := range tests {
		r := d.cli(dir, append([]string{"exec"}, tt.args...)...)
		if r.code != tt.code || (tt.stdout != "" && r.stdout != tt.stdout) || !strings.Contains(r.stderr, tt.stderr) {
			t.Errorf("exec %q: exit %d, stdout %q, stderr %q; want %d, %q, %q", tt.args, r.code, r.stdout, r.stderr, tt.code, tt.stdout, tt.stderr)
		}
		switch strings.Join(tt.args, " ") {
		case "--background -- sleep 5":
			// The session id alone: S=$(execmesh exec --background …).
			if !regexp.MustCompile(`^[a-z0-9]+(-[a-z0-9]+)*\n$`).MatchString(r.stdout) {
				t.Errorf("exec %q: stdout %q, want the session id alone", tt.args, r.stdout)
			}
		case "--no-wait --yield-ms 200 -- sh -c sleep 5":
			if !strings.Contains(r.stdout, "Command still running (session ") {
				t.Errorf("exec %q: stdout %q, want the agent's text", tt.args, r.stdout)
			}
		}
	}
}

// TestCLIExecWaitsForApproval: an exec that needs approval says so on
// stderr and waits; approved (with `execmesh approvals resolve`), it runs
// and exec takes its status; denied, exec exits 1 with the reason. The
// sessionKey's events stay for the agent.
func TestCLIExecWaitsForApproval(t *testing.T) {
	state := filepath.Join(t.TempDir(), ".execmesh")
	dir := t.TempDir()
	d := startBareDaemon(t, "gateway", state, dir) // allowlist + on-miss

	run := func(decision string, command ...string) (cliResult, string) {
		bin, _ := execmeshBinary()
		cmd := exec.Command(bin, append([]string{"exec", "--"}, command...)...)
		cmd.Dir = dir
		cmd.Env = cleanEnv(map[string]string{"HOME": d.home, "EXECMESH_GATEWAY_URL": d.url, "EXECMESH_STATE_DIR": state})
		var out bytes.Buffer
		cmd.Stdout = &out
		errPipe, _ := cmd.StderrPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		rd := bufio.NewReader(errPipe)
		line, err := rd.ReadString('\n')
		if err != nil || !strings.Contains(line, "waiting for approval") {
			t.Fatalf("first stderr line %q (%v)", line, err)
		}
		slug := regexp.MustCompile(`approval ([0-9a-f]{8})`).FindStringSubmatch(line)
		if slug == nil {
			t.Fatalf("no approval slug in %q", line)
		}
		// Still waiting a moment later.
		time.Sleep(300 * time.Millisecond)
		if cmd.ProcessState != nil {
			t.Fatal("exec returned before the decision")
		}
		if r := d.cli(dir, "approvals", "resolve", slug[1], decision); r.code != 0 {
			t.Fatalf("resolve: %d %s", r.code, r.stderr)
		}
		rest, _ := io.ReadAll(rd)
		_ = cmd.Wait()
		return cliResult{code: cmd.ProcessState.ExitCode(), stdout: out.String(), stderr: line + string(rest)}, slug[1]
	}

	r, slug := run("allow-once", "sh", "-c", "echo approved-run; exit 3")
	if r.code != 3 || r.stdout != "approved-run\n" {
		t.Fatalf("approved: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r, _ = run("deny", "echo", "never")
	if r.code != 1 || r.stdout != "" || !strings.Contains(r.stderr, "exec denied (user-denied): echo never") {
		t.Fatalf("denied: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	// exec read the approvals' state, not the events: the agent still
	// gets its Exec finished and Exec denied.
	events := httpGetJSON(t, d.url+"/v1/events?sessionKey=agent:main:main&waitMs=3000")["events"].([]any)
	var kinds []string
	for _, e := range events {
		kinds = append(kinds, e.(map[string]any)["kind"].(string))
	}
	if !strings.Contains(strings.Join(kinds, " "), "exec.finished") || !strings.Contains(strings.Join(kinds, " "), "exec.denied") {
		t.Fatalf("events after the CLI waited: %v", events)
	}
	if r := d.cli(dir, "approvals", "get", slug); r.code != 0 || !strings.Contains(r.stdout, "decided") || !strings.Contains(r.stdout, "allow-once") {
		t.Fatalf("approvals get: %d %q %q", r.code, r.stdout, r.stderr)
	}
}

// TestCLINodesCommands: invite refuses on a loopback NATS server and says
// to use --nats-listen; approve and reject take node names.
func TestCLINodesCommands(t *testing.T) {
	d := trustedUp(t, t.TempDir())
	name := waitLocalNode(t, d)
	r := d.cli(t.TempDir(), "nodes", "invite", "--name", "build-1")
	if r.code == 0 || r.stdout != "" || !strings.Contains(r.stderr, "loopback only") || !strings.Contains(r.stderr, "--nats-listen") {
		t.Fatalf("invite on loopback: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r = d.cli(t.TempDir(), "nodes", "approve", name)
	if r.code != 0 || !strings.Contains(r.stdout, "node "+name+" (id ") || !strings.Contains(r.stdout, "approved") {
		t.Fatalf("approve by name: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if r := d.cli(t.TempDir(), "nodes", "reject", "no-such-node"); r.code != 1 || !strings.Contains(r.stderr, `unknown node "no-such-node"`) {
		t.Fatalf("reject unknown: exit %d, stderr %q", r.code, r.stderr)
	}

	// Beyond loopback the invite works.
	d2 := trustedUp(t, t.TempDir(), "--nats-listen", "0.0.0.0:"+strings.Split(freeAddr(t), ":")[1], "--token", "tok")
	r = runBinary(t, t.TempDir(), map[string]string{"HOME": d2.home, "EXECMESH_GATEWAY_URL": d2.url, "EXECMESH_GATEWAY_TOKEN": "tok"}, "", "nodes", "invite", "--name", "build-1")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "execmesh node --join ") {
		t.Fatalf("invite beyond loopback: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

// TestCLIConventions: completion scripts, the version from the build
// information, man pages, usage errors before any request.
func TestCLIConventions(t *testing.T) {
	dir := t.TempDir()
	env := map[string]string{"HOME": dir, "EXECMESH_GATEWAY_URL": "http://" + freeAddr(t)}
	for shell, want := range map[string]string{"bash": "__start_execmesh", "zsh": "#compdef execmesh", "fish": "complete -c execmesh"} {
		if r := runBinary(t, dir, env, "", "completion", shell); r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Errorf("completion %s: exit %d, %.200q", shell, r.code, r.stdout)
		}
	}
	r := runBinary(t, dir, env, "", "version")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "execmesh ") {
		t.Fatalf("version: %d %q", r.code, r.stdout)
	}
	// The go command stamps the revision when the module root holds a .git
	// directory (a clone, as in CI; a git worktree's .git is a file).
	root, _ := moduleRoot()
	if fi, err := os.Stat(filepath.Join(root, ".git")); err != nil || !fi.IsDir() {
		t.Logf("no .git directory at %s: the commit is not checked", root)
	} else if head, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output(); err == nil {
		if rev := strings.TrimSpace(string(head)); !strings.Contains(r.stdout, "commit "+rev[:12]) {
			t.Errorf("version %q does not name the commit %s", r.stdout, rev[:12])
		}
	}
	man := filepath.Join(dir, "man")
	if r := runBinary(t, dir, env, "", "man", man); r.code != 0 {
		t.Fatalf("man: %d %s", r.code, r.stderr)
	}
	for _, page := range []string{"execmesh.1", "execmesh-exec.1", "execmesh-nodes-approvals-set.1"} {
		b, err := os.ReadFile(filepath.Join(man, page))
		if err != nil || !bytes.Contains(b, []byte(".SH NAME")) {
			t.Errorf("%s: %v %.100q", page, err, b)
		}
	}
	// Missing arguments: usage errors, exit 2, before any request (the
	// gateway URL is a port nobody listens on).
	for _, args := range [][]string{{"process", "poll"}, {"nodes", "approve"}, {"approvals", "resolve", "x"}, {"exec"}} {
		if r := runBinary(t, dir, env, "", args...); r.code != 2 || strings.Contains(r.stderr, "cannot reach") {
			t.Errorf("%q: exit %d, stderr %q", args, r.code, r.stderr)
		}
	}
	if r := runBinary(t, dir, env, "", "help"); !strings.Contains(r.stdout, "nodes approvals get NODE | set NODE FILE|- --base-hash H") || !strings.Contains(r.stdout, "--operator-token") {
		t.Errorf("top-level help:\n%s", r.stdout)
	}
	if r := runBinary(t, dir, env, "", "up", "--help"); strings.Contains(r.stdout, "-1ns") || !strings.Contains(r.stdout, "--drain-timeout duration") {
		t.Errorf("up --help:\n%s", r.stdout)
	}
}

// TestCLIDaemonSurfaces: GET / leads to the control page, whose URL the
// start-up lines print; the embedded server's banner stays out of the info
// log, the real NATS address is reported (0.0.0.0:P as such); blockers is
// a list.
func TestCLIDaemonSurfaces(t *testing.T) {
	port := strings.Split(freeAddr(t), ":")[1]
	d := trustedUp(t, t.TempDir(), "--nats-listen", "0.0.0.0:"+port, "--token", "tok")
	waitLocalNode2 := func() {
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(d.stderr.String(), "pairing: paired") {
			if time.Now().After(deadline) {
				t.Fatalf("local node not paired:\n%s", d.stderr.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitLocalNode2()
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := noRedirect.Get(d.url + "/")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusFound || res.Header.Get("Location") != "/ui/" {
		t.Fatalf("GET /: %d %q", res.StatusCode, res.Header.Get("Location"))
	}
	out := d.stdout.String()
	if !strings.Contains(out, "control page: "+d.url+"/ui/") || !strings.Contains(out, "NATS: embedded server on 0.0.0.0:"+port) {
		t.Errorf("start-up lines:\n%s", out)
	}
	log := d.stderr.String()
	if strings.Contains(log, "Starting nats-server") || strings.Contains(log, "JETSTREAM") {
		t.Errorf("the server's banner is logged at info:\n%s", log)
	}
	if strings.Contains(log, "nats://127.0.0.1:4222") || !strings.Contains(log, "embedded server on 0.0.0.0:"+port) {
		t.Errorf("the log does not say which server the local node uses:\n%s", log)
	}
	req, _ := http.NewRequest("GET", d.url+"/v1/admin/blockers", nil)
	req.Header.Set("Authorization", "Bearer tok")
	res, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if strings.TrimSpace(string(body)) != `{"blockers":[]}` {
		t.Errorf("blockers: %s", body)
	}
	d.stop()
	if d.cmd.ProcessState.ExitCode() != 0 {
		t.Errorf("exit %d after SIGTERM\n%s", d.cmd.ProcessState.ExitCode(), d.stderr.String())
	}
}
