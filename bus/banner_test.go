package bus_test

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/internal/testutil"
)

// TestStartupBannerAtDebug: nats-server's start-up banner (version, name,
// JetStream limits, "Server is ready") is logged at debug level; at info a
// start shows one line of its own.
func TestStartupBannerAtDebug(t *testing.T) {
	for _, level := range []slog.Level{slog.LevelInfo, slog.LevelDebug} {
		var logs testutil.SyncBuffer
		cfg := bus.DefaultServerConfig(t.TempDir())
		cfg.Listen = "127.0.0.1:-1"
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: level}))
		s, err := bus.StartServer(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		s.Shutdown(t.Context())
		out := logs.String()
		banner := []string{"Starting nats-server", "Version:", "JETSTREAM", "Listening for client connections", "Server is ready"}
		for _, line := range banner {
			if shown := strings.Contains(out, line); shown != (level == slog.LevelDebug) {
				t.Errorf("level %v: %q shown = %v\n%s", level, line, shown, out)
			}
		}
		if !strings.Contains(out, "nats server ready") {
			t.Errorf("level %v: no ready line\n%s", level, out)
		}
		if level == slog.LevelInfo {
			start, _, _ := strings.Cut(out, "nats server ready")
			if n := strings.Count(start, "level=INFO"); n != 1 {
				t.Errorf("%d info lines for a start, want 1:\n%s", n, out)
			}
		}
	}
}

// TestListenAddrAndInProcessServer: the server tells its real listen
// address (0.0.0.0:P is every interface, not 127.0.0.1), and an in-process
// connection is described by it rather than by nats.go's default URL.
func TestListenAddrAndInProcessServer(t *testing.T) {
	for _, tt := range []struct {
		listen   string
		prefix   string
		loopback bool
	}{{"127.0.0.1:-1", "127.0.0.1:", true}, {"0.0.0.0:-1", "0.0.0.0:", false}} {
		cfg := bus.DefaultServerConfig(t.TempDir())
		cfg.Listen = tt.listen
		if !tt.loopback {
			cfg.Users = []bus.User{{Name: "gw", Password: "pw"}}
		}
		s, err := bus.StartServer(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		addr := s.ListenAddr()
		if !strings.HasPrefix(addr, tt.prefix) || s.ListensOnLoopback() != tt.loopback {
			t.Errorf("%s: ListenAddr %q, loopback %v", tt.listen, addr, s.ListensOnLoopback())
		}
		cc := bus.ClientConfig{InProcess: s}
		if !tt.loopback {
			cc.User, cc.Password = "gw", "pw"
		}
		nc, err := bus.Connect(t.Context(), cc, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := bus.ConnectedServer(nc); !strings.HasPrefix(got, "in-process, embedded server on "+addr+" (") {
			t.Errorf("%s: ConnectedServer = %q", tt.listen, got)
		}
		nc.Close()
		s.Shutdown(t.Context())
	}
}
