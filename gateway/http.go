package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/execmesh/execmesh/protocol"
)

// maxEventWait bounds GET /v1/events?waitMs.
const maxEventWait = 60 * time.Second

// Handler returns the gateway's HTTP API (DESIGN.md §3).
func (g *Gateway) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", g.handleHealth)
	mux.HandleFunc("POST /tools/invoke", g.authed(g.handleInvoke))
	mux.HandleFunc("GET /v1/events", g.authed(g.handleEvents))
	mux.HandleFunc("GET /v1/events/stream", g.authed(g.handleEventStream))
	mux.HandleFunc("GET /v1/sessions/{sessionKey}/exec", g.authed(g.handleGetSessionExec))
	mux.HandleFunc("PUT /v1/sessions/{sessionKey}/exec", g.authed(g.handlePutSessionExec))
	mux.HandleFunc("GET /v1/sessions/{sessionKey}/{sessionId}/stream", g.authed(g.handleSessionStream))
	mux.HandleFunc("GET /v1/admin/blockers", g.authed(g.handleBlockers))
	mux.HandleFunc("GET /v1/config/exec-node", g.authed(g.handleGetExecNode))
	mux.HandleFunc("PUT /v1/config/exec-node", g.authed(g.handlePutExecNode))
	mux.HandleFunc("GET /v1/nodes/{id}/approvals", g.authed(g.handleNodeApprovals(protocol.NodeEndpointApprovalsGet)))
	mux.HandleFunc("PUT /v1/nodes/{id}/approvals", g.authed(g.handleNodeApprovals(protocol.NodeEndpointApprovalsSet)))
	mux.HandleFunc("GET /v1/approvals", g.authed(g.handleListApprovals))
	mux.HandleFunc("POST /v1/approvals/{id}", g.authed(g.handleDecideApproval))
	for _, extra := range g.extraRoutes() {
		mux.HandleFunc(extra.pattern, g.authed(extra.handler))
	}
	// Paths without a method: the method-specific patterns above win, so
	// these only see wrong methods and unknown paths, answered in JSON.
	mux.HandleFunc("/tools/invoke", methodNotAllowed)
	mux.HandleFunc("/healthz", methodNotAllowed)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, protocol.Errorf(protocol.ErrNotFound, "not found: %s", r.URL.Path))
	})
	return mux
}

// route is an extra API route registered by other parts of the gateway.
type route struct {
	pattern string
	handler http.HandlerFunc
}

// extraRoutes lists routes of the node registry and the approvals flow.
func (g *Gateway) extraRoutes() []route { return g.routes }

func methodNotAllowed(w http.ResponseWriter, r *http.Request) {
	writeError(w, protocol.Errorf(protocol.ErrMethodNotAllowed, "method %s not allowed for %s", r.Method, r.URL.Path))
}

func (g *Gateway) handleHealth(w http.ResponseWriter, r *http.Request) {
	if g.closing.Load() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"ok": false, "status": "shutting down"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ok": true, "containment": g.local.Containment().Mode})
}

// authed checks the bearer token and the failure rate limit.
func (g *Gateway) authed(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		token := g.Config().Gateway.Auth.Token
		if token == "" {
			h(w, r)
			return
		}
		addr := clientAddr(r)
		if wait, blocked := g.limiter.blocked(addr); blocked {
			w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(max(wait, time.Second).Seconds()))))
			writeError(w, protocol.Errorf(protocol.ErrRateLimited, "too many failed authentications; retry later"))
			return
		}
		if !tokenMatches(r.Header.Get("Authorization"), token) {
			g.limiter.fail(addr)
			w.Header().Set("WWW-Authenticate", `Bearer realm="execmesh"`)
			writeError(w, protocol.Errorf(protocol.ErrUnauthorized, "unauthorized: missing or invalid bearer token"))
			return
		}
		h(w, r)
	}
}

// reservedInvokeKeys are the top-level keys of an invoke body; in the flat
// form every other key is a tool argument.
var reservedInvokeKeys = map[string]bool{"tool": true, "args": true, "sessionKey": true, "model": true, "action": false}

// DecodeInvoke parses an invoke body in either shape: {tool, args,
// sessionKey} or the flat {tool, command, …} of the docs' examples.
func DecodeInvoke(body []byte) (InvokeRequest, error) {
	var fields map[string]json.RawMessage
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return InvokeRequest{}, protocol.Errorf(protocol.ErrInvalidRequest, "request body must be a JSON object")
	}
	if err := json.Unmarshal(trimmed, &fields); err != nil {
		return InvokeRequest{}, protocol.Errorf(protocol.ErrInvalidRequest, "malformed JSON: %v", err)
	}
	var req InvokeRequest
	for _, k := range []string{"tool", "sessionKey", "model"} {
		raw, ok := fields[k]
		if !ok || isJSONNull(raw) {
			continue
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return InvokeRequest{}, protocol.Errorf(protocol.ErrInvalidRequest, "%q must be a string", k)
		}
		switch k {
		case "tool":
			req.Tool = s
		case "sessionKey":
			req.SessionKey = s
		case "model":
			req.Model = s
		}
	}
	if req.Tool == "" {
		return InvokeRequest{}, protocol.Errorf(protocol.ErrInvalidRequest, "\"tool\" is required")
	}
	flat := map[string]json.RawMessage{}
	for k, v := range fields {
		if !reservedInvokeKeys[k] {
			flat[k] = v
		}
	}
	if raw, ok := fields["args"]; ok && !isJSONNull(raw) {
		if t := bytes.TrimSpace(raw); len(t) == 0 || t[0] != '{' {
			return InvokeRequest{}, protocol.Errorf(protocol.ErrInvalidRequest, "\"args\" must be a JSON object")
		}
		if len(flat) > 0 {
			return InvokeRequest{}, protocol.Errorf(protocol.ErrInvalidRequest, "pass tool arguments either in \"args\" or at the top level, not both")
		}
		req.Args = raw
		return req, nil
	}
	if len(flat) > 0 {
		b, err := json.Marshal(flat)
		if err != nil {
			return InvokeRequest{}, protocol.Errorf(protocol.ErrInvalidRequest, "arguments: %v", err)
		}
		req.Args = b
	}
	return req, nil
}

