package hostbus

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"go.uber.org/goleak"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
	"github.com/execmesh/execmesh/host"
	"github.com/execmesh/execmesh/protocol"
	"github.com/execmesh/execmesh/session"
)

const streamTestKey = "agent:main:main"

// streamEnv is a node (a real host.Local served by a Server, with the
// node's confined NATS identity) and a gateway's Remote of it, on an
// embedded server that enforces the permissions.
type streamEnv struct {
	t      testing.TB
	srv    *bus.Server
	local  *host.Local
	server *Server
	nodeNC *nats.Conn
	gwNC   *nats.Conn
	remote *Remote
	group  string
	cwd    string
}

type streamEnvOpts struct {
	ping, timeout time.Duration
	// group, when set, serves the host under another group than a node's
	// (a gateway's host), without authentication.
	group string
}

func newStreamEnv(t testing.TB, o streamEnvOpts) *streamEnv {
	t.Helper()
	// Registered first, so it runs last: after the servers, connections
	// and host of the test are gone, nothing of the streams is left.
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	if o.ping == 0 {
		o.ping = 100 * time.Millisecond
	}
	if o.timeout == 0 {
		o.timeout = 5 * time.Second
	}
	e := &streamEnv{t: t}
	gwUser := bus.User{Name: "gateway", Password: "gw-secret", Permissions: bus.GatewayPermissions(protocol.DefaultSubjectPrefix)}
	id, err := bus.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	nodeUser, err := bus.NodeUser(protocol.DefaultSubjectPrefix, id.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	nodeCfg := bus.ClientConfig{Name: "node", NKeySeed: id.Seed, InboxPrefix: bus.InboxPrefix(id.NodeID)}
	gwCfg := bus.ClientConfig{Name: "gateway", User: gwUser.Name, Password: gwUser.Password}
	e.group = protocol.Subjects("").NodeGroup(id.NodeID)
	if o.group != "" {
		e.srv = bustest.StartServer(t, bustest.WithoutJetStream())
		nodeCfg, gwCfg = bus.ClientConfig{Name: "node"}, bus.ClientConfig{Name: "gateway"}
		e.group = o.group
	} else {
		e.srv = bustest.StartServer(t, bustest.WithoutJetStream(), bustest.WithUsers(gwUser), bustest.WithNKeys(nodeUser))
	}
	e.nodeNC = bustest.Connect(t, e.srv, nodeCfg)
	e.gwNC = bustest.Connect(t, e.srv, gwCfg)

	e.cwd, err = filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	scfg := session.DefaultConfig()
	scfg.KillGrace = time.Second
	scfg.DrainWait = 500 * time.Millisecond
	e.local, err = host.NewLocal(host.Config{
		Kind: host.KindNode, ID: id.NodeID, Session: scfg, StateDir: t.TempDir(),
		Environ: []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + e.cwd, "SHELL=/bin/sh", "LANG=C"},
		Cwd:     e.cwd, Confine: host.ConfineConfig{Off: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := e.local.Close(ctx); err != nil {
			t.Errorf("Local.Close: %v", err)
		}
	})
	e.server = NewServer(ServerConfig{Host: e.local, Name: "node test", Instance: e.local.Instance(), StreamPing: o.ping, StreamTimeout: o.timeout})
	svc, err := micro.AddService(e.nodeNC, micro.Config{Name: bus.NodeServiceName, Version: "0.0.0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = svc.Stop()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := e.server.Close(ctx); err != nil {
			t.Errorf("Server.Close: %v", err)
		}
	})
	if err := e.server.AddTo(e.nodeNC, svc.AddGroup(e.group)); err != nil {
		t.Fatal(err)
	}
	if err := e.nodeNC.Flush(); err != nil {
		t.Fatal(err)
	}
	e.remote = &Remote{Conn: e.gwNC, Group: e.group, Label: "node test", StreamPing: o.ping, StreamTimeout: o.timeout}
	return e
}

