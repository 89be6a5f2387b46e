// Command httpexec is the second baseline of execmesh-bench's exec
// latency: the least a Go HTTP service that runs a command for an agent
// must do. POST / with {"command":"…"} runs `/bin/sh -c command` with
// os/exec and answers {"output":"…","exitCode":N} as JSON; nothing else
// (no policy, no sessions, no sanitizing). It prints its address on
// stdout and serves until SIGTERM.
//
// With -raw it serves the same over a hand-written HTTP/1.1 loop instead
// of net/http (one goroutine per connection, requests with a
// Content-Length body, answers with one): the bench calls it with a
// hand-written client too, and the pair is the floor of an HTTP exec
// round trip in Go on the machine, which no service built on net/http
// and its client reaches.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type request struct {
	Command string `json:"command"`
}

type response struct {
	Output   string `json:"output"`
	ExitCode int    `json:"exitCode"`
}

// maxBody bounds a request body.
const maxBody = 1 << 20

// runCommand runs the command of a request body and returns the JSON
// answer, or an HTTP status and message.
func runCommand(ctx context.Context, body io.Reader) ([]byte, int, string) {
	var req request
	if err := json.NewDecoder(body).Decode(&req); err != nil || req.Command == "" {
		return nil, http.StatusBadRequest, "want {\"command\":\"…\"}"
	}
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", req.Command)
	out, err := cmd.CombinedOutput()
	res := response{Output: string(out)}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		res.ExitCode = ee.ExitCode()
	case err != nil:
		return nil, http.StatusInternalServerError, err.Error()
	}
	b, _ := json.Marshal(res)
	return append(b, '\n'), http.StatusOK, ""
}

func run(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	b, code, msg := runCommand(r.Context(), http.MaxBytesReader(w, r.Body, maxBody))
	if code != http.StatusOK {
		http.Error(w, msg, code)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// serveRaw answers requests on ln with a hand-written HTTP/1.1 loop
// until ln is closed.
func serveRaw(ln net.Listener) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go serveRawConn(c)
	}
}

// serveRawConn answers the requests of one keep-alive connection in turn;
// a malformed request gets a 400 and the connection closes.
func serveRawConn(c net.Conn) {
	defer c.Close()
	br, bw := bufio.NewReader(c), bufio.NewWriter(c)
	var body bytes.Buffer
	for {
		method, n, err := readRawRequest(br)
		if err != nil {
			if !errors.Is(err, io.EOF) {
				writeRaw(bw, http.StatusBadRequest, "text/plain", []byte(err.Error()+"\n"), true)
			}
			return
		}
		body.Reset()
		if _, err := io.CopyN(&body, br, n); err != nil {
			return
		}
		if method != http.MethodPost {
			writeRaw(bw, http.StatusMethodNotAllowed, "text/plain", []byte("POST only\n"), false)
			continue
		}
		b, code, msg := runCommand(context.Background(), &body)
		if code != http.StatusOK {
			writeRaw(bw, code, "text/plain", []byte(msg+"\n"), false)
			continue
		}
		if writeRaw(bw, code, "application/json", b, false) != nil {
			return
		}
	}
}

// readRawRequest reads a request line and headers and returns the method
// and the body's length (Content-Length; no chunked bodies).
func readRawRequest(br *bufio.Reader) (method string, n int64, err error) {
	line, err := br.ReadString('\n')
	if err != nil {
		return "", 0, err
	}
	method, _, ok := strings.Cut(line, " ")
	if !ok {
		return "", 0, fmt.Errorf("malformed request line %q", line)
	}
	for {
		h, err := br.ReadString('\n')
		if err != nil {
			return "", 0, err
		}
		if h == "\r\n" || h == "\n" {
			break
		}
		k, v, ok := strings.Cut(h, ":")
		if !ok {
			return "", 0, fmt.Errorf("malformed header %q", h)
		}
		switch {
		case strings.EqualFold(k, "Content-Length"):
			n, err = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil || n < 0 || n > maxBody {
				return "", 0, fmt.Errorf("bad Content-Length %q", v)
			}
		case strings.EqualFold(k, "Transfer-Encoding"):
			return "", 0, errors.New("chunked bodies are not supported")
		}
	}
	return method, n, nil
}

func writeRaw(bw *bufio.Writer, code int, contentType string, body []byte, closing bool) error {
	fmt.Fprintf(bw, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n", code, http.StatusText(code), contentType, len(body))
	if closing {
		bw.WriteString("Connection: close\r\n")
	}
	bw.WriteString("\r\n")
	bw.Write(body)
	return bw.Flush()
}

func main() {
	raw := flag.Bool("raw", false, "serve with a hand-written HTTP/1.1 loop instead of net/http")
	flag.Parse()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, "httpexec:", err)
		os.Exit(1)
	}
	srv := &http.Server{Handler: http.HandlerFunc(run), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
		<-sig
		_ = srv.Close()
		_ = ln.Close()
	}()
	fmt.Printf("listening on http://%s\n", ln.Addr())
	if *raw {
		err = serveRaw(ln)
		if errors.Is(err, net.ErrClosed) {
			err = nil
		}
	} else {
		err = srv.Serve(ln)
	}
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintln(os.Stderr, "httpexec:", err)
		os.Exit(1)
	}
}