func isJSONNull(raw json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("null")) }

// invokeResponse is the answer to POST /tools/invoke.
type invokeResponse struct {
	OK     bool             `json:"ok"`
	Result *protocol.Result `json:"result,omitempty"`
	Error  *protocol.Error  `json:"error,omitempty"`
}

func (g *Gateway) handleInvoke(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxPayloadBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, protocol.Errorf(protocol.ErrTooLarge, "request body exceeds the %d byte limit", MaxPayloadBytes))
			return
		}
		writeError(w, protocol.Errorf(protocol.ErrInvalidRequest, "reading request body: %v", err))
		return
	}
	resp, status := g.InvokeJSON(r.Context(), body)
	writeJSON(w, status, resp)
}

// InvokeJSON runs one invoke body and returns the response document and
// its HTTP status. The NATS endpoint answers with the same document.
func (g *Gateway) InvokeJSON(ctx context.Context, body []byte) (any, int) {
	if len(body) > MaxPayloadBytes {
		e := protocol.Errorf(protocol.ErrTooLarge, "request body exceeds the %d byte limit", MaxPayloadBytes)
		return invokeResponse{Error: e}, e.Type.HTTPStatus()
	}
	req, err := DecodeInvoke(body)
	if err != nil {
		e := protocol.AsError(err)
		return invokeResponse{Error: e}, e.Type.HTTPStatus()
	}
	res, err := g.Invoke(ctx, req)
	if err != nil {
		e := protocol.AsError(err)
		if e.Type == protocol.ErrInternal {
			g.log.Error("tool call failed", "tool", req.Tool, "err", err)
		}
		return invokeResponse{Error: e}, e.Type.HTTPStatus()
	}
	return invokeResponse{OK: true, Result: &res}, http.StatusOK
}

func (g *Gateway) handleEvents(w http.ResponseWriter, r *http.Request) {
	key, _, err := ParseSessionKey(r.URL.Query().Get("sessionKey"))
	if err != nil {
		writeError(w, err)
		return
	}
	wait := time.Duration(0)
	if v := r.URL.Query().Get("waitMs"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			writeError(w, protocol.Errorf(protocol.ErrInvalidRequest, "waitMs must be a non-negative integer"))
			return
		}
		wait = min(time.Duration(n)*time.Millisecond, maxEventWait)
	}
	writeJSON(w, http.StatusOK, map[string]any{"events": g.events.take(r.Context(), key, wait)})
}

func (g *Gateway) handleEventStream(w http.ResponseWriter, r *http.Request) {
	key, _, err := ParseSessionKey(r.URL.Query().Get("sessionKey"))
	if err != nil {
		writeError(w, err)
		return
	}
	sse := startSSE(w)
	if sse == nil {
		return
	}
	ch, backlog, cancel := g.events.subscribe(key)
	defer cancel()
	send := func(ev protocol.SystemEvent) bool {
		b, _ := json.Marshal(ev)
		return sse.event(ev.ID, ev.Kind, b)
	}
	for _, ev := range backlog {
		if !send(ev) {
			return
		}
	}
	if !sse.comment("connected") {
		return
	}
	keepalive := time.NewTicker(sseKeepalive)
	defer keepalive.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case ev := <-ch:
			if !send(ev) {
				return
			}
		case <-keepalive.C:
			if !sse.comment("keepalive") {
				return
			}
		}
	}
}

func (g *Gateway) handleGetSessionExec(w http.ResponseWriter, r *http.Request) {
	d, err := g.SessionDefaults(r.PathValue("sessionKey"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, d)
}

func (g *Gateway) handlePutSessionExec(w http.ResponseWriter, r *http.Request) {
	var d SessionExecDefaults
	if err := decodeStrict(w, r, &d); err != nil {
		writeError(w, err)
		return
	}
	if err := g.SetSessionDefaults(r.PathValue("sessionKey"), d); err != nil {
		writeError(w, err)
		return
	}
	d, _ = g.SessionDefaults(r.PathValue("sessionKey"))
	writeJSON(w, http.StatusOK, d)
}

func (g *Gateway) handleBlockers(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"blockers": g.Blockers()})
}

// decodeStrict decodes a small JSON body, rejecting unknown fields.
func decodeStrict(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return protocol.Errorf(protocol.ErrInvalidRequest, "invalid body: %v", err)
	}
	return nil
}

func writeError(w http.ResponseWriter, err error) {
	e := protocol.AsError(err)
	writeJSON(w, e.Type.HTTPStatus(), invokeResponse{Error: e})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}
