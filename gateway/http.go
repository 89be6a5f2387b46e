package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/execmesh/execmesh/access"
	"github.com/execmesh/execmesh/events"
	"github.com/execmesh/execmesh/host"
	"github.com/execmesh/execmesh/protocol"
)

// maxEventWait bounds GET /v1/events?waitMs.
const maxEventWait = 60 * time.Second

// Handler returns the gateway's HTTP API (DESIGN.md §3), behind Protect.
// Every route but GET /healthz needs the agent's authority (the tool
// token, or none on a token-less loopback gateway); the operator routes
// (approval decisions, node pairing, node approvals files, configuration
// changes) need the operator token.
func (g *Gateway) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", g.handleHealth)
	mux.HandleFunc("GET /v1/whoami", g.handleWhoami)
	mux.HandleFunc("POST /tools/invoke", g.authed(g.handleInvoke))
	mux.HandleFunc("GET /v1/events", g.authed(g.handleEvents))
	mux.HandleFunc("GET /v1/events/stream", g.authed(g.handleEventStream))
	mux.HandleFunc("GET /v1/sessions/{sessionKey}/exec", g.authed(g.handleGetSessionExec))
	// Per-sessionKey defaults stay the agent's: they only tighten, and
	// select what a call may select itself (host, node).
	mux.HandleFunc("PUT /v1/sessions/{sessionKey}/exec", g.authed(g.handlePutSessionExec))
	mux.HandleFunc("GET /v1/sessions/{sessionKey}/{sessionId}/stream", g.authed(g.handleSessionStream))
	// Attach sockets authenticate themselves: a browser's token comes as a
	// subprotocol (attach.go).
	mux.HandleFunc("GET /v1/sessions/{id}/attach", g.handleAttach)
	mux.HandleFunc("GET /v1/exec/attach", g.handleExecAttach)
	mux.HandleFunc("GET /v1/sessions", g.operator(g.handleSessionKeys))
	mux.HandleFunc("GET /v1/admin/blockers", g.authed(g.handleBlockers))
	mux.HandleFunc("POST /v1/admin/reload", g.operator(g.handleReload))
	mux.HandleFunc("GET /v1/config/exec-node", g.authed(g.handleGetExecNode))
	mux.HandleFunc("PUT /v1/config/exec-node", g.operator(g.handlePutExecNode))
	mux.HandleFunc("GET /v1/nodes/{id}/approvals", g.operator(g.handleNodeApprovals(protocol.NodeEndpointApprovalsGet)))
	mux.HandleFunc("PUT /v1/nodes/{id}/approvals", g.operator(g.handleNodeApprovals(protocol.NodeEndpointApprovalsSet)))
	mux.HandleFunc("GET /v1/approvals", g.authed(g.handleListApprovals))
	mux.HandleFunc("GET /v1/gateways", g.authed(g.handleGateways))
	mux.HandleFunc("GET /v1/approvals/{id}", g.authed(g.handleGetApproval))
	mux.HandleFunc("POST /v1/approvals/{id}", g.operator(g.handleDecideApproval))
	mux.HandleFunc("POST /v1/events/ack", g.authed(g.handleEventsAck))
	for _, extra := range g.extraRoutes() {
		if extra.operator {
			mux.HandleFunc(extra.pattern, g.operator(extra.handler))
		} else {
			mux.HandleFunc(extra.pattern, g.authed(extra.handler))
		}
	}
	// Paths without a method: the method-specific patterns above win, so
	// these only see wrong methods and unknown paths, answered in JSON.
	mux.HandleFunc("/tools/invoke", methodNotAllowed)
	mux.HandleFunc("/healthz", methodNotAllowed)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, protocol.Errorf(protocol.ErrNotFound, "not found: %s", r.URL.Path))
	})
	return g.Protect(mux)
}

// route is an extra API route registered by other parts of the gateway.
type route struct {
	pattern string
	handler http.HandlerFunc
	// operator: the route needs the operator token.
	operator bool
}

// extraRoutes lists routes of the node registry and the approvals flow.
func (g *Gateway) extraRoutes() []route { return g.routes }

func methodNotAllowed(w http.ResponseWriter, r *http.Request) {
	writeError(w, protocol.Errorf(protocol.ErrMethodNotAllowed, "method %s not allowed for %s", r.Method, r.URL.Path))
}

// healthReport is the answer of GET /healthz.
type healthReport struct {
	OK bool `json:"ok"`
	// Status says what keeps the gateway from serving every call.
	Status    string `json:"status,omitempty"`
	GatewayID string `json:"gatewayId"`
	// HostID names the gateway's view of the file system: a client that
	// sees the same one sends its working directory with exec.
	HostID string `json:"hostId,omitempty"`
	// Containment is how the gateway's session core holds process trees:
	// "cgroup" or "process-group".
	Containment string `json:"containment"`
	// Confinement is how the gateway host's security allowlist runs are
	// held: "landlock" (by the kernel) or "ask" (every program that is
	// not a safe bin needs approval), with the reason.
	Confinement host.Confinement `json:"confinement"`
}

