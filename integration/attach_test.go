package integration

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/sync/errgroup"

	"github.com/execmesh/execmesh/bus"
)

// The tests of this file hold the remote shell to what people expect of
// ssh and kubectl exec, through the built binary: the real bytes, stdout
// and stderr apart, stdin, a terminal, attaching to a session an agent
// started, on the gateway's host and on a node alike.

// streamHosts are the exec flags of each host a stream test runs on.
func streamHosts(t *testing.T, d *bareDaemon) map[string][]string {
	node := waitLocalNode(t, d)
	return map[string][]string{"gateway": {"--host", "gateway"}, "node": {"--node", node}}
}

// TestStreamExecBytes: exec prints the command's bytes exactly: 50 MB of
// stdin through sha256sum, a gzip stream that gunzips, output far beyond
// the agents' 200 000-character cap, and stdout and stderr apart, each
// in order, run after run.
func TestStreamExecBytes(t *testing.T) {
	dir := t.TempDir()
	d := trustedUp(t, dir)
	data := make([]byte, 50_000_000)
	_, _ = rand.Read(data)
	sum := sha256.Sum256(data)
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, data[:20_000_000], 0o644); err != nil {
		t.Fatal(err)
	}
	for name, flags := range streamHosts(t, d) {
		t.Run(name, func(t *testing.T) {
			r := runBinary(t, dir, d.env(), string(data), append(append([]string{"exec", "-i"}, flags...), "--", "sha256sum")...)
			if r.code != 0 || !strings.HasPrefix(r.stdout, hex.EncodeToString(sum[:])) {
				t.Fatalf("sha256sum of 50 MB of stdin: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
			}
			r = runBinary(t, dir, d.env(), "", append(append([]string{"exec"}, flags...), "--", "gzip", "-1", "-c", big)...)
			zr, err := gzip.NewReader(strings.NewReader(r.stdout))
			if err != nil {
				t.Fatalf("gzip -c: exit %d, %d bytes, stderr %q: %v", r.code, len(r.stdout), r.stderr, err)
			}
			got, err := io.ReadAll(zr)
			if err != nil || !bytes.Equal(got, data[:20_000_000]) {
				t.Fatalf("gunzip of exec's output: %d bytes, %v", len(got), err)
			}
			r = runBinary(t, dir, d.env(), "", append(append([]string{"exec"}, flags...), "--", "seq", "1", "100000")...)
			if r.code != 0 || len(r.stdout) != 588_895 || !strings.HasSuffix(r.stdout, "\n99999\n100000\n") || r.stderr != "" {
				t.Fatalf("seq 1 100000: exit %d, %d bytes, stderr %q", r.code, len(r.stdout), r.stderr)
			}
			// The exec timeout is 124 on every host.
			r = runBinary(t, dir, d.env(), "", append(append([]string{"exec", "--timeout", "1"}, flags...), "--", "sleep", "20")...)
			if r.code != 124 || !strings.Contains(r.stderr, "timed out") {
				t.Errorf("--timeout 1: exit %d, stderr %q", r.code, r.stderr)
			}
			// -t without a terminal here runs without one, as ssh does,
			// and the piped input ends.
			r = runBinary(t, dir, d.env(), "echo hi-$((1+1))\n", append(append([]string{"exec", "-t"}, flags...), "--", "sh")...)
			if r.code != 0 || r.stdout != "hi-2\n" || !strings.Contains(r.stderr, "stdin is not a terminal") {
				t.Errorf("exec -t with piped input: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
			}
			runs := 100
			if name == "node" {
				runs = 30
			}
			for i := range runs {
				r := runBinary(t, dir, d.env(), "", append(append([]string{"exec"}, flags...), "echo out1; echo err1 >&2; echo out2; echo err2 >&2; exit 4")...)
				if r.code != 4 || r.stdout != "out1\nout2\n" || r.stderr != "err1\nerr2\n" {
					t.Fatalf("run %d: exit %d, stdout %q, stderr %q", i, r.code, r.stdout, r.stderr)
				}
			}
		})
	}
}

// env is the client environment of the daemon's CLI.
func (d *bareDaemon) env() map[string]string {
	return map[string]string{"HOME": d.home, "EXECMESH_GATEWAY_URL": d.url, "EXECMESH_STATE_DIR": d.stateDir}
}

// tmuxSession is a terminal the test types into and reads, running one
// command of the execmesh binary.
type tmuxSession struct {
	t    *testing.T
	name string
	sock string
}

// startTmux runs the execmesh binary with args in a fresh tmux server of
// its own, in a 100x30 window; the shell then prints EXITED and the
// status.
func startTmux(t *testing.T, d *bareDaemon, args ...string) *tmuxSession {
	t.Helper()
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Skip("tmux is not installed: the terminal tests need it (apt-get install tmux)")
	}
	bin, err := execmeshBinary()
	if err != nil {
		t.Fatal(err)
	}
	s := &tmuxSession{t: t, name: "t", sock: filepath.Join(t.TempDir(), "tmux.sock")}
	var env []string
	for k, v := range d.env() {
		env = append(env, k+"="+v)
	}
	quoted := []string{"env", "-u", "TMUX"}
	quoted = append(quoted, env...)
	quoted = append(quoted, bin)
	for _, a := range args {
		quoted = append(quoted, "'"+strings.ReplaceAll(a, "'", `'\''`)+"'")
	}
	line := strings.Join(quoted, " ") + "; echo EXITED $?; sleep 600"
	s.tmux("new-session", "-d", "-s", s.name, "-x", "100", "-y", "30", line)
	t.Cleanup(func() { _ = exec.Command("tmux", "-S", s.sock, "kill-server").Run() })
	return s
}

