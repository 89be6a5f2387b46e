package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// lines is an io.Writer that hands each line written to a channel.
type lines chan string

func (l lines) Write(p []byte) (int, error) {
	for _, s := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		l <- s
	}
	return len(p), nil
}

func next(t *testing.T, l lines, what string) string {
	t.Helper()
	select {
	case s := <-l:
		return s
	case <-time.After(10 * time.Second):
		t.Fatalf("no %s within 10s", what)
		return ""
	}
}

// TestServerRunsCommandsOnTheNode: the HTTP front answers with what the
// node, a NATS client of its own, ran; bad requests never reach it; with
// no node the answer is a 502, not a hang.
func TestServerRunsCommandsOnTheNode(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	srvOut, nodeOut := make(lines, 4), make(lines, 4)
	srvDone, nodeDone := make(chan error, 1), make(chan error, 1)
	started := []chan error{srvDone}
	go func() { srvDone <- runServer(ctx, srvOut) }()
	t.Cleanup(func() {
		cancel()
		for _, c := range started {
			select {
			case err := <-c:
				if err != nil {
					t.Errorf("end: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Error("an end did not stop within 10s")
			}
		}
	})
	fields := strings.Fields(strings.TrimPrefix(next(t, srvOut, "address"), "listening on "))
	if len(fields) != 2 || !strings.HasPrefix(fields[0], "http://") || !strings.HasPrefix(fields[1], "nats://") {
		t.Fatalf("server printed %q, want its HTTP and NATS addresses", fields)
	}
	url := fields[0] + "/"
	post := func(method, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, url, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(bufio.NewReader(resp.Body))
		return resp.StatusCode, string(b)
	}

	if code, b := post(http.MethodPost, `{"command":"echo hi"}`); code != http.StatusBadGateway || !strings.Contains(b, "node:") {
		t.Fatalf("without a node: HTTP %d %q, want 502", code, b)
	}
	started = append(started, nodeDone)
	go func() { nodeDone <- runNode(ctx, fields[1], nodeOut) }()
	if s := next(t, nodeOut, "ready"); s != "ready" {
		t.Fatalf("node printed %q, want ready", s)
	}
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
		code, b := post(tc.method, tc.body)
		if code != tc.code {
			t.Errorf("%s: HTTP %d %q, want %d", tc.name, code, b, tc.code)
			continue
		}
		if code != 200 {
			continue
		}
		var r response
		if err := json.Unmarshal([]byte(b), &r); err != nil || r.Output != tc.output || r.ExitCode != tc.exit {
			t.Errorf("%s: %q (%v), want output %q exit %d", tc.name, b, err, tc.output, tc.exit)
		}
	}
}

// TestRunCommandRefusesBadBodies: the node answers a body it cannot read
// with exit code -1 and the reason, instead of running anything.
func TestRunCommandRefusesBadBodies(t *testing.T) {
	var r response
	if err := json.Unmarshal(runCommand([]byte("echo hi")), &r); err != nil {
		t.Fatal(err)
	}
	if r.ExitCode != -1 || r.Output == "" {
		t.Fatalf("got %+v, want exit -1 and a reason", r)
	}
}
