package bus_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
)

// BenchmarkRequestChunked: one request and its one-part reply through an
// embedded server (requester in-process, responder over TCP, as the
// gateway and a node agent), against nats.go's own Request, which shares
// one subscription per connection (sub-benchmark "baseline"), and
// through a Requester ("one-part-shared"). `make
// bench` runs it; alone:
//
//	go test -run '^$' -bench 'BenchmarkRequestChunked' -benchmem ./bus
func BenchmarkRequestChunked(b *testing.B) {
	s := bustest.StartServer(b, bustest.WithListen("127.0.0.1:-1"))
	resp := bustest.Connect(b, s, bus.ClientConfig{Name: "responder", URLs: []string{s.ClientURL()}})
	req := bustest.Connect(b, s, bus.ClientConfig{Name: "requester", InProcess: s})
	if _, err := resp.Subscribe("svc", func(m *nats.Msg) { _ = bus.RespondChunked(resp, m.Reply, []byte("pong"), nil) }); err != nil {
		b.Fatal(err)
	}
	if err := resp.Flush(); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.Run("one-part/execmesh", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := bus.RequestChunked(ctx, req, "svc", []byte("ping"), nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	baseline := func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := req.Request("svc", []byte("ping"), 10*time.Second); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("one-part/baseline", baseline)
	// The same through a Requester: one reply subscription shared by
	// every request, as the gateway calls nodes.
	q := bus.NewRequester(req)
	defer q.Close()
	b.Run("one-part-shared/execmesh", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := q.Request(ctx, "svc", []byte("ping"), nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("one-part-shared/baseline", baseline)
}
