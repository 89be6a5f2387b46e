package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/execmesh/execmesh/config"

	"github.com/execmesh/execmesh/protocol"
	"github.com/execmesh/execmesh/session"
)

// sseEvent is one server-sent event, or a comment (name ":").
type sseEvent struct {
	name string
	data string
	at   time.Time
}

// sseClient reads a stream's events in a goroutine it owns; close stops
// it and waits for it.
type sseClient struct {
	resp   *http.Response
	cancel context.CancelFunc
	events chan sseEvent
	wg     sync.WaitGroup
}

// streamPath is the stream URL path of a session.
func streamPath(sessionKey, id string) string {
	return "/v1/sessions/" + url.PathEscape(sessionKey) + "/" + url.PathEscape(id) + "/stream"
}

// openStream GETs base+path with the bearer token (when not empty) and
// returns the response; a 200 answer is read as events.
func openStream(t *testing.T, base, path, token string) *sseClient {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatalf("GET %s: %v", path, err)
	}
	c := &sseClient{resp: resp, cancel: cancel, events: make(chan sseEvent, 1024)}
	t.Cleanup(c.close)
	if resp.StatusCode != http.StatusOK {
		return c
	}
	c.wg.Go(func() {
		defer close(c.events)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
		var ev sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if ev.name != "" {
					ev.at = time.Now()
					c.events <- ev
				}
				ev = sseEvent{}
			case strings.HasPrefix(line, ":"):
				ev.name, ev.data = ":", strings.TrimSpace(line[1:])
			case strings.HasPrefix(line, "event: "):
				ev.name = line[len("event: "):]
			case strings.HasPrefix(line, "data: "):
				ev.data += line[len("data: "):]
			}
		}
	})
	return c
}

func (c *sseClient) close() {
	c.cancel()
	c.resp.Body.Close()
	c.wg.Wait()
}

// next returns the next event, failing the test when none comes in time
// or the stream ended.
func (c *sseClient) next(t *testing.T, wait time.Duration) sseEvent {
	t.Helper()
	select {
	case ev, ok := <-c.events:
		if !ok {
			t.Fatalf("stream ended")
		}
		return ev
	case <-time.After(wait):
		t.Fatalf("no event within %v", wait)
	}
	return sseEvent{}
}

// streamResult is what a client following the protocol ends up with.
type streamResult struct {
	events  []sseEvent
	view    string         // the output after applying every output event
	appends []string       // the appended texts, in order
	resets  []string       // the reset texts, in order
	final   map[string]any // the last status event
	errText string         // the error event's message, if any
}

// follow reads events until the stream ends (the server closes it after
// the final status or an error), applying output events as a client does.
func (c *sseClient) follow(t *testing.T, wait time.Duration) streamResult {
	t.Helper()
	var r streamResult
	deadline := time.After(wait)
	for {
		select {
		case ev, ok := <-c.events:
			if !ok {
				return r
			}
			r.events = append(r.events, ev)
			switch ev.name {
			case "output":
				var d map[string]string
				if err := json.Unmarshal([]byte(ev.data), &d); err != nil {
					t.Fatalf("output data %q: %v", ev.data, err)
				}
				if s, ok := d["reset"]; ok {
					r.view = s
					r.resets = append(r.resets, s)
				} else if s, ok := d["append"]; ok {
					r.view += s
					r.appends = append(r.appends, s)
				} else {
					t.Fatalf("output event without append or reset: %s", ev.data)
				}
			case "status":
				var d map[string]any
				if err := json.Unmarshal([]byte(ev.data), &d); err != nil {
					t.Fatalf("status data %q: %v", ev.data, err)
				}
				r.final = d
			case "error":
				var d map[string]string
				_ = json.Unmarshal([]byte(ev.data), &d)
				r.errText = d["error"]
			}
		case <-deadline:
			t.Fatalf("stream did not end within %v; events so far: %v", wait, r.events)
		}
	}
}

