package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
)

// leanConn is a hand-written HTTP/1.1 client on one keep-alive
// connection: it writes a request in one write and reads the status line,
// the headers and a Content-Length body, nothing else (no redirects,
// pooling, chunked bodies or goroutines). net/http's client hands every
// request to a writer goroutine and every answer from a reader
// goroutine; with bench/httpexec -raw it measures an HTTP exec round trip
// without those hand-offs or net/http's server. Calls must not overlap.
type leanConn struct {
	conn net.Conn
	br   *bufio.Reader
	host string
	req  []byte
}

// dialLean connects to the host of an http:// URL.
func dialLean(ctx context.Context, url string) (*leanConn, error) {
	host, ok := strings.CutPrefix(strings.TrimSuffix(url, "/"), "http://")
	if !ok || host == "" || strings.Contains(host, "/") {
		return nil, fmt.Errorf("lean HTTP client: want http://host:port/, got %q", url)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		return nil, err
	}
	return &leanConn{conn: conn, br: bufio.NewReader(conn), host: host}, nil
}

func (r *leanConn) close() { _ = r.conn.Close() }

// post sends body to path and returns the status code and the body.
func (r *leanConn) post(ctx context.Context, path string, body []byte) (int, []byte, error) {
	dl, _ := ctx.Deadline() // zero: none
	_ = r.conn.SetDeadline(dl)
	r.req = fmt.Appendf(r.req[:0], "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", path, r.host, len(body))
	r.req = append(r.req, body...)
	if _, err := r.conn.Write(r.req); err != nil {
		return 0, nil, err
	}
	return readLeanResponse(r.br)
}

// maxLeanBody bounds the body leanConn reads (an exec answer is a few
// hundred bytes).
const maxLeanBody = 64 << 20

// readLeanResponse reads one HTTP/1.1 response with a Content-Length body.
func readLeanResponse(br *bufio.Reader) (int, []byte, error) {
	status, err := br.ReadString('\n')
	if err != nil {
		return 0, nil, err
	}
	proto, rest, _ := strings.Cut(status, " ")
	codeText, _, _ := strings.Cut(strings.TrimSpace(rest), " ")
	code, err := strconv.Atoi(codeText)
	if !strings.HasPrefix(proto, "HTTP/1.") || err != nil {
		return 0, nil, fmt.Errorf("lean HTTP client: malformed status line %q", status)
	}
	n := -1
	for {
		h, err := br.ReadString('\n')
		if err != nil {
			return 0, nil, err
		}
		if h == "\r\n" || h == "\n" {
			break
		}
		if k, v, ok := strings.Cut(h, ":"); ok && strings.EqualFold(k, "Content-Length") {
			if n, err = strconv.Atoi(strings.TrimSpace(v)); err != nil || n < 0 || n > maxLeanBody {
				return 0, nil, fmt.Errorf("lean HTTP client: bad Content-Length %q", v)
			}
		}
	}
	if n < 0 {
		return 0, nil, errors.New("lean HTTP client: response without Content-Length")
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(br, b); err != nil {
		return 0, nil, err
	}
	return code, b, nil
}
