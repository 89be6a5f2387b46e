package mcpserver

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/execmesh/execmesh/protocol"
)

// connect serves srv on an in-memory transport and returns a connected
// client session, closed at the end of the test.
func connect(t *testing.T, srv *mcp.Server, sink logSink) *mcp.ClientSession {
	t.Helper()
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(t.Context(), st, nil)
	if err != nil {
		t.Fatalf("server Connect: %v", err)
	}
	cs, err := newClient(sink).Connect(t.Context(), ct, nil)
	if err != nil {
		t.Fatalf("client Connect: %v", err)
	}
	t.Cleanup(func() {
		cs.Close()
		ss.Wait()
	})
	return cs
}

func TestInMemoryEmbedded(t *testing.T) {
	t.Parallel()
	emb := startEmbedded(t)
	sink := make(logSink, 16)
	cs := connect(t, New(emb.Invoker(""), Options{Version: "test", StructuredContent: true}), sink)
	if v := cs.InitializeResult().ProtocolVersion; v >= "2026-07-28" {
		t.Errorf("negotiated %s: want an initialize-handshake version", v)
	}
	exerciseTools(t, cs, sink)
}

// fakeInvoker counts the event long polls in flight and can inject events.
type fakeInvoker struct {
	active atomic.Int32
	events chan protocol.SystemEvent
}

func (f *fakeInvoker) Invoke(ctx context.Context, tool string, args json.RawMessage) (protocol.Result, error) {
	return protocol.TextResult("ok", protocol.Details{Status: protocol.Some("completed")}), nil
}

func (f *fakeInvoker) Follow(ctx context.Context, wait time.Duration, send func(protocol.SystemEvent) error) error {
	f.active.Add(1)
	defer f.active.Add(-1)
	for {
		select {
		case ev := <-f.events:
			if err := send(ev); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func TestEventForwardingEndsWithSession(t *testing.T) {
	t.Parallel()
	inv := &fakeInvoker{events: make(chan protocol.SystemEvent, 1)}
	sink := make(logSink, 4)
	st, ct := mcp.NewInMemoryTransports()
	srv := New(inv, Options{})
	ss, err := srv.Connect(t.Context(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := newClient(sink).Connect(t.Context(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	takeLogs(t, cs)
	inv.events <- protocol.SystemEvent{ID: "e1", Kind: protocol.EventExecExit, Text: "Exec completed (abcdefgh, code 0) :: hi"}
	sink.wait(t, "abcdefgh", 5*time.Second)
	waitFor(t, func() bool { return inv.active.Load() == 1 }, "a long poll in flight")
	cs.Close()
	ss.Wait()
	waitFor(t, func() bool { return inv.active.Load() == 0 }, "the long poll to end with the session")
}

func TestDisableEvents(t *testing.T) {
	t.Parallel()
	inv := &fakeInvoker{events: make(chan protocol.SystemEvent, 1)}
	cs := connect(t, New(inv, Options{DisableEvents: true}), make(logSink, 1))
	if res := call(t, cs, "exec", map[string]any{"command": "true"}); text(res) != "ok" {
		t.Fatalf("call: %q", text(res))
	}
	if n := inv.active.Load(); n != 0 {
		t.Errorf("%d event polls with events disabled", n)
	}
}

// waitFor polls cond until it holds or 5 s pass.
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// blockingReader blocks until released; it is not an io.Closer.
type blockingReader struct{ release chan struct{} }

func (r blockingReader) Read([]byte) (int, error) {
	<-r.release
	return 0, io.EOF
}

func TestServeStdioCancel(t *testing.T) {
	t.Parallel()
	pr, pw := io.Pipe()
	blocked := blockingReader{make(chan struct{})}
	t.Cleanup(func() { pw.Close(); close(blocked.release) })
	for name, r := range map[string]io.Reader{"closer": pr, "not closer": blocked} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			go func() { done <- ServeStdio(ctx, &fakeInvoker{}, Options{}, r, io.Discard) }()
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("ServeStdio after cancel: %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("ServeStdio did not return after cancel")
			}
		})
	}
}

// TestApplyPatchOffered: apply_patch is listed only where Options.ApplyPatch
// says the gateway serves it (tools.exec.applyPatch.enabled), and a call
// applies the patch.
func TestApplyPatchOffered(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := testConfig(dir)
	cfg.Tools.Exec.ApplyPatch.Enabled = true
	emb, err := NewEmbedded(t.Context(), cfg, testGatewayOptions(dir))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { emb.Close(context.Background()) })

	names := func(cs *mcp.ClientSession) []string {
		res, err := cs.ListTools(t.Context(), nil)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, tool := range res.Tools {
			out = append(out, tool.Name)
		}
		return out
	}
	for _, tt := range []struct {
		offer func() bool
		want  string
	}{{nil, "[exec process]"}, {func() bool { return false }, "[exec process]"}, {func() bool { return true }, "[apply_patch exec process]"}} {
		cs := connect(t, New(emb.Invoker(""), Options{Version: "test", ApplyPatch: tt.offer, DisableEvents: true}), make(logSink, 1))
		got := names(cs)
		slices.Sort(got)
		if fmt.Sprint(got) != tt.want {
			t.Errorf("tools %v, want %s", got, tt.want)
		}
	}

	cs := connect(t, New(emb.Invoker(""), Options{Version: "test", ApplyPatch: func() bool { return true }, DisableEvents: true}), make(logSink, 1))
	patch := "*** Begin Patch\n*** Add File: hello.txt\n+hello from mcp\n*** End Patch\n"
	// No workdir: the agent's workspace (tools.exec.applyPatch.workspaceOnly).
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "apply_patch", Arguments: map[string]any{"input": patch}})
	if err != nil || res.IsError {
		t.Fatalf("apply_patch: %v %+v", err, res)
	}
	if b, err := os.ReadFile(filepath.Join(emb.Gateway.Config().Sandbox.Workspace, "main", "hello.txt")); err != nil || string(b) != "hello from mcp\n" {
		t.Fatalf("patched file: %q %v", b, err)
	}
}