func (g *Gateway) handleHealth(w http.ResponseWriter, r *http.Request) {
	rep := healthReport{OK: true, GatewayID: g.id, HostID: g.hostID, Containment: g.local.Manager().Containment().Mode,
		Confinement: g.local.Confinement()}
	if err := g.Healthy(); err != nil {
		rep.OK, rep.Status = false, err.Error()
		writeJSON(w, http.StatusServiceUnavailable, rep)
		return
	}
	writeJSON(w, http.StatusOK, rep)
}

// handleGateways answers GET /v1/gateways: the gateways of the
// deployment that are heart-beating, this one marked "self".
func (g *Gateway) handleGateways(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"gateways": g.peers.List()})
}

// handleWhoami answers GET /v1/whoami: {"role":"operator"|"agent"}, the
// authority of the request's token (401 for a wrong one), so that the
// control page and the CLI can say which token they hold.
func (g *Gateway) handleWhoami(w http.ResponseWriter, r *http.Request) {
	got, err := g.guard.Authenticate(w, r, access.RoleAgent)
	if err != nil {
		writeError(w, err)
		return
	}
	name := "agent"
	if got == access.RoleOperator {
		name = "operator"
	}
	writeJSON(w, http.StatusOK, map[string]string{"role": name})
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
	// list, in an HTTP answer, is the result of a process list with its
	// entries as their hosts encoded them (Result is nil): writeJSON
	// writes it as it would write Result.
	list *protocol.ListResult
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
	resp, status := g.invokeJSON(r.Context(), body, r.Header.Get(IdempotencyHeader))
	if resp.OK && resp.list != nil && resp.Error == nil {
		g.writeList(w, status, resp.list)
		return
	}
	writeJSON(w, status, resp)
}

// maxKeptAnswer bounds the answer buffer writeList keeps for the next
// list.
const maxKeptAnswer = 16 << 20

// writeList writes a process list answer from its hosts' encoded
// entries, as writeJSON would write it decoded. With its length known,
// the megabytes of a long list go out as they are rather than in chunks
// of the chunked encoding. The buffer is kept for the next list: a fresh
// one of megabytes is cleared and faulted in at each list, and a
// sync.Pool loses it to the collections that a list's garbage starts.
func (g *Gateway) writeList(w http.ResponseWriter, status int, list *protocol.ListResult) {
	g.answerMu.Lock()
	b := g.answerBuf
	g.answerBuf = nil
	g.answerMu.Unlock()
	b = slices.Grow(b[:0], 64+list.JSONSize())
	b = append(b, `{"ok":true,"result":`...)
	b = append(list.AppendJSON(b), '}', '\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b) // written or copied when it returns
	if cap(b) <= maxKeptAnswer {
		g.answerMu.Lock()
		if cap(b) > cap(g.answerBuf) {
			g.answerBuf = b[:0]
		}
		g.answerMu.Unlock()
	}
}

// IdempotencyHeader names the header (HTTP, and on NATS requests) whose
// value makes an exec start idempotent.
const IdempotencyHeader = "Idempotency-Key"

// InvokeJSON runs one invoke body and returns the response document and
// its HTTP status. The NATS endpoint answers with the same document.
func (g *Gateway) InvokeJSON(ctx context.Context, body []byte, idempotencyKey string) (any, int) {
	resp, status := g.invokeJSON(ctx, body, idempotencyKey)
	if resp.list != nil {
		res := resp.list.Result()
		resp.Result, resp.list = &res, nil
	}
	return resp, status
}

// invokeJSON is InvokeJSON, a process list's result kept as its entries'
// JSON (invokeResponse.list).
func (g *Gateway) invokeJSON(ctx context.Context, body []byte, idempotencyKey string) (invokeResponse, int) {
	if len(body) > MaxPayloadBytes {
		e := protocol.Errorf(protocol.ErrTooLarge, "request body exceeds the %d byte limit", MaxPayloadBytes)
		return invokeResponse{Error: e}, e.Type.HTTPStatus()
	}
	req, err := DecodeInvoke(body)
	if err != nil {
		e := protocol.AsError(err)
		return invokeResponse{Error: e}, e.Type.HTTPStatus()
	}
	req.IdempotencyKey = idempotencyKey
	a, err := g.invoke(ctx, req)
	if err != nil {
		e := protocol.AsError(err)
		if e.Type == protocol.ErrInternal {
			g.log.Error("tool call failed", "tool", req.Tool, "err", err)
		}
		return invokeResponse{Error: e}, e.Type.HTTPStatus()
	}
	if a.list != nil {
		return invokeResponse{OK: true, list: a.list}, http.StatusOK
	}
	return invokeResponse{OK: true, Result: &a.res}, http.StatusOK
}

// handleEvents serves GET /v1/events?sessionKey=K&waitMs=N[&ack=ID]: the
// unconfirmed events of K, waiting up to N ms for the first. A request
// confirms what the previous one returned (the client came back for
// more); with ack it confirms exactly the events up to that id, so a
// client that crashed before handling an answer gets the rest again.
func (g *Gateway) handleEvents(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	key, _, err := ParseSessionKey(q.Get("sessionKey"))
	if err != nil {
		writeError(w, err)
		return
	}
	wait := time.Duration(0)
	if v := q.Get("waitMs"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			writeError(w, protocol.Errorf(protocol.ErrInvalidRequest, "waitMs must be a non-negative integer"))
			return
		}
		wait = min(time.Duration(n)*time.Millisecond, maxEventWait)
	}
	evs, err := g.events.Take(r.Context(), key, wait, q.Get("ack"))
	if err != nil {
		if r.Context().Err() != nil {
			return
		}
		writeError(w, eventStoreError(err))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"events": evs})
}

