package session

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/execmesh/execmesh/internal/testutil"
	"github.com/execmesh/execmesh/protocol"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(runHelper(os.Getenv(helperEnv)))
	}
	goleak.VerifyTestMain(m)
}

// loadFixture decodes a conformance fixture into v.
func loadFixture(t *testing.T, name string, v any) {
	t.Helper()
	data, err := os.ReadFile(testutil.ConformanceFile(t, name))
	if err != nil {
		t.Fatalf("conformance fixtures missing (testdata/conformance at the module root): %v", err)
	}
	if err := json.Unmarshal(testutil.ApplyDeviations(data), v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

// waitLimit bounds every wait in the tests. It only matters when a test
// fails; it is generous because the tests share slow, loaded machines.
const waitLimit = 90 * time.Second

// testConfig is the default configuration with a short kill grace, which
// only matters for commands that ignore SIGTERM.
func testConfig() Config {
	cfg := DefaultConfig()
	cfg.KillGrace = time.Second
	cfg.DrainWait = 500 * time.Millisecond
	return cfg
}

// newManager starts a Manager that is closed when the test ends.
func newManager(t *testing.T, mutate func(*Config)) *Manager {
	t.Helper()
	cfg := testConfig()
	if mutate != nil {
		mutate(&cfg)
	}
	m, err := NewManager(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := m.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return m
}

// checkFor retries f until it succeeds or total passes, then fails the
// test with f's last error.
func checkFor(t *testing.T, total, interval time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(total)
	var err error
	for {
		if err = f(); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %v", total, err)
		}
		time.Sleep(interval)
	}
}

// mustExec runs Exec and fails the test on an error.
func mustExec(t *testing.T, m *Manager, req ExecRequest) protocol.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := m.Exec(ctx, req)
	if err != nil {
		t.Fatalf("Exec(%q): %v", req.Command, err)
	}
	return res
}

// startBackground runs req in the background and returns the session id.
func startBackground(t *testing.T, m *Manager, req ExecRequest) string {
	t.Helper()
	req.Background = true
	res := mustExec(t, m, req)
	if res.Status() != protocol.StatusRunning {
		t.Fatalf("Exec(%q) = %s %q, want running", req.Command, res.Status(), res.Text())
	}
	return res.SessionID()
}

// proc runs a process action with a generous context.
func proc(t *testing.T, m *Manager, scope string, args protocol.ProcessArgs) protocol.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return m.Process(ctx, scope, args)
}

// waitExited waits until a session has recorded its exit.
func waitExited(t *testing.T, m *Manager, id string) {
	t.Helper()
	s := m.anySession(id)
	if s == nil {
		t.Fatalf("session %s unknown", id)
	}
	select {
	case <-s.done:
	case <-time.After(waitLimit):
		t.Fatalf("session %s did not exit", id)
	}
}

// anySession finds a session by id whatever its scope or state (tests only).
func (m *Manager) anySession(id string) *session {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.sessions[id]; s != nil {
		return s
	}
	return m.removed[id]
}

// waitOutput waits until a session's retained output contains want.
func waitOutput(t *testing.T, m *Manager, id, want string) {
	t.Helper()
	s := m.anySession(id)
	if s == nil {
		t.Fatalf("session %s unknown", id)
	}
	checkFor(t, waitLimit, 5*time.Millisecond, func() error {
		s.mu.Lock()
		got := s.out.aggregated()
		s.mu.Unlock()
		if !strings.Contains(got, want) {
			return fmt.Errorf("output %q does not contain %q yet", got, want)
		}
		return nil
	})
}

// eventRecorder collects exit events and acknowledgements.
type eventRecorder struct {
	mu     sync.Mutex
	events []protocol.ExitEvent
	acks   []string
	ch     chan protocol.ExitEvent
}

func newEventRecorder() *eventRecorder {
	return &eventRecorder{ch: make(chan protocol.ExitEvent, 1000)}
}

func (r *eventRecorder) onExit(ev protocol.ExitEvent) {
	r.mu.Lock()
	r.events = append(r.events, ev)
	r.mu.Unlock()
	r.ch <- ev
}

func (r *eventRecorder) onAck(scope, id string) {
	r.mu.Lock()
	r.acks = append(r.acks, scope+"|"+id)
	r.mu.Unlock()
}

// next returns the next exit event.
func (r *eventRecorder) next(t *testing.T) protocol.ExitEvent {
	t.Helper()
	select {
	case ev := <-r.ch:
		return ev
	case <-time.After(waitLimit):
		t.Fatal("no exit event")
	}
	return protocol.ExitEvent{}
}

func ptr[T any](v T) *T { return &v }

// mkExecutable creates an executable file (and its directory).
func mkExecutable(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte("#!/bin/sh\n"), 0o755)
}
