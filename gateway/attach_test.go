package gateway

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/execmesh/execmesh/config"
	"github.com/execmesh/execmesh/protocol"
)

// wsClient is a test client of an attach socket.
type wsClient struct {
	t    *testing.T
	conn *websocket.Conn
	ctx  context.Context
}

// dialAttach opens path (with query) on the test gateway with header.
func (tg *testGateway) dialAttach(path string, header http.Header) (*wsClient, *http.Response, error) {
	ctx, cancel := context.WithTimeout(tg.t.Context(), 60*time.Second)
	tg.t.Cleanup(cancel)
	u := "ws" + strings.TrimPrefix(tg.srv.URL, "http") + path
	if header == nil {
		header = http.Header{"Authorization": {"Bearer " + tg.g.operatorToken()}}
	}
	conn, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: header, Subprotocols: []string{attachSubprotocol}})
	if err != nil {
		return nil, resp, err
	}
	conn.SetReadLimit(protocol.MaxFrameData + 1) // what clients are told to accept
	tg.t.Cleanup(func() { conn.CloseNow() })
	return &wsClient{t: tg.t, conn: conn, ctx: ctx}, resp, nil
}

func (c *wsClient) control(ctl protocol.Control) {
	c.t.Helper()
	b, _ := json.Marshal(ctl)
	if err := c.conn.Write(c.ctx, websocket.MessageText, b); err != nil {
		c.t.Fatal(err)
	}
}

func (c *wsClient) stdin(p []byte) {
	c.t.Helper()
	if err := c.conn.Write(c.ctx, websocket.MessageBinary, append([]byte{protocol.FrameStdin}, p...)); err != nil {
		c.t.Fatal(err)
	}
}

// next reads one message: data (kind, bytes) or a control.
func (c *wsClient) next() (byte, []byte, *protocol.Control, error) {
	typ, b, err := c.conn.Read(c.ctx)
	if err != nil {
		return 0, nil, nil, err
	}
	if typ == websocket.MessageBinary {
		if len(b) == 0 {
			return 0, nil, nil, errors.New("empty binary message")
		}
		return b[0], b[1:], nil, nil
	}
	ctl, err := protocol.ParseControl(b)
	if err != nil {
		return 0, nil, nil, err
	}
	return protocol.FrameControl, nil, ctl, nil
}

// started reads the started frame.
func (c *wsClient) started() *protocol.Control {
	c.t.Helper()
	_, _, ctl, err := c.next()
	if err != nil || ctl == nil || ctl.Type != protocol.ControlStarted {
		c.t.Fatalf("no started frame: %+v %v", ctl, err)
	}
	return ctl
}

// untilExit collects output until the exit frame, then expects a normal
// close.
func (c *wsClient) untilExit() (stdout, stderr []byte, exit *protocol.Control) {
	c.t.Helper()
	for {
		kind, data, ctl, err := c.next()
		if err != nil {
			c.t.Fatalf("before the exit: %v (stdout %q)", err, stdout)
		}
		switch {
		case kind == protocol.FrameStdout:
			stdout = append(stdout, data...)
		case kind == protocol.FrameStderr:
			stderr = append(stderr, data...)
		case ctl.Type == protocol.ControlExit:
			if _, _, _, err := c.next(); websocket.CloseStatus(err) != websocket.StatusNormalClosure {
				c.t.Errorf("after the exit: %v", err)
			}
			return stdout, stderr, ctl
		default:
			c.t.Fatalf("unexpected control %+v", ctl)
		}
	}
}

func execFrame(t *testing.T, args map[string]any) protocol.Control {
	b, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	return protocol.Control{Type: protocol.ControlStart, Exec: b}
}

// TestExecAttachStreams: a start socket runs the command as exec does and
// streams stdout and stderr apart, each in order, to the byte, then the
// exit; the session is an ordinary session the process tool sees.
func TestExecAttachStreams(t *testing.T) {
	tg := startGateway(t, nil)
	for i := range 20 {
		c, _, err := tg.dialAttach("/v1/exec/attach", nil)
		if err != nil {
			t.Fatal(err)
		}
		c.control(execFrame(t, map[string]any{"command": "echo out1; echo err >&2; echo out2; printf '\\000\\377'; exit 3"}))
		st := c.started()
		out, errb, exit := c.untilExit()
		if string(out) != "out1\nout2\n\x00\xff" || string(errb) != "err\n" {
			t.Fatalf("run %d: stdout %q stderr %q", i, out, errb)
		}
		if exit.ExitCode == nil || *exit.ExitCode != 3 || exit.Reason != "exit" {
			t.Fatalf("exit %+v code %v", exit, exit.ExitCode)
		}
		if i == 0 {
			res := tg.invoke(protocol.ToolProcess, map[string]any{"action": "poll", "sessionId": st.SessionID}, "")
			if !strings.Contains(res.Text(), "out2") {
				t.Errorf("the agent's poll: %q", res.Text())
			}
		}
	}
}

