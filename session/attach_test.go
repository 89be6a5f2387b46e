package session

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/execmesh/execmesh/protocol"
)

// drain reads an attachment to its end and returns stdout, stderr and the
// exit.
func drain(t *testing.T, a *Attachment) (stdout, stderr []byte, exit *Exit) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	for {
		c, e, err := a.Next(ctx)
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		if e != nil {
			return stdout, stderr, e
		}
		if len(c.Data) > maxChunk || len(c.Data) == 0 {
			t.Fatalf("a chunk of %d bytes", len(c.Data))
		}
		switch c.Stream {
		case StreamStdout:
			stdout = append(stdout, c.Data...)
		case StreamStderr:
			stderr = append(stderr, c.Data...)
		default:
			t.Fatalf("chunk of stream %d", c.Stream)
		}
	}
}

// startAttached starts command in the background with a bound attachment.
func startAttached(t *testing.T, m *Manager, command string, pty bool, opts AttachOptions) (*Attachment, string) {
	t.Helper()
	a := NewAttachment(opts)
	res, err := m.Exec(context.Background(), ExecRequest{Command: command, Background: true, PTY: pty, Attach: a})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status() != protocol.StatusRunning {
		t.Fatalf("not running: %s", res.Text())
	}
	return a, res.Details.SessionID.Value()
}

// TestAttachRawStreams: an attachment bound at the start gets every byte
// of stdout and stderr, separately and in order, binary included, beyond
// the agent's output cap, and the exit after them; the agent's buffer is
// fed as before.
func TestAttachRawStreams(t *testing.T) {
	m := newManager(t, func(c *Config) { c.MaxOutputChars = 1000 })
	for _, tc := range []struct {
		name, command     string
		wantOut, wantErr  string
		wantCode          int
		compareAggregated bool
	}{
		{"separate and ordered", "echo out1; echo err >&2; echo out2", "out1\nout2\n", "err\n", 0, true},
		{"binary", `printf 'a\000b\377\n'`, "a\x00b\xff\n", "", 0, false},
		{"exit code", "printf x; exit 3", "x", "", 3, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, id := startAttached(t, m, tc.command, false, AttachOptions{})
			out, errb, exit := drain(t, a)
			if string(out) != tc.wantOut || string(errb) != tc.wantErr {
				t.Errorf("stdout %q stderr %q", out, errb)
			}
			if exit.ExitCode == nil || *exit.ExitCode != tc.wantCode {
				t.Errorf("exit %+v", exit)
			}
			res := m.Process(context.Background(), "", protocol.ProcessArgs{Action: "poll", SessionID: id})
			if tc.compareAggregated && !strings.Contains(res.Text(), strings.Fields(tc.wantOut)[0]) {
				t.Errorf("the agent's poll lost the output: %q", res.Text())
			}
		})
	}
	t.Run("flood", func(t *testing.T) {
		a, _ := startAttached(t, m, "head -c 50000000 /dev/zero", false, AttachOptions{})
		out, _, exit := drain(t, a)
		if len(out) != 50000000 || exit.Status != protocol.StatusCompleted {
			t.Errorf("%d bytes, %+v", len(out), exit)
		}
	})
	t.Run("beyond the cap", func(t *testing.T) {
		a, _ := startAttached(t, m, "head -c 3000000 /dev/urandom | od -An -tx1 | head -c 2000000", false, AttachOptions{})
		out, _, exit := drain(t, a)
		if len(out) != 2000000 || exit.Status != protocol.StatusCompleted {
			t.Errorf("%d bytes, %+v", len(out), exit)
		}
	})
}

// TestAttachStdin: a start with Stdin writes a pipe the program reads to
// the byte; CloseWrite is its end of file.
func TestAttachStdin(t *testing.T) {
	m := newManager(t, nil)
	a, _ := startAttached(t, m, "sha256sum", false, AttachOptions{Write: true, Stdin: true})
	data := make([]byte, 3<<20)
	_, _ = rand.Read(data)
	ctx := context.Background()
	go func() {
		if err := a.Write(ctx, data); err != nil {
			t.Errorf("Write: %v", err)
		}
		if err := a.CloseWrite(); err != nil {
			t.Errorf("CloseWrite: %v", err)
		}
	}()
	out, _, exit := drain(t, a)
	sum := sha256.Sum256(data)
	if !strings.HasPrefix(string(out), hex.EncodeToString(sum[:])) || *exit.ExitCode != 0 {
		t.Errorf("sum %q exit %+v", out, exit)
	}
}

