package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/coder/websocket"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"github.com/execmesh/execmesh/protocol"
)

// errNoStreams is a gateway that serves no attach sockets (an older one).
var errNoStreams = errors.New("the gateway serves no streams")

// errFallback tells runExec to run the call without streams.
var errFallback = errors.New("no streams: fall back to the tool's text")

// streamSubprotocol is the gateway's attach subprotocol.
const streamSubprotocol = "execmesh.attach.v1"

// stdinChunk is how much of local stdin one frame carries.
const stdinChunk = 32 << 10

// detachKey, typed on a raw terminal, detaches from a session (Ctrl-]).
const detachKey = 0x1d

// streamOptions shape a streamed exec or an attach.
type streamOptions struct {
	stdin  bool   // -i: forward stdin
	tty    bool   // -t: a PTY, the local terminal in raw mode
	signal string // --signal: what an interrupt sends (default: the signal received)
	keep   bool   // --keep: the session outlives the client
}

// dialStream opens an attach socket of the gateway.
func (cl *client) dialStream(ctx context.Context, path string, query url.Values) (*websocket.Conn, error) {
	u := "ws" + strings.TrimPrefix(cl.base, "http") + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	h := http.Header{"User-Agent": {cl.userAgent}}
	if cl.token != "" {
		h.Set("Authorization", "Bearer "+cl.token)
	}
	if cl.operatorToken != "" && query.Get("sessionKey") == "" {
		h.Set("Authorization", "Bearer "+cl.operatorToken)
	}
	conn, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: cl.hc, HTTPHeader: h, Subprotocols: []string{streamSubprotocol}})
	if err != nil {
		if resp != nil && resp.Body != nil {
			var ans struct {
				Error *protocol.Error `json:"error"`
			}
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			if json.Unmarshal(b, &ans) == nil && ans.Error != nil {
				return nil, ans.Error
			}
			if resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed {
				return nil, fmt.Errorf("%s: %s: %w", path, resp.Status, errNoStreams)
			}
			return nil, fmt.Errorf("%s: %s", path, resp.Status)
		}
		if errors.Is(err, syscall.ECONNREFUSED) {
			return nil, &unreachableError{url: cl.base, err: err}
		}
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	conn.SetReadLimit(protocol.MaxFrameData + 1)
	return conn, nil
}

// streamSession is one attached client: it copies output to stdout and
// stderr, input from stdin, forwards signals and the window size, and
// returns the session's exit status.
type streamSession struct {
	c    *cli
	conn *websocket.Conn
	opts streamOptions
	pty  bool
	// detachStatus is the exit status when the client detaches: the
	// session is killed for a streamed exec (128+SIGINT), left running
	// for attach (0).
	detachStatus int

	writeMu sync.Mutex // one writer of the socket at a time
}

// send writes a control frame.
func (s *streamSession) send(ctx context.Context, ctl protocol.Control) error {
	b, err := json.Marshal(ctl)
	if err != nil {
		return err
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	return s.conn.Write(ctx, websocket.MessageText, b)
}

// sendStdin writes a stdin frame.
func (s *streamSession) sendStdin(ctx context.Context, p []byte) error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	return s.conn.Write(ctx, websocket.MessageBinary, append([]byte{protocol.FrameStdin}, p...))
}

// readControl reads the next message, which must be a control frame.
func readControl(ctx context.Context, conn *websocket.Conn) (*protocol.Control, error) {
	typ, b, err := conn.Read(ctx)
	if err != nil {
		return nil, closeError(err)
	}
	if typ != websocket.MessageText {
		return nil, errors.New("the gateway sent output before saying what it attached to")
	}
	return protocol.ParseControl(b)
}

// closeError says why a socket closed.
func closeError(err error) error {
	var ce websocket.CloseError
	if errors.As(err, &ce) {
		if ce.Reason != "" {
			return errors.New(ce.Reason)
		}
		return fmt.Errorf("the gateway closed the stream (%v)", ce.Code)
	}
	return err
}

