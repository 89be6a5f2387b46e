package bus_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
)

func TestChunkSize(t *testing.T) {
	if got := bus.ChunkSize(nil); got != bus.DefaultMaxPayload-8<<10 {
		t.Fatalf("ChunkSize(nil) = %d", got)
	}
	s := bustest.StartServer(t, bustest.WithoutJetStream(), bustest.WithMaxPayload(4096))
	nc := bustest.Connect(t, s, bus.ClientConfig{})
	if got := bus.ChunkSize(nc); got != 3072 {
		t.Fatalf("ChunkSize with max_payload 4096 = %d, want 3072", got)
	}
}

// TestChunkedReply50MB sends a 50 MB reply through a server with the
// default 1 MB max_payload: it arrives complete and intact.
func TestChunkedReply50MB(t *testing.T) {
	s := bustest.StartServer(t, bustest.WithoutJetStream(), bustest.WithMaxPayload(1<<20))
	responder := bustest.Connect(t, s, bus.ClientConfig{Name: "responder"})
	requester := bustest.Connect(t, s, bus.ClientConfig{Name: "requester"})

	payload := make([]byte, 50<<20)
	rand.Read(payload)
	var wg sync.WaitGroup
	defer wg.Wait()
	sub, err := responder.Subscribe("big", func(m *nats.Msg) {
		// Answer from a goroutine, as a micro handler must.
		wg.Go(func() {
			if err := bus.RespondChunked(responder, m.Reply, payload, nats.Header{"X-Kind": {"log"}}); err != nil {
				t.Error(err)
			}
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	responder.Flush()

	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	start := time.Now()
	m, err := bus.RequestChunked(ctx, requester, "big", []byte("give"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("50 MB in %s", time.Since(start))
	if !bytes.Equal(m.Data, payload) {
		t.Fatalf("reply of %d bytes differs from the %d sent", len(m.Data), len(payload))
	}
	if got := m.Header.Get("X-Kind"); got != "log" {
		t.Fatalf("header X-Kind = %q", got)
	}
	if m.Header.Get(bus.HeaderChunk) != "" {
		t.Fatal("chunk header left on the result")
	}
	// The server refuses anything above 1 MB, so the reply must have
	// come in parts: at least this many.
	if n := (len(payload) + bus.ChunkSize(responder) - 1) / bus.ChunkSize(responder); n < 51 {
		t.Fatalf("expected more than 50 parts, chunk size %d", bus.ChunkSize(responder))
	}
}

func TestChunkedSmallReplyIsOnePart(t *testing.T) {
	s := bustest.StartServer(t, bustest.WithoutJetStream())
	nc := bustest.Connect(t, s, bus.ClientConfig{})
	sub, err := nc.Subscribe("small", func(m *nats.Msg) {
		if err := bus.RespondChunked(nc, m.Reply, []byte("tiny"), nil); err != nil {
			t.Error(err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	// A plain NATS request sees the whole answer in one message.
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	m, err := nc.RequestWithContext(ctx, "small", nil)
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Data) != "tiny" || m.Header != nil {
		t.Fatalf("reply %q header %q", m.Data, m.Header.Get(bus.HeaderChunk))
	}
	m, err = bus.RequestChunked(ctx, nc, "small", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Data) != "tiny" {
		t.Fatalf("reply %q", m.Data)
	}

	// An empty payload is one empty part.
	sub2, err := nc.Subscribe("empty", func(m *nats.Msg) { bus.RespondChunked(nc, m.Reply, nil, nil) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub2.Unsubscribe()
	m, err = bus.RequestChunked(ctx, nc, "empty", nil, nil)
	if err != nil || len(m.Data) != 0 {
		t.Fatalf("empty reply: %v %q", err, m.Data)
	}
}

func TestRequestChunkedPlainReply(t *testing.T) {
	s := bustest.StartServer(t, bustest.WithoutJetStream())
	nc := bustest.Connect(t, s, bus.ClientConfig{})
	sub, err := nc.Subscribe("plain", func(m *nats.Msg) { m.Respond([]byte("plain answer")) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	m, err := bus.RequestChunked(t.Context(), nc, "plain", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Data) != "plain answer" {
		t.Fatalf("reply %q", m.Data)
	}
}

func TestRequestChunkedOutOfOrder(t *testing.T) {
	s := bustest.StartServer(t, bustest.WithoutJetStream())
	nc := bustest.Connect(t, s, bus.ClientConfig{})
	sub, err := nc.Subscribe("shuffled", func(m *nats.Msg) {
		for _, p := range []struct{ i, data string }{{"3/3", "cc"}, {"1/3", "aa"}, {"3/3", "XX"}, {"2/3", "bb"}} {
			r := nats.NewMsg(m.Reply)
			r.Header.Set(bus.HeaderChunk, p.i)
			r.Data = []byte(p.data)
			nc.PublishMsg(r)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	m, err := bus.RequestChunked(t.Context(), nc, "shuffled", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Data) != "aabbcc" {
		t.Fatalf("reassembled %q", m.Data)
	}
}

func TestRequestChunkedBadHeader(t *testing.T) {
	s := bustest.StartServer(t, bustest.WithoutJetStream())
	nc := bustest.Connect(t, s, bus.ClientConfig{})
	for _, v := range []string{"0/1", "2/1", "x/y", "1/0", "1/99999999"} {
		sub, err := nc.Subscribe("bad", func(m *nats.Msg) {
			r := nats.NewMsg(m.Reply)
			r.Header.Set(bus.HeaderChunk, v)
			nc.PublishMsg(r)
		})
		if err != nil {
			t.Fatal(err)
		}
		_, err = bus.RequestChunked(t.Context(), nc, "bad", nil, nil)
		sub.Unsubscribe()
		if !errors.Is(err, bus.ErrBadChunk) {
			t.Fatalf("header %q: err = %v, want ErrBadChunk", v, err)
		}
	}
}

func TestRequestChunkedUnreachable(t *testing.T) {
	s := bustest.StartServer(t, bustest.WithoutJetStream())
	nc := bustest.Connect(t, s, bus.ClientConfig{})
	start := time.Now()
	_, err := bus.RequestChunked(t.Context(), nc, "execmesh.node.nobody.exec", []byte("{}"), nil)
	if !errors.Is(err, bus.ErrUnreachable) {
		t.Fatalf("err = %v, want ErrUnreachable", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("no-responders took %s; it should fail at once", d)
	}
}

// silentResponder starts a server and a client with a subscriber on
// "silent" that receives requests and never answers.
func silentResponder(t *testing.T) (*bus.Server, *nats.Conn, *nats.Subscription) {
	t.Helper()
	s := bustest.StartServer(t, bustest.WithoutJetStream())
	nc := bustest.Connect(t, s, bus.ClientConfig{})
	sub, err := nc.SubscribeSync("silent")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return s, nc, sub
}

func TestRequestChunkedTimeout(t *testing.T) {
	_, nc, _ := silentResponder(t)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	_, err := bus.RequestChunked(ctx, nc, "silent", nil, nil)
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, bus.ErrUnreachable) {
		t.Fatalf("err = %v, want DeadlineExceeded", err)
	}
}

// TestRequestChunkedConnectionLost: a request in flight when the server
// goes away fails at once with ErrConnectionLost instead of holding its
// caller until the deadline; a request made while the connection is down
// fails before it is sent.
func TestRequestChunkedConnectionLost(t *testing.T) {
	s, nc, sub := silentResponder(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	go func() {
		// Once the request has arrived, take the server away.
		if _, err := sub.NextMsg(10 * time.Second); err != nil {
			t.Error(err)
		}
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		_ = s.Shutdown(sctx)
	}()
	start := time.Now()
	_, err := bus.RequestChunked(ctx, nc, "silent", nil, nil)
	if !errors.Is(err, bus.ErrConnectionLost) {
		t.Fatalf("err = %v, want ErrConnectionLost", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("failed after %s, not when the connection dropped", d)
	}
	_, err = bus.RequestChunked(ctx, nc, "silent", nil, nil)
	if !errors.Is(err, bus.ErrConnectionLost) {
		t.Fatalf("while disconnected: err = %v, want ErrConnectionLost", err)
	}
}

func TestRequestChunkedTooLarge(t *testing.T) {
	s := bustest.StartServer(t, bustest.WithoutJetStream(), bustest.WithMaxPayload(4096))
	nc := bustest.Connect(t, s, bus.ClientConfig{})
	_, err := bus.RequestChunked(t.Context(), nc, "any", make([]byte, 8192), nil)
	if !errors.Is(err, nats.ErrMaxPayload) {
		t.Fatalf("err = %v, want ErrMaxPayload", err)
	}
}

// TestChunkedMicro answers a micro endpoint with a chunked reply from a
// goroutine and an error reply through req.Error.
func TestChunkedMicro(t *testing.T) {
	s := bustest.StartServer(t, bustest.WithoutJetStream(), bustest.WithMaxPayload(64<<10))
	nodeConn := bustest.Connect(t, s, bus.ClientConfig{Name: "node"})
	gw := bustest.Connect(t, s, bus.ClientConfig{Name: "gateway"})

	payload := bytes.Repeat([]byte("0123456789abcdef"), 40_000) // 640 KB, 11 parts
	var wg sync.WaitGroup
	defer wg.Wait()
	svc, err := micro.AddService(nodeConn, micro.Config{Name: bus.NodeServiceName, Version: "0.0.0-dev"})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Stop()
	g := svc.AddGroup("execmesh.node.n1")
	if err := g.AddEndpoint("log", micro.HandlerFunc(func(req micro.Request) {
		reply := req.Reply()
		wg.Go(func() {
			if err := bus.RespondChunked(nodeConn, reply, payload, nil); err != nil {
				t.Error(err)
			}
		})
	})); err != nil {
		t.Fatal(err)
	}
	if err := g.AddEndpoint("fail", micro.HandlerFunc(func(req micro.Request) {
		req.Error("404", "unknown session", nil)
	})); err != nil {
		t.Fatal(err)
	}

	// The endpoints are subscriptions on another connection: make sure the
	// server has them before asking.
	if err := nodeConn.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	m, err := bus.RequestChunked(ctx, gw, "execmesh.node.n1.log", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(m.Data, payload) {
		t.Fatalf("got %d bytes, want %d", len(m.Data), len(payload))
	}
	if err := bus.ReplyError(m); err != nil {
		t.Fatalf("ReplyError on success: %v", err)
	}
	m, err = bus.RequestChunked(ctx, gw, "execmesh.node.n1.fail", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var se *bus.ServiceError
	if err := bus.ReplyError(m); !errors.As(err, &se) || se.Code != "404" || se.Description != "unknown session" {
		t.Fatalf("ReplyError = %v", err)
	}
}

// TestRequestChunkedBuffer: a request allocates a reply buffer for what
// flow control lets be in flight, not a channel of the connection's
// SubChanLen (64 Ki messages, 512 KiB) per request.
func TestRequestChunkedBuffer(t *testing.T) {
	s := bustest.StartServer(t)
	nc := bustest.Connect(t, s, bus.ClientConfig{Name: "c", InProcess: s})
	if _, err := nc.Subscribe("svc", func(m *nats.Msg) { _ = bus.RespondChunked(nc, m.Reply, []byte("pong"), nil) }); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := bus.RequestChunked(ctx, nc, "svc", nil, nil); err != nil {
		t.Fatal(err)
	}
	const n = 20
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range n {
		if _, err := bus.RequestChunked(ctx, nc, "svc", nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	runtime.ReadMemStats(&after)
	if per := (after.TotalAlloc - before.TotalAlloc) / n; per > 64<<10 {
		t.Errorf("%d bytes allocated per request", per)
	}
}
