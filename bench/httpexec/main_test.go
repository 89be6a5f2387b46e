package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// startRaw serves the hand-written loop on a loopback port until the test
// ends.
func startRaw(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = serveRaw(ln) }()
	t.Cleanup(func() { _ = ln.Close() })
	return ln
}

// TestRawServerAnswersAsNetHTTP: the hand-written loop gives a standard
// client (net/http's) the answers the net/http handler gives.
func TestRawServerAnswersAsNetHTTP(t *testing.T) {
	ln := startRaw(t)
	std := httptest.NewServer(http.HandlerFunc(run))
	t.Cleanup(std.Close)

	for _, tc := range []struct {
		name, method, body string
		code               int
		output             string
		exit               int
	}{
		{"echo", http.MethodPost, `{"command":"echo hi"}`, 200, "hi\n", 0},
		{"stderr and exit code", http.MethodPost, `{"command":"echo oops >&2; exit 3"}`, 200, "oops\n", 3},
		{"no command", http.MethodPost, `{}`, 400, "", 0},
		{"not JSON", http.MethodPost, `echo hi`, 400, "", 0},
		{"GET", http.MethodGet, ``, 405, "", 0},
	} {
		for _, srv := range []string{"http://" + ln.Addr().String(), std.URL} {
			req, _ := http.NewRequest(tc.method, srv+"/", strings.NewReader(tc.body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("%s on %s: %v", tc.name, srv, err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.code {
				t.Errorf("%s on %s: HTTP %d %q, want %d", tc.name, srv, resp.StatusCode, b, tc.code)
				continue
			}
			if tc.code != 200 {
				continue
			}
			var r response
			if err := json.Unmarshal(b, &r); err != nil || r.Output != tc.output || r.ExitCode != tc.exit {
				t.Errorf("%s on %s: %q (%v), want output %q exit %d", tc.name, srv, b, err, tc.output, tc.exit)
			}
		}
	}
}

// TestRawServerKeepsAliveAndRefusesChunked: requests follow one another
// on one connection; a chunked body, which the loop does not read, gets
// a 400 and the connection closes instead of being misread.
func TestRawServerKeepsAliveAndRefusesChunked(t *testing.T) {
	ln := startRaw(t)
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	body := `{"command":"echo hi"}`
	for i := range 3 {
		if _, err := io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 21\r\n\r\n"+body); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || !strings.Contains(string(b), `"output":"hi\n"`) {
			t.Fatalf("request %d: HTTP %d %q", i, resp.StatusCode, b)
		}
	}
	if _, err := io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n15\r\n"+body+"\r\n0\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 400 || !resp.Close {
		t.Fatalf("chunked: HTTP %d, close %v; want 400 and the connection closed", resp.StatusCode, resp.Close)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("after the chunked request the connection stays open (%v)", err)
	}
}
