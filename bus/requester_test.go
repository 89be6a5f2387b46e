package bus_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
)

// TestRequesterReplies: every kind of reply RequestChunked reads comes
// through a shared Requester the same way, on one connection, one after
// another: a 50 MB reply in parts (flow control over more than two
// windows), one part, a plain reply, an empty one, parts out of order,
// bad headers, no responders, a deadline, a request above max_payload.
func TestRequesterReplies(t *testing.T) {
	s := bustest.StartServer(t, bustest.WithoutJetStream(), bustest.WithMaxPayload(1<<20))
	responder := bustest.Connect(t, s, bus.ClientConfig{Name: "responder"})
	nc := bustest.Connect(t, s, bus.ClientConfig{Name: "requester"})
	q := bus.NewRequester(nc)
	t.Cleanup(q.Close)

	big := make([]byte, 50<<20)
	rand.Read(big)
	var wg sync.WaitGroup
	defer wg.Wait()
	badHeader := ""
	handlers := map[string]nats.MsgHandler{
		"big": func(m *nats.Msg) {
			wg.Go(func() {
				if err := bus.RespondChunked(responder, m.Reply, big, nats.Header{"X-Kind": {"log"}}); err != nil {
					t.Error(err)
				}
			})
		},
		"small": func(m *nats.Msg) { bus.RespondChunked(responder, m.Reply, []byte("tiny"), nil) },
		"empty": func(m *nats.Msg) { bus.RespondChunked(responder, m.Reply, nil, nil) },
		"plain": func(m *nats.Msg) { m.Respond([]byte("plain answer")) },
		"shuffled": func(m *nats.Msg) {
			for _, p := range []struct{ i, data string }{{"3/3", "cc"}, {"1/3", "aa"}, {"3/3", "XX"}, {"2/3", "bb"}} {
				r := nats.NewMsg(m.Reply)
				r.Header.Set(bus.HeaderChunk, p.i)
				r.Data = []byte(p.data)
				responder.PublishMsg(r)
			}
		},
		"bad": func(m *nats.Msg) {
			r := nats.NewMsg(m.Reply)
			r.Header.Set(bus.HeaderChunk, badHeader)
			responder.PublishMsg(r)
		},
		"silent": func(*nats.Msg) {},
	}
	for subj, h := range handlers {
		if _, err := responder.Subscribe(subj, h); err != nil {
			t.Fatal(err)
		}
	}
	responder.Flush()

	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	m, err := q.Request(ctx, "big", []byte("give"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(m.Data, big) || m.Header.Get("X-Kind") != "log" || m.Header.Get(bus.HeaderChunk) != "" {
		t.Fatalf("50 MB reply: %d bytes, equal %v, header %v", len(m.Data), bytes.Equal(m.Data, big), m.Header)
	}
	for subj, want := range map[string]string{"small": "tiny", "empty": "", "plain": "plain answer", "shuffled": "aabbcc"} {
		m, err := q.Request(ctx, subj, nil, nil)
		if err != nil || string(m.Data) != want {
			t.Fatalf("%s: %v %v, want %q", subj, err, m, want)
		}
	}
	for _, v := range []string{"0/1", "2/1", "x/y", "1/0", "1/99999999"} {
		badHeader = v
		if _, err := q.Request(ctx, "bad", nil, nil); !errors.Is(err, bus.ErrBadChunk) {
			t.Fatalf("header %q: err = %v, want ErrBadChunk", v, err)
		}
	}
	start := time.Now()
	if _, err := q.Request(ctx, "execmesh.node.nobody.exec", []byte("{}"), nil); !errors.Is(err, bus.ErrUnreachable) {
		t.Fatalf("nobody listening: err = %v, want ErrUnreachable", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("no-responders took %s; it should fail at once", d)
	}
	sctx, scancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = q.Request(sctx, "silent", nil, nil)
	scancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("silent: err = %v, want DeadlineExceeded", err)
	}
	if _, err := q.Request(ctx, "any", make([]byte, 2<<20), nil); !errors.Is(err, nats.ErrMaxPayload) {
		t.Fatalf("too large: err = %v, want ErrMaxPayload", err)
	}
	// Still usable after every failure.
	if m, err := q.Request(ctx, "small", nil, nil); err != nil || string(m.Data) != "tiny" {
		t.Fatalf("after the failures: %v %v", err, m)
	}
}

// TestRequesterShared: concurrent requests each get their own reply, over
// one subscription whatever their number, and a reply that comes after
// its request gave up reaches nobody.
func TestRequesterShared(t *testing.T) {
	s := bustest.StartServer(t, bustest.WithoutJetStream())
	responder := bustest.Connect(t, s, bus.ClientConfig{Name: "responder"})
	nc := bustest.Connect(t, s, bus.ClientConfig{Name: "requester"})
	q := bus.NewRequester(nc)
	t.Cleanup(q.Close)
	if _, err := responder.Subscribe("echo", func(m *nats.Msg) {
		// Answer out of order: later requests may be answered first.
		go bus.RespondChunked(responder, m.Reply, append([]byte("re:"), m.Data...), nil)
	}); err != nil {
		t.Fatal(err)
	}
	late := make(chan *nats.Msg, 1)
	if _, err := responder.Subscribe("late", func(m *nats.Msg) { late <- m }); err != nil {
		t.Fatal(err)
	}
	responder.Flush()
	before := nc.NumSubscriptions()

	var wg sync.WaitGroup
	for i := range 200 {
		wg.Go(func() {
			body := fmt.Sprintf("call-%d", i)
			m, err := q.Request(t.Context(), "echo", []byte(body), nil)
			if err != nil || string(m.Data) != "re:"+body {
				t.Errorf("%s: %v %v", body, err, m)
			}
		})
	}
	wg.Wait()
	if n := nc.NumSubscriptions() - before; n != 1 {
		t.Fatalf("%d subscriptions for 200 requests, want one shared", n)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	if _, err := q.Request(ctx, "late", nil, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("late: err = %v", err)
	}
	cancel()
	m := <-late
	if err := bus.RespondChunked(responder, m.Reply, []byte("too late"), nil); err != nil {
		t.Fatal(err)
	}
	if m, err := q.Request(t.Context(), "echo", []byte("next"), nil); err != nil || string(m.Data) != "re:next" {
		t.Fatalf("after a late reply: %v %v", err, m)
	}
}

// TestRequesterConnectionLost: requests in flight when the server goes
// away fail at once with ErrConnectionLost, as do those made while the
// connection is down; Close fails those waiting and every later one.
func TestRequesterConnectionLost(t *testing.T) {
	s, nc, sub := silentResponder(t)
	q := bus.NewRequester(nc)
	t.Cleanup(q.Close)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	go func() {
		for range 3 {
			if _, err := sub.NextMsg(10 * time.Second); err != nil {
				t.Error(err)
			}
		}
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		_ = s.Shutdown(sctx)
	}()
	start := time.Now()
	errs := make(chan error, 3)
	for range 3 {
		go func() {
			_, err := q.Request(ctx, "silent", nil, nil)
			errs <- err
		}()
	}
	for range 3 {
		if err := <-errs; !errors.Is(err, bus.ErrConnectionLost) {
			t.Fatalf("in flight: err = %v, want ErrConnectionLost", err)
		}
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("failed after %s, not when the connection dropped", d)
	}
	if _, err := q.Request(ctx, "silent", nil, nil); !errors.Is(err, bus.ErrConnectionLost) {
		t.Fatalf("while disconnected: err = %v, want ErrConnectionLost", err)
	}
}

func TestRequesterClose(t *testing.T) {
	_, nc, sub := silentResponder(t)
	q := bus.NewRequester(nc)
	errc := make(chan error, 1)
	go func() {
		_, err := q.Request(t.Context(), "silent", nil, nil)
		errc <- err
	}()
	if _, err := sub.NextMsg(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	q.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, bus.ErrConnectionLost) {
			t.Fatalf("waiting at Close: err = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a request waiting at Close did not end")
	}
	if _, err := q.Request(t.Context(), "silent", nil, nil); !errors.Is(err, bus.ErrConnectionLost) {
		t.Fatalf("after Close: err = %v", err)
	}
	q.Close() // twice is harmless
}