// TestExecAttachFlood: a flood of output arrives whole, in messages no
// larger than clients are told to accept.
func TestExecAttachFlood(t *testing.T) {
	tg := startGateway(t, nil)
	c, _, err := tg.dialAttach("/v1/exec/attach", nil)
	if err != nil {
		t.Fatal(err)
	}
	c.control(execFrame(t, map[string]any{"command": "head -c 30000000 /dev/zero; yes | head -c 3000000 >&2"}))
	c.started()
	out, errb, exit := c.untilExit()
	if len(out) != 30000000 || len(errb) != 3000000 || *exit.ExitCode != 0 || bytes.Count(out, []byte{0}) != len(out) {
		t.Errorf("stdout %d bytes, stderr %d, exit %+v", len(out), len(errb), exit)
	}
}

// TestExecAttachStdin: stdin of a start with stdin reaches the program
// byte for byte, and eof ends it.
func TestExecAttachStdin(t *testing.T) {
	tg := startGateway(t, nil)
	c, _, err := tg.dialAttach("/v1/exec/attach", nil)
	if err != nil {
		t.Fatal(err)
	}
	ctl := execFrame(t, map[string]any{"command": "sha256sum"})
	ctl.Stdin = true
	c.control(ctl)
	c.started()
	data := make([]byte, 5<<20)
	_, _ = rand.Read(data)
	for p := data; len(p) > 0; {
		n := min(len(p), 100<<10)
		c.stdin(p[:n])
		p = p[n:]
	}
	c.control(protocol.Control{Type: protocol.ControlEOF})
	out, _, exit := c.untilExit()
	sum := sha256.Sum256(data)
	if !strings.HasPrefix(string(out), hex.EncodeToString(sum[:])) || *exit.ExitCode != 0 {
		t.Errorf("sha256sum said %q, exit %+v", out, exit)
	}
}

