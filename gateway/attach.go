package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/execmesh/execmesh/access"
	"github.com/execmesh/execmesh/host"
	"github.com/execmesh/execmesh/index"
	"github.com/execmesh/execmesh/protocol"
	"github.com/execmesh/execmesh/session"
)

// Attach sockets (DESIGN.md §3.7; docs/attach.md is the reference).
const (
	// attachSubprotocol is the WebSocket subprotocol of attach sockets.
	attachSubprotocol = "execmesh.attach.v1"
	// attachBearerPrefix starts a subprotocol that carries the token,
	// for browsers, which cannot set the Authorization header on a
	// WebSocket.
	attachBearerPrefix = "execmesh.bearer."
	// attachStartWait bounds the wait for a start socket's start frame.
	attachStartWait = 30 * time.Second
	// attachWriteWait bounds one write to a client: a client that takes
	// no output for that long is closed as too slow.
	attachWriteWait = 30 * time.Second
)

// endSession is the close reason after the exit frame.
const endSession = "session ended"

// Close codes of attach sockets beyond the standard ones.
const (
	// closeSlowClient: the client did not read output fast enough.
	closeSlowClient websocket.StatusCode = 4008
	// closeStreamLost: the session's host stopped answering, or the
	// stream broke on the way.
	closeStreamLost websocket.StatusCode = 4010
)

// attachToken moves a token offered as a subprotocol into the
// Authorization header, so that the common check applies. A header the
// client set wins.
func attachToken(r *http.Request) {
	if r.Header.Get("Authorization") != "" {
		return
	}
	for _, p := range strings.Split(r.Header.Get("Sec-WebSocket-Protocol"), ",") {
		p = strings.TrimSpace(p)
		if tok, ok := strings.CutPrefix(p, attachBearerPrefix); ok && tok != "" {
			r.Header.Set("Authorization", "Bearer "+tok)
			return
		}
	}
}

// handleAttach serves GET /v1/sessions/{id}/attach: a WebSocket on a
// running session's raw streams. ?sessionKey= names the caller's scope
// (required with the tool token; the operator may attach to any session,
// and its scope is looked up); ?write=1 asks for the session's input.
func (g *Gateway) handleAttach(w http.ResponseWriter, r *http.Request) {
	attachToken(r)
	role, perr := g.guard.Authenticate(w, r, access.RoleAgent)
	if perr != nil {
		writeError(w, perr)
		return
	}
	id := r.PathValue("id")
	q := r.URL.Query()
	write := q.Get("write") == "1" || q.Get("write") == "true"
	key := q.Get("sessionKey")
	if key == "" && role != access.RoleOperator {
		writeError(w, protocol.Errorf(protocol.ErrInvalidRequest, "attach: sessionKey is required with the tool token"))
		return
	}
	if !session.ValidSessionID(id) {
		writeError(w, protocol.Errorf(protocol.ErrInvalidRequest, "attach: invalid session id %q", id))
		return
	}
	ctx := r.Context()
	h, sessionKey, err := g.attachHost(ctx, key, id)
	if err != nil {
		writeError(w, err)
		return
	}
	st, err := h.Attach(ctx, protocol.AttachRequest{SessionKey: sessionKey, SessionID: id, Write: write})
	if err != nil {
		writeError(w, err)
		return
	}
	conn, err := g.acceptAttach(w, r)
	if err != nil {
		_ = st.Close()
		return
	}
	g.pumpAttach(ctx, conn, st)
}

// attachHost finds the host that holds session id and the sessionKey it
// runs under: key when given (the session must be of that scope), else
// the session index's.
func (g *Gateway) attachHost(ctx context.Context, key, id string) (host.Streamer, string, error) {
	sessionKey := ""
	if key != "" {
		k, _, err := ParseSessionKey(key)
		if err != nil {
			return nil, "", err
		}
		sessionKey = k
		if g.local.Has(sessionKey, id) {
			return g.local, sessionKey, nil
		}
	}
	notFound := protocol.Errorf(protocol.ErrNotFound, "No session found for %s", id)
	rec, ok := g.index.Lookup(ctx, id)
	if !ok || (sessionKey != "" && rec.SessionKey != sessionKey) {
		return nil, "", notFound
	}
	if rec.State == index.StateLost {
		return nil, "", protocol.Errorf(protocol.ErrNotFound, "session %s is lost: %s", id, rec.LostReason)
	}
	h, _, err := g.hostOf(ctx, rec)
	if err != nil {
		return nil, "", err
	}
	s, ok := h.(host.Streamer)
	if !ok {
		return nil, "", protocol.Errorf(protocol.ErrInvalidRequest, "the host of session %s does not serve streams", id)
	}
	return s, rec.SessionKey, nil
}