// start runs command on the node with a stream bound, and claims it.
func (e *streamEnv) start(command string, spec protocol.StreamSpec, pty bool) host.Stream {
	e.t.Helper()
	if spec.ID == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		spec.ID = hex.EncodeToString(b[:])
	}
	reply, err := e.remote.Exec(e.t.Context(), protocol.ExecRequest{
		SessionKey: streamTestKey, AgentID: "main", Target: protocol.TargetNode,
		Args:     protocol.ExecArgs{Command: command, PTY: pty},
		Security: "full", Ask: "off", Stream: &spec,
	})
	if err != nil {
		e.t.Fatalf("exec %q: %v", command, err)
	}
	if st := reply.Result.Status(); st != protocol.StatusRunning {
		e.t.Fatalf("exec %q: status %q: %+v", command, st, reply.Result)
	}
	st, err := e.remote.Attach(e.t.Context(), protocol.AttachRequest{SessionKey: streamTestKey, StreamID: spec.ID})
	if err != nil {
		e.t.Fatalf("attach %s: %v", spec.ID, err)
	}
	e.t.Cleanup(func() { _ = st.Close() })
	if got := st.Started(); got.Type != protocol.ControlStarted || got.SessionID != reply.Result.SessionID() || !got.Writer || got.PTY != pty || got.Credit != 0 {
		e.t.Fatalf("started = %+v, session %s", got, reply.Result.SessionID())
	}
	return st
}

// status polls a session on the node's host.
func (e *streamEnv) status(id string) string {
	e.t.Helper()
	r, err := e.local.Process(e.t.Context(), protocol.ProcessRequest{SessionKey: streamTestKey, Args: protocol.ProcessArgs{Action: "poll", SessionID: id}})
	if err != nil {
		e.t.Fatalf("poll %s: %v", id, err)
	}
	return r.Result.Status()
}

// output is what a stream delivered.
type output struct {
	stdout, stderr []byte
	exit           *protocol.Control
	controls       []*protocol.Control // other than the exit
}

// readAll reads a stream to its exit, bounded by d.
func readAll(t testing.TB, st host.Stream, d time.Duration) output {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	var o output
	for {
		f, err := st.Recv(ctx)
		if err != nil {
			t.Fatalf("Recv after %d+%d bytes: %v", len(o.stdout), len(o.stderr), err)
		}
		switch f.Kind {
		case protocol.FrameStdout:
			o.stdout = append(o.stdout, f.Data...)
		case protocol.FrameStderr:
			o.stderr = append(o.stderr, f.Data...)
		case protocol.FrameControl:
			if f.Control.Type == protocol.ControlExit {
				o.exit = f.Control
				if _, err := st.Recv(ctx); !errors.Is(err, io.EOF) {
					t.Fatalf("Recv after the exit: %v, want io.EOF", err)
				}
				return o
			}
			o.controls = append(o.controls, f.Control)
		default:
			t.Fatalf("frame of kind %d", f.Kind)
		}
	}
}

func exitCode(c *protocol.Control) int {
	if c == nil || c.ExitCode == nil {
		return -1
	}
	return *c.ExitCode
}