// TestAttachAgentPTY: a person attaches read-write to a PTY session an
// agent started, types into it, and the agent's poll returns it; a
// second writer is refused, a reader sees the same output.
func TestAttachAgentPTY(t *testing.T) {
	tg := startGateway(t, func(c *config.Config, _ *Options) { c.Gateway.Auth.Token = "tool-secret" })
	const key = "agent:main:alpha"
	res := tg.do(http.MethodPost, "/tools/invoke", mustJSON(t, map[string]any{"tool": "exec", "sessionKey": key,
		"args": map[string]any{"command": "sh", "pty": true, "background": true}}), tg.asAgent())
	if !res.OK {
		t.Fatalf("exec: %s", res.Raw)
	}
	id := res.Result.SessionID()
	path := "/v1/sessions/" + id + "/attach?sessionKey=" + url.QueryEscape(key)

	// The tool token reaches only its own sessionKey's sessions.
	if _, resp, err := tg.dialAttach("/v1/sessions/"+id+"/attach?sessionKey=agent:main:other", tg.asAgent()); err == nil || resp == nil || resp.StatusCode != http.StatusNotFound {
		t.Errorf("another sessionKey attached: %v %v", err, resp)
	}
	if _, resp, err := tg.dialAttach("/v1/sessions/"+id+"/attach", tg.asAgent()); err == nil || resp == nil || resp.StatusCode != http.StatusBadRequest {
		t.Errorf("the tool token without a sessionKey: %v %v", err, resp)
	}
	if _, resp, err := tg.dialAttach(path, http.Header{}); err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("no token: %v %v", err, resp)
	}
	// A browser's token rides as a subprotocol.
	rw, _, err := tg.dialAttach(path+"&write=1", http.Header{"Sec-WebSocket-Protocol": {attachBearerPrefix + "tool-secret"}})
	if err != nil {
		t.Fatal(err)
	}
	if st := rw.started(); !st.PTY || !st.Writer || st.SessionID != id {
		t.Fatalf("started %+v", st)
	}
	if _, resp, err := tg.dialAttach(path+"&write=1", tg.asAgent()); err == nil || resp == nil || resp.StatusCode != http.StatusConflict {
		t.Errorf("a second writer: %v %v", err, resp)
	}
	ro, _, err := tg.dialAttach("/v1/sessions/"+id+"/attach", nil) // the operator needs no sessionKey
	if err != nil {
		t.Fatal(err)
	}
	if st := ro.started(); st.Writer {
		t.Errorf("a reader holds the input: %+v", st)
	}
	rw.control(protocol.Control{Type: protocol.ControlResize, Cols: 91, Rows: 17})
	rw.stdin([]byte("stty size; echo typed-$((6*7))\n"))
	for _, c := range []*wsClient{rw, ro} {
		var seen bytes.Buffer
		for !strings.Contains(seen.String(), "typed-42") || !strings.Contains(seen.String(), "17 91") {
			_, data, ctl, err := c.next()
			if err != nil || ctl != nil {
				t.Fatalf("waiting for the output: %v %+v; saw %q", err, ctl, seen.String())
			}
			seen.Write(data)
		}
	}
	// Input from the reader is refused, and the socket stays open.
	ro.stdin([]byte("echo nope\n"))
	if _, _, ctl, err := ro.next(); err != nil || ctl == nil || ctl.Type != protocol.ControlError {
		t.Errorf("a reader's input: %+v %v", ctl, err)
	}
	checkFor(t, 30*time.Second, func() error {
		r := tg.do(http.MethodPost, "/tools/invoke", mustJSON(t, map[string]any{"tool": "process", "sessionKey": key,
			"args": map[string]any{"action": "log", "sessionId": id}}), tg.asAgent())
		if !strings.Contains(string(r.Raw), "typed-42") {
			return errors.New("the agent's log lacks the typed line")
		}
		return nil
	})
	// Detaching leaves the agent's session running.
	rw.conn.Close(websocket.StatusNormalClosure, "")
	ro.conn.Close(websocket.StatusNormalClosure, "")
	r := tg.do(http.MethodPost, "/tools/invoke", mustJSON(t, map[string]any{"tool": "process", "sessionKey": key,
		"args": map[string]any{"action": "poll", "sessionId": id}}), tg.asAgent())
	if !strings.Contains(string(r.Raw), `"status":"running"`) {
		t.Errorf("after detaching: %s", r.Raw)
	}
	tg.do(http.MethodPost, "/tools/invoke", mustJSON(t, map[string]any{"tool": "process", "sessionKey": key,
		"args": map[string]any{"action": "kill", "sessionId": id}}), tg.asAgent())
}

// TestExecAttachDetach: a client that goes away kills its session unless
// it asked to keep it.
func TestExecAttachDetach(t *testing.T) {
	tg := startGateway(t, nil)
	ids := map[bool]string{}
	for _, keep := range []bool{false, true} {
		c, _, err := tg.dialAttach("/v1/exec/attach", nil)
		if err != nil {
			t.Fatal(err)
		}
		ctl := execFrame(t, map[string]any{"command": "sleep 600"})
		ctl.KeepOnDetach = keep
		c.control(ctl)
		ids[keep] = c.started().SessionID
		c.conn.CloseNow()
	}
	checkFor(t, 30*time.Second, func() error {
		res := tg.invoke(protocol.ToolProcess, map[string]any{"action": "poll", "sessionId": ids[false]}, "")
		if res.Status() == protocol.StatusRunning {
			return errors.New("the session of a client that went away still runs")
		}
		return nil
	})
	if res := tg.invoke(protocol.ToolProcess, map[string]any{"action": "poll", "sessionId": ids[true]}, ""); res.Status() != protocol.StatusRunning {
		t.Errorf("keepOnDetach: %s", res.Text())
	}
	tg.invoke(protocol.ToolProcess, map[string]any{"action": "kill", "sessionId": ids[true]}, "")
}