// TestSessionStream follows a session's output to its end, for a gateway
// session and a node session: output arrives while the command runs, the
// final status ends the stream, and a poll afterwards still gets all the
// output (the stream read with log, draining nothing).
func TestSessionStream(t *testing.T) {
	for _, host := range []string{"gateway", "node"} {
		t.Run(host, func(t *testing.T) {
			var tg *testGateway
			args := map[string]any{
				"command":    "echo one; sleep 0.8; echo two; sleep 0.8; echo three",
				"background": true,
			}
			if host == "node" {
				env := startNodeGateway(t, nil, "", func(c *config.Config, _ *Options) { c.Gateway.Auth.Token = "stream-token" })
				env.pairAgent(testAgentConfig(t, env.srv, "streamer"))
				tg = env.testGateway
				args["host"] = "node"
			} else {
				tg = startGateway(t, func(c *config.Config, _ *Options) { c.Gateway.Auth.Token = "stream-token" })
			}
			res := tg.invoke("exec", args, "")
			if res.Status() != protocol.StatusRunning {
				t.Fatalf("exec: %s %v", res.Text(), res.Details)
			}
			id := res.SessionID()

			c := openStream(t, tg.srv.URL, streamPath(DefaultSessionKey, id), tg.token)
			if c.resp.StatusCode != http.StatusOK {
				t.Fatalf("stream: %d", c.resp.StatusCode)
			}
			if ct := c.resp.Header.Get("Content-Type"); ct != "text/event-stream" {
				t.Errorf("Content-Type %q", ct)
			}
			first := c.next(t, 10*time.Second)
			if first.name != "output" || !strings.Contains(first.data, `"reset"`) {
				t.Fatalf("first event: %s %s", first.name, first.data)
			}
			r := c.follow(t, 30*time.Second)
			r.events = append([]sseEvent{first}, r.events...)
			var d map[string]string
			_ = json.Unmarshal([]byte(first.data), &d)
			r.view = d["reset"] + strings.Join(r.appends, "")

			if r.final == nil || r.final["status"] != protocol.StatusCompleted || r.final["exitCode"] != float64(0) || r.final["sessionId"] != id {
				t.Fatalf("final status: %v (events %v)", r.final, r.events)
			}
			if last := r.events[len(r.events)-1]; last.name != "status" {
				t.Errorf("last event %s %s, want the final status", last.name, last.data)
			}
			// Incremental: "three" came in an append of its own, after
			// "one" had been sent.
			incremental := false
			for _, a := range r.appends {
				if strings.Contains(a, "three") && !strings.Contains(a, "one") {
					incremental = true
				}
			}
			if !incremental || len(r.resets) != 0 {
				t.Errorf("output was not streamed incrementally: first %q, appends %q, resets %q", d["reset"], r.appends, r.resets)
			}
			want := "one\ntwo\nthree"
			if r.view != want {
				t.Errorf("client view %q, want %q", r.view, want)
			}
			if txt, _ := r.final["text"].(string); !strings.Contains(txt, want) {
				t.Errorf("final text %q", txt)
			}

			// The stream took nothing from the agent: a poll still has it all.
			poll := tg.invoke("process", map[string]any{"action": "poll", "sessionId": id}, "")
			if !strings.Contains(poll.Text(), "one") || !strings.Contains(poll.Text(), "three") {
				t.Errorf("poll after the stream: %q", poll.Text())
			}
		})
	}
}