// TestStreamByteExact: 20 MB (6 MB under the race detector) of random
// bytes through the node's stream are the bytes the command wrote (tee
// kept a copy on the node).
func TestStreamByteExact(t *testing.T) {
	e := newStreamEnv(t, streamEnvOpts{})
	file := filepath.Join(e.cwd, "copy")
	size := 20000000
	if raceEnabled {
		size = 6000000
	}
	st := e.start(fmt.Sprintf("head -c %d /dev/urandom | tee %s", size, file), protocol.StreamSpec{}, false)
	o := readAll(t, st, 60*time.Second)
	if exitCode(o.exit) != 0 || o.exit.Status != "completed" {
		t.Fatalf("exit %+v, stderr %q", o.exit, o.stderr)
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if len(o.stdout) != size || sha256.Sum256(o.stdout) != sha256.Sum256(want) {
		t.Fatalf("streamed %d bytes, sha256 %x; the command wrote %d, %x", len(o.stdout), sha256.Sum256(o.stdout), len(want), sha256.Sum256(want))
	}
	if len(o.stderr) != 0 || len(o.controls) != 0 {
		t.Fatalf("stderr %q, controls %+v", o.stderr, o.controls)
	}
}

// TestStreamStdoutStderr: the two streams stay apart and each in order,
// run after run.
func TestStreamStdoutStderr(t *testing.T) {
	e := newStreamEnv(t, streamEnvOpts{})
	for i := range 15 {
		st := e.start(fmt.Sprintf("echo out1; echo err%d >&2; echo out2; exit 3", i), protocol.StreamSpec{}, false)
		o := readAll(t, st, 20*time.Second)
		if string(o.stdout) != "out1\nout2\n" || string(o.stderr) != fmt.Sprintf("err%d\n", i) || exitCode(o.exit) != 3 {
			t.Fatalf("run %d: stdout %q, stderr %q, exit %+v", i, o.stdout, o.stderr, o.exit)
		}
		_ = st.Close()
	}
}

// TestStreamStdin: input through the Remote reaches the command whole,
// then its end of file; input the session cannot take is refused
// without ending the stream.
func TestStreamStdin(t *testing.T) {
	e := newStreamEnv(t, streamEnvOpts{})
	st := e.start("sha256sum", protocol.StreamSpec{Stdin: true}, false)
	data := make([]byte, 5<<20+12345)
	_, _ = rand.Read(data)
	done := make(chan output, 1)
	go func() { done <- readAll(t, st, 60*time.Second) }()
	for d := data; len(d) > 0; {
		n := min(len(d), 300<<10+7) // larger than a frame: split
		if err := st.Send(t.Context(), protocol.Frame{Kind: protocol.FrameStdin, Data: d[:n]}); err != nil {
			t.Fatalf("Send: %v", err)
		}
		d = d[n:]
	}
	if err := st.Send(t.Context(), protocol.Frame{Kind: protocol.FrameControl, Control: &protocol.Control{Type: protocol.ControlEOF}}); err != nil {
		t.Fatalf("Send eof: %v", err)
	}
	o := <-done
	sum := sha256.Sum256(data)
	if want := hex.EncodeToString(sum[:]) + "  -\n"; string(o.stdout) != want || exitCode(o.exit) != 0 {
		t.Fatalf("sha256sum said %q (exit %+v), want %q", o.stdout, o.exit, want)
	}
	if err := st.Send(t.Context(), protocol.Frame{Kind: protocol.FrameStdin, Data: []byte("late")}); !errors.Is(err, host.ErrStreamRefused) {
		t.Fatalf("Send after the exit: %v", err)
	}

	// A session without stdin: the node refuses the input, the stream
	// goes on.
	st = e.start("echo up; sleep 60", protocol.StreamSpec{}, false)
	waitOutput(t, st, "up\n")
	if err := st.Send(t.Context(), protocol.Frame{Kind: protocol.FrameStdin, Data: []byte("hello\n")}); err != nil {
		t.Fatalf("Send: %v", err)
	}
	if err := st.Send(t.Context(), protocol.Frame{Kind: protocol.FrameControl, Control: &protocol.Control{Type: protocol.ControlResize}}); !errors.Is(err, host.ErrStreamRefused) {
		t.Fatalf("resize without a size: %v, want a refusal", err)
	}
	f, err := st.Recv(t.Context())
	if err != nil || f.Kind != protocol.FrameControl || f.Control.Type != protocol.ControlError || !strings.Contains(f.Control.Error, "no stdin") || f.Control.Reason != "" {
		t.Fatalf("Recv: %+v %+v, %v; want the refusal", f, f.Control, err)
	}
	if err := st.Send(t.Context(), protocol.Frame{Kind: protocol.FrameControl, Control: &protocol.Control{Type: protocol.ControlSignal, Signal: "KILL"}}); err != nil {
		t.Fatalf("Send signal: %v", err)
	}
	if o := readAll(t, st, 20*time.Second); o.exit.Signal != "SIGKILL" || len(o.stdout) != 0 {
		t.Fatalf("after SIGKILL: stdout %q, exit %+v", o.stdout, o.exit)
	}
}

// TestStreamBackPressure: a reader that stops reading holds the node to
// its window and the command blocks; once it reads again, everything
// arrives.
func TestStreamBackPressure(t *testing.T) {
	e := newStreamEnv(t, streamEnvOpts{})
	const total = 20000000
	st := e.start(fmt.Sprintf("head -c %d /dev/zero; echo done >&2", total), protocol.StreamSpec{}, false)
	rs := st.(*remoteStream)
	f, err := st.Recv(t.Context())
	if err != nil || f.Kind != protocol.FrameStdout {
		t.Fatalf("first frame %+v, %v", f, err)
	}
	got := len(f.Data)
	// The node fills the window (it splits a frame to use the last of
	// its credit), then stops.
	var sent int64
	bustest.CheckFor(t, 20*time.Second, 5*time.Millisecond, func() error {
		s, maxInflight, ok := e.server.streamStats(rs.id)
		if !ok {
			return errors.New("no stream on the node")
		}
		sent = s
		if maxInflight < DefaultStreamWindow-frameCost { // less than one more frame's cost left
			return fmt.Errorf("in flight at most %d", maxInflight)
		}
		return nil
	})
	// It stays stopped: nothing more is sent, the command still runs.
	time.Sleep(300 * time.Millisecond) // a window for a breach to show
	s, maxInflight, _ := e.server.streamStats(rs.id)
	if maxInflight > DefaultStreamWindow {
		t.Fatalf("the node had %d bytes in flight; window %d", maxInflight, DefaultStreamWindow)
	}
	if s != sent {
		t.Fatalf("the node sent %d bytes, then %d, while the reader read nothing", sent, s)
	}
	if s >= total/2 {
		t.Fatalf("the node sent %d of %d bytes to a reader that read %d", s, total, got)
	}
	rs.mu.Lock()
	queued := rs.out.received - rs.out.used
	rs.mu.Unlock()
	if queued > DefaultStreamWindow {
		t.Fatalf("the gateway holds %d bytes; window %d", queued, DefaultStreamWindow)
	}
	sid := st.Started().SessionID
	if stt := e.status(sid); stt != protocol.StatusRunning {
		t.Fatalf("session %s, want running (blocked on its output)", stt)
	}
	o := readAll(t, st, 60*time.Second)
	if got += len(o.stdout); got != total || string(o.stderr) != "done\n" || exitCode(o.exit) != 0 {
		t.Fatalf("read %d of %d bytes, stderr %q, exit %+v", got, total, o.stderr, o.exit)
	}
	if bytes.Count(o.stdout, []byte{0}) != len(o.stdout) {
		t.Fatal("output is not zeros")
	}
}

// TestStreamNodeGoesAway: when the node's connection closes, the
// gateway's Recv fails within the liveness bound, and the node ends its
// side (a session killed on detach is killed); a node that closes its
// Server tells the gateway why.
func TestStreamNodeGoesAway(t *testing.T) {
	t.Run("connection closed", func(t *testing.T) {
		timeout := 1500 * time.Millisecond
		e := newStreamEnv(t, streamEnvOpts{timeout: timeout})
		st := e.start("echo up; sleep 60", protocol.StreamSpec{}, false)
		waitOutput(t, st, "up\n")
		sid := st.Started().SessionID
		began := time.Now()
		e.nodeNC.Close()
		_, err := st.Recv(t.Context())
		took := time.Since(began)
		var se *SilentError
		if !errors.Is(err, ErrStreamLost) || !errors.As(err, &se) || !strings.Contains(err.Error(), "stopped answering") {
			t.Fatalf("Recv: %v", err)
		}
		if took < timeout/2 || took > timeout+2*time.Second {
			t.Fatalf("Recv failed after %s; timeout %s", took, timeout)
		}
		bustest.CheckFor(t, 15*time.Second, 20*time.Millisecond, func() error {
			if s := e.status(sid); s == protocol.StatusRunning {
				return errors.New("the session still runs")
			}
			return nil
		})
	})
	t.Run("server closed", func(t *testing.T) {
		e := newStreamEnv(t, streamEnvOpts{timeout: time.Minute})
		st := e.start("echo up; sleep 60", protocol.StreamSpec{KeepOnDetach: true}, false)
		waitOutput(t, st, "up\n")
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		if err := e.server.Close(ctx); err != nil {
			t.Fatal(err)
		}
		_, err := st.Recv(ctx)
		if !errors.Is(err, ErrStreamLost) || !strings.Contains(err.Error(), "shutting down") {
			t.Fatalf("Recv: %v", err)
		}
		if s := e.status(st.Started().SessionID); s != protocol.StatusRunning {
			t.Fatalf("a session kept on detach is %s", s)
		}
	})
}

// TestStreamGatewayGoesAway: a gateway that goes silent, or closes its
// stream, is detached by the node; a session started to be killed on
// detach is killed, one kept on detach runs on.
func TestStreamGatewayGoesAway(t *testing.T) {
	t.Run("connection closed", func(t *testing.T) {
		e := newStreamEnv(t, streamEnvOpts{timeout: 1500 * time.Millisecond})
		st := e.start("echo up; sleep 60", protocol.StreamSpec{}, false)
		waitOutput(t, st, "up\n")
		sid := st.Started().SessionID
		began := time.Now()
		e.gwNC.Close()
		bustest.CheckFor(t, 15*time.Second, 20*time.Millisecond, func() error {
			if s := e.status(sid); s == protocol.StatusRunning {
				return errors.New("the session still runs")
			}
			return nil
		})
		if took := time.Since(began); took < time.Second {
			t.Fatalf("killed after %s: before the gateway could be silent for the timeout", took)
		}
		if _, err := st.Recv(t.Context()); !errors.Is(err, ErrStreamLost) || !errors.Is(err, bus.ErrConnectionLost) {
			t.Fatalf("Recv on a closed connection: %v", err)
		}
	})
	t.Run("stream closed", func(t *testing.T) {
		e := newStreamEnv(t, streamEnvOpts{timeout: time.Minute})
		kill := e.start("echo up; sleep 60", protocol.StreamSpec{}, false)
		keep := e.start("echo up; sleep 60", protocol.StreamSpec{KeepOnDetach: true}, false)
		waitOutput(t, kill, "up\n")
		waitOutput(t, keep, "up\n")
		_ = kill.Close()
		_ = keep.Close()
		if _, err := kill.Recv(t.Context()); !errors.Is(err, session.ErrDetached) {
			t.Fatalf("Recv after Close: %v", err)
		}
		bustest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
			if s := e.status(kill.Started().SessionID); s == protocol.StatusRunning {
				return errors.New("the session still runs")
			}
			return nil
		})
		if s := e.status(keep.Started().SessionID); s != protocol.StatusRunning {
			t.Fatalf("a session kept on detach is %s", s)
		}
		e.server.mu.Lock()
		n := len(e.server.streams)
		e.server.mu.Unlock()
		if n != 0 {
			t.Fatalf("the node holds %d streams after both closed", n)
		}
	})
}