// run pumps the session until it ends or the client detaches, and
// returns the exit status.
func (s *streamSession) run(ctx context.Context) (int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if s.opts.tty && s.pty {
		if restore, ok := s.rawTerminal(ctx); ok {
			defer restore()
		}
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	detached := make(chan struct{})
	var detachOnce sync.Once
	detach := func() { detachOnce.Do(func() { close(detached); s.conn.CloseNow() }) }
	go s.forwardSignals(ctx, sigs, detach)
	if s.opts.stdin {
		go s.forwardStdin(ctx, detach)
	}
	buf := make([]byte, protocol.MaxFrameData+1)
	for {
		typ, b, err := s.readMessage(ctx, buf)
		if err != nil {
			select {
			case <-detached:
				fmt.Fprint(s.c.stderr, "execmesh: detached\r\n") // the terminal may still be raw
				return s.detachStatus, nil
			default:
			}
			return exitFail, fmt.Errorf("the stream ended before the session did: %w", closeError(err))
		}
		if typ == websocket.MessageBinary {
			if len(b) == 0 {
				continue
			}
			w := s.c.stdout
			if b[0] == protocol.FrameStderr {
				w = s.c.stderr
			}
			if _, err := w.Write(b[1:]); err != nil {
				return exitFail, fmt.Errorf("writing the output: %w", err)
			}
			continue
		}
		ctl, err := protocol.ParseControl(b)
		if err != nil {
			return exitFail, err
		}
		switch ctl.Type {
		case protocol.ControlExit:
			code, why := controlExitStatus(ctl)
			if why != "" {
				fmt.Fprintln(s.c.stderr, "execmesh:", why)
			}
			return code, nil
		case protocol.ControlError:
			fmt.Fprintln(s.c.stderr, "execmesh:", ctl.Error)
		}
	}
}

// readMessage reads one message into buf, which holds the largest a
// gateway sends: output flows without an allocation per message.
func (s *streamSession) readMessage(ctx context.Context, buf []byte) (websocket.MessageType, []byte, error) {
	typ, r, err := s.conn.Reader(ctx)
	if err != nil {
		return 0, nil, err
	}
	n, err := io.ReadFull(r, buf)
	switch {
	case err == io.EOF || err == io.ErrUnexpectedEOF:
		return typ, buf[:n], nil
	case err != nil:
		return 0, nil, err
	}
	// A full buffer: the message ends here, or is longer than the read
	// limit allows, which this read reports.
	var one [1]byte
	if m, err := r.Read(one[:]); m > 0 || (err != nil && err != io.EOF) {
		if err == nil {
			err = errors.New("a message longer than the stream's limit")
		}
		return 0, nil, err
	}
	return typ, buf[:n], nil
}

// rawTerminal puts the local terminal in raw mode and keeps the remote
// window size in step with it.
func (s *streamSession) rawTerminal(ctx context.Context) (func(), bool) {
	in, ok := s.c.stdin.(*os.File)
	if !ok || !isTerminal(in) {
		return nil, false
	}
	old, err := term.MakeRaw(int(in.Fd()))
	if err != nil {
		return nil, false
	}
	resize := func() {
		if w, h, err := term.GetSize(int(in.Fd())); err == nil {
			_ = s.send(ctx, protocol.Control{Type: protocol.ControlResize, Cols: w, Rows: h})
		}
	}
	resize()
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-winch:
				resize()
			}
		}
	}()
	return func() {
		signal.Stop(winch)
		_ = term.Restore(int(in.Fd()), old)
	}, true
}

// forwardSignals sends an interrupt to the session's foreground process
// group; a second one within two seconds detaches.
func (s *streamSession) forwardSignals(ctx context.Context, sigs <-chan os.Signal, detach func()) {
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case sig := <-sigs:
			// On a raw terminal Ctrl-C is a byte for the remote; a
			// SIGTERM or SIGHUP is for execmesh itself, as it is for ssh.
			if time.Since(last) < 2*time.Second || (s.opts.tty && s.pty && sig != syscall.SIGINT) {
				detach()
				return
			}
			last = time.Now()
			name := s.opts.signal
			if name == "" {
				name = unix.SignalName(sig.(syscall.Signal))
			}
			_ = s.send(ctx, protocol.Control{Type: protocol.ControlSignal, Signal: name})
		}
	}
}

