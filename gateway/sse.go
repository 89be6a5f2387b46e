package gateway

import (
	"fmt"
	"net/http"
	"time"

	"github.com/execmesh/execmesh/protocol"
)

// sseKeepalive is how often an idle server-sent-events stream sends a
// comment, so that proxies and browsers do not time the connection out.
const sseKeepalive = 15 * time.Second

// sseWriter writes one server-sent-events stream. Every write flushes;
// a false result means the client is gone.
type sseWriter struct {
	w       http.ResponseWriter
	flusher http.Flusher
}

// startSSE answers 200 with the headers of an event stream. When w cannot
// stream it answers 500 instead and returns nil.
func startSSE(w http.ResponseWriter) *sseWriter {
	flusher, ok := w.(http.Flusher)
	if !ok {
		writeError(w, protocol.Errorf(protocol.ErrInternal, "streaming unsupported"))
		return nil
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	w.WriteHeader(http.StatusOK)
	return &sseWriter{w: w, flusher: flusher}
}

// event sends one event; id may be empty, data is one line of JSON.
func (s *sseWriter) event(id, name string, data []byte) bool {
	var err error
	if id != "" {
		_, err = fmt.Fprintf(s.w, "id: %s\nevent: %s\ndata: %s\n\n", id, name, data)
	} else {
		_, err = fmt.Fprintf(s.w, "event: %s\ndata: %s\n\n", name, data)
	}
	s.flusher.Flush()
	return err == nil
}

// comment sends a comment line (": text"), such as a keepalive.
func (s *sseWriter) comment(text string) bool {
	_, err := fmt.Fprintf(s.w, ": %s\n\n", text)
	s.flusher.Flush()
	return err == nil
}