// waitOutput reads st until its stdout so far is want.
func waitOutput(t *testing.T, st host.Stream, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	var got []byte
	for string(got) != want {
		f, err := st.Recv(ctx)
		if err != nil {
			t.Fatalf("waiting for %q (have %q): %v", want, got, err)
		}
		if f.Kind != protocol.FrameStdout {
			t.Fatalf("waiting for %q (have %q): frame %d %+v", want, got, f.Kind, f.Control)
		}
		got = append(got, f.Data...)
	}
}

// TestStreamForgedFrames: a frame on the output subject that is not the
// node's next one, or that does not parse, ends the stream with an
// error (this server has no permissions that would refuse the forger).
func TestStreamForgedFrames(t *testing.T) {
	e := newStreamEnv(t, streamEnvOpts{group: "execmesh.node.forged"})
	forger := bustest.Connect(t, e.srv, bus.ClientConfig{Name: "forger"})
	for _, c := range []struct {
		name string
		msg  func() []byte
		want error
	}{
		{"bad seq", func() []byte {
			b, _ := protocol.AppendSeqFrame(nil, 1000, protocol.Frame{Kind: protocol.FrameStdout, Data: []byte("rm -rf /\n")})
			return b
		}, nil},
		{"replayed seq", func() []byte {
			b, _ := protocol.AppendSeqFrame(nil, 1, protocol.Frame{Kind: protocol.FrameStdout, Data: []byte("rm -rf /\n")})
			return b
		}, nil},
		{"garbage", func() []byte { return []byte{9, 1, 2} }, protocol.ErrBadFrame},
		{"bad control", func() []byte { return append([]byte{3, 0, 0, 0, 0, 0, 0, 0, 2}, `{"type":"exit","x":1}`...) }, protocol.ErrBadFrame},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := e.start("echo up; sleep 60", protocol.StreamSpec{}, false)
			waitOutput(t, st, "up\n")
			_, out := streamSubjects(e.group, st.(*remoteStream).id)
			if err := forger.Publish(out, c.msg()); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			f, err := st.Recv(ctx)
			if !errors.Is(err, ErrStreamLost) || (c.want != nil && !errors.Is(err, c.want)) {
				t.Fatalf("Recv: %+v, %v", f, err)
			}
			if c.want == nil && !strings.Contains(err.Error(), "lost (or forged)") {
				t.Fatalf("Recv: %v", err)
			}
		})
	}
}

