package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/execmesh/execmesh/protocol"
)

// Client timeouts. Tool calls are bounded by the gateway itself (the yield
// window is at most 120 s, a poll at most 30 s, and an exec that cannot be
// backgrounded by its own timeout), so they get no client deadline beyond
// the caller's context; everything else gets apiTimeout, which is longer
// than a 30 s long poll plus margin.
const (
	dialTimeout = 10 * time.Second
	apiTimeout  = 60 * time.Second
	// pollMargin is added to a long poll's waitMs for its deadline.
	pollMargin = 30 * time.Second
	// maxAnswer bounds what the client reads from one answer (the gateway's
	// own payload limit is 2 MB; results may be a little larger).
	maxAnswer = 64 << 20
)

// client talks to a gateway's HTTP API.
type client struct {
	base  string // http(s)://host:port, no trailing slash
	token string
	// operatorToken goes to operator endpoints (isOperatorRequest)
	// instead of token; "" sends token there too.
	operatorToken string
	userAgent     string
	hc            *http.Client
}

// newClient returns a client for the gateway at base. Call close when done
// so that idle connections do not outlive the command.
func newClient(base, token string) *client {
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   dialTimeout,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
		MaxIdleConnsPerHost:   4,
	}
	return &client{base: base, token: token, userAgent: "execmesh/" + buildVersion().Version, hc: &http.Client{Transport: tr}}
}

func (c *client) close() { c.hc.CloseIdleConnections() }

// unreachableError is a gateway that refused the connection.
type unreachableError struct {
	url string
	err error
}

func (e *unreachableError) Error() string {
	return fmt.Sprintf("cannot reach the gateway at %s: is \"execmesh up\" running?", e.url)
}

func (e *unreachableError) Unwrap() error { return e.err }

// request sends one request and returns the answer's body. A body that is
// not nil is sent as JSON. A non-2xx answer returns the body together with
// a *protocol.Error decoded from it ({"ok":false,"error":{…}} or
// {"error":{…}}), or built from the status when the body says nothing.
func (c *client) request(ctx context.Context, method, path string, query url.Values, body any) ([]byte, error) {
	resp, err := c.send(ctx, method, path, query, body, "application/json")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return nil, fmt.Errorf("%s %s: reading the answer: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		return data, answerError(resp.StatusCode, data)
	}
	return data, nil
}

// send builds and sends a request, returning the response unread.
func (c *client) send(ctx context.Context, method, path string, query url.Values, body any, accept string) (*http.Response, error) {
	u := c.base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	var rd io.Reader
	if body != nil {
		var data []byte
		if raw, ok := body.(json.RawMessage); ok {
			data = raw
		} else {
			var err error
			if data, err = json.Marshal(body); err != nil {
				return nil, fmt.Errorf("encoding the request: %w", err)
			}
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", accept)
	req.Header.Set("User-Agent", c.userAgent)
	token := c.token
	if c.operatorToken != "" && isOperatorRequest(method, path) {
		token = c.operatorToken
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return nil, &unreachableError{url: c.base, err: err}
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%s %s: %w", method, path, context.Cause(ctx))
		}
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	return resp, nil
}

// answerError decodes the error of a non-2xx answer.
func answerError(status int, data []byte) *protocol.Error {
	var env struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(data, &env) == nil && len(env.Error) > 0 {
		var pe protocol.Error
		if json.Unmarshal(env.Error, &pe) == nil && pe.Message != "" {
			if pe.Type == "" {
				pe.Type = typeForStatus(status)
			}
			return &pe
		}
		var msg string
		if json.Unmarshal(env.Error, &msg) == nil && msg != "" {
			return &protocol.Error{Type: typeForStatus(status), Message: msg}
		}
	}
	text := strings.TrimSpace(string(data))
	if len(text) > 200 {
		text = text[:200] + "…"
	}
	msg := fmt.Sprintf("gateway answered %d %s", status, http.StatusText(status))
	if text != "" {
		msg += ": " + text
	}
	return &protocol.Error{Type: typeForStatus(status), Message: msg}
}

// typeForStatus is the inverse of protocol.ErrorType.HTTPStatus, for
// answers that carry no error type.
func typeForStatus(status int) protocol.ErrorType {
	switch status {
	case http.StatusBadRequest:
		return protocol.ErrInvalidRequest
	case http.StatusUnauthorized:
		return protocol.ErrUnauthorized
	case http.StatusNotFound:
		return protocol.ErrNotFound
	case http.StatusMethodNotAllowed:
		return protocol.ErrMethodNotAllowed
	case http.StatusConflict:
		return protocol.ErrConflict
	case http.StatusRequestEntityTooLarge:
		return protocol.ErrTooLarge
	case http.StatusTooManyRequests:
		return protocol.ErrRateLimited
	case http.StatusServiceUnavailable:
		return protocol.ErrUnavailable
	default:
		return protocol.ErrInternal
	}
}

// getJSON GETs path within apiTimeout and decodes the answer into out,
// returning the raw body too (for --json).
func (c *client) getJSON(ctx context.Context, path string, query url.Values, out any) ([]byte, error) {
	return c.apiJSON(ctx, http.MethodGet, path, query, nil, out)
}

// apiJSON sends a request within apiTimeout and decodes the answer into out
// (when out is not nil).
func (c *client) apiJSON(ctx context.Context, method, path string, query url.Values, body, out any) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	data, err := c.request(ctx, method, path, query, body)
	if err != nil {
		return data, err
	}
	if out != nil && len(bytes.TrimSpace(data)) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			return data, fmt.Errorf("%s %s: unexpected answer: %w", method, path, err)
		}
	}
	return data, nil
}

// invokeAnswer is the body of a /tools/invoke answer.
type invokeAnswer struct {
	OK     bool            `json:"ok"`
	Result protocol.Result `json:"result"`
	Error  *protocol.Error `json:"error,omitempty"`
}

// invoke sends one tool call (a JSON object with tool, args and
// sessionKey). It returns the raw answer and its decoding; a 4xx answer is
// returned as well, with its *protocol.Error.
func (c *client) invoke(ctx context.Context, call json.RawMessage) ([]byte, invokeAnswer, error) {
	var ans invokeAnswer
	data, err := c.request(ctx, http.MethodPost, "/tools/invoke", nil, call)
	if err != nil {
		return data, ans, err
	}
	if err := json.Unmarshal(data, &ans); err != nil {
		return data, ans, fmt.Errorf("POST /tools/invoke: unexpected answer: %w", err)
	}
	if !ans.OK {
		if ans.Error == nil {
			ans.Error = &protocol.Error{Type: protocol.ErrInternal, Message: "gateway answered ok=false without an error"}
		}
		return data, ans, ans.Error
	}
	return data, ans, nil
}

// invokeTool builds the call body for tool and args under sessionKey and
// sends it.
func (c *client) invokeTool(ctx context.Context, tool string, args any, sessionKey string) ([]byte, invokeAnswer, error) {
	body, err := json.Marshal(struct {
		Tool       string `json:"tool"`
		Args       any    `json:"args"`
		SessionKey string `json:"sessionKey,omitempty"`
	}{tool, args, sessionKey})
	if err != nil {
		return nil, invokeAnswer{}, fmt.Errorf("encoding the %s call: %w", tool, err)
	}
	return c.invoke(ctx, body)
}
