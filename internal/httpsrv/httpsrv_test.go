package httpsrv

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/execmesh/execmesh/config"
)

// TestTimeouts: both bounds are set, and a request in progress outlives
// them both (they bound the waits between and before requests only).
func TestTimeouts(t *testing.T) {
	t.Parallel()
	ctx := context.WithValue(t.Context(), ctxKey{}, "base")
	srv := New(ctx, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Context().Value(ctxKey{}) != "base" {
			http.Error(w, "request context not derived from base", http.StatusInternalServerError)
			return
		}
		d, _ := time.ParseDuration(r.URL.Query().Get("sleep"))
		time.Sleep(d)
		_, _ = io.WriteString(w, "done")
	}), nil)
	if srv.ReadHeaderTimeout != config.HTTPReadHeaderTimeout || srv.IdleTimeout != config.HTTPIdleTimeout ||
		srv.ReadHeaderTimeout <= 0 || srv.IdleTimeout <= 0 {
		t.Fatalf("timeouts: read header %v, idle %v", srv.ReadHeaderTimeout, srv.IdleTimeout)
	}
	// The bounds, shortened here to keep the test short.
	srv.ReadHeaderTimeout, srv.IdleTimeout = 200*time.Millisecond, 200*time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	// A request that takes longer than both bounds is answered.
	if _, err := io.WriteString(c, "GET /?sleep=500ms HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("slow request: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(body) != "done" {
		t.Fatalf("slow request: %d %q", resp.StatusCode, body)
	}
	// Then the connection idles, and the server closes it.
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	t0 := time.Now()
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("idle connection: %v, want it closed by the server", err)
	}
	if d := time.Since(t0); d > 3*time.Second {
		t.Fatalf("idle connection closed after %v", d)
	}
}

type ctxKey struct{}
