// Command natsexec is the baseline of execmesh-bench's host=node exec
// latency: the least a Go service must do to run an agent's command on
// another process over NATS, as execmesh does for host=node.
//
// Started plain, it runs an embedded NATS server (loopback TCP, no
// JetStream) and a net/http server: POST / with {"command":"…"} goes as
// one NATS request, over an in-process connection as `execmesh up` holds
// its own, to the subject natsexec.run, and the reply is the HTTP answer.
// It prints "listening on http://ADDR nats://ADDR".
//
// With -node URL it is the other end, a process of its own as `execmesh
// node` is: it connects to URL over TCP, answers natsexec.run by running
// `/bin/sh -c command` with os/exec and replies
// {"output":"…","exitCode":N}, and prints "ready" once subscribed.
//
// Nothing else: no policy, no sessions, no sanitizing, no persistence.
// Both ends serve until SIGTERM.
package main

import (
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
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

const (
	subject = "natsexec.run"
	// maxBody bounds a request body.
	maxBody = 1 << 20
	// timeout bounds one command's round trip.
	timeout = 30 * time.Second
)

type request struct {
	Command string `json:"command"`
}

type response struct {
	Output   string `json:"output"`
	ExitCode int    `json:"exitCode"`
}

func main() {
	node := flag.String("node", "", "run the node end, connected to the NATS server at `url`")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	var err error
	if *node != "" {
		err = runNode(ctx, *node, os.Stdout)
	} else {
		err = runServer(ctx, os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "natsexec:", err)
		os.Exit(1)
	}
}

// runNode answers exec requests from the NATS server at url until ctx
// ends, and writes "ready" to out once it is subscribed.
func runNode(ctx context.Context, url string, out io.Writer) error {
	nc, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer nc.Close()
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) { _ = m.Respond(runCommand(m.Data)) })
	if err != nil {
		return err
	}
	if err := nc.Flush(); err != nil { // the server has the subscription
		return err
	}
	fmt.Fprintln(out, "ready")
	<-ctx.Done()
	return sub.Unsubscribe()
}

// runCommand runs the command of a request body (checked by the server)
// and returns the JSON answer.
func runCommand(body []byte) []byte {
	var req request
	res := response{ExitCode: -1}
	if err := json.Unmarshal(body, &req); err != nil {
		res.Output = err.Error()
	} else {
		out, err := exec.Command("/bin/sh", "-c", req.Command).CombinedOutput()
		res.Output, res.ExitCode = string(out), 0
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee):
			res.ExitCode = ee.ExitCode()
		case err != nil:
			res.Output, res.ExitCode = err.Error(), -1
		}
	}
	b, _ := json.Marshal(res)
	return append(b, '\n')
}

// runServer runs the NATS server and the HTTP front on loopback until ctx
// ends, and writes their addresses to out once both listen.
func runServer(ctx context.Context, out io.Writer) error {
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true})
	if err != nil {
		return err
	}
	ns.Start()
	defer ns.Shutdown()
	if !ns.ReadyForConnections(10 * time.Second) {
		return errors.New("the NATS server did not start")
	}
	nc, err := nats.Connect("", nats.InProcessServer(ns))
	if err != nil {
		return err
	}
	defer nc.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: handler(nc), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	fmt.Fprintf(out, "listening on http://%s %s\n", ln.Addr(), ns.ClientURL())
	select {
	case <-ctx.Done():
		return srv.Close()
	case err := <-errc:
		return err
	}
}

// handler forwards each command to the node over nc.
func handler(nc *nats.Conn) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "POST only", http.StatusMethodNotAllowed)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
		var req request
		if err != nil || json.Unmarshal(body, &req) != nil || req.Command == "" {
			http.Error(w, `want {"command":"…"}`, http.StatusBadRequest)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), timeout)
		defer cancel()
		m, err := nc.RequestWithContext(ctx, subject, body)
		if err != nil {
			http.Error(w, "node: "+err.Error(), http.StatusBadGateway)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(m.Data)
	})
}