func (s *tmuxSession) tmux(args ...string) string {
	s.t.Helper()
	out, err := exec.Command("tmux", append([]string{"-S", s.sock}, args...)...).CombinedOutput()
	if err != nil {
		s.t.Fatalf("tmux %q: %v: %s", args, err, out)
	}
	return string(out)
}

// keys types into the terminal (tmux send-keys arguments).
func (s *tmuxSession) keys(keys ...string) {
	s.t.Helper()
	s.tmux(append([]string{"send-keys", "-t", s.name}, keys...)...)
}

// screen is the terminal's text.
func (s *tmuxSession) screen() string {
	s.t.Helper()
	return s.tmux("capture-pane", "-p", "-t", s.name)
}

// waitScreen waits until the screen matches re, and returns the match.
func (s *tmuxSession) waitScreen(re string) []string {
	s.t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.Now().Add(30 * time.Second)
	for {
		scr := s.screen()
		if m := rx.FindStringSubmatch(scr); m != nil {
			return m
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("the terminal never showed %q:\n%s", re, scr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitScreenAsking types keys (and Enter) every second until the screen
// matches re.
func (s *tmuxSession) waitScreenAsking(re, keys string) {
	s.t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.Now().Add(30 * time.Second)
	for {
		s.keys(keys, "Enter")
		for range 20 {
			if rx.MatchString(s.screen()) {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("the terminal never showed %q:\n%s", re, s.screen())
		}
	}
}

// TestStreamExecTTY: exec -t is an interactive terminal: typing reaches
// the remote shell, the window size follows the local one, Ctrl-C stops
// the foreground job and not the shell, and exec exits with the shell's
// status.
func TestStreamExecTTY(t *testing.T) {
	d := trustedUp(t, t.TempDir())
	for name, flags := range streamHosts(t, d) {
		t.Run(name, func(t *testing.T) {
			s := startTmux(t, d, append(append([]string{"exec", "-t"}, flags...), "--", "sh")...)
			s.keys("echo typed-$((6*7)); stty size", "Enter")
			s.waitScreen(`typed-42`)
			s.waitScreen(`(?m)^30 100`)
			s.tmux("resize-window", "-t", s.name, "-x", "70", "-y", "20")
			// The new size travels from tmux's SIGWINCH to the remote
			// terminal beside the keys: ask until it has arrived.
			s.waitScreenAsking(`(?m)^20 70`, "clear; stty size")
			s.keys("sleep 600", "Enter")
			time.Sleep(300 * time.Millisecond) // the sleep runs in the foreground
			s.keys("C-c")
			// The shell runs the next line: the sleep ended, the shell did not.
			s.keys("echo alive-$((2+3)); exit 6", "Enter")
			s.waitScreen(`alive-5`)
			s.waitScreen(`EXITED 6`)
		})
	}
}

// TestAttachToAgentSession: a person attaches to a PTY session an agent
// started in the background, types into it, and the agent's poll returns
// what was typed; detaching (Ctrl-]) leaves the session running.
// logs -f follows a session's raw output to its end.
func TestAttachToAgentSession(t *testing.T) {
	dir := t.TempDir()
	d := trustedUp(t, dir)
	for name, flags := range streamHosts(t, d) {
		t.Run(name, func(t *testing.T) {
			r := d.cli(dir, append(append([]string{"exec", "--background", "--pty"}, flags...), "--", "sh")...)
			id := strings.TrimSpace(r.stdout)
			if r.code != 0 || id == "" {
				t.Fatalf("exec --background: exit %d, %q %q", r.code, r.stdout, r.stderr)
			}
			s := startTmux(t, d, "attach", "-i", id)
			time.Sleep(300 * time.Millisecond) // attached
			s.keys("echo typed-$((6*7))", "Enter")
			s.waitScreen(`typed-42`)
			// The agent's poll returns what the person typed (each poll
			// the output since the one before).
			deadline := time.Now().Add(30 * time.Second)
			var polled string
			for !strings.Contains(polled, "typed-42") {
				polled += d.cli(dir, "process", "poll", id).stdout
				if time.Now().After(deadline) {
					t.Fatalf("the agent's polls never showed the typed line: %q", polled)
				}
				time.Sleep(100 * time.Millisecond)
			}
			s.keys("C-]")
			s.waitScreen(`EXITED 0`)
			if p := d.cli(dir, "process", "poll", id); !strings.Contains(p.stdout, "still running") && !strings.Contains(p.stdout, "running") {
				t.Errorf("after detaching: %q", p.stdout)
			}
			d.cli(dir, "process", "kill", id)

			// logs -f: the raw output of a session from now to its end.
			r = d.cli(dir, append(append([]string{"exec", "--background"}, flags...), "--", "sh", "-c", "sleep 1; seq 1 50000; echo bye >&2; exit 2")...)
			id = strings.TrimSpace(r.stdout)
			r = d.cli(dir, "logs", "-f", id)
			if r.code != 2 || len(r.stdout) != 288_894 || r.stderr != "bye\n" {
				t.Errorf("logs -f: exit %d, %d bytes, stderr %q", r.code, len(r.stdout), r.stderr)
			}
		})
	}
}

// TestStreamSlowReaderBounded: a client that stops reading a fast
// command's output holds it back; the daemon (gateway and node in one
// process) does not buffer it, and all of it arrives once the client
// reads again.
func TestStreamSlowReaderBounded(t *testing.T) {
	dir := t.TempDir()
	d := trustedUp(t, dir)
	node := waitLocalNode(t, d)
	bin, err := execmeshBinary()
	if err != nil {
		t.Fatal(err)
	}
	const total = 1_000_000_000
	cmd := exec.Command(bin, "exec", "--node", node, "--", "head", "-c", strconv.Itoa(total), "/dev/zero")
	cmd.Dir = dir
	cmd.Env = cleanEnv(d.env())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	before := rssKiB(t, d.cmd.Process.Pid)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Read a little, then stop for a while: the pipe fills, and so does
	// every window behind it.
	buf := make([]byte, 1<<20)
	if _, err := io.ReadFull(out, buf); err != nil {
		t.Fatal(err)
	}
	peak := 0
	for range 20 {
		time.Sleep(250 * time.Millisecond)
		peak = max(peak, rssKiB(t, d.cmd.Process.Pid))
	}
	n, err := io.CopyBuffer(io.Discard, out, buf)
	if err != nil || n+int64(len(buf)) != total {
		t.Fatalf("read %d bytes after the pause: %v", n+int64(len(buf)), err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exec: %v: %s", err, stderr.String())
	}
	if grew := peak - before; grew > 64<<10 {
		t.Errorf("the daemon grew by %d KiB while the client did not read (from %d KiB)", grew, before)
	}
	t.Logf("daemon RSS %d KiB before, %d KiB at most while the client paused", before, peak)
}

// rssKiB is a process's resident set.
func rssKiB(t *testing.T, pid int) int {
	t.Helper()
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(st), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			return n
		}
	}
	return 0
}

// TestAttachThousandClients: a thousand clients attached to one session
// all get its output and its exit when it ends while they are attached;
// afterwards the daemon holds no more descriptors or threads than
// before.
func TestAttachThousandClients(t *testing.T) {
	dir := t.TempDir()
	d := trustedUp(t, dir)
	tok, err := os.ReadFile(filepath.Join(d.stateDir, "operator.token"))
	if err != nil {
		t.Fatal(err)
	}
	gate := filepath.Join(dir, "go")
	r := d.cli(dir, "exec", "--background", "--", "sh", "-c", "while [ ! -e "+gate+" ]; do sleep 0.05; done; echo all-see-this; exit 3")
	id := strings.TrimSpace(r.stdout)
	if r.code != 0 || id == "" {
		t.Fatalf("exec --background: %d %q %q", r.code, r.stdout, r.stderr)
	}
	pid := d.cmd.Process.Pid
	fdsBefore, threadsBefore := countFDs(t, pid), countThreads(t, pid)

	const clients = 1000
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	conns := make([]*websocket.Conn, clients)
	u := "ws" + strings.TrimPrefix(d.url, "http") + "/v1/sessions/" + id + "/attach"
	for i := range conns {
		c, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + strings.TrimSpace(string(tok))}},
			Subprotocols: []string{"execmesh.attach.v1"}})
		if err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
		defer c.CloseNow()
		if typ, b, err := c.Read(ctx); err != nil || typ != websocket.MessageText || !strings.Contains(string(b), `"started"`) {
			t.Fatalf("client %d: %v %s", i, err, b)
		}
		conns[i] = c
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var g errgroup.Group
	g.SetLimit(64)
	for i, c := range conns {
		g.Go(func() error {
			var out []byte
			for {
				typ, b, err := c.Read(ctx)
				if err != nil {
					return fmt.Errorf("client %d: %v after %q", i, err, out)
				}
				if typ == websocket.MessageBinary {
					out = append(out, b[1:]...)
					continue
				}
				if strings.Contains(string(b), `"exit"`) {
					if string(out) != "all-see-this\n" || !strings.Contains(string(b), `"exitCode":3`) {
						return fmt.Errorf("client %d: output %q, exit %s", i, out, b)
					}
					_, _, err := c.Read(ctx)
					if websocket.CloseStatus(err) != websocket.StatusNormalClosure {
						return fmt.Errorf("client %d: after the exit: %v", i, err)
					}
					return nil
				}
			}
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		fds, threads := countFDs(t, pid), countThreads(t, pid)
		if fds <= fdsBefore+5 && threads <= threadsBefore+8 {
			t.Logf("descriptors %d before, %d after; threads %d before, %d after", fdsBefore, fds, threadsBefore, threads)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon holds %d descriptors and %d threads, %d and %d before the clients", fds, threads, fdsBefore, threadsBefore)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func countFDs(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func countThreads(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestAttachNodeGoesAway: a node agent killed while a client is attached
// to one of its sessions ends the stream with a reason, within the
// stream's liveness bound, and the gateway keeps nothing of it.
func TestAttachNodeGoesAway(t *testing.T) {
	ns := startNodeServer(t, bus.ServerConfig{})
	gw := startItGateway(t, ns, "", bus.ClientConfig{})
	np := newNodeProc(t, "going", "--nats-url", ns.url())
	np.start()
	gw.waitNode(np.id, "connected", "")
	gw.approve(np.id)

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	u := "ws" + strings.TrimPrefix(gw.http.URL, "http") + "/v1/exec/attach"
	c, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{Subprotocols: []string{"execmesh.attach.v1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	start, _ := json.Marshal(map[string]any{"type": "start", "exec": map[string]any{"command": "while :; do echo tick; sleep 0.1; done", "host": "node", "node": np.id}})
	if err := c.Write(ctx, websocket.MessageText, start); err != nil {
		t.Fatal(err)
	}
	for ticks := 0; ticks < 3; {
		typ, b, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("before the kill: %v", err)
		}
		if typ == websocket.MessageBinary {
			ticks += strings.Count(string(b), "tick")
		}
	}
	np.kill()
	killed := time.Now()
	for {
		_, _, err := c.Read(ctx)
		if err == nil {
			continue
		}
		var ce websocket.CloseError
		if !errors.As(err, &ce) || ce.Code != 4010 || !strings.Contains(ce.Reason, "stream lost: node going") {
			t.Fatalf("the stream ended with %v, want close 4010 saying the node stopped answering", err)
		}
		if waited := time.Since(killed); waited > 30*time.Second {
			t.Errorf("the stream ended %v after the node died", waited)
		}
		t.Logf("closed %v after the kill: %s", time.Since(killed).Round(time.Millisecond), ce.Reason)
		break
	}
}
