package mcpserver

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestNoticesRideOnToolResults: the delivery rule for exit notices. A
// client that never set a logging level (OpenClaw's: no handler for log
// messages, though its SDK answers pings) gets no logging notification;
// the notice is appended to the text of its next tool result, and to no
// later one: an answered ping never counts as delivery, and a notice is
// confirmed as it rides on a result. A client whose level is above info
// gets them the same way. One that set info gets a notification and no
// notice on its results: each notice reaches a client exactly once.
func TestNoticesRideOnToolResults(t *testing.T) {
	t.Parallel()
	emb := startEmbedded(t)
	for _, tc := range []struct {
		name  string
		level mcp.LoggingLevel // "" sets none
		// logged: the notice comes as a logging notification, not on results.
		logged bool
	}{
		{"no level", "", false},
		{"warning", "warning", false},
		{"info", "info", true},
		{"debug", "debug", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			key := "agent:notice-" + strings.ReplaceAll(tc.name, " ", "-") + ":main"
			sink := make(logSink, 16)
			cs := connect(t, New(emb.Invoker(key), Options{Version: "test", StructuredContent: true, AckTimeout: time.Second}), sink)
			if tc.level != "" {
				if err := cs.SetLoggingLevel(t.Context(), &mcp.SetLoggingLevelParams{Level: tc.level}); err != nil {
					t.Fatal(err)
				}
			}
			res := call(t, cs, "exec", map[string]any{"command": "echo ride-$((6*7)); exit 3", "background": true})
			id, _ := details(t, res)["sessionId"].(string)
			if id == "" {
				t.Fatalf("background exec: %q %v", text(res), res.StructuredContent)
			}
			notice := noticePrefix + "Exec completed (" + id + ", code 3) :: ride-42"
			// Tool calls until the exit has happened and then some: more
			// than long enough for a notification, its ping and a second
			// try to show.
			seen, calls := 0, 0
			deadline := time.Now().Add(30 * time.Second) // a loaded machine's event store is slow
			for ; time.Now().Before(deadline) && (seen == 0 && !tc.logged || calls < 15); calls++ {
				res := call(t, cs, "process", map[string]any{"action": "list"})
				seen += strings.Count(text(res), notice)
				time.Sleep(100 * time.Millisecond)
			}
			notified := 0
			for len(sink) > 0 {
				if p := <-sink; strings.Contains(dataText(p), "ride-42") {
					notified++
				}
			}
			if tc.logged {
				if seen != 0 {
					t.Errorf("the notice rode on %d tool results of a client that takes log messages", seen)
				}
				if notified == 0 {
					sink.wait(t, "ride-42", 10*time.Second)
				}
				return
			}
			if notified != 0 {
				t.Errorf("%d logging notifications to a client that set no level that takes them", notified)
			}
			if seen != 1 {
				t.Fatalf("the notice %q came on %d tool results, want exactly 1", notice, seen)
			}
			// Confirmed: later results, and other readers, do not get it.
			for range 3 {
				if res := call(t, cs, "exec", map[string]any{"command": "true"}); strings.Contains(text(res), notice) {
					t.Errorf("the notice came again: %q", text(res))
				}
			}
			if evs, err := emb.Gateway.TakeEvents(t.Context(), key, 0, "0"); err != nil || len(evs) != 0 {
				t.Errorf("events still queued after the notice rode on a result: %v %v", evs, err)
			}
		})
	}
}

// dataText is a logging notification's data as text.
func dataText(p *mcp.LoggingMessageParams) string {
	if b, err := json.Marshal(p.Data); err == nil {
		return string(b)
	}
	return ""
}

// TestTextOnlyContent: a result is its text alone unless the client asked
// for structured content (Options.StructuredContent, or over HTTP the
// X-Execmesh-Structured-Content header or structuredContent parameter):
// OpenClaw prepends structured content to the text, so the model would
// read every output twice.
func TestTextOnlyContent(t *testing.T) {
	t.Parallel()
	emb := startEmbedded(t)
	check := func(t *testing.T, cs *mcp.ClientSession, structured bool) {
		t.Helper()
		res := call(t, cs, "exec", map[string]any{"command": "echo once-$((6*7))"})
		if len(res.Content) != 1 || text(res) != "once-42" {
			t.Errorf("content %q, want the text once-42 alone", text(res))
		}
		if got := res.StructuredContent != nil; got != structured {
			t.Errorf("structured content %v, want it: %v", res.StructuredContent, structured)
		}
		if structured && details(t, res)["status"] != "completed" {
			t.Errorf("details %v", res.StructuredContent)
		}
	}
	t.Run("options", func(t *testing.T) {
		t.Parallel()
		for _, on := range []bool{false, true} {
			check(t, connect(t, New(emb.Invoker(""), Options{StructuredContent: on, DisableEvents: true}), make(logSink, 1)), on)
		}
	})
	t.Run("http", func(t *testing.T) {
		t.Parallel()
		srv := httptest.NewServer(HTTPHandler(emb.Invoker, Options{DisableEvents: true}))
		t.Cleanup(srv.Close)
		for _, tc := range []struct {
			query, header string
			want          bool
		}{
			{"", "", false},
			{"", "1", true},
			{"", "true", true},
			{"", "0", false},
			{"", "yes please", false},
			{"?structuredContent=1", "", true},
			{"?structuredContent=false", "", false},
		} {
			tr := mcp.StreamableClientTransport{Endpoint: srv.URL + "/mcp" + tc.query}
			if tc.header != "" {
				tr.HTTPClient = httpClientWith(StructuredContentHeader, tc.header)
			}
			cs, err := newClient(make(logSink, 1)).Connect(t.Context(), &tr, nil)
			if err != nil {
				t.Fatal(err)
			}
			check(t, cs, tc.want)
			cs.Close()
		}
	})
}

// httpClientWith is an HTTP client that sets one header on every request.
func httpClientWith(key, value string) *http.Client {
	return &http.Client{Transport: headerTransport{key, value, http.DefaultTransport}}
}