// forwardStdin copies local stdin to the session, then sends its end. On
// a raw terminal Ctrl-] detaches.
func (s *streamSession) forwardStdin(ctx context.Context, detach func()) {
	buf := make([]byte, stdinChunk)
	raw := s.opts.tty && s.pty
	for {
		n, err := s.c.stdin.Read(buf)
		if n > 0 {
			p := buf[:n]
			if raw {
				if i := bytes.IndexByte(p, detachKey); i >= 0 {
					if i > 0 {
						_ = s.sendStdin(ctx, p[:i])
					}
					detach()
					return
				}
			}
			if werr := s.sendStdin(ctx, p); werr != nil {
				return
			}
		}
		if err != nil {
			if err == io.EOF {
				_ = s.send(ctx, protocol.Control{Type: protocol.ControlEOF})
			}
			return
		}
	}
}

// controlExitStatus is the exit status of an exit frame, as exitStatus
// gives it for a result: the code, 128+N for signal N, 124 for a
// timeout; with a note for the ones that are not the command's own code.
func controlExitStatus(ctl *protocol.Control) (int, string) {
	switch {
	case ctl.Reason == "overall-timeout" || ctl.Reason == "no-output-timeout":
		return exitTimeout, "command timed out: the exec timeout ended it (" + orDash(ctl.Signal, "killed") + ")"
	case ctl.Reason == "manual-cancel":
		return signalStatus(ctl.Signal), "command stopped by request (" + orDash(ctl.Signal, "killed") + ")"
	case ctl.Signal != "":
		return signalStatus(ctl.Signal), "command ended by signal " + ctl.Signal
	case ctl.ExitCode != nil:
		return *ctl.ExitCode & 0xff, ""
	case ctl.Status == protocol.StatusFailed:
		return exitFail, "command failed"
	}
	return exitOK, ""
}

// streamExec runs an exec call attached: the command's stdout and stderr
// as it wrote them, stdin with -i, a terminal with -t. A start that does
// not leave a running session (approval, refusal) is answered as exec
// without streams would be.
func (c *cli) streamExec(ctx context.Context, cl *client, f *clientFlags, o *execOptions, a protocol.ExecArgs) error {
	// Interrupts are forwarded to the command, not taken as the end of
	// this process (main's context ends on SIGINT).
	sctx := context.WithoutCancel(ctx)
	conn, err := cl.dialStream(ctx, "/v1/exec/attach", nil)
	if err != nil {
		if errors.Is(err, errNoStreams) && !o.stream.stdin {
			return errFallback // an older gateway: its text, announced as such
		}
		return err
	}
	defer conn.CloseNow()
	execJSON, err := json.Marshal(a)
	if err != nil {
		return err
	}
	s := &streamSession{c: c, conn: conn, opts: o.stream, detachStatus: exitSignalBase + int(syscall.SIGINT)}
	if err := s.send(sctx, protocol.Control{Type: protocol.ControlStart, Exec: execJSON, SessionKey: f.sessionKey,
		Stdin: o.stream.stdin, KeepOnDetach: o.stream.keep}); err != nil {
		return fmt.Errorf("starting the command: %w", closeError(err))
	}
	first, err := readControl(sctx, conn)
	if err != nil {
		return err
	}
	switch first.Type {
	case protocol.ControlStarted:
	case protocol.ControlError:
		err := errors.New(first.Error)
		if hint := unknownNodeHint(ctx, cl, a.Node, &protocol.Error{Type: protocol.ErrNotFound, Message: first.Error}); hint != "" {
			err = fmt.Errorf("%w; %s", err, hint)
		}
		return err
	case protocol.ControlResult:
		res := *first.Result
		data, _ := json.Marshal(invokeAnswer{OK: true, Result: res})
		if res.Status() == protocol.StatusApprovalPending {
			return c.awaitApproval(ctx, cl, f, o, res, data)
		}
		return c.finishWait(false, data, res, c.outputFacts(o, res, nil))
	default:
		return fmt.Errorf("the gateway answered the start with %q", first.Type)
	}
	s.pty = first.PTY
	return s.wait(sctx)
}

// wait runs the session to its end and turns its exit status into the
// command's.
func (s *streamSession) wait(ctx context.Context) error {
	code, err := s.run(ctx)
	if err != nil {
		return err
	}
	if code != exitOK {
		return &exitError{code: code}
	}
	return nil
}