// TestAttachBadInput: bad frames close the socket with a reason, a start
// that does not run answers the tool's result or error, and nothing is
// left behind.
func TestAttachBadInput(t *testing.T) {
	tg := startGateway(t, func(c *config.Config, _ *Options) { c.Tools.Exec.Security = "deny" })
	goroutines := 0
	for round := range 4 {
		if round == 1 {
			goroutines = runtime.NumGoroutine() // the gateway's own have started
		}
		for _, tc := range []struct {
			name  string
			first func(c *wsClient)
			code  websocket.StatusCode
			text  string
		}{
			{"not a start", func(c *wsClient) { c.control(protocol.Control{Type: protocol.ControlEOF}) }, websocket.StatusPolicyViolation, "start frame"},
			{"unknown type", func(c *wsClient) { _ = c.conn.Write(c.ctx, websocket.MessageText, []byte(`{"type":"launch"}`)) }, websocket.StatusPolicyViolation, "unknown control type"},
			{"unknown field", func(c *wsClient) {
				_ = c.conn.Write(c.ctx, websocket.MessageText, []byte(`{"type":"start","exec":{"command":"true"},"sudo":true}`))
			}, websocket.StatusPolicyViolation, "unknown field"},
			{"too big", func(c *wsClient) {
				_ = c.conn.Write(c.ctx, websocket.MessageText, bytes.Repeat([]byte("x"), protocol.MaxFrameData+10))
			}, websocket.StatusMessageTooBig, ""},
			{"bad exec args", func(c *wsClient) { c.control(execFrame(t, map[string]any{"command": "true", "yieldMs": "soon"})) }, websocket.StatusNormalClosure, ""},
			{"denied", func(c *wsClient) { c.control(execFrame(t, map[string]any{"command": "true"})) }, websocket.StatusNormalClosure, ""},
		} {
			t.Run(tc.name, func(t *testing.T) {
				c, _, err := tg.dialAttach("/v1/exec/attach", nil)
				if err != nil {
					t.Fatal(err)
				}
				tc.first(c)
				var sawError bool
				for {
					_, _, ctl, err := c.next()
					if err != nil {
						if got := websocket.CloseStatus(err); got != tc.code {
							t.Errorf("close %v, want %v (%v)", got, tc.code, err)
						}
						if !strings.Contains(err.Error(), tc.text) {
							t.Errorf("close reason %v lacks %q", err, tc.text)
						}
						break
					}
					if ctl != nil && (ctl.Type == protocol.ControlError || ctl.Type == protocol.ControlResult) {
						sawError = true
					}
				}
				if tc.code == websocket.StatusNormalClosure && !sawError {
					t.Error("no error or result frame before the close")
				}
			})
		}
	}
	checkFor(t, 10*time.Second, func() error {
		buf := make([]byte, 4<<20)
		dump := string(buf[:runtime.Stack(buf, true)])
		// The gateway's own watchers start in their time; what an attach
		// leaves behind is named.
		for _, f := range []string{"coder/websocket", "pumpAttach", "pumpOutput", "pumpInput", "(*Attachment)", "hostbus.(*remoteStream)"} {
			if strings.Contains(dump, f) {
				return fmt.Errorf("goroutines of %s left behind (%d at the start, %d now):\n%s", f, goroutines, runtime.NumGoroutine(), dump)
			}
		}
		return nil
	})

}

