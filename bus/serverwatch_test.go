package bus_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
)

// freezeProxy forwards TCP to a server and, while frozen, holds every
// byte (as a SIGSTOPped server or a link that drops everything would:
// the connection stays open, nothing comes back).
type freezeProxy struct {
	ln     net.Listener
	frozen atomic.Bool
	pings  atomic.Int64 // PINGs seen, either way
	mu     sync.Mutex
	conns  []net.Conn
}

func newFreezeProxy(t *testing.T, target string) *freezeProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &freezeProxy{ln: ln}
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			go p.pipe(c, s)
			go p.pipe(s, c)
		}
	}()
	return p
}

func (p *freezeProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		for p.frozen.Load() {
			time.Sleep(10 * time.Millisecond)
		}
		if n > 0 {
			p.pings.Add(int64(bytes.Count(buf[:n], []byte("PING\r\n"))))
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				dst.Close()
			}
			return
		}
	}
}

// TestServerWatch: a server that stops answering is noticed within the
// ping's timeout; a call waiting on it ends with ErrServerSilent, a new
// one at once, and Healthy says so until the server answers again.
func TestServerWatch(t *testing.T) {
	s := bustest.StartServer(t, bustest.WithoutJetStream())
	p := newFreezeProxy(t, s.ListenAddr())
	nc := bustest.Connect(t, s, bus.ClientConfig{URLs: []string{"nats://" + p.ln.Addr().String()}})
	w := bus.NewServerWatch(nc, bus.ServerWatchOptions{Interval: 100 * time.Millisecond, Timeout: 300 * time.Millisecond})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go w.Run(ctx)

	time.Sleep(300 * time.Millisecond)
	if err := w.Healthy(); err != nil {
		t.Fatalf("healthy server: %v", err)
	}
	wctx, release := w.Watch(t.Context())
	defer release()
	p.frozen.Store(true)
	start := time.Now()
	select {
	case <-wctx.Done():
	case <-time.After(3 * time.Second):
		t.Fatal("a call waiting on a frozen server was not ended")
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("noticed after %s", took)
	}
	if !errors.Is(context.Cause(wctx), bus.ErrServerSilent) || !errors.Is(w.Healthy(), bus.ErrServerSilent) {
		t.Fatalf("cause %v, healthy %v", context.Cause(wctx), w.Healthy())
	}
	now, release2 := w.Watch(t.Context())
	defer release2()
	if now.Err() == nil {
		t.Error("a call made while the server is silent was not ended at once")
	}
	p.frozen.Store(false)
	deadline := time.Now().Add(3 * time.Second)
	for w.Healthy() != nil {
		if time.Now().After(deadline) {
			t.Fatal("still silent after the server answers again")
		}
		time.Sleep(20 * time.Millisecond)
	}
	again, release3 := w.Watch(t.Context())
	defer release3()
	if again.Err() != nil {
		t.Error("a call after the server came back was ended")
	}
	var nilWatch *bus.ServerWatch
	if c, r := nilWatch.Watch(t.Context()); c != t.Context() || nilWatch.Healthy() != nil {
		t.Error("a nil watch must change nothing")
	} else {
		r()
	}
}

// TestServerWatchPingsOnDemand: an idle watch does not ping every
// Interval (an idle daemon would wake for nothing), but a health check
// or a call more than Interval after the last ping has one sent at once,
// and pings go on every Interval while a call waits.
func TestServerWatchPingsOnDemand(t *testing.T) {
	s := bustest.StartServer(t, bustest.WithoutJetStream())
	p := newFreezeProxy(t, s.ListenAddr())
	nc := bustest.Connect(t, s, bus.ClientConfig{URLs: []string{"nats://" + p.ln.Addr().String()}})
	const iv = 100 * time.Millisecond
	w := bus.NewServerWatch(nc, bus.ServerWatchOptions{Interval: iv, IdleInterval: time.Hour, Timeout: 300 * time.Millisecond})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go w.Run(ctx)
	settle := func() int64 {
		time.Sleep(50 * time.Millisecond)
		return p.pings.Load()
	}
	waitPings := func(what string, from, want int64) int64 {
		t.Helper()
		deadline := time.Now().Add(2 * time.Second)
		for p.pings.Load()-from < want {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d ping(s), want %d", what, p.pings.Load()-from, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
		return p.pings.Load()
	}

	n := settle() // the first ping, at once
	time.Sleep(8 * iv)
	if got := p.pings.Load() - n; got != 0 {
		t.Errorf("idle for %s: %d ping(s), want none", 8*iv, got)
	}
	if err := w.Healthy(); err != nil {
		t.Fatal(err)
	}
	n = waitPings("a health check after a pause", n, 1)
	n = settle()
	for range 5 { // asked again within Interval: no more pings
		_ = w.Healthy()
	}
	if got := p.pings.Load() - n; got > 1 {
		t.Errorf("health checks within %s of a ping: %d pings, want at most 1", iv, got)
	}
	time.Sleep(2 * iv)
	n = p.pings.Load()
	_, release := w.Watch(t.Context())
	n = waitPings("a call after a pause", n, 1)
	waitPings("a call waiting", n, 3)
	release()

	// A call that begins right after a health check had a ping sent:
	// no new ping at once, but one every Interval while it waits.
	time.Sleep(3 * iv)
	n = p.pings.Load()
	_ = w.Healthy()
	n = waitPings("a health check after a pause", n, 1)
	_, release = w.Watch(t.Context())
	waitPings("a call waiting after a health check", n, 3)
	release()
	time.Sleep(3 * iv) // a ping already timed when the call ended may still go
	n = p.pings.Load()
	time.Sleep(8 * iv)
	if got := p.pings.Load() - n; got > 1 {
		t.Errorf("idle again for %s: %d ping(s), want at most 1", 8*iv, got)
	}
}
