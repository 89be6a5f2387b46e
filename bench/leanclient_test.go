package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// TestLeanConnAgainstNetHTTP: the hand-written client speaks to a
// net/http server: bodies both ways, status codes, one connection for
// every call.
func TestLeanConnAgainstNetHTTP(t *testing.T) {
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.Method != http.MethodPost || r.URL.Path != "/tools/invoke" || r.Header.Get("Content-Type") != "application/json" {
			http.Error(w, "want POST /tools/invoke application/json", http.StatusBadRequest)
			return
		}
		if string(b) == "fail" {
			http.Error(w, "failed", http.StatusTeapot)
			return
		}
		_, _ = w.Write(append([]byte("got "), b...))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	rc, err := dialLean(t.Context(), srv.URL+"/")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.close()
	for _, tc := range []struct {
		body string
		code int
		want string
	}{
		{`{"command":"echo hi"}`, 200, `got {"command":"echo hi"}`},
		{"", 200, "got "},
		{"fail", http.StatusTeapot, "failed\n"},
		{strings.Repeat("x", 1500), 200, "got " + strings.Repeat("x", 1500)},
	} {
		code, b, err := rc.post(t.Context(), "/tools/invoke", []byte(tc.body))
		if err != nil || code != tc.code || string(b) != tc.want {
			t.Errorf("post %.20q: %d %.40q %v, want %d %.40q", tc.body, code, b, err, tc.code, tc.want)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections, want 1 kept alive", n)
	}
	// An answer too large for net/http to give a length comes chunked,
	// which the client refuses rather than misreads.
	if code, b, err := rc.post(t.Context(), "/tools/invoke", []byte(strings.Repeat("x", 100_000))); err == nil {
		t.Errorf("a chunked answer was read as %d %.40q", code, b)
	}
	if _, err := dialLean(t.Context(), "https://example.com/"); err == nil {
		t.Error("an https URL was accepted")
	}
}

// TestReadLeanResponse: what the client does not understand is an error,
// never a misread answer.
func TestReadLeanResponse(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		code     int
		body     string
		fails    bool
	}{
		{"ok", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi", 200, "hi", false},
		{"bare newlines", "HTTP/1.0 404 Not Found\nContent-Length: 0\n\n", 404, "", false},
		{"no length", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n", 0, "", true},
		{"bad length", "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", 0, "", true},
		{"huge length", "HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n", 0, "", true},
		{"not HTTP", "SSH-2.0-OpenSSH\r\n\r\n", 0, "", true},
		{"short body", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhi", 0, "", true},
		{"cut headers", "HTTP/1.1 200 OK\r\nContent-Le", 0, "", true},
	} {
		code, b, err := readLeanResponse(bufio.NewReader(strings.NewReader(tc.in)))
		if (err != nil) != tc.fails || code != tc.code || string(b) != tc.body {
			t.Errorf("%s: %d %q %v, want %d %q (error: %v)", tc.name, code, b, err, tc.code, tc.body, tc.fails)
		}
	}
}
