// Package bustest starts real embedded NATS servers for tests of any
// execmesh package, so gateway, nodeagent and integration tests share one
// way to do it: loopback, a random port, JetStream on with its store in
// t.TempDir(), readiness awaited, and shutdown registered with t.Cleanup.
//
// Helpers take t, call t.Helper and fail the test with t.Fatalf; none
// panics or leaks a server.
package bustest

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/execmesh/execmesh/bus"
)

// startTimeout bounds server start and shutdown in tests.
const startTimeout = 30 * time.Second

// Option adjusts the server configuration before the server starts.
type Option func(*bus.ServerConfig)

// WithMaxPayload sets the server's max_payload.
func WithMaxPayload(n int) Option { return func(c *bus.ServerConfig) { c.MaxPayload = n } }

// WithListen sets the client address (default 127.0.0.1:-1, a random port).
func WithListen(addr string) Option { return func(c *bus.ServerConfig) { c.Listen = addr } }

// WithStoreDir sets the JetStream store, for tests that restart a server on
// the same data (default: a fresh t.TempDir()).
func WithStoreDir(dir string) Option { return func(c *bus.ServerConfig) { c.StoreDir = dir } }

// WithoutJetStream starts the server without JetStream.
func WithoutJetStream() Option { return func(c *bus.ServerConfig) { c.JetStream = false } }

// WithUsers adds user/password identities (the server then requires
// authentication).
func WithUsers(users ...bus.User) Option {
	return func(c *bus.ServerConfig) { c.Users = append(c.Users, users...) }
}

// WithNKeys adds nkey identities (the server then requires
// authentication).
func WithNKeys(nk ...bus.NKeyUser) Option {
	return func(c *bus.ServerConfig) { c.NKeys = append(c.NKeys, nk...) }
}

// WithLogger sends the server's log to l (default: discarded, since a
// log line written after the test ended would fail it).
func WithLogger(l *slog.Logger) Option { return func(c *bus.ServerConfig) { c.Logger = l } }

// WithConfig applies an arbitrary change.
func WithConfig(f func(*bus.ServerConfig)) Option { return Option(f) }

// StartServer starts an embedded server and shuts it down when the test
// ends.
func StartServer(t testing.TB, opts ...Option) *bus.Server {
	t.Helper()
	cfg := bus.ServerConfig{
		Listen:    "127.0.0.1:-1",
		StoreDir:  filepath.Join(t.TempDir(), "nats"),
		JetStream: true,
	}
	for _, o := range opts {
		o(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	s, err := bus.StartServer(ctx, cfg)
	if err != nil {
		t.Fatalf("bustest: start server: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("bustest: %v", err)
		}
	})
	return s
}

// Connect connects to s (by URL unless cfg names URLs or InProcess) and
// closes the connection when the test ends, before the server stops.
func Connect(t testing.TB, s *bus.Server, cfg bus.ClientConfig) *nats.Conn {
	t.Helper()
	if len(cfg.URLs) == 0 && cfg.InProcess == nil {
		cfg.URLs = []string{s.ClientURL()}
	}
	if cfg.Name == "" {
		cfg.Name = t.Name()
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	nc, err := bus.Connect(ctx, cfg, nil)
	if err != nil {
		t.Fatalf("bustest: connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// JetStream returns a JetStream context on nc.
func JetStream(t testing.TB, nc *nats.Conn) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("bustest: jetstream: %v", err)
	}
	return js
}

// FreePort returns a TCP port that was free a moment ago, for tests that
// must restart a server on the same address. Prefer port -1 everywhere
// else: another process can take the port in between.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("bustest: free port: %v", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		t.Fatalf("bustest: free port: %v", err)
	}
	return port
}

// CheckFor calls f every interval until it returns nil, and fails the test
// with f's last error when total has passed.
func CheckFor(t testing.TB, total, interval time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(total)
	var err error
	for {
		if err = f(); err == nil {
			return
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(interval)
	}
	t.Fatalf("bustest: condition not met after %s: %v", total, err)
}

// Listen returns "127.0.0.1:<port>".
func Listen(port int) string { return fmt.Sprintf("127.0.0.1:%d", port) }
