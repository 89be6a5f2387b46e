package openclawtest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// ModelID is the model's id under the provider StartGateway configures:
// the agent's model is "<ModelProvider>/<ModelID>".
const (
	ModelProvider = "scripted"
	ModelID       = "scripted-1"
)

// Message is one message of a chat request, as the model was shown it.
type Message struct {
	// Role is system, user, assistant or tool.
	Role string
	// Text is the message's text (the parts of a multi-part content
	// joined by newlines).
	Text string
	// ToolCalls are an assistant message's tool calls.
	ToolCalls []ToolCall
	// ToolCallID is the call a tool message answers.
	ToolCallID string
}

// ToolCall is one function call of the model.
type ToolCall struct {
	// ID identifies the call; Reply fills it in when empty.
	ID string
	// Name is the tool's name as the model sees it (execmesh__exec).
	Name string
	// Args are the call's arguments.
	Args map[string]any
}

// Request is one chat-completions request the agent made.
type Request struct {
	// Messages are the messages the model was shown, in order.
	Messages []Message
	// Tools are the names of the functions offered.
	Tools []string
	// Raw is the request body.
	Raw json.RawMessage
}

// internalContext starts the user message OpenClaw appends to every
// request (its "internal context": active subagents and the like); it is
// not what the user said.
const internalContext = "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>"

// IsPrompt reports whether m is a user message that OpenClaw sent as the
// turn's prompt, rather than its appended internal context.
func (m Message) IsPrompt() bool {
	return m.Role == "user" && !strings.HasPrefix(strings.TrimSpace(m.Text), internalContext)
}

// turnStart returns the index of the turn's prompt: the last user message
// that is not OpenClaw's internal context (-1 when there is none).
func (r Request) turnStart() int {
	for i := len(r.Messages) - 1; i >= 0; i-- {
		if r.Messages[i].IsPrompt() {
			return i
		}
	}
	return -1
}

// Step is the number of assistant messages after the turn's prompt: 0 for
// the first model call of a turn, 1 after the first round of tool results,
// and so on.
func (r Request) Step() int {
	n := 0
	for _, m := range r.Messages[r.turnStart()+1:] {
		if m.Role == "assistant" {
			n++
		}
	}
	return n
}

// LastUser returns the text of the turn's prompt (OpenClaw adds a
// timestamp before it and runtime facts after it).
func (r Request) LastUser() string {
	if i := r.turnStart(); i >= 0 {
		return r.Messages[i].Text
	}
	return ""
}

// ToolResults returns the tool messages after the turn's prompt.
func (r Request) ToolResults() []Message {
	var out []Message
	for _, m := range r.Messages[r.turnStart()+1:] {
		if m.Role == "tool" {
			out = append(out, m)
		}
	}
	return out
}

// Count returns how many times s occurs in the text of all messages but
// the system prompt: how often the model was shown it.
func (r Request) Count(s string) int {
	n := 0
	for _, m := range r.Messages {
		if m.Role != "system" {
			n += strings.Count(m.Text, s)
		}
	}
	return n
}

// Transcript renders the messages for a failure message.
func (r Request) Transcript() string {
	var b strings.Builder
	for _, m := range r.Messages {
		if m.Role == "system" {
			continue
		}
		fmt.Fprintf(&b, "[%s", m.Role)
		if m.ToolCallID != "" {
			fmt.Fprintf(&b, " %s", m.ToolCallID)
		}
		fmt.Fprintf(&b, "] %s\n", m.Text)
		for _, c := range m.ToolCalls {
			a, _ := json.Marshal(c.Args)
			fmt.Fprintf(&b, "  -> %s %s %s\n", c.ID, c.Name, a)
		}
	}
	return b.String()
}

// Reply is the model's answer: tool calls, or else a final text.
type Reply struct {
	Text      string
	ToolCalls []ToolCall
}

// Script decides the model's reply to a request.
type Script func(Request) Reply

// Model is a scripted OpenAI-compatible chat-completions server on
// loopback (POST /v1/chat/completions, streamed or not; GET /v1/models).
// It records every request. It is safe for concurrent use.
type Model struct {
	// URL is the API's base URL, ending in /v1.
	URL string

	srv    *httptest.Server
	mu     sync.Mutex
	script Script
	reqs   []Request
	calls  int
}

// NewModel starts a model server closed at the end of the test. A nil
// script answers every request with the text "ok".
func NewModel(t testing.TB, script Script) *Model {
	m := &Model{script: script}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", m.complete)
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, map[string]any{"object": "list", "data": []any{map[string]any{"id": ModelID, "object": "model", "owned_by": "execmesh-test"}}})
	})
	m.srv = httptest.NewServer(mux)
	t.Cleanup(m.srv.Close)
	m.URL = m.srv.URL + "/v1"
	return m
}