// handleExecAttach serves GET /v1/exec/attach: a WebSocket whose first
// message is a start frame; the command runs as an exec call would (the
// same hosts, policy and approvals), in the background, attached to the
// socket from its first byte of output.
func (g *Gateway) handleExecAttach(w http.ResponseWriter, r *http.Request) {
	attachToken(r)
	if _, perr := g.guard.Authenticate(w, r, access.RoleAgent); perr != nil {
		writeError(w, perr)
		return
	}
	conn, err := g.acceptAttach(w, r)
	if err != nil {
		return
	}
	ctx := r.Context()
	start, err := readStart(ctx, conn)
	if err != nil {
		closeWith(conn, websocket.StatusPolicyViolation, err.Error())
		return
	}
	key := start.SessionKey
	if key == "" {
		key = r.URL.Query().Get("sessionKey")
	}
	st, res, err := g.startAttached(ctx, key, start)
	switch {
	case err != nil:
		e := protocol.AsError(err)
		_ = writeControl(ctx, conn, &protocol.Control{Type: protocol.ControlError, Error: e.Message})
		closeWith(conn, websocket.StatusNormalClosure, "not started")
		return
	case st == nil:
		_ = writeControl(ctx, conn, &protocol.Control{Type: protocol.ControlResult, Result: &res})
		closeWith(conn, websocket.StatusNormalClosure, "not started")
		return
	}
	if g.pumpAttach(ctx, conn, st) {
		// The client saw the end, as a poll would have shown it: the exit
		// notice would tell the sessionKey's agent of a run it never
		// started.
		sessionKey, _, _ := ParseSessionKey(key)
		g.polled(context.WithoutCancel(ctx), sessionKey, st.Started().SessionID)
	}
}

// readStart reads and checks a start frame.
func readStart(ctx context.Context, conn *websocket.Conn) (*protocol.Control, error) {
	ctx, cancel := context.WithTimeout(ctx, attachStartWait)
	defer cancel()
	typ, b, err := conn.Read(ctx)
	if err != nil {
		return nil, fmt.Errorf("no start frame: %w", err)
	}
	if typ != websocket.MessageText {
		return nil, errors.New("the first message must be a start frame")
	}
	c, err := protocol.ParseControl(b)
	if err != nil {
		return nil, err
	}
	if c.Type != protocol.ControlStart {
		return nil, fmt.Errorf("the first message must be a start frame, not %q", c.Type)
	}
	return c, nil
}

// startAttached runs a start frame's exec call with a stream bound, and
// claims the stream. A call that leaves no running session (it needs an
// approval, policy refused it, it failed) gives its result instead.
func (g *Gateway) startAttached(ctx context.Context, key string, start *protocol.Control) (host.Stream, protocol.Result, error) {
	var rnd [16]byte
	_, _ = rand.Read(rnd[:])
	spec := &protocol.StreamSpec{ID: hex.EncodeToString(rnd[:]), Stdin: start.Stdin, KeepOnDetach: start.KeepOnDetach}
	a, err := g.invoke(ctx, InvokeRequest{Tool: protocol.ToolExec, Args: start.Exec, SessionKey: key, stream: spec})
	if err != nil {
		return nil, protocol.Result{}, err
	}
	res := a.res
	id := res.SessionID()
	if res.Status() != protocol.StatusRunning || id == "" {
		return nil, res, nil
	}
	h, _, err := g.attachHost(ctx, key, id)
	if err != nil {
		return nil, protocol.Result{}, err
	}
	sessionKey, _, _ := ParseSessionKey(key) // invoke checked it
	st, err := h.Attach(ctx, protocol.AttachRequest{SessionKey: sessionKey, StreamID: spec.ID})
	if err != nil {
		return nil, protocol.Result{}, err
	}
	return st, res, nil
}

// acceptAttach upgrades an attach request. The browser checks of every
// endpoint (Gateway.Protect) already ran; the library's own check of the
// Origin header against the host stays on as well.
func (g *Gateway) acceptAttach(w http.ResponseWriter, r *http.Request) (*websocket.Conn, error) {
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{attachSubprotocol}})
	if err != nil {
		g.log.Debug("attach upgrade failed", "err", err)
		return nil, err
	}
	conn.SetReadLimit(protocol.MaxFrameData + 1)
	return conn, nil
}