// TestStreamPTY: resize and signal frames reach a PTY session.
func TestStreamPTY(t *testing.T) {
	e := newStreamEnv(t, streamEnvOpts{})
	// exec: the sleep is the session's leader, so SIGINT ends the session
	// whether it reaches the shell just before the exec or the sleep.
	st := e.start(`printf 'ready\n'; read x; stty size; exec sleep 60`, protocol.StreamSpec{}, true)
	var mu sync.Mutex
	var out []byte
	done := make(chan *protocol.Control, 1)
	go func() {
		defer close(done)
		for {
			f, err := st.Recv(t.Context())
			if err != nil {
				return
			}
			if f.Kind == protocol.FrameControl && f.Control.Type == protocol.ControlExit {
				done <- f.Control
				return
			}
			mu.Lock()
			out = append(out, f.Data...)
			mu.Unlock()
		}
	}()
	waitFor := func(what string) {
		t.Helper()
		bustest.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
			mu.Lock()
			defer mu.Unlock()
			if !bytes.Contains(out, []byte(what)) {
				return fmt.Errorf("no %q in %q", what, out)
			}
			return nil
		})
	}
	send := func(f protocol.Frame) {
		t.Helper()
		if err := st.Send(t.Context(), f); err != nil {
			t.Fatalf("Send %+v: %v", f, err)
		}
	}
	waitFor("ready")
	send(protocol.Frame{Kind: protocol.FrameControl, Control: &protocol.Control{Type: protocol.ControlResize, Cols: 101, Rows: 42}})
	send(protocol.Frame{Kind: protocol.FrameStdin, Data: []byte("go\r")})
	waitFor("42 101")
	began := time.Now()
	send(protocol.Frame{Kind: protocol.FrameControl, Control: &protocol.Control{Type: protocol.ControlSignal, Signal: "SIGINT"}})
	select {
	case c := <-done:
		if c == nil {
			t.Fatal("the stream ended without an exit")
		}
		if time.Since(began) > 20*time.Second {
			t.Fatalf("exit after %s", time.Since(began))
		}
		if c.Signal != "SIGINT" || c.Reason != "signal" {
			t.Fatalf("the session ended with %+v, not by SIGINT", c)
		}
	case <-time.After(30 * time.Second):
		mu.Lock()
		t.Fatalf("SIGINT did not end the session: %q", out)
	}
}

