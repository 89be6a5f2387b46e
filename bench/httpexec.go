package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// httpExec is the running bench/httpexec server: the minimal Go HTTP exec
// service that is the exec latency's second baseline.
type httpExec struct {
	url  string
	cmd  *exec.Cmd
	done chan struct{}
}

// buildHTTPExec builds bench/httpexec into the cluster's directory.
func buildHTTPExec(ctx context.Context, c *cluster, o *options) (string, error) {
	bin := filepath.Join(c.dir, "httpexec")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./bench/httpexec")
	build.Dir = o.root
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./bench/httpexec: %w\n%s", err, out)
	}
	return bin, nil
}

// startHTTPExec runs the bench/httpexec binary bin (with args) as a
// separate process with the commands' environment and working directory.
func startHTTPExec(c *cluster, bin string, args ...string) (*httpExec, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env, cmd.Dir = c.env, c.workdir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	h := &httpExec{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(h.done) }()
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			line <- sc.Text()
		}
		close(line)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case l, ok := <-line:
		if u, found := strings.CutPrefix(l, "listening on "); ok && found {
			h.url = u + "/"
			return h, nil
		}
		h.stop()
		return nil, fmt.Errorf("httpexec printed %q, want its address", l)
	case <-time.After(10 * time.Second):
		h.stop()
		return nil, fmt.Errorf("httpexec printed no address within 10s")
	}
}

// stop ends the server (SIGTERM, then SIGKILL) and waits for it.
func (h *httpExec) stop() {
	_ = h.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-h.done:
	case <-time.After(5 * time.Second):
		_ = h.cmd.Process.Kill()
		<-h.done
	}
}

// probe is one call of command through the server, timed like toolExec:
// the round trip including the body, decoded and checked outside.
func (h *httpExec) probe(cl *client, command, want string) func(ctx context.Context) (time.Duration, error) {
	return timedExecCall(command, want, func(ctx context.Context, body []byte) (int, []byte, error) {
		return cl.postRaw(ctx, h.url, body)
	})
}

// leanProbe is probe through a hand-written HTTP/1.1 client (see
// leanConn).
func (h *httpExec) leanProbe(lc *leanConn, command, want string) func(ctx context.Context) (time.Duration, error) {
	return timedExecCall(command, want, func(ctx context.Context, body []byte) (int, []byte, error) {
		return lc.post(ctx, "/", body)
	})
}

// timedExecCall times one post of {"command": command} and checks the
// answer, outside the timed region, for output want and exit code 0.
func timedExecCall(command, want string, post func(ctx context.Context, body []byte) (int, []byte, error)) func(ctx context.Context) (time.Duration, error) {
	body := mustJSON(map[string]string{"command": command})
	return func(ctx context.Context) (time.Duration, error) {
		t0 := time.Now()
		code, raw, err := post(ctx, body)
		d := time.Since(t0)
		if err != nil {
			return d, err
		}
		var r struct {
			Output   string `json:"output"`
			ExitCode int    `json:"exitCode"`
		}
		if err := json.Unmarshal(raw, &r); err != nil || code != 200 {
			return d, fmt.Errorf("httpexec: HTTP %d %.200q", code, raw)
		}
		if strings.TrimSpace(r.Output) != want || r.ExitCode != 0 {
			return d, fmt.Errorf("httpexec: output %q exit %d, want %q", r.Output, r.ExitCode, want)
		}
		return d, nil
	}
}