// pumpAttach joins a socket and a stream until the session ends, the
// client goes away or either side fails; each end has a close reason. It
// reports whether the client was sent the session's exit.
func (g *Gateway) pumpAttach(ctx context.Context, conn *websocket.Conn, st host.Stream) (exited bool) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer st.Close()
	started := st.Started()
	if err := writeControl(ctx, conn, &started); err != nil {
		conn.CloseNow()
		return false
	}
	out := make(chan struct{})
	go func() {
		defer close(out)
		code, reason := g.pumpOutput(ctx, conn, st)
		exited = reason == endSession
		closeWith(conn, code, reason)
		cancel(errors.New(reason))
	}()
	go func() {
		select {
		case <-g.bg.Done():
			closeWith(conn, websocket.StatusGoingAway, "gateway is shutting down")
			cancel(errors.New("gateway is shutting down"))
		case <-ctx.Done():
		}
	}()
	g.pumpInput(ctx, conn, st)
	cancel(errors.New("client went away"))
	<-out
	return exited
}

// pumpOutput copies the stream's output to the socket and says how the
// socket is to be closed.
func (g *Gateway) pumpOutput(ctx context.Context, conn *websocket.Conn, st host.Stream) (websocket.StatusCode, string) {
	var msg []byte
	for {
		f, err := st.Recv(ctx)
		switch {
		case errors.Is(err, session.ErrSlowReader):
			return closeSlowClient, err.Error()
		case ctx.Err() != nil:
			return websocket.StatusNormalClosure, context.Cause(ctx).Error()
		case err != nil:
			return closeStreamLost, truncateReason(err.Error())
		}
		wctx, cancel := context.WithTimeout(ctx, attachWriteWait)
		if f.Kind == protocol.FrameControl {
			err = writeControl(wctx, conn, f.Control)
		} else {
			// A message carries at most MaxFrameData bytes: what clients
			// are told to accept.
			for p := f.Data; len(p) > 0 && err == nil; {
				n := min(len(p), protocol.MaxFrameData)
				msg = append(append(msg[:0], f.Kind), p[:n]...)
				err = conn.Write(wctx, websocket.MessageBinary, msg)
				p = p[n:]
			}
		}
		cancel()
		if err != nil {
			if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
				return closeSlowClient, "the client did not read the session's output fast enough"
			}
			return websocket.StatusNormalClosure, "client went away"
		}
		if f.Kind == protocol.FrameControl && f.Control.Type == protocol.ControlExit {
			return websocket.StatusNormalClosure, endSession
		}
	}
}

// pumpInput hands the client's frames to the stream until the client or
// the stream goes away. A refused frame is answered with an error frame;
// a frame that is not understood closes the socket.
func (g *Gateway) pumpInput(ctx context.Context, conn *websocket.Conn, st host.Stream) {
	for {
		typ, b, err := conn.Read(ctx)
		if err != nil {
			return // the library closed with the reason (too big, …)
		}
		var f protocol.Frame
		switch {
		case typ == websocket.MessageBinary && len(b) > 0 && b[0] == protocol.FrameStdin:
			f = protocol.Frame{Kind: protocol.FrameStdin, Data: b[1:]}
		case typ == websocket.MessageBinary:
			closeWith(conn, websocket.StatusPolicyViolation, "a client's binary message is stdin: kind byte 0")
			return
		default:
			c, err := protocol.ParseControl(b)
			if err != nil {
				closeWith(conn, websocket.StatusPolicyViolation, truncateReason(err.Error()))
				return
			}
			f = protocol.Frame{Kind: protocol.FrameControl, Control: c}
		}
		if err := st.Send(ctx, f); err != nil {
			if !errors.Is(err, host.ErrStreamRefused) && !errors.Is(err, session.ErrNotWriter) {
				if ctx.Err() != nil {
					return
				}
				g.log.Debug("attach input failed", "err", err)
			}
			if werr := writeControl(ctx, conn, &protocol.Control{Type: protocol.ControlError, Error: err.Error()}); werr != nil {
				return
			}
		}
	}
}

// writeControl sends a Control as a text message.
func writeControl(ctx context.Context, conn *websocket.Conn, c *protocol.Control) error {
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	return conn.Write(ctx, websocket.MessageText, b)
}

// closeWith closes a socket with a code and reason, without waiting long
// for the client's half of the handshake.
func closeWith(conn *websocket.Conn, code websocket.StatusCode, reason string) {
	done := make(chan struct{})
	go func() {
		_ = conn.Close(code, truncateReason(reason))
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		conn.CloseNow()
	}
}

// truncateReason fits a close reason in a control frame (123 bytes).
func truncateReason(s string) string {
	if len(s) <= 123 {
		return s
	}
	return strings.ToValidUTF8(s[:120], "") + "..."
}

// handleSessionKeys serves GET /v1/sessions (operator): the sessionKeys
// that hold sessions in the session index, with how many each holds and
// how many of them run, the busiest first. The tool API lists sessions
// per sessionKey; this is how an operator finds the keys.
func (g *Gateway) handleSessionKeys(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, struct {
		SessionKeys []index.KeyCount `json:"sessionKeys"`
	}{g.index.Keys()})
}
