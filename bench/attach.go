package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/coder/websocket"
	"github.com/creack/pty"

	"github.com/execmesh/execmesh/protocol"
)

// attachTarget: 1 GB through a streamed `execmesh exec` within 1.5× a
// bare Go pipe reader of the same command.
const attachTarget = 1.5

// keystrokes is how many round trips the keystroke figure times.
const keystrokes = 200

// cliExec runs the execmesh client, `execmesh exec [hostArgs] -- sh -c
// command`, with its stdout on /dev/null: the whole path of a person's
// streamed exec, the client's start included.
func (c *cluster) cliExec(command string, hostArgs ...string) func(ctx context.Context) (time.Duration, error) {
	return func(ctx context.Context) (time.Duration, error) {
		args := append(append([]string{"exec"}, hostArgs...), "--", benchShell, "-c", command)
		cmd := exec.CommandContext(ctx, c.bin, args...)
		cmd.Env = append(append([]string(nil), c.env...), "EXECMESH_GATEWAY_URL="+c.up.base, "HOME="+filepath.Dir(c.up.state),
			"EXECMESH_STATE_DIR="+c.up.state)
		cmd.Dir = c.workdir
		null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
		if err != nil {
			return 0, err
		}
		defer null.Close()
		var stderr strings.Builder
		cmd.Stdout, cmd.Stderr = null, &stderr
		t0 := time.Now()
		err = cmd.Run()
		d := time.Since(t0)
		if err != nil {
			return 0, fmt.Errorf("execmesh %s: %v: %s", strings.Join(args, " "), err, stderr.String())
		}
		return d, nil
	}
}

// attachRoundTrip starts `cat` on a PTY through an attach socket and
// times keystrokes from the write of one byte to its echo.
func attachRoundTrip(ctx context.Context, base, host, node string) ([]time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(base, "http")+"/v1/exec/attach",
		&websocket.DialOptions{Subprotocols: []string{"execmesh.attach.v1"}})
	if err != nil {
		return nil, err
	}
	defer conn.CloseNow()
	args := map[string]any{"command": "stty -echo; exec cat", "pty": true, "host": host}
	if node != "" {
		args["node"] = node
	}
	execJSON, _ := json.Marshal(args)
	start, _ := json.Marshal(protocol.Control{Type: protocol.ControlStart, Exec: execJSON})
	if err := conn.Write(ctx, websocket.MessageText, start); err != nil {
		return nil, err
	}
	if typ, b, err := conn.Read(ctx); err != nil || typ != websocket.MessageText || !strings.Contains(string(b), `"started"`) {
		return nil, fmt.Errorf("attach start: %v %s", err, b)
	}
	// Each keystroke is a line of its own, read back by its text: an
	// echo of the terminal (before stty ran) never counts for a later one.
	var ds []time.Duration
	var seen []byte
	for i := 0; len(ds) < keystrokes; i++ {
		line := fmt.Sprintf("k%d\n", i)
		t0 := time.Now()
		if err := conn.Write(ctx, websocket.MessageBinary, append([]byte{protocol.FrameStdin}, line...)); err != nil {
			return nil, err
		}
		var err error
		if seen, err = readUntil(ctx, conn, seen, fmt.Sprintf("k%d\r\n", i)); err != nil {
			return nil, err
		}
		if i > 0 { // the first also waited for the shell to start
			ds = append(ds, time.Since(t0))
		}
	}
	return ds, nil
}

// readUntil reads output until it holds want, and returns what follows.
func readUntil(ctx context.Context, conn *websocket.Conn, seen []byte, want string) ([]byte, error) {
	for {
		if i := strings.Index(string(seen), want); i >= 0 {
			return seen[i+len(want):], nil
		}
		typ, b, err := conn.Read(ctx)
		if err != nil {
			return nil, err
		}
		if typ == websocket.MessageBinary && len(b) > 0 {
			seen = append(seen, b[1:]...)
		}
		if typ == websocket.MessageText && strings.Contains(string(b), `"exit"`) {
			return nil, fmt.Errorf("the session ended: %s", b)
		}
	}
}

// barePTYRoundTrip is the same keystroke through a local PTY to cat.
func barePTYRoundTrip(ctx context.Context) ([]time.Duration, error) {
	cmd := exec.CommandContext(ctx, benchShell, "-c", "stty -echo; exec cat")
	ptmx, err := pty.Start(cmd)
	if err != nil {
		return nil, err
	}
	defer func() { ptmx.Close(); _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	buf := make([]byte, 4096)
	var ds []time.Duration
	var seen []byte
	for i := 0; len(ds) < keystrokes; i++ {
		want := fmt.Sprintf("k%d\r\n", i)
		t0 := time.Now()
		if _, err := fmt.Fprintf(ptmx, "k%d\n", i); err != nil {
			return nil, err
		}
		for !strings.Contains(string(seen), want) {
			n, err := ptmx.Read(buf)
			if err != nil && !errors.Is(err, io.EOF) {
				return nil, err
			}
			seen = append(seen, buf[:n]...)
		}
		seen = seen[strings.Index(string(seen), want)+len(want):]
		if i > 0 {
			ds = append(ds, time.Since(t0))
		}
	}
	return ds, nil
}

// benchAttachRTT reports the keystroke round trip p50 over a PTY attach,
// host=gateway and host=node, beside a local PTY's.
func benchAttachRTT(ctx context.Context, c *cluster, node *nodeProc, res *results) error {
	bare, err := barePTYRoundTrip(ctx)
	if err != nil {
		return fmt.Errorf("bare PTY round trip: %w", err)
	}
	baseMs := float64(percentile(bare, 0.5).Microseconds()) / 1000
	for _, h := range []struct{ host, node string }{{"gateway", ""}, {"node", node.id}} {
		ds, err := attachRoundTrip(ctx, c.up.base, h.host, h.node)
		if err != nil {
			return fmt.Errorf("attach round trip, host=%s: %w", h.host, err)
		}
		res.add(figure{Section: "throughput", Figure: "keystroke round trip over a PTY attach, host=" + h.host + ", p50",
			Value: float64(percentile(ds, 0.5).Microseconds()) / 1000, Unit: "ms", Baseline: baseMs, BaselineName: "local PTY to cat",
			Note: fmt.Sprintf("%d keystrokes: one stdin frame on GET /v1/exec/attach to `cat` on a PTY, timed until its echo arrives; reported, no bar", keystrokes)})
	}
	return nil
}
