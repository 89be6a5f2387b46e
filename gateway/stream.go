package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/execmesh/execmesh/protocol"
	"github.com/execmesh/execmesh/session"
)

// Intervals of a session output stream (GET
// /v1/sessions/{sessionKey}/{sessionId}/stream).
const (
	// streamTick is how often the stream reads the session's log.
	streamTick = 250 * time.Millisecond
	// streamPing is how often an idle stream sends a heartbeat comment.
	streamPing = sseKeepalive
)

// streamTiming holds the intervals of one stream; tests shorten them.
type streamTiming struct {
	tick time.Duration // how often the log is read
	ping time.Duration // how often a heartbeat comment is sent
}

// handleSessionStream serves GET /v1/sessions/{sessionKey}/{sessionId}/stream:
// the output of one process session as server-sent events, for local and
// node sessions alike. The stream reads the session with the process log
// action, as a client calling the tool would (never poll: it drains
// nothing an agent has not read and acknowledges no exit notice), every
// 250 ms, and pushes what changed:
//
//   - event "output", data {"append": text} with the output that is new
//     since the last event, or {"reset": text} with the whole retained
//     output (the first output event, and whenever the new output cannot
//     be lined up with what was sent). Once the retention cap drops the
//     start of the output, the stream goes on appending: the client's text
//     is then the output since the stream began, whose end is the
//     retained output; a client keeps as much of it as it likes. The text
//     is what process log shows (all retained lines), without the
//     waiting-for-input hint.
//   - event "status", data {"status", "sessionId", "waitingForInput"} when
//     the session's state changes; the last one, for a session that is no
//     longer running, adds "exitCode", "exitSignal", "exitReason" (when the
//     session has them) and "text", the final log text. The stream then
//     ends.
//   - event "error", data {"error": message} when reading the session
//     fails once the stream has begun (the session was removed, the node
//     became unreachable, the gateway is shutting down); the stream ends.
//   - a ": ping" comment every 15 s.
//
// An unknown session (or one the log action refuses, such as a foreground
// run not yet backgrounded) is answered before the stream starts: 404 with
// the tool's text as error message, like any other API error. An invalid
// sessionKey is 400. The stream also ends when the client goes away or the
// gateway closes.
func (g *Gateway) handleSessionStream(w http.ResponseWriter, r *http.Request) {
	g.streamSession(w, r, streamTiming{tick: streamTick, ping: streamPing})
}

func (g *Gateway) streamSession(w http.ResponseWriter, r *http.Request, timing streamTiming) {
	key, agentID, err := ParseSessionKey(r.PathValue("sessionKey"))
	if err != nil {
		writeError(w, err)
		return
	}
	id := r.PathValue("sessionId")
	ctx := r.Context()
	first, err := g.sessionLog(ctx, key, agentID, id)
	if err != nil {
		writeError(w, err)
		return
	}
	if msg, failed := logFailure(first); failed {
		writeError(w, protocol.Errorf(protocol.ErrNotFound, "%s", msg))
		return
	}
	sse := startSSE(w)
	if sse == nil {
		return
	}
	s := &sessionStream{sse: sse}
	if !s.update(first) {
		return
	}
	tick := time.NewTicker(timing.tick)
	defer tick.Stop()
	ping := time.NewTicker(timing.ping)
	defer ping.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.bg.Done():
			s.event("error", map[string]string{"error": "gateway is shutting down"})
			return
		case <-ping.C:
			if !sse.comment("ping") {
				return
			}
		case <-tick.C:
			res, err := g.sessionLog(ctx, key, agentID, id)
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				s.event("error", map[string]string{"error": protocol.AsError(err).Message})
				return
			}
			if msg, failed := logFailure(res); failed {
				s.event("error", map[string]string{"error": msg})
				return
			}
			if !s.update(res) {
				return
			}
		}
	}
}

// sessionLog reads all the retained output of a session with the process
// log action, dispatched as a process tool call of sessionKey is (the
// gateway's session core, or the node that holds the session), after the
// same checks (gateway closing, the process tool allowed for the agent).
// It is not counted as a tool call in the metrics: a stream reads four
// times a second.
func (g *Gateway) sessionLog(ctx context.Context, sessionKey, agentID, id string) (protocol.Result, error) {
	if g.closing.Load() {
		return protocol.Result{}, &protocol.Error{Type: protocol.ErrUnavailable, Message: "gateway is shutting down", Retryable: true}
	}
	cfg := g.Config()
	if !toolAllowed(&cfg, agentID, protocol.ToolProcess, "") {
		return protocol.Result{}, protocol.Errorf(protocol.ErrNotFound, "Tool not available: %s", protocol.ToolProcess)
	}
	offset := 0
	c := &call{g: g, cfg: cfg, sessionKey: sessionKey, agentID: agentID}
	return c.process(ctx, protocol.ProcessArgs{Action: "log", SessionID: id, Offset: &offset})
}

