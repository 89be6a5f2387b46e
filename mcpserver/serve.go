package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/execmesh/execmesh/gateway"
)

// SessionKeyHeader names the request header that selects the sessionKey of
// a streamable-HTTP MCP session; the sessionKey query parameter works too.
const SessionKeyHeader = "X-Execmesh-Session-Key"

// StructuredContentHeader names the request header with which a
// streamable-HTTP client asks for each result's details as structured
// content beside the text ("1" or "true"; the structuredContent query
// parameter works too). Without it a result is its text alone
// (Options.StructuredContent).
const StructuredContentHeader = "X-Execmesh-Structured-Content"

// ServeStdio serves one MCP session over r and w, newline-delimited
// JSON-RPC as an MCP client speaks it on a server's stdin and stdout. It
// returns when r ends, the client closes the session or ctx is cancelled
// (which is not an error), after the session's event forwarding has ended.
// When r is also an io.Closer (os.Stdin), it is closed on cancellation so
// that the blocked read returns.
func ServeStdio(ctx context.Context, inv Invoker, opts Options, r io.Reader, w io.Writer) error {
	s := newServer(inv, opts)
	rc, ok := r.(io.ReadCloser)
	if !ok {
		rc = io.NopCloser(r)
	}
	err := s.mcp.Run(ctx, &mcp.IOTransport{Reader: rc, Writer: nopWriteCloser{w}})
	s.wg.Wait()
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return nil
	}
	return err
}

// nopWriteCloser keeps the transport from closing the caller's writer
// (stdout stays usable for a final message).
type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// HTTPHandler returns the MCP streamable-HTTP transport: one MCP server per
// session, built on the Invoker that inv returns for the session's
// sessionKey, read from the X-Execmesh-Session-Key header or the
// sessionKey query parameter when the session starts (default
// agent:main:main). A session whose first request asks for structured
// content (StructuredContentHeader) gets it. It checks no credentials: mount it behind the
// gateway's bearer-token check.
func HTTPHandler(inv func(sessionKey string) Invoker, opts Options) http.Handler {
	timeout := opts.SessionTimeout
	switch {
	case timeout == 0:
		timeout = defaultSessionTimeout
	case timeout < 0:
		timeout = 0 // the SDK's "never"
	}
	h := mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		key, _ := requestSessionKey(r)
		o := opts
		if wantsStructured(r) {
			o.StructuredContent = true
		}
		return New(inv(key), o)
	}, &mcp.StreamableHTTPOptions{SessionTimeout: timeout, Logger: opts.Logger})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := requestSessionKey(r); err != nil {
			writeRPCError(w, http.StatusBadRequest, err.Error())
			return
		}
		h.ServeHTTP(w, r)
	})
}

// wantsStructured reports whether the request asks for structured
// content (StructuredContentHeader or the structuredContent parameter).
func wantsStructured(r *http.Request) bool {
	v := r.Header.Get(StructuredContentHeader)
	if v == "" {
		v = r.URL.Query().Get("structuredContent")
	}
	on, err := strconv.ParseBool(v)
	return err == nil && on
}

// requestSessionKey returns the request's sessionKey, validated.
func requestSessionKey(r *http.Request) (string, error) {
	key := r.Header.Get(SessionKeyHeader)
	if key == "" {
		key = r.URL.Query().Get("sessionKey")
	}
	key, _, err := gateway.ParseSessionKey(key)
	return key, err
}

// writeRPCError answers with a JSON-RPC error, the body MCP clients read
// on a rejected request.
func writeRPCError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"jsonrpc": "2.0",
		"id":      nil,
		"error":   map[string]any{"code": -32602, "message": msg},
	})
}
