package bus_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
)

func TestConnectByURLAndInProcess(t *testing.T) {
	s := bustest.StartServer(t)
	byURL := bustest.Connect(t, s, bus.ClientConfig{})
	inProc := bustest.Connect(t, s, bus.ClientConfig{InProcess: s})
	if got := bus.ConnectedServer(byURL); got == "" {
		t.Fatal("ConnectedServer empty for a connected client")
	}
	roundTrip(t, byURL, inProc)
	roundTrip(t, inProc, byURL)
}

func TestConnectSeveralURLs(t *testing.T) {
	s := bustest.StartServer(t)
	dead := bustest.Listen(bustest.FreePort(t))
	// The first URL refuses connections; the comma-joined form and a
	// separate entry both work.
	nc := bustest.Connect(t, s, bus.ClientConfig{URLs: []string{"nats://" + dead + "," + s.ClientURL(), "nats://" + dead}})
	roundTrip(t, nc, nc)
}

func TestConnectRejectsConflictingAuth(t *testing.T) {
	_, err := bus.Connect(t.Context(), bus.ClientConfig{URLs: []string{"nats://127.0.0.1:1"}, User: "a", Token: "b"}, nil)
	if err == nil {
		t.Fatal("connected with two auth methods")
	}
	_, err = bus.Connect(t.Context(), bus.ClientConfig{}, nil)
	if err == nil {
		t.Fatal("connected without URL")
	}
}

func TestConnectWaitsForServerAndAsync(t *testing.T) {
	port := bustest.FreePort(t)
	url := "nats://" + bustest.Listen(port)

	// Nothing listens: Connect waits until ctx ends.
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if _, err := bus.Connect(ctx, bus.ClientConfig{URLs: []string{url}}, nil); !errors.Is(err, bus.ErrNotConnected) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v", err)
	}

	// Async returns at once and connects when the server appears.
	nc, err := bus.Connect(t.Context(), bus.ClientConfig{URLs: []string{url}, Async: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if nc.IsConnected() {
		t.Fatal("connected to nothing")
	}
	bustest.StartServer(t, bustest.WithListen(bustest.Listen(port)))
	bustest.CheckFor(t, 15*time.Second, 20*time.Millisecond, func() error {
		if !nc.IsConnected() {
			return fmt.Errorf("status %v", nc.Status())
		}
		return nil
	})
}

// TestReconnectSamePort stops the server under a connected client and
// starts a new one on the same port: the client reconnects by itself and
// its subscriptions work again.
func TestReconnectSamePort(t *testing.T) {
	port := bustest.FreePort(t)
	listen := bustest.Listen(port)
	cfg := bus.ServerConfig{Listen: listen, JetStream: true, StoreDir: filepath.Join(t.TempDir(), "a")}
	s1, err := bus.StartServer(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s1.Shutdown(context.Background()) })

	h := &recordHandler{}
	nc, err := bus.Connect(t.Context(), bus.ClientConfig{URLs: []string{s1.ClientURL()}, Name: "reconnector"}, slogger(h))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sub, err := nc.Subscribe("echo", func(m *nats.Msg) { m.Respond(m.Data) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	if err := s1.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	bustest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if nc.IsConnected() {
			return errors.New("still connected")
		}
		return nil
	})

	cfg.StoreDir = filepath.Join(t.TempDir(), "b")
	s2, err := bus.StartServer(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s2.Shutdown(context.Background()) })

	bustest.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		if !nc.IsConnected() {
			return fmt.Errorf("status %v", nc.Status())
		}
		return nil
	})
	if err := nc.Flush(); err != nil { // the new server has the resent subscription
		t.Fatal(err)
	}
	if nc.Stats().Reconnects == 0 {
		t.Fatal("no reconnect counted")
	}
	other := bustest.Connect(t, s2, bus.ClientConfig{})
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	m, err := other.RequestWithContext(ctx, "echo", []byte("back"))
	if err != nil {
		t.Fatalf("subscription not restored: %v", err)
	}
	if string(m.Data) != "back" {
		t.Fatalf("reply %q", m.Data)
	}
	if !h.has(slog.LevelWarn, "nats disconnected") && !h.has(slog.LevelInfo, "nats disconnected") {
		t.Errorf("no disconnect logged: %q", h.messages())
	}
	if !h.has(slog.LevelInfo, "nats reconnected") {
		t.Errorf("no reconnect logged: %q", h.messages())
	}
}

// TestClientPingInterval: a client pings its server every 5 s over the
// network (a link that stopped delivering is replaced within 15 s), but seldom in the same process, where no link can go stale
// and the pings would only wake an idle daemon.
func TestClientPingInterval(t *testing.T) {
	s := bustest.StartServer(t, bustest.WithoutJetStream())
	for _, c := range []struct {
		name string
		cfg  bus.ClientConfig
		want time.Duration
	}{
		{"network", bus.ClientConfig{}, 5 * time.Second},
		{"in process", bus.ClientConfig{InProcess: s}, 2 * time.Minute},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := bustest.Connect(t, s, c.cfg).Opts.PingInterval; got != c.want {
				t.Errorf("ping interval %s, want %s", got, c.want)
			}
		})
	}
}