// TestAttachCrossOrigin: a web page of another origin cannot open an
// attach socket, with or without a token.
func TestAttachCrossOrigin(t *testing.T) {
	tg := startGateway(t, nil)
	for _, h := range []http.Header{
		{"Origin": {"https://evil.example"}},
		{"Origin": {"https://evil.example"}, "Authorization": {"Bearer " + tg.g.operatorToken()}},
	} {
		if _, resp, err := tg.dialAttach("/v1/exec/attach", h); err == nil || resp == nil || resp.StatusCode/100 != 4 {
			t.Errorf("cross-origin %v: %v %v", h, err, resp)
		}
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSessionKeysList: the operator finds every sessionKey that holds
// sessions, with its counts; the tool token may not.
func TestSessionKeysList(t *testing.T) {
	tg := startGateway(t, func(c *config.Config, _ *Options) { c.Gateway.Auth.Token = "tool-secret" })
	for _, key := range []string{"agent:main:a", "agent:main:b", "agent:main:b", "agent:ops:c"} {
		r := tg.do(http.MethodPost, "/tools/invoke", mustJSON(t, map[string]any{"tool": "exec", "sessionKey": key,
			"args": map[string]any{"command": "sleep 60", "background": true}}), tg.asAgent())
		if !r.OK {
			t.Fatalf("exec: %s", r.Raw)
		}
	}
	if r := tg.do(http.MethodGet, "/v1/sessions", nil, tg.asAgent()); r.Status != http.StatusForbidden {
		t.Errorf("the tool token listed the sessionKeys: %d %s", r.Status, r.Raw)
	}
	var got struct {
		SessionKeys []struct {
			SessionKey        string
			Sessions, Running int
		}
	}
	checkFor(t, 10*time.Second, func() error {
		r := tg.do(http.MethodGet, "/v1/sessions", nil, nil)
		if err := json.Unmarshal(r.Raw, &got); err != nil || r.Status != http.StatusOK {
			return fmt.Errorf("%d %s: %v", r.Status, r.Raw, err)
		}
		if len(got.SessionKeys) != 3 || got.SessionKeys[0].SessionKey != "agent:main:b" || got.SessionKeys[0].Sessions != 2 || got.SessionKeys[0].Running != 2 {
			return fmt.Errorf("sessionKeys %+v", got.SessionKeys)
		}
		return nil
	})
}

// TestExecAttachSandbox: a start attached to host=sandbox runs in the
// sandbox with the same streams: stdout and stderr apart, stdin, a PTY.
func TestExecAttachSandbox(t *testing.T) {
	tg := startSandboxGateway(t, nil)
	c, _, err := tg.dialAttach("/v1/exec/attach", nil)
	if err != nil {
		t.Fatal(err)
	}
	ctl := execFrame(t, map[string]any{"command": "touch /etc/x 2>/dev/null || echo ro >&2; read line; echo got-$line; printf '\\000'"})
	ctl.Stdin = true
	c.control(ctl)
	c.started()
	c.stdin([]byte("abc\n"))
	c.control(protocol.Control{Type: protocol.ControlEOF})
	out, errb, exit := c.untilExit()
	if string(out) != "got-abc\n\x00" || string(errb) != "ro\n" || *exit.ExitCode != 0 {
		t.Errorf("stdout %q stderr %q exit %+v", out, errb, exit)
	}
	p, _, err := tg.dialAttach("/v1/exec/attach", nil)
	if err != nil {
		t.Fatal(err)
	}
	p.control(execFrame(t, map[string]any{"command": "stty size; exit 5", "pty": true}))
	if st := p.started(); !st.PTY {
		t.Fatalf("started %+v", st)
	}
	out, _, exit = p.untilExit()
	if !strings.Contains(string(out), "30 120") || *exit.ExitCode != 5 {
		t.Errorf("pty: %q %+v", out, exit)
	}
}

// TestExecAttachNoNotice: a run started attached whose client saw its end
// leaves no exit notice for the sessionKey's agent, who never started it;
// a person watching an agent's session takes nothing from the agent.
func TestExecAttachNoNotice(t *testing.T) {
	tg := startGateway(t, nil)
	c, _, err := tg.dialAttach("/v1/exec/attach", nil)
	if err != nil {
		t.Fatal(err)
	}
	c.control(execFrame(t, map[string]any{"command": "echo person"}))
	person := c.started().SessionID
	c.untilExit()
	agent := tg.invoke(protocol.ToolExec, map[string]any{"command": "sleep 0.5; echo agent", "background": true}, "").SessionID()
	w, _, err := tg.dialAttach("/v1/sessions/"+agent+"/attach", nil)
	if err != nil {
		t.Fatal(err)
	}
	w.started()
	w.untilExit()
	var evs struct {
		Events []protocol.SystemEvent `json:"events"`
	}
	checkFor(t, 30*time.Second, func() error {
		r := tg.do(http.MethodGet, "/v1/events?sessionKey="+url.QueryEscape(DefaultSessionKey)+"&waitMs=200", nil, nil)
		if err := json.Unmarshal(r.Raw, &evs); err != nil {
			return fmt.Errorf("%s: %v", r.Raw, err)
		}
		for _, e := range evs.Events {
			if strings.Contains(e.Text, agent) {
				return nil
			}
		}
		return fmt.Errorf("no notice of the agent's session %s: %+v", agent, evs.Events)
	})
	for _, e := range evs.Events {
		if strings.Contains(e.Text, person) {
			t.Errorf("a notice of the attached run: %+v", e)
		}
	}
}
