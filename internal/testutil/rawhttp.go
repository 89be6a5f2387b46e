package testutil

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// RawAnswer is an HTTP answer read by RawHTTP.
type RawAnswer struct {
	Status int
	Header http.Header
	Body   string
}

// RawHTTP writes one HTTP/1.1 request to addr exactly as given — head is
// the request line and the header lines, one a line ("\n" becomes CRLF) —
// adding only Content-Length and Connection: close, then body; it dials
// from the local address from unless that is "" (a 127.x address other
// than 127.0.0.1 makes another client address on loopback). It reads the
// answer and fails the test on a transport error.
func RawHTTP(t testing.TB, addr, from, head, body string) RawAnswer {
	t.Helper()
	d := net.Dialer{Timeout: 10 * time.Second}
	if from != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(from)}
	}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s from %q: %v", addr, from, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(60 * time.Second))
	req := strings.ReplaceAll(strings.TrimSpace(head), "\n", "\r\n") +
		fmt.Sprintf("\r\nContent-Length: %d\r\nConnection: close\r\n\r\n", len(body)) + body
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the answer to %q: %v", head, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return RawAnswer{Status: res.StatusCode, Header: res.Header, Body: string(b)}
}