// TestAttachPTY: an attachment to a PTY session types into it, resizes
// the terminal, and Ctrl-C's signal reaches the foreground job, not the
// shell; an agent's poll sees what was typed.
func TestAttachPTY(t *testing.T) {
	m := newManager(t, nil)
	_, id := startAttached(t, m, "sh", true, AttachOptions{})
	// The agent started it; a person attaches read-write.
	a, err := m.Attach("", id, AttachOptions{Write: true})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if !a.PTY() {
		t.Fatal("not a PTY")
	}
	if _, err := m.Attach("", id, AttachOptions{Write: true}); !errors.Is(err, ErrWriterTaken) {
		t.Errorf("a second writer: %v", err)
	}
	ro, err := m.Attach("", id, AttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if err := ro.Write(context.Background(), []byte("x")); !errors.Is(err, ErrNotWriter) {
		t.Errorf("a reader wrote: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	var seen bytes.Buffer
	waitFor := func(a *Attachment, want string) {
		t.Helper()
		for !strings.Contains(seen.String(), want) {
			c, e, err := a.Next(ctx)
			if err != nil || e != nil {
				t.Fatalf("waiting for %q: %v %+v; saw %q", want, err, e, seen.String())
			}
			seen.Write(c.Data)
		}
	}
	if err := a.Resize(100, 33); err != nil {
		t.Fatal(err)
	}
	if err := a.Write(ctx, []byte("stty size; echo typed-$((6*7))\n")); err != nil {
		t.Fatal(err)
	}
	waitFor(a, "33 100")
	waitFor(a, "typed-42")
	checkFor(t, waitLimit, 20*time.Millisecond, func() error {
		res := m.Process(context.Background(), "", protocol.ProcessArgs{Action: "log", SessionID: id})
		if !strings.Contains(res.Text(), "typed-42") {
			return errors.New("the agent's log lacks the typed line: " + res.Text())
		}
		return nil
	})
	seen.Reset()
	if err := a.Write(ctx, []byte("sleep 600; echo after-$((1+1))\n")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the sleep becomes the foreground job
	if err := a.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := a.Write(ctx, []byte("echo alive-$((2+3))\n")); err != nil {
		t.Fatal(err)
	}
	waitFor(a, "alive-5")
	// The reader saw the same output.
	var ros bytes.Buffer
	for !strings.Contains(ros.String(), "alive-5") {
		c, _, err := ro.Next(ctx)
		if err != nil {
			t.Fatalf("reader: %v; saw %q", err, ros.String())
		}
		ros.Write(c.Data)
	}
	if err := a.Write(ctx, []byte("exit 4\n")); err != nil {
		t.Fatal(err)
	}
	for {
		_, e, err := a.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if e != nil {
			if e.ExitCode == nil || *e.ExitCode != 4 {
				t.Errorf("exit %+v", e)
			}
			break
		}
	}
}

// TestAttachSlowReader: a reader that never reads holds the output back
// for at most its stall, then is detached; the agent's buffer loses
// nothing and the session goes on.
func TestAttachSlowReader(t *testing.T) {
	m := newManager(t, nil)
	a, id := startAttached(t, m, "seq 1 200000", false, AttachOptions{Queue: 4096, Stall: 300 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	checkFor(t, waitLimit, 20*time.Millisecond, func() error {
		res := m.Process(ctx, "", protocol.ProcessArgs{Action: "poll", SessionID: id})
		if res.Status() == protocol.StatusRunning {
			return errors.New("still running")
		}
		return nil
	})
	if _, _, err := a.Next(ctx); !errors.Is(err, ErrSlowReader) {
		t.Errorf("Next after the stall: %v", err)
	}
	res := m.Process(ctx, "", protocol.ProcessArgs{Action: "log", SessionID: id, Offset: new(int), Limit: ptr(1 << 20)})
	if !strings.HasSuffix(strings.TrimSpace(res.Text()), "200000") {
		t.Errorf("the agent's log lost output: %q", tail(res.Text(), 100))
	}
}

// TestAttachKillOnDetach: closing an attachment made with KillOnDetach
// ends the session; without it the session goes on.
func TestAttachKillOnDetach(t *testing.T) {
	m := newManager(t, nil)
	keep, keepID := startAttached(t, m, "sleep 600", false, AttachOptions{})
	kill, killID := startAttached(t, m, "sleep 600", false, AttachOptions{KillOnDetach: true})
	_ = keep.Close()
	_ = kill.Close()
	checkFor(t, waitLimit, 20*time.Millisecond, func() error {
		res := m.Process(context.Background(), "", protocol.ProcessArgs{Action: "poll", SessionID: killID})
		if res.Status() == protocol.StatusRunning {
			return errors.New("the killed session still runs")
		}
		return nil
	})
	if res := m.Process(context.Background(), "", protocol.ProcessArgs{Action: "poll", SessionID: keepID}); res.Status() != protocol.StatusRunning {
		t.Errorf("the kept session: %s", res.Text())
	}
	if _, err := m.Attach("other-scope", keepID, AttachOptions{}); !errors.Is(err, ErrNoSuchSession) {
		t.Errorf("another scope attached: %v", err)
	}
	m.Process(context.Background(), "", protocol.ProcessArgs{Action: "kill", SessionID: keepID})
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// TestCommandsGetDefaultSignals: a daemon started with SIGINT and SIGHUP
// ignored (nohup, a script's background job) runs commands in which they
// are not: Ctrl-C and hangups reach them.
func TestCommandsGetDefaultSignals(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// sh's trap "" ignores them, and exec keeps them ignored.
	cmd := exec.Command("sh", "-c", `trap "" INT HUP; exec "$0"`, exe)
	cmd.Env = append(os.Environ(), helperEnv+"=sigdefaults")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if strings.Contains(string(out), "survived") || !strings.Contains(string(out), "SIGINT") || !strings.Contains(string(out), "SIGHUP") {
		t.Errorf("commands kept the daemon's ignored signals:\n%s", out)
	}
}