// newAttachCmd is `execmesh attach SESSION`.
func (c *cli) newAttachCmd() *cobra.Command {
	var f clientFlags
	var o streamOptions
	cmd := &cobra.Command{
		Use:   "attach [flags] SESSION",
		Short: "join a running session: its output live, with -i its input (a PTY session as a terminal)",
		Long: `Join a running session as it runs, like docker attach: its stdout and stderr from now on,
as the command writes them (earlier output: execmesh process log SESSION). With -i, this
terminal's input goes to the session (one client at a time holds it); a PTY session then gets
this terminal in raw mode, its window size, and Ctrl-C reaches its foreground job. Ctrl-]
detaches; so does a second interrupt within 2 s. Detaching leaves the session running.
execmesh exits with the session's exit status when it ends while attached.

The operator token (read from the state dir on the gateway's machine) reaches any session;
with --session-key, the tool token reaches that sessionKey's sessions.`,
		Example: "  execmesh attach nimble-coral\n  execmesh attach -i --session-key agent:main:main nimble-coral",
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageErrorf("attach: name one session (usage: execmesh attach [flags] SESSION)")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			o.tty = o.stdin
			return c.runAttach(cmd, &f, o, args[0])
		},
	}
	fs := cmd.Flags()
	f.register(fs, withSessionKey)
	fs.BoolVarP(&o.stdin, "interactive", "i", false, "send this terminal's input to the session (a PTY session's as a raw terminal)")
	return cmd
}

// newLogsCmd is `execmesh logs -f SESSION`.
func (c *cli) newLogsCmd() *cobra.Command {
	var f clientFlags
	var follow bool
	cmd := &cobra.Command{
		Use:   "logs -f SESSION",
		Short: "follow a session's raw output (stdout and stderr apart, byte-exact) until it ends",
		Long: `Follow a running session's output as the command writes it, from now on: stdout to stdout,
stderr to stderr, byte-exact and uncut, until the session ends (exit status: the session's).
Without -f, print the session's retained output (execmesh process log).`,
		Example: "  execmesh logs -f nimble-coral > build.log",
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageErrorf("logs: name one session (usage: execmesh logs -f SESSION)")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if !follow {
				return c.runLogText(cmd, &f, args[0])
			}
			return c.runAttach(cmd, &f, streamOptions{}, args[0])
		},
	}
	fs := cmd.Flags()
	f.register(fs, withSessionKey)
	fs.BoolVarP(&follow, "follow", "f", false, "follow the raw output until the session ends")
	return cmd
}

// runLogText prints a session's retained output (process log).
func (c *cli) runLogText(cmd *cobra.Command, f *clientFlags, id string) error {
	cl, err := f.client(c)
	if err != nil {
		return err
	}
	defer cl.close()
	offset := 0
	_, ans, err := cl.invokeTool(cmd.Context(), protocol.ToolProcess, protocol.ProcessArgs{Action: "log", SessionID: id, Offset: &offset}, f.sessionKey)
	if err != nil {
		return err
	}
	printText(c.stdout, ans.Result.Text())
	if ans.Result.Status() == protocol.StatusFailed && ans.Result.SessionID() == "" {
		return &exitError{code: exitFail}
	}
	return nil
}

// runAttach joins a running session.
func (c *cli) runAttach(cmd *cobra.Command, f *clientFlags, o streamOptions, id string) error {
	ctx := cmd.Context()
	cl, err := f.client(c)
	if err != nil {
		return err
	}
	defer cl.close()
	q := url.Values{}
	if cmd.Flags().Changed("session-key") || cl.operatorToken == "" {
		q.Set("sessionKey", f.sessionKey)
	}
	if o.stdin {
		q.Set("write", "1")
	}
	sctx := context.WithoutCancel(ctx)
	conn, err := cl.dialStream(ctx, "/v1/sessions/"+url.PathEscape(id)+"/attach", q)
	if err != nil {
		return err
	}
	defer conn.CloseNow()
	first, err := readControl(sctx, conn)
	if err != nil {
		return err
	}
	if first.Type != protocol.ControlStarted {
		return fmt.Errorf("the gateway answered the attach with %q", first.Type)
	}
	s := &streamSession{c: c, conn: conn, opts: o, pty: first.PTY}
	return s.wait(sctx)
}