// TestSessionStreamReset: when the retention cap drops the start of the
// output, the stream sends the whole retained output again (reset), and
// the client's view still ends equal to the session's log.
func TestSessionStreamReset(t *testing.T) {
	tg := startGateway(t, func(_ *config.Config, o *Options) {
		o.Getenv = func(k string) string {
			if k == "OPENCLAW_BASH_MAX_OUTPUT_CHARS" {
				return "1000"
			}
			return ""
		}
	})
	res := tg.invoke("exec", map[string]any{
		"command":    `i=0; while [ $i -lt 60 ]; do echo "line-$i-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"; i=$((i+1)); sleep 0.05; done`,
		"background": true,
	}, "")
	if res.Status() != protocol.StatusRunning {
		t.Fatalf("exec: %s", res.Text())
	}
	id := res.SessionID()
	c := openStream(t, tg.srv.URL, streamPath(DefaultSessionKey, id), "")
	r := c.follow(t, 30*time.Second)
	if r.final == nil || r.final["status"] != protocol.StatusCompleted {
		t.Fatalf("final: %v", r.final)
	}
	// Once the cap drops the start, the stream goes on appending what is
	// new instead of resending the whole retained output at every tick (a
	// tick delayed past the cap by a loaded machine may still reset).
	if len(r.resets) > 3 || len(r.appends) < 5 {
		t.Errorf("after the cap: %d resets, %d appends; want appends of the new output", len(r.resets), len(r.appends))
	}
	log := tg.invoke("process", map[string]any{"action": "log", "sessionId": id, "offset": 0}, "")
	if body := strings.TrimPrefix(log.Text(), session.RetentionCapNote); body == log.Text() || !strings.HasSuffix(r.view, body) {
		t.Errorf("client view does not end with the retained log:\nview %q\nlog  %q", r.view, log.Text())
	}
	if len(r.resets) == 1 {
		// One reset (the first event): the view is the whole output.
		var want strings.Builder
		for i := range 60 {
			fmt.Fprintf(&want, "line-%d-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\n", i)
		}
		if got := strings.TrimPrefix(r.view, session.RetentionCapNote); strings.TrimRight(got, "\n") != strings.TrimRight(want.String(), "\n") {
			t.Errorf("view is not the whole output:\n%q", got)
		}
	}
}

// TestSlid lines up retained output before and after the cap slid it.
func TestSlid(t *testing.T) {
	long := strings.Repeat("0123456789abcdef", 200) // 3200 bytes
	for _, tc := range []struct {
		name      string
		sent, out string
		want      int
	}{
		{"slid by 100", long, long[100:] + "NEW", len(long) - 100},
		{"nothing in common", long, strings.Repeat("z", 3000), -1},
		{"overlap too short", long, long[3000:] + strings.Repeat("q", 2000), -1},
		{"short texts", "abc", "bcd", -1},
		{"periodic text lines up at the tail", strings.Repeat("\\x00", 1000), strings.Repeat("\\x00", 1000) + "end", 3996},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := slid(tc.sent, tc.out)
			if got != tc.want {
				t.Fatalf("slid = %d, want %d", got, tc.want)
			}
			if got >= 0 && !strings.HasSuffix(tc.sent+tc.out[got:], tc.out) {
				t.Fatalf("view would not end with out")
			}
		})
	}
}

// TestSessionStreamRefusals: no token is 401, an unknown session 404
// before any stream, a bad sessionKey 400, and another sessionKey does not
// see the session.
func TestSessionStreamRefusals(t *testing.T) {
	tg := startGateway(t, func(c *config.Config, _ *Options) { c.Gateway.Auth.Token = "stream-token" })
	res := tg.invoke("exec", map[string]any{"command": "sleep 30", "background": true}, "")
	id := res.SessionID()

	for _, tc := range []struct {
		name, path, token string
		status            int
		message           string
	}{
		{"no token", streamPath(DefaultSessionKey, id), "", http.StatusUnauthorized, "unauthorized: missing or invalid bearer token"},
		{"wrong token", streamPath(DefaultSessionKey, id), "nope", http.StatusUnauthorized, "unauthorized: missing or invalid bearer token"},
		{"unknown session", streamPath(DefaultSessionKey, "no-such-session"), tg.token, http.StatusNotFound, "No session found for no-such-session"},
		{"other sessionKey", streamPath("agent:main:other", id), tg.token, http.StatusNotFound, "No session found for " + id},
		{"bad sessionKey", streamPath("not a key", id), tg.token, http.StatusBadRequest, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := openStream(t, tg.srv.URL, tc.path, tc.token)
			if c.resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", c.resp.StatusCode, tc.status)
			}
			var body invokeResponse
			if err := json.NewDecoder(c.resp.Body).Decode(&body); err != nil || body.Error == nil {
				t.Fatalf("body: %v %+v", err, body)
			}
			if tc.message != "" && body.Error.Message != tc.message {
				t.Errorf("message %q, want %q", body.Error.Message, tc.message)
			}
		})
	}
}

