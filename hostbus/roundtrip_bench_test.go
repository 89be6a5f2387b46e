package hostbus_test

import (
	"context"
	"encoding/json"
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

// BenchmarkRemoteExecRoundTrip: one exec through Remote.Exec to a Server
// in a micro service (the gateway's side in-process, the node's over TCP,
// with the gateway's Requester, ServerWatch and a node watch), against a
// bare nats.go Request/Respond of the same request and reply bytes on the
// same connections. Each iteration does one of each, so both are measured
// in the same run; it reports their medians and remote/bare, the figure
// that matters. Alone:
//
//	flock /tmp/execmesh-bench.lock go test -run '^$' -bench RemoteExecRoundTrip ./hostbus
func BenchmarkRemoteExecRoundTrip(b *testing.B) {
	s := bustest.StartServer(b, bustest.WithoutJetStream())
	nodeNC := bustest.Connect(b, s, bus.ClientConfig{Name: "node", URLs: []string{s.ClientURL()}})
	gwNC := bustest.Connect(b, s, bus.ClientConfig{Name: "gateway", InProcess: s})

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
	h := &instantHost{reply: protocol.ExecReply{Result: protocol.TextResult("hi\n", details), Instance: "run-1"}}

	// The node side: a Server in a micro service, as the node agent.
	srv := hostbus.NewServer(hostbus.ServerConfig{Host: h, Name: "node bench", Instance: "run-1",
		Count: func(_ string, fn hostbus.HandlerFunc) hostbus.HandlerFunc { return fn }})
	svc, err := micro.AddService(nodeNC, micro.Config{Name: bus.NodeServiceName, Version: "0.0.0"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = svc.Stop() })
	group := protocol.Subjects("").NodeGroup("NBENCH")
	if err := srv.AddTo(nodeNC, svc.AddGroup(group)); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = srv.Close(context.Background()) })

	// The bare side: the same bytes both ways.
	body, err := json.Marshal(req)
	if err != nil {
		b.Fatal(err)
	}
	replyBody := h.reply.AppendJSON(nil)
	if _, err := nodeNC.Subscribe("bare.exec", func(m *nats.Msg) { _ = m.Respond(replyBody) }); err != nil {
		b.Fatal(err)
	}
	if err := nodeNC.Flush(); err != nil {
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
		Conn: gwNC, Group: group, Label: "node bench", ServerWatch: watch, Requests: requests,
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