// TestStreamAttachRunning: a second client attaches to a running session
// by its id (a fresh stream id), read-only: it sees the output from then
// on, and its input is refused at once.
func TestStreamAttachRunning(t *testing.T) {
	e := newStreamEnv(t, streamEnvOpts{group: "execmesh.gwhost.gw-1"}) // a gateway's host: the other subjects
	first := e.start("read x; echo got $x", protocol.StreamSpec{Stdin: true}, false)
	sid := first.Started().SessionID
	second, err := e.remote.Attach(t.Context(), protocol.AttachRequest{SessionKey: streamTestKey, SessionID: sid})
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	if s := second.Started(); s.SessionID != sid || s.Writer {
		t.Fatalf("started %+v", s)
	}
	if err := second.Send(t.Context(), protocol.Frame{Kind: protocol.FrameStdin, Data: []byte("x")}); !errors.Is(err, host.ErrStreamRefused) {
		t.Fatalf("read-only Send: %v", err)
	}
	if _, err := e.remote.Attach(t.Context(), protocol.AttachRequest{SessionKey: streamTestKey, SessionID: sid, Write: true}); err == nil {
		t.Fatal("a second writer was attached")
	} else if pe := protocol.AsError(err); pe.Type != protocol.ErrConflict {
		t.Fatalf("second writer: %v", err)
	}
	if _, err := e.remote.Attach(t.Context(), protocol.AttachRequest{SessionKey: streamTestKey, SessionID: "no-such-session"}); protocol.AsError(err).Type != protocol.ErrNotFound {
		t.Fatalf("attach to an unknown session: %v", err)
	}
	if err := first.Send(t.Context(), protocol.Frame{Kind: protocol.FrameStdin, Data: []byte("it\n")}); err != nil {
		t.Fatal(err)
	}
	for _, st := range []host.Stream{first, second} {
		if o := readAll(t, st, 20*time.Second); string(o.stdout) != "got it\n" || exitCode(o.exit) != 0 {
			t.Fatalf("stdout %q, exit %+v", o.stdout, o.exit)
		}
	}
}

// BenchmarkStreamThroughput: 200 MB of a command's output read from its
// pipe directly, through a host.Stream of the session core, and through
// a Remote's stream over NATS.
func BenchmarkStreamThroughput(b *testing.B) {
	const size = 200_000_000
	command := fmt.Sprintf("head -c %d /dev/zero", size)
	b.Run("pipe", func(b *testing.B) {
		b.SetBytes(size)
		buf := make([]byte, 64<<10)
		for b.Loop() {
			cmd := exec.Command("/bin/sh", "-c", command)
			out, err := cmd.StdoutPipe()
			if err != nil {
				b.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			n, err := io.CopyBuffer(io.Discard, struct{ io.Reader }{out}, buf)
			if err != nil || n != size {
				b.Fatalf("read %d: %v", n, err)
			}
			if err := cmd.Wait(); err != nil {
				b.Fatal(err)
			}
		}
	})
	drain := func(b *testing.B, st host.Stream) {
		var n int
		for {
			f, err := st.Recv(b.Context())
			if err != nil {
				b.Fatalf("Recv after %d bytes: %v", n, err)
			}
			if f.Kind == protocol.FrameControl {
				break
			}
			n += len(f.Data)
		}
		if n != size {
			b.Fatalf("read %d bytes", n)
		}
		_ = st.Close()
	}
	e := newStreamEnv(b, streamEnvOpts{})
	b.Run("local", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			id := fmt.Sprintf("local-%d", time.Now().UnixNano())
			_, err := e.local.Exec(b.Context(), protocol.ExecRequest{
				SessionKey: streamTestKey, AgentID: "main", Target: protocol.TargetNode,
				Args: protocol.ExecArgs{Command: command}, Security: "full", Ask: "off",
				Stream: &protocol.StreamSpec{ID: id},
			})
			if err != nil {
				b.Fatal(err)
			}
			st, err := e.local.Attach(b.Context(), protocol.AttachRequest{SessionKey: streamTestKey, StreamID: id})
			if err != nil {
				b.Fatal(err)
			}
			drain(b, st)
		}
	})
	b.Run("remote", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			e.t = b
			drain(b, e.start(command, protocol.StreamSpec{}, false))
		}
	})
}

