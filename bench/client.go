package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"
)

// client calls the gateway's tool API over real HTTP (keep-alive
// connections on loopback), as an agent would.
type client struct {
	url string
	hc  *http.Client
}

func newClient(baseURL string, conns int) *client {
	tr := &http.Transport{
		MaxIdleConns:        conns + 8,
		MaxIdleConnsPerHost: conns + 8,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
	}
	return &client{url: baseURL + "/tools/invoke", hc: &http.Client{Transport: tr}}
}

// invokeRaw posts one body and returns the raw answer. The time an agent
// waits is the whole round trip including reading the body; decoding is
// left to the caller, outside any timed region.
func (c *client) invokeRaw(ctx context.Context, body []byte) (int, []byte, error) {
	return c.postRaw(ctx, c.url, body)
}

// postRaw posts body to url with the same transport (the HTTP exec server
// baseline is measured with the very client that calls the gateway).
func (c *client) postRaw(ctx context.Context, url string, body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := c.hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	if n := res.ContentLength; n > 0 && n <= 1<<30 {
		// Read into a buffer of the announced size, as an HTTP client
		// does: io.ReadAll's doublings copied a whole list of 10 000
		// sessions a dozen times over while the call was timed.
		buf := bytes.NewBuffer(make([]byte, 0, n+1))
		_, err = buf.ReadFrom(res.Body)
		return res.StatusCode, buf.Bytes(), err
	}
	raw, err := io.ReadAll(res.Body)
	return res.StatusCode, raw, err
}

// invoke posts one body and decodes the answer.
func (c *client) invoke(ctx context.Context, body []byte) (*answer, error) {
	code, raw, err := c.invokeRaw(ctx, body)
	if err != nil {
		return nil, err
	}
	return decodeAnswer(code, raw)
}

// answer is the part of a /tools/invoke answer the benchmark checks.
type answer struct {
	HTTPStatus int
	OK         bool `json:"ok"`
	Result     struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
		Details struct {
			Status    string `json:"status"`
			SessionID string `json:"sessionId"`
			PID       int    `json:"pid"`
			ExitCode  *int   `json:"exitCode"`
			Sessions  []struct {
				SessionID string `json:"sessionId"`
				Status    string `json:"status"`
				EndedAt   int64  `json:"endedAt"` // unix ms, finished entries
			} `json:"sessions"`
			Total *int `json:"total"` // paged process list only
		} `json:"details"`
	} `json:"result"`
	Error *struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

// timed returns a measurement of one call of body: the round trip, and an
// error when the call failed or check refuses the decoded answer. The
// answer is decoded outside the timed region.
func (c *client) timed(body []byte, check func(a *answer) error) func(ctx context.Context) (time.Duration, error) {
	return func(ctx context.Context) (time.Duration, error) {
		t0 := time.Now()
		code, raw, err := c.invokeRaw(ctx, body)
		d := time.Since(t0)
		if err != nil {
			return d, err
		}
		a, err := decodeAnswer(code, raw)
		if err != nil {
			return d, err
		}
		return d, check(a)
	}
}

func decodeAnswer(code int, raw []byte) (*answer, error) {
	a := &answer{HTTPStatus: code}
	if err := json.Unmarshal(raw, a); err != nil {
		return nil, fmt.Errorf("HTTP %d: undecodable answer %.200q: %w", code, raw, err)
	}
	return a, nil
}

func (a *answer) status() string {
	if !a.OK {
		return ""
	}
	return a.Result.Details.Status
}

func (a *answer) text() string {
	if len(a.Result.Content) == 0 {
		return ""
	}
	return a.Result.Content[0].Text
}

// describe says what went wrong, for error messages.
func (a *answer) describe() string {
	if a.Error != nil {
		return fmt.Sprintf("HTTP %d %s: %s", a.HTTPStatus, a.Error.Type, a.Error.Message)
	}
	t := a.text()
	if len(t) > 300 {
		t = t[:300] + "…"
	}
	return fmt.Sprintf("HTTP %d status %q: %s", a.HTTPStatus, a.status(), t)
}

// execBody is an exec call on host ("gateway" or "node", with node id).
func execBody(command, host, node string, background bool, extra ...any) []byte {
	args := map[string]any{"command": command, "host": host}
	if node != "" {
		args["node"] = node
	}
	if background {
		args["background"] = true
	}
	for i := 0; i+1 < len(extra); i += 2 {
		args[extra[i].(string)] = extra[i+1]
	}
	return mustJSON(map[string]any{"tool": "exec", "args": args})
}

// processBody is a process call.
func processBody(action, sessionID string, extra ...any) []byte {
	args := map[string]any{"action": action}
	if sessionID != "" {
		args["sessionId"] = sessionID
	}
	for i := 0; i+1 < len(extra); i += 2 {
		args[extra[i].(string)] = extra[i+1]
	}
	return mustJSON(map[string]any{"tool": "process", "args": args})
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only fixed shapes are marshalled
	}
	return b
}