// TestSessionStreamPingAndHangUp: an idle stream sends heartbeat comments,
// and the handler returns when the client goes away.
func TestSessionStreamPingAndHangUp(t *testing.T) {
	tg := startGateway(t, nil)
	res := tg.invoke("exec", map[string]any{"command": "echo idle; sleep 30", "background": true}, "")
	id := res.SessionID()

	returned := make(chan struct{}, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /s/{sessionKey}/{sessionId}", func(w http.ResponseWriter, r *http.Request) {
		tg.g.streamSession(w, r, streamTiming{tick: 20 * time.Millisecond, ping: 50 * time.Millisecond})
		returned <- struct{}{}
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	c := openStream(t, srv.URL, "/s/"+url.PathEscape(DefaultSessionKey)+"/"+id, "")
	pings := 0
	for pings < 2 {
		ev := c.next(t, 10*time.Second)
		if ev.name == ":" {
			if ev.data != "ping" {
				t.Errorf("comment %q", ev.data)
			}
			pings++
		}
	}
	c.close()
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler did not return after the client went away")
	}
}

// TestSessionStreamOutputText covers how a log result becomes stream
// output.
func TestSessionStreamOutputText(t *testing.T) {
	for _, tc := range []struct {
		name string
		res  protocol.Result
		want string
	}{
		{"running, no output", protocol.TextResult("(no output yet)", protocol.Details{Status: protocol.Some("running"), TotalChars: protocol.Some(0)}), ""},
		{"running, node numbers", protocol.TextResult("(no output yet)", protocol.Details{Status: protocol.Some("running"), TotalChars: protocol.Some(0)}), ""},
		{"running", protocol.TextResult("a\nb", protocol.Details{Status: protocol.Some("running"), TotalChars: protocol.Some(4)}), "a\nb"},
		{"waiting for input", protocol.TextResult("prompt>\n\nNo new output for 16s; this session may be waiting for input. Use process write, send-keys, submit, or paste to provide input.",
			protocol.Details{Status: protocol.Some("running"), WaitingForInput: protocol.Some(true), TotalChars: protocol.Some(7)}), "prompt>"},
		{"finished", protocol.TextResult("x\n\nProcess stopped by request (signal SIGTERM).", protocol.Details{Status: protocol.Some("completed"), SessionID: protocol.Some("s")}), "x\n\nProcess stopped by request (signal SIGTERM)."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := streamOutput(tc.res); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
	if msg, failed := logFailure(protocol.FailedResult("No session found for x")); !failed || msg != "No session found for x" {
		t.Errorf("logFailure of a tool failure: %q %v", msg, failed)
	}
	if _, failed := logFailure(protocol.TextResult("boom", protocol.Details{Status: protocol.Some("failed"), SessionID: protocol.Some("s")})); failed {
		t.Errorf("a failed session's log is not a tool failure")
	}
}

// TestSessionStreamWireFormat: each event is an "event:" line, one "data:"
// line of JSON and a blank line.
func TestSessionStreamWireFormat(t *testing.T) {
	rec := httptest.NewRecorder()
	s := &sessionStream{sse: &sseWriter{w: rec, flusher: rec}}
	s.update(protocol.TextResult("a\nb", protocol.Details{Status: protocol.Some("running"), SessionID: protocol.Some("s"), TotalChars: protocol.Some(3)}))
	s.update(protocol.TextResult("a\nb\nc", protocol.Details{Status: protocol.Some("completed"), SessionID: protocol.Some("s"), ExitCode: protocol.Some(0)}))
	want := "event: output\ndata: {\"reset\":\"a\\nb\"}\n\n" +
		"event: status\ndata: {\"sessionId\":\"s\",\"status\":\"running\",\"waitingForInput\":false}\n\n" +
		"event: output\ndata: {\"append\":\"\\nc\"}\n\n" +
		"event: status\ndata: {\"exitCode\":0,\"sessionId\":\"s\",\"status\":\"completed\",\"text\":\"a\\nb\\nc\",\"waitingForInput\":false}\n\n"
	if got := rec.Body.String(); got != want {
		t.Errorf("wire format:\n got %q\nwant %q", got, want)
	}
}