// eventStoreError is the answer for a failing event store: retryable 503.
func eventStoreError(err error) error {
	var pe *protocol.Error
	if errors.As(err, &pe) {
		return pe
	}
	return &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true, Message: fmt.Sprintf("the event store is not available: %v. Retry.", err)}
}

// handleEventsAck serves POST /v1/events/ack {"sessionKey","upTo"}: it
// confirms the events of the key up to the id upTo.
func (g *Gateway) handleEventsAck(w http.ResponseWriter, r *http.Request) {
	var body struct {
		SessionKey string `json:"sessionKey"`
		UpTo       string `json:"upTo"`
	}
	if err := decodeStrict(w, r, &body); err != nil {
		writeError(w, err)
		return
	}
	key, _, err := ParseSessionKey(body.SessionKey)
	if err != nil {
		writeError(w, err)
		return
	}
	if err := g.events.Ack(r.Context(), key, body.UpTo); err != nil {
		writeError(w, eventStoreError(err))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ok": true})
}

// handleEventStream serves GET /v1/events/stream?sessionKey=K: the events
// of K as server-sent events whose id is the event id; a client that
// reconnects with Last-Event-ID (or ?after=ID) confirms the events up to
// it and gets the rest. Nothing is confirmed otherwise.
func (g *Gateway) handleEventStream(w http.ResponseWriter, r *http.Request) {
	key, _, err := ParseSessionKey(r.URL.Query().Get("sessionKey"))
	if err != nil {
		writeError(w, err)
		return
	}
	after := r.Header.Get("Last-Event-ID")
	if v := r.URL.Query().Get("after"); v != "" {
		after = v
	}
	if after != "" {
		if _, err := events.ParseID(strings.TrimSuffix(after, "-dropped")); err != nil {
			writeError(w, err)
			return
		}
	}
	sse := startSSE(w)
	if sse == nil {
		return
	}
	if !sse.comment("connected") {
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	stop := context.AfterFunc(g.bg, cancel)
	defer stop()
	keepalive := time.NewTicker(sseKeepalive)
	defer keepalive.Stop()
	var mu sync.Mutex // the stream's writer is shared with the keepalive
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-keepalive.C:
				mu.Lock()
				ok := sse.comment("keepalive")
				mu.Unlock()
				if !ok {
					cancel()
					return
				}
			}
		}
	}()
	err = g.events.Stream(ctx, key, after, func(ev protocol.SystemEvent) error {
		b, _ := json.Marshal(ev)
		mu.Lock()
		defer mu.Unlock()
		if !sse.event(ev.ID, ev.Kind, b) {
			return errClientGone
		}
		return nil
	})
	if err != nil && !errors.Is(err, errClientGone) && ctx.Err() == nil {
		mu.Lock()
		b, _ := json.Marshal(map[string]string{"error": err.Error()})
		sse.event("", "error", b)
		mu.Unlock()
	}
}

var errClientGone = errors.New("client gone")

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
	if err := g.SetSessionDefaults(r.Context(), r.PathValue("sessionKey"), d); err != nil {
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
	if r, ok := v.(invokeResponse); ok && r.OK && r.Result != nil && r.Error == nil {
		// A result is written by hand, byte for byte as the encoder
		// would: a whole process list of ten thousand sessions takes
		// encoding/json hundreds of milliseconds.
		b := append(make([]byte, 0, 256+512*len(r.Result.Details.Sessions.Value())), `{"ok":true,"result":`...)
		b = r.Result.AppendJSON(b)
		_, _ = w.Write(append(b, '}', '\n'))
		return
	}
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// FollowEvents hands each system event of sessionKey to send as it comes,
// confirming it once send accepted it, until ctx ends or send fails (MCP
// sessions deliver exit notices this way).
func (g *Gateway) FollowEvents(ctx context.Context, sessionKey string, send func(protocol.SystemEvent) error) error {
	key, _, err := ParseSessionKey(sessionKey)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(g.bg, cancel)
	defer stop()
	return g.events.Follow(ctx, key, send)
}

// TakeEvents returns the unconfirmed events of sessionKey (see
// handleEvents), waiting up to wait for the first.
func (g *Gateway) TakeEvents(ctx context.Context, sessionKey string, wait time.Duration, ack string) ([]protocol.SystemEvent, error) {
	key, _, err := ParseSessionKey(sessionKey)
	if err != nil {
		return nil, err
	}
	return g.events.Take(ctx, key, wait, ack)
}

// Confinement reports how the gateway host's security allowlist runs are
// held (host.Local.Confinement).
func (g *Gateway) Confinement() host.Confinement { return g.local.Confinement() }