// logFailure tells a log action that failed (unknown session, …), whose
// details carry the error text, from the log of a session that failed,
// whose details name the session.
func logFailure(res protocol.Result) (string, bool) {
	if res.Status() != protocol.StatusFailed || res.SessionID() != "" {
		return "", false
	}
	if msg := res.Details.Error.Value(); msg != "" {
		return msg, true
	}
	return res.Text(), true
}

// streamOutput is the text a stream shows for a log result: the log text
// without the waiting-for-input hint, and empty rather than "(no output
// yet)" while a session has printed nothing.
func streamOutput(res protocol.Result) string {
	text := res.Text()
	if res.Status() != protocol.StatusRunning {
		return text
	}
	if res.Details.WaitingForInput.Value() {
		if i := strings.LastIndex(text, session.InputWaitHintPrefix); i >= 0 {
			text = text[:i]
		}
	}
	if n, ok := res.Details.TotalChars.Get(); ok && n == 0 && text == session.LogNoOutputYet {
		return ""
	}
	return text
}

// sessionStream writes the events of one stream.
type sessionStream struct {
	sse     *sseWriter
	started bool   // an output event was sent
	sent    string // the output the client holds
	status  string // the last status sent
	waiting bool   // the last waitingForInput sent
}

// update sends what changed since the last result. It returns false when
// the stream must end: the session is no longer running, or the client
// is gone.
func (s *sessionStream) update(res protocol.Result) bool {
	out := streamOutput(res)
	switch {
	case !s.started:
		if !s.event("output", map[string]string{"reset": out}) {
			return false
		}
	case out == s.sent:
	case strings.HasPrefix(out, s.sent):
		if !s.event("output", map[string]string{"append": out[len(s.sent):]}) {
			return false
		}
	default:
		// The cap dropped the start: send only what is new rather than
		// the whole retained output (up to 200 000 chars) at every tick.
		data := map[string]string{"reset": out}
		prev, body := strings.TrimPrefix(s.sent, session.RetentionCapNote), strings.TrimPrefix(out, session.RetentionCapNote)
		if n := slid(prev, body); n >= 0 {
			data = map[string]string{"append": body[n:]}
		}
		if !s.event("output", data) {
			return false
		}
	}
	s.started, s.sent = true, out
	status := res.Status()
	waiting := res.Details.WaitingForInput.Value()
	if status == protocol.StatusRunning {
		if status == s.status && waiting == s.waiting {
			return true
		}
		s.status, s.waiting = status, waiting
		return s.event("status", streamStatus{Status: status, SessionID: res.SessionID(), WaitingForInput: waiting})
	}
	s.event("status", streamStatus{
		ExitCode:   res.Details.ExitCode.Ptr(),
		ExitReason: res.Details.ExitReason.Value(),
		ExitSignal: res.Details.ExitSignal.Value(),
		SessionID:  res.SessionID(),
		Status:     status,
		Text:       res.Text(),
	})
	return false
}

// streamStatus is the data of a status event: the session's status on
// every change while it runs; the last one, when it ended, with how it
// ended and the final log text.
type streamStatus struct {
	ExitCode        *int   `json:"exitCode,omitempty"`
	ExitReason      string `json:"exitReason,omitempty"`
	ExitSignal      string `json:"exitSignal,omitempty"`
	SessionID       string `json:"sessionId"`
	Status          string `json:"status"`
	Text            string `json:"text,omitempty"`
	WaitingForInput bool   `json:"waitingForInput"`
}

// slidProbe is how much of the new text is searched for in the old one,
// and slidMinOverlap how much of the two must agree, for slid to line
// them up; slidCandidates bounds the places tried.
const (
	slidProbe      = 64
	slidMinOverlap = 1024 // or a quarter of the old text, if less
	slidCandidates = 16
)

// slid lines up the retained output before (sent) and after (out) the
// retention cap dropped its start: it returns the length of the longest
// suffix of sent that out starts with, at least min(slidMinOverlap,
// len(sent)/4) bytes long and shorter than sent, or -1. The text after
// that overlap in out is new.
func slid(sent, out string) int {
	minOverlap := min(slidMinOverlap, len(sent)/4)
	if minOverlap < slidProbe || len(out) < minOverlap {
		return -1
	}
	probe := out[:slidProbe]
	from := 1
	for range slidCandidates {
		i := strings.Index(sent[from:], probe)
		if i < 0 {
			return -1
		}
		k := from + i
		if n := len(sent) - k; n < minOverlap {
			return -1
		} else if strings.HasPrefix(out, sent[k:]) {
			return n
		}
		from = k + 1
	}
	return -1
}

// event sends one event with data encoded as JSON. It returns false when
// the client is gone.
func (s *sessionStream) event(name string, data any) bool {
	b, err := json.Marshal(data)
	if err != nil {
		b = []byte(`{"error":"encoding the event failed"}`)
		name = "error"
	}
	return s.sse.event("", name, b)
}
