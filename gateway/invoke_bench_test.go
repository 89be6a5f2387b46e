package gateway

import (
	"context"
	"testing"
	"time"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
	"github.com/execmesh/execmesh/config"
)

// BenchmarkInvokeExec is one foreground `exec echo hi` on the gateway's
// own host through InvokeJSON (the HTTP handler's work without HTTP): the
// gateway's cost on top of the session core's (session
// BenchmarkExecContainment) and a fork (session BenchmarkExecBare).
func BenchmarkInvokeExec(b *testing.B) {
	cfg := config.Default()
	cfg.StateDir = b.TempDir()
	cfg.Tools.Exec.Security = "full"
	cfg.Tools.Exec.Ask = "off"
	cwd := b.TempDir()
	srv := bustest.StartServer(b)
	g, err := New(b.Context(), cfg, Options{
		Conn:           bustest.Connect(b, srv, bus.ClientConfig{Name: "gateway"}),
		Server:         srv,
		Cwd:            cwd,
		Environ:        []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + cwd, "SHELL=/bin/sh", "LANG=C"},
		Getenv:         func(string) string { return "" },
		LoginShellPath: func() string { return "" },
	})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = g.Close(ctx)
	}()
	body := []byte(`{"tool":"exec","sessionKey":"agent:main:bench","args":{"command":"echo hi","host":"gateway"}}`)
	for b.Loop() {
		if _, status := g.InvokeJSON(b.Context(), body, ""); status != 200 {
			b.Fatalf("status %d", status)
		}
	}
}