// TestStreamAttachWire pins the attach request's JSON: nodes and gateways
// of other versions speak it.
func TestStreamAttachWire(t *testing.T) {
	w := attachWire{AttachRequest: protocol.AttachRequest{SessionKey: "k", SessionID: "s", StreamID: "x", Write: true}, Stream: "x", Window: 1 << 20}
	b, err := json.Marshal(w)
	if err != nil {
		t.Fatal(err)
	}
	const golden = `{"sessionKey":"k","sessionId":"s","streamId":"x","write":true,"stream":"x","window":1048576}`
	if string(b) != golden {
		t.Fatalf("encoded %s, want %s", b, golden)
	}
	var back attachWire
	if err := DecodeStrict("attach", []byte(golden), &back); err != nil || back != w {
		t.Fatalf("decoded %+v, %v", back, err)
	}
	if protocol.NodeEndpointAttach != "attach" {
		t.Fatalf("endpoint %q", protocol.NodeEndpointAttach)
	}
}

// TestStreamAttachRefused: attach requests the node cannot take are
// refused with the error of their fault, and nothing stays open.
func TestStreamAttachRefused(t *testing.T) {
	e := newStreamEnv(t, streamEnvOpts{group: "execmesh.node.refuse"})
	subject := e.group + "." + protocol.NodeEndpointAttach
	for _, c := range []struct {
		body string
		want protocol.ErrorType
		text string
	}{
		{`{"sessionKey":"k","sessionId":"s","stream":"a.b","window":1048576}`, protocol.ErrInvalidRequest, "invalid stream id"},
		{`{"sessionKey":"k","sessionId":"s","stream":"a","window":1}`, protocol.ErrInvalidRequest, "window"},
		{`{"sessionKey":"k","streamId":"b","stream":"a","window":1048576}`, protocol.ErrInvalidRequest, "the same"},
		{`{"sessionKey":"k","sessionId":"s","stream":"a","window":1048576,"extra":1}`, protocol.ErrInvalidRequest, "unknown field"},
		{`{"sessionKey":"k","streamId":"a","stream":"a","window":1048576}`, protocol.ErrNotFound, "not bound"},
		{`{"sessionKey":"` + streamTestKey + `","sessionId":"gone-away","stream":"a","window":1048576}`, protocol.ErrNotFound, "No session found"},
	} {
		m, err := bus.RequestChunked(t.Context(), e.gwNC, subject, []byte(c.body), nil)
		if err != nil {
			t.Fatal(err)
		}
		got := e.remote.replyError(bus.ReplyError(m))
		if pe := protocol.AsError(got); pe.Type != c.want || !strings.Contains(pe.Message, c.text) {
			t.Errorf("%s: %v, want %s %q", c.body, got, c.want, c.text)
		}
	}
	e.server.mu.Lock()
	n := len(e.server.streams)
	e.server.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d streams open", n)
	}

	// A host that does not stream, and a host of an older version (no
	// attach endpoint, only ping).
	plain := NewServer(ServerConfig{Host: struct{ host.Host }{e.local}, Name: "plain"})
	defer plain.Close(context.Background())
	svc, err := micro.AddService(e.nodeNC, micro.Config{Name: "plain", Version: "0.0.0"})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Stop()
	if err := plain.AddTo(e.nodeNC, svc.AddGroup("execmesh.node.plain")); err != nil {
		t.Fatal(err)
	}
	if err := svc.AddGroup("execmesh.node.old").AddEndpoint("ping", plain.Endpoint("ping", plain.handlePing), micro.WithEndpointSubject(protocol.NodeEndpointPing)); err != nil {
		t.Fatal(err)
	}
	if err := e.nodeNC.Flush(); err != nil {
		t.Fatal(err)
	}
	unreachable := 0
	for group, want := range map[string]string{"execmesh.node.plain": "plain does not serve streams", "execmesh.node.old": "does not serve streams (it runs an older execmesh)"} {
		r := &Remote{Conn: e.gwNC, Group: group, Label: "node " + group, OnUnreachable: func() { unreachable++ }}
		_, err := r.Attach(t.Context(), protocol.AttachRequest{SessionKey: streamTestKey, SessionID: "any"})
		if pe := protocol.AsError(err); pe.Type != protocol.ErrInvalidRequest || !strings.Contains(pe.Message, want) {
			t.Errorf("attach to %s: %v, want %q", group, err, want)
		}
	}
	if unreachable != 0 {
		t.Errorf("a host without streams was reported unreachable %d times", unreachable)
	}
}

