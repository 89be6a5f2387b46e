package hostbus_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
	"github.com/execmesh/execmesh/hostbus"
	"github.com/execmesh/execmesh/protocol"
)

// instantHost answers every exec at once with the reply of a finished
// `echo hi`: what is left of a round trip is the transport.
type instantHost struct{ reply protocol.ExecReply }

func (h *instantHost) Exec(context.Context, protocol.ExecRequest) (protocol.ExecReply, error) {
	return h.reply, nil
}

func (h *instantHost) Process(context.Context, protocol.ProcessRequest) (protocol.ProcessReply, error) {
	return protocol.ProcessReply{}, nil
}

func (h *instantHost) List(context.Context, protocol.ListRequest) (protocol.ListReply, error) {
	return protocol.ListReply{}, nil
}

func (h *instantHost) ApplyPatch(context.Context, protocol.ApplyPatchRequest) (protocol.Result, error) {
	return protocol.Result{}, nil
}

// benchNodeEnv, set to a NATS URL, makes the test binary the node side of
// BenchmarkRemoteExecRoundTrip in a process of its own.
const benchNodeEnv = "EXECMESH_HOSTBUS_BENCH_NODE"

func TestMain(m *testing.M) {
	if url := os.Getenv(benchNodeEnv); url != "" {
		os.Exit(runBenchNode(url))
	}
	os.Exit(m.Run())
}

// runBenchNode serves the node side on url until stdin closes.
func runBenchNode(url string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, err := bus.Connect(ctx, bus.ClientConfig{Name: "node", URLs: []string{url}}, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer nc.Close()
	stop, err := serveBenchNode(nc)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer stop()
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// The request of the benchmark, and the reply of a finished `echo hi`.
func benchExec() (protocol.ExecRequest, protocol.ExecReply) {
	timeout := 0.0
	yield := 10000.0
	req := protocol.ExecRequest{
		SessionKey: "agent:main:main", AgentID: "main", SessionID: "calm-reef-1234", Target: protocol.TargetNode,
		Args:     protocol.ExecArgs{Command: "echo hi", YieldMs: &yield, Timeout: &timeout},
		Security: "full", Ask: "off",
	}
	details := protocol.Details{}
	details.Status = protocol.Some("completed")
	details.ExitCode = protocol.Some(0)
	details.DurationMs = protocol.Some(int64(1))
	details.Cwd = protocol.Some("/home/user")
	return req, protocol.ExecReply{Result: protocol.TextResult("hi\n", details), Instance: "run-1"}
}

var benchGroup = protocol.Subjects("").NodeGroup("NBENCH")

// serveBenchNode serves, on nc, a Server of an instantHost in a micro
// service group as the node agent does, and "bare.exec", answered with
// the same reply bytes by a plain subscription.
func serveBenchNode(nc *nats.Conn) (stop func(), err error) {
	_, reply := benchExec()
	h := &instantHost{reply: reply}
	srv := hostbus.NewServer(hostbus.ServerConfig{Host: h, Name: "node bench", Instance: "run-1",
		Count: func(_ string, fn hostbus.HandlerFunc) hostbus.HandlerFunc { return fn }})
	svc, err := micro.AddService(nc, micro.Config{Name: bus.NodeServiceName, Version: "0.0.0"})
	if err != nil {
		return nil, err
	}
	stop = func() {
		_ = svc.Stop()
		_ = srv.Close(context.Background())
	}
	if err := srv.AddTo(nc, svc.AddGroup(benchGroup)); err != nil {
		stop()
		return nil, err
	}
	replyBody := reply.AppendJSON(nil)
	if _, err := nc.Subscribe("bare.exec", func(m *nats.Msg) { _ = m.Respond(replyBody) }); err != nil {
		stop()
		return nil, err
	}
	if err := nc.Flush(); err != nil {
		stop()
		return nil, err
	}
	return stop, nil
}

// BenchmarkRemoteExecRoundTrip: one exec through Remote.Exec to a Server
// in a micro service (the gateway's side in-process, with the gateway's
// Requester, ServerWatch and a node watch; the node's over TCP, in this
// process or, "node=process", in a child process), against a bare nats.go
// Request/Respond of the same request and reply bytes on the same
// connections. Each iteration does one of each, so both are measured in
// the same run; it reports their medians and remote/bare, the figure that
// matters. Alone:
//
//	flock /tmp/execmesh-bench.lock go test -run '^$' -bench RemoteExecRoundTrip ./hostbus
func BenchmarkRemoteExecRoundTrip(b *testing.B) {
	s := bustest.StartServer(b, bustest.WithoutJetStream())
	gwNC := bustest.Connect(b, s, bus.ClientConfig{Name: "gateway", InProcess: s})

	b.Run("node=process", func(b *testing.B) {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), benchNodeEnv+"="+s.ClientURL())
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			b.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		defer func() {
			_ = stdin.Close()
			_ = cmd.Wait()
		}()
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err != nil || line != "ready\n" {
			b.Fatalf("node process: %q, %v", line, err)
		}
		benchRoundTrip(b, gwNC)
	})
	b.Run("node=in-process", func(b *testing.B) {
		nodeNC := bustest.Connect(b, s, bus.ClientConfig{Name: "node", URLs: []string{s.ClientURL()}})
		stop, err := serveBenchNode(nodeNC)
		if err != nil {
			b.Fatal(err)
		}
		defer stop()
		benchRoundTrip(b, gwNC)
	})
}

