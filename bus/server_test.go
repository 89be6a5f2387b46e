package bus_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
)

func TestStartServerAndShutdown(t *testing.T) {
	ctx := t.Context()
	cfg := bus.DefaultServerConfig(t.TempDir())
	cfg.Listen = "127.0.0.1:-1"
	s, err := bus.StartServer(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	url := s.ClientURL()
	if !strings.HasPrefix(url, "nats://127.0.0.1:") {
		t.Fatalf("ClientURL = %q", url)
	}
	if !s.NATSServer().JetStreamEnabled() {
		t.Fatal("JetStream is off in the default config")
	}
	nc, err := bus.Connect(ctx, bus.ClientConfig{URLs: []string{url}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()

	// Shutdown is idempotent and safe from several goroutines.
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			if err := s.Shutdown(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.AddUser(bus.User{Name: "a", Password: "b"}); !errors.Is(err, bus.ErrServerClosed) {
		t.Fatalf("AddUser after shutdown: %v, want ErrServerClosed", err)
	}
	// The port is free again.
	l, err := net.Listen("tcp", strings.TrimPrefix(url, "nats://"))
	if err != nil {
		t.Fatalf("port still held after Shutdown: %v", err)
	}
	l.Close()
}

func TestStartServerConfigErrors(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		cfg  bus.ServerConfig
		want error
	}{
		{"port 0", bus.ServerConfig{Listen: "127.0.0.1:0"}, bus.ErrInvalidConfig},
		{"bad listen", bus.ServerConfig{Listen: "nonsense"}, bus.ErrInvalidConfig},
		{"jetstream without store", bus.ServerConfig{Listen: "127.0.0.1:-1", JetStream: true}, bus.ErrInvalidConfig},
		{"open beyond loopback", bus.ServerConfig{Listen: "0.0.0.0:-1"}, bus.ErrAuthRequired},
		{"open on every interface", bus.ServerConfig{Listen: ":-1"}, bus.ErrAuthRequired},
		{"bad nkey", bus.ServerConfig{Listen: "127.0.0.1:-1", NKeys: []bus.NKeyUser{{PublicKey: "UNOPE"}}}, bus.ErrInvalidConfig},
		{"user without password", bus.ServerConfig{Listen: "127.0.0.1:-1", Users: []bus.User{{Name: "gw"}}}, bus.ErrInvalidConfig},
		{"cluster without name", bus.ServerConfig{Listen: "127.0.0.1:-1", Cluster: &bus.ClusterConfig{Listen: "127.0.0.1:-1"}}, bus.ErrInvalidConfig},
		{"open cluster beyond loopback", bus.ServerConfig{Listen: "127.0.0.1:-1", Cluster: &bus.ClusterConfig{Name: "c", Listen: "0.0.0.0:-1"}}, bus.ErrAuthRequired},
		{"clustered jetstream without name", bus.ServerConfig{Listen: "127.0.0.1:-1", JetStream: true, StoreDir: dir, Cluster: &bus.ClusterConfig{Name: "c", Listen: "127.0.0.1:-1"}}, bus.ErrInvalidConfig},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := bus.StartServer(t.Context(), tt.cfg)
			if err == nil {
				s.Shutdown(t.Context())
				t.Fatal("started")
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestStartServerAuthBeyondLoopback(t *testing.T) {
	s := bustest.StartServer(t, bustest.WithListen("0.0.0.0:-1"),
		bustest.WithUsers(bus.User{Name: "gw", Password: "secret"}))
	// A loopback URL even though the server listens everywhere.
	if url := s.ClientURL(); !strings.HasPrefix(url, "nats://127.0.0.1:") {
		t.Fatalf("ClientURL = %q", url)
	}
	bustest.Connect(t, s, bus.ClientConfig{User: "gw", Password: "secret"})

	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	_, err := bus.Connect(ctx, bus.ClientConfig{URLs: []string{s.ClientURL()}}, nil)
	if !errors.Is(err, bus.ErrNotConnected) || !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("anonymous connect: %v, want ErrNotConnected wrapping ErrAuthorization", err)
	}
}

func TestStartServerPortInUseFailsFast(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	start := time.Now()
	s, err := bus.StartServer(t.Context(), bus.ServerConfig{Listen: l.Addr().String()})
	if err == nil {
		s.Shutdown(t.Context())
		t.Fatal("started on a used port")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %s to report %v", d, err)
	}
	if !strings.Contains(err.Error(), "listen") {
		t.Fatalf("err = %v, want the listen error", err)
	}
}

func TestStartServerContextBoundsWait(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	s, err := bus.StartServer(ctx, bus.ServerConfig{Listen: "127.0.0.1:-1"})
	if err == nil {
		// Readiness may already have been reached; that is fine too.
		s.Shutdown(t.Context())
		return
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
}

// TestServerLogsGoToSlog: nats-server's logs reach slog; its start-up
// banner at debug level, the one ready line at info (TestStartupBannerAtDebug).
func TestServerLogsGoToSlog(t *testing.T) {
	h := &recordHandler{}
	bustest.StartServer(t, bustest.WithLogger(slog.New(h)))
	if !h.has(slog.LevelDebug, "Server is ready") || !h.has(slog.LevelInfo, "nats server ready") {
		t.Fatalf("no 'Server is ready' debug record and 'nats server ready' info record among %d records", len(h.messages()))
	}
}

func TestDontListenInProcessOnly(t *testing.T) {
	s := bustest.StartServer(t, bustest.WithConfig(func(c *bus.ServerConfig) { c.DontListen = true }))
	if url := s.ClientURL(); url != "" {
		t.Fatalf("ClientURL = %q with DontListen", url)
	}
	nc := bustest.Connect(t, s, bus.ClientConfig{InProcess: s})
	roundTrip(t, nc, nc)
}

// recordHandler keeps every record's level and message.
type recordHandler struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.recs = append(h.recs, r)
	h.mu.Unlock()
	return nil
}
func (h *recordHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordHandler) WithGroup(string) slog.Handler      { return h }

func (h *recordHandler) messages() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]string, len(h.recs))
	for i, r := range h.recs {
		out[i] = r.Message
	}
	return out
}

func (h *recordHandler) has(level slog.Level, substr string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.recs {
		if r.Level == level && strings.Contains(r.Message, substr) {
			return true
		}
	}
	return false
}

// roundTrip checks that a request from req reaches a responder on resp.
func roundTrip(t *testing.T, req, resp *nats.Conn) {
	t.Helper()
	subject := "rt." + strings.ReplaceAll(filepath.Base(t.Name()), "/", "_")
	sub, err := resp.Subscribe(subject, func(m *nats.Msg) { m.Respond(append([]byte("re:"), m.Data...)) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := resp.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	m, err := req.RequestWithContext(ctx, subject, []byte("hi"))
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Data) != "re:hi" {
		t.Fatalf("reply %q", m.Data)
	}
}

func slogger(h slog.Handler) *slog.Logger { return slog.New(h) }

func slogTextHandler(w io.Writer) slog.Handler { return slog.NewTextHandler(w, nil) }