// fakeStreamer is a host.Streamer whose streams deliver frames, then
// fail with err.
type fakeStreamer struct {
	frames []protocol.Frame
	err    error
}

func (f fakeStreamer) Attach(context.Context, protocol.AttachRequest) (host.Stream, error) {
	return &fakeStream{frames: f.frames, err: f.err}, nil
}

type fakeStream struct {
	frames []protocol.Frame
	err    error
}

func (s *fakeStream) Started() protocol.Control {
	return protocol.Control{Type: protocol.ControlStarted, SessionID: "fake"}
}

func (s *fakeStream) Recv(ctx context.Context) (protocol.Frame, error) {
	if len(s.frames) > 0 {
		f := s.frames[0]
		s.frames = s.frames[1:]
		return f, nil
	}
	return protocol.Frame{}, s.err
}

func (s *fakeStream) Send(context.Context, protocol.Frame) error { return nil }
func (s *fakeStream) Close() error                               { return nil }

// TestStreamSlowReader: a host that detached the stream because its
// output was not taken in time says so, and the gateway's Recv fails with
// session.ErrSlowReader after the output it had.
func TestStreamSlowReader(t *testing.T) {
	e := newStreamEnv(t, streamEnvOpts{group: "execmesh.node.slow"})
	srv := NewServer(ServerConfig{Host: struct {
		host.Host
		fakeStreamer
	}{e.local, fakeStreamer{frames: []protocol.Frame{{Kind: protocol.FrameStdout, Data: []byte("last")}}, err: session.ErrSlowReader}}, Name: "fake"})
	defer srv.Close(context.Background())
	svc, err := micro.AddService(e.nodeNC, micro.Config{Name: "fake", Version: "0.0.0"})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Stop()
	if err := srv.AddTo(e.nodeNC, svc.AddGroup("execmesh.node.fake")); err != nil {
		t.Fatal(err)
	}
	if err := e.nodeNC.Flush(); err != nil {
		t.Fatal(err)
	}
	r := &Remote{Conn: e.gwNC, Group: "execmesh.node.fake", Label: "node fake"}
	st, err := r.Attach(t.Context(), protocol.AttachRequest{SessionKey: streamTestKey, SessionID: "fake"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if f, err := st.Recv(t.Context()); err != nil || string(f.Data) != "last" {
		t.Fatalf("Recv: %+v, %v", f, err)
	}
	_, err = st.Recv(t.Context())
	if !errors.Is(err, session.ErrSlowReader) || errors.Is(err, ErrStreamLost) {
		t.Fatalf("Recv: %v, want session.ErrSlowReader", err)
	}
	if err := st.Send(t.Context(), protocol.Frame{Kind: protocol.FrameStdin, Data: []byte("x")}); !errors.Is(err, session.ErrSlowReader) {
		t.Fatalf("Send after the end: %v", err)
	}
}

// TestInbound: a peer may have a window of cost arrived and unused; a
// grant goes back once a quarter of the window was used, and covers all
// used since the last one.
func TestInbound(t *testing.T) {
	w := inbound{window: 100}
	for _, step := range []struct {
		arrive, use int64
		ok          bool
		grant       int64
	}{
		{arrive: 60, ok: true},
		{arrive: 40, ok: true},
		{use: 20},
		{use: 10, grant: 30},
		{arrive: 30, ok: true},
		{arrive: 1, ok: false}, // 131 arrived, 30 granted: 101 > 100
	} {
		if step.arrive > 0 {
			if got := w.arrive(step.arrive); got != step.ok {
				t.Fatalf("arrive(%d) = %v, want %v (%+v)", step.arrive, got, step.ok, w)
			}
		}
		if step.use > 0 {
			if got := w.use(step.use); got != step.grant {
				t.Fatalf("use(%d) = %d, want %d (%+v)", step.use, got, step.grant, w)
			}
		}
	}
}