// SetScript replaces the script.
func (m *Model) SetScript(s Script) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.script = s
}

// Requests returns the requests so far, oldest first.
func (m *Model) Requests() []Request {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]Request(nil), m.reqs...)
}

// Last returns the last request whose messages mention s (the agent's
// turns of one OpenClaw session, when s is a marker of that session), and
// false when there is none.
func (m *Model) Last(s string) (Request, bool) {
	reqs := m.Requests()
	for i := len(reqs) - 1; i >= 0; i-- {
		if reqs[i].Count(s) > 0 {
			return reqs[i], true
		}
	}
	return Request{}, false
}

// chatRequest is the part of an OpenAI chat request the model reads.
type chatRequest struct {
	Stream   bool `json:"stream"`
	Messages []struct {
		Role       string          `json:"role"`
		Content    json.RawMessage `json:"content"`
		ToolCallID string          `json:"tool_call_id"`
		ToolCalls  []struct {
			ID       string `json:"id"`
			Function struct {
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"function"`
		} `json:"tool_calls"`
	} `json:"messages"`
	Tools []struct {
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	} `json:"tools"`
}

// contentText flattens a message content: a string, or parts with text.
func contentText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) != nil {
		return string(raw)
	}
	texts := make([]string, 0, len(parts))
	for _, p := range parts {
		if p.Text != "" {
			texts = append(texts, p.Text)
		}
	}
	return strings.Join(texts, "\n")
}

func (m *Model) complete(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var cr chatRequest
	if err := json.Unmarshal(body, &cr); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	req := Request{Raw: body}
	for _, msg := range cr.Messages {
		mm := Message{Role: msg.Role, Text: contentText(msg.Content), ToolCallID: msg.ToolCallID}
		for _, c := range msg.ToolCalls {
			tc := ToolCall{ID: c.ID, Name: c.Function.Name}
			_ = json.Unmarshal([]byte(c.Function.Arguments), &tc.Args)
			mm.ToolCalls = append(mm.ToolCalls, tc)
		}
		req.Messages = append(req.Messages, mm)
	}
	for _, t := range cr.Tools {
		req.Tools = append(req.Tools, t.Function.Name)
	}
	m.mu.Lock()
	m.reqs = append(m.reqs, req)
	script := m.script
	m.calls++
	n := m.calls
	m.mu.Unlock()
	reply := Reply{Text: "ok"}
	if script != nil {
		reply = script(req)
	}
	calls := make([]map[string]any, 0, len(reply.ToolCalls))
	for i, c := range reply.ToolCalls {
		id := c.ID
		if id == "" {
			id = fmt.Sprintf("call_%d_%d", n, i)
		}
		args, _ := json.Marshal(c.Args)
		if c.Args == nil {
			args = []byte("{}")
		}
		calls = append(calls, map[string]any{"index": i, "id": id, "type": "function",
			"function": map[string]any{"name": c.Name, "arguments": string(args)}})
	}
	finish := "stop"
	msg := map[string]any{"role": "assistant", "content": reply.Text}
	if len(calls) > 0 {
		finish = "tool_calls"
		msg["tool_calls"] = calls
		if reply.Text == "" {
			msg["content"] = nil
		}
	}
	id := fmt.Sprintf("chatcmpl-%d", n)
	created := time.Now().Unix()
	usage := map[string]any{"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20}
	if !cr.Stream {
		writeJSON(w, map[string]any{"id": id, "object": "chat.completion", "created": created, "model": ModelID,
			"choices": []any{map[string]any{"index": 0, "message": msg, "finish_reason": finish}}, "usage": usage})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	chunk := func(choices []any, extra map[string]any) {
		c := map[string]any{"id": id, "object": "chat.completion.chunk", "created": created, "model": ModelID, "choices": choices}
		for k, v := range extra {
			c[k] = v
		}
		b, _ := json.Marshal(c)
		fmt.Fprintf(w, "data: %s\n\n", b)
	}
	chunk([]any{map[string]any{"index": 0, "delta": msg, "finish_reason": nil}}, nil)
	chunk([]any{map[string]any{"index": 0, "delta": map[string]any{}, "finish_reason": finish}}, nil)
	chunk([]any{}, map[string]any{"usage": usage})
	fmt.Fprint(w, "data: [DONE]\n\n")
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
