// Command httpexec is the second baseline of execmesh-bench's exec
// latency: the least a Go HTTP service that runs a command for an agent
// must do. POST / with {"command":"…"} runs `/bin/sh -c command` with
// os/exec and answers {"output":"…","exitCode":N} as JSON; nothing else
// (no policy, no sessions, no sanitizing). It prints its address on
// stdout and serves until SIGTERM.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
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

func run(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	var req request
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil || req.Command == "" {
		http.Error(w, "want {\"command\":\"…\"}", http.StatusBadRequest)
		return
	}
	cmd := exec.CommandContext(r.Context(), "/bin/sh", "-c", req.Command)
	out, err := cmd.CombinedOutput()
	res := response{Output: string(out)}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		res.ExitCode = ee.ExitCode()
	case err != nil:
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(res)
}

func main() {
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
	}()
	fmt.Printf("listening on http://%s\n", ln.Addr())
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintln(os.Stderr, "httpexec:", err)
		os.Exit(1)
	}
}