func benchRoundTrip(b *testing.B, gwNC *nats.Conn) {
	req, _ := benchExec()
	body, err := json.Marshal(req)
	if err != nil {
		b.Fatal(err)
	}
	// The gateway side, as nodes.Registry.Host builds it.
	watch := bus.NewServerWatch(gwNC, bus.ServerWatchOptions{})
	wctx, wcancel := context.WithCancel(context.Background())
	b.Cleanup(wcancel)
	go watch.Run(wctx)
	epoch, endEpoch := context.WithCancelCause(context.Background())
	b.Cleanup(func() { endEpoch(nil) })
	requests := bus.NewRequester(gwNC)
	b.Cleanup(requests.Close)
	remote := &hostbus.Remote{
		Conn: gwNC, Group: benchGroup, Label: "node bench", ServerWatch: watch, Requests: requests,
		Watch: func(ctx context.Context) (context.Context, context.CancelFunc) {
			c, cancel := context.WithCancelCause(ctx)
			stop := context.AfterFunc(epoch, func() { cancel(context.Cause(epoch)) })
			return c, func() { stop(); cancel(nil) }
		},
	}

	ctx := context.Background()
	hdr := nats.Header{}
	hdr.Set(protocol.NodeHeaderIdempotencyKey, "0f6b1e6c-6d2a-4c3e-9a51-2b7e4f0d9c11")
	for range 200 { // warm up both paths
		if _, err := remote.Exec(ctx, req); err != nil {
			b.Fatal(err)
		}
		if _, err := gwNC.Request("bare.exec", body, 5*time.Second); err != nil {
			b.Fatal(err)
		}
	}
	bare := make([]time.Duration, 0, b.N)
	ours := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		m := nats.NewMsg("bare.exec")
		m.Data, m.Header = body, hdr
		if _, err := gwNC.RequestMsg(m, 5*time.Second); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if _, err := remote.Exec(ctx, req); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		bare, ours = append(bare, t1.Sub(t0)), append(ours, t2.Sub(t1))
	}
	b.StopTimer()
	slices.Sort(bare)
	slices.Sort(ours)
	bp50, rp50 := bare[len(bare)/2], ours[len(ours)/2]
	b.ReportMetric(float64(bp50.Microseconds()), "bare-p50-µs")
	b.ReportMetric(float64(rp50.Microseconds()), "remote-p50-µs")
	b.ReportMetric(float64(rp50)/float64(bp50), "remote/bare")
	b.ReportMetric(float64((rp50 - bp50).Microseconds()), "extra-µs")
}
