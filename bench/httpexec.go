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

// baselineProc is a running baseline command (bench/httpexec,
// bench/natsexec): a process of its own, stopped with stop.
type baselineProc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// httpExec is a running baseline that answers exec calls over HTTP at
// url: bench/httpexec (the minimal Go HTTP exec service, the exec
// latency's second baseline) or the front of bench/natsexec.
type httpExec struct {
	*baselineProc
	url string
}

// buildBaseline builds the baseline command bench/name into the
// cluster's directory.
func buildBaseline(ctx context.Context, c *cluster, o *options, name string) (string, error) {
	bin := filepath.Join(c.dir, name)
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./bench/"+name)
	build.Dir = o.root
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./bench/%s: %w\n%s", name, err, out)
	}
	return bin, nil
}

// startHTTPExec runs the bench/httpexec binary bin (with args) as a
// separate process with the commands' environment and working directory.
func startHTTPExec(c *cluster, bin string, args ...string) (*httpExec, error) {
	p, l, err := startBaselineProc(c, bin, args...)
	if err != nil {
		return nil, err
	}
	if u, found := strings.CutPrefix(l, "listening on "); found {
		return &httpExec{baselineProc: p, url: u + "/"}, nil
	}
	p.stop()
	return nil, fmt.Errorf("%s printed %q, want its address", filepath.Base(bin), l)
}

// natsExec is the running bench/natsexec pair: the minimal HTTP exec
// service that runs its commands on a node process over NATS, host=node's
// baseline as bench/httpexec is host=gateway's.
type natsExec struct {
	*httpExec               // the HTTP front with its NATS server
	node      *baselineProc // the node process
}

// startNATSExec runs the bench/natsexec binary bin twice, as the HTTP
// front with its NATS server and as a node connected to that over TCP,
// and returns once the node is subscribed.
func startNATSExec(c *cluster, bin string) (*natsExec, error) {
	front, l, err := startBaselineProc(c, bin)
	if err != nil {
		return nil, err
	}
	addrs := strings.Fields(strings.TrimPrefix(l, "listening on "))
	if len(addrs) != 2 || !strings.HasPrefix(addrs[0], "http://") || !strings.HasPrefix(addrs[1], "nats://") {
		front.stop()
		return nil, fmt.Errorf("natsexec printed %q, want its HTTP and NATS addresses", l)
	}
	node, l, err := startBaselineProc(c, bin, "-node", addrs[1])
	if err == nil && l != "ready" {
		node.stop()
		err = fmt.Errorf("natsexec -node printed %q, want ready", l)
	}
	if err != nil {
		front.stop()
		return nil, err
	}
	return &natsExec{httpExec: &httpExec{baselineProc: front, url: addrs[0] + "/"}, node: node}, nil
}

// stop ends the node, then the front.
func (n *natsExec) stop() {
	n.node.stop()
	n.httpExec.stop()
}

// startBaselineProc runs bin (with args) as a separate process with the
// commands' environment and working directory and returns it with the
// first line it printed.
func startBaselineProc(c *cluster, bin string, args ...string) (*baselineProc, string, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env, cmd.Dir = c.env, c.workdir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, "", err
	}
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	h := &baselineProc{cmd: cmd, done: make(chan struct{})}
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
		if ok {
			return h, l, nil
		}
		h.stop()
		return nil, "", fmt.Errorf("%s %s printed nothing", filepath.Base(bin), strings.Join(args, " "))
	case <-time.After(10 * time.Second):
		h.stop()
		return nil, "", fmt.Errorf("%s %s printed nothing within 10s", filepath.Base(bin), strings.Join(args, " "))
	}
}

// stop ends the process (SIGTERM, then SIGKILL) and waits for it.
func (h *baselineProc) stop() {
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
