package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/config"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/bus/bustest"
	"github.com/execmesh/execmesh/internal/testutil"
	"github.com/execmesh/execmesh/protocol"
	"github.com/execmesh/execmesh/session"
)

// cgroupsUsable reports whether the session core can run in cgroup
// containment here, and why not.
func cgroupsUsable() (bool, string) {
	cfg := session.DefaultConfig()
	cfg.Containment = session.ContainmentCgroup
	m, err := session.NewManager(cfg)
	if err != nil {
		return false, err.Error()
	}
	_ = m.Close(context.Background())
	return true, ""
}

// escapeeRounds runs the escapee case rounds times through
// tg's tools: after other sessions, `setsid sleep & sleep` in the
// background, killed; the setsid sleep must be gone each time.
func escapeeRounds(t *testing.T, tg *testGateway, rounds int, extra map[string]any) {
	t.Helper()
	args := func(a map[string]any) map[string]any {
		for k, v := range extra {
			a[k] = v
		}
		return a
	}
	for round := range rounds {
		tg.invoke("exec", args(map[string]any{"command": "echo earlier " + strconv.Itoa(round)}), "")
		esc, fg := testutil.SleepToken(), testutil.SleepToken()
		res := tg.invoke("exec", args(map[string]any{"command": "setsid sleep " + esc + " >/dev/null 2>&1 & sleep " + fg, "background": true}), "")
		id := res.SessionID()
		if res.Status() != protocol.StatusRunning || id == "" {
			t.Fatalf("round %d: start: %s %q", round, res.Status(), res.Text())
		}
		var procs []testutil.Proc
		checkFor(t, 30*time.Second, func() error {
			if procs = append(testutil.ProcsWith(esc), testutil.ProcsWith(fg)...); len(procs) < 2 {
				return fmt.Errorf("%d of 2 processes up", len(procs))
			}
			return nil
		})
		if r := tg.invoke("process", map[string]any{"action": "kill", "sessionId": id}, ""); r.Status() != protocol.StatusCompleted {
			t.Fatalf("round %d: kill: %s %q", round, r.Status(), r.Text())
		}
		// The grace is 1 s; only a survivor stays longer.
		checkFor(t, 8*time.Second, func() error {
			if left := testutil.StillAlive(procs); len(left) > 0 {
				return fmt.Errorf("round %d: %v survive the kill", round, left)
			}
			return nil
		})
	}
}

// TestEscapeeHostGateway: host=gateway, 50 rounds in each containment.
func TestEscapeeHostGateway(t *testing.T) {
	for _, mode := range []string{session.ContainmentCgroup, session.ContainmentProcessGroup} {
		t.Run(mode, func(t *testing.T) {
			if ok, why := cgroupsUsable(); mode == session.ContainmentCgroup && !ok {
				t.Skipf("cgroup containment unavailable here: %s", why)
			}
			tg := startGateway(t, func(c *config.Config, _ *Options) { c.Tools.Exec.Containment = mode })
			if got := tg.g.local.Manager().Containment().Mode; got != mode {
				t.Fatalf("containment %s, want %s", got, mode)
			}
			escapeeRounds(t, tg, 50, nil)
		})
	}
}

// TestEscapeeHostNode: host=node, a real node agent over a real embedded
// NATS server, 50 rounds in each containment; GET /v1/nodes shows the
// node's containment.
func TestEscapeeHostNode(t *testing.T) {
	for _, mode := range []string{session.ContainmentCgroup, session.ContainmentProcessGroup} {
		t.Run(mode, func(t *testing.T) {
			if ok, why := cgroupsUsable(); mode == session.ContainmentCgroup && !ok {
				t.Skipf("cgroup containment unavailable here: %s", why)
			}
			env := startNodeGateway(t, nil, "", nil)
			cfg := testAgentConfig(t, env.srv, "alpha")
			cfg.Session.Containment = mode
			a := env.pairAgent(cfg)
			checkFor(t, 30*time.Second, func() error {
				if v := env.waitNode(a.ID(), "connected", ""); v.Containment != mode {
					return fmt.Errorf("GET /v1/nodes containment %q, want %q", v.Containment, mode)
				}
				return nil
			})
			escapeeRounds(t, env.testGateway, 50, map[string]any{"host": "node"})
			if mode == session.ContainmentProcessGroup {
				// The node's session core applies the limits the gateway
				// sends, and refuses those it cannot.
				status, perr := env.invokeErr("exec", map[string]any{"command": "true", "host": "node", "limits": map[string]any{"pidsMax": 10}}, "")
				if status != http.StatusBadRequest || !strings.Contains(perr.Message, "pidsMax needs the pids controller") || !strings.Contains(perr.Message, "process-group containment") {
					t.Errorf("host=node exec with limits: %d %+v", status, perr)
				}
			}
		})
	}
}

// TestEscapeeHostSandbox: host=sandbox, where the session's command is
// bwrap and everything it starts runs in the session's cgroup too (in
// process-group containment bwrap's --die-with-parent ends the sandbox).
func TestEscapeeHostSandbox(t *testing.T) {
	for _, mode := range []string{session.ContainmentCgroup, session.ContainmentProcessGroup} {
		t.Run(mode, func(t *testing.T) {
			if ok, why := cgroupsUsable(); mode == session.ContainmentCgroup && !ok {
				t.Skipf("cgroup containment unavailable here: %s", why)
			}
			tg := startSandboxGateway(t, func(c *config.Config) { c.Tools.Exec.Containment = mode })
			escapeeRounds(t, tg, 50, nil)
		})
	}
}

// TestHealthzContainment: /healthz says which containment runs.
func TestHealthzContainment(t *testing.T) {
	for _, mode := range []string{"", session.ContainmentProcessGroup} {
		tg := startGateway(t, func(c *config.Config, _ *Options) { c.Tools.Exec.Containment = mode })
		r := tg.do("GET", "/healthz", nil, nil)
		var h struct {
			OK          bool   `json:"ok"`
			Containment string `json:"containment"`
		}
		if err := json.Unmarshal(r.Raw, &h); err != nil || r.Status != http.StatusOK || !h.OK {
			t.Fatalf("healthz: %d %s", r.Status, r.Raw)
		}
		want := mode
		if mode == "" {
			want = tg.g.local.Manager().Containment().Mode
		}
		if h.Containment != want || (want != session.ContainmentCgroup && want != session.ContainmentProcessGroup) {
			t.Errorf("healthz containment %q, want %q (%s)", h.Containment, want, r.Raw)
		}
	}
}

// TestEffectiveLimits: config, agent and call combine; a call may only
// tighten.
func TestEffectiveLimits(t *testing.T) {
	cfg := config.Default()
	cfg.Tools.Exec.Limits = protocol.Limits{MemoryMax: 1 << 30, PidsMax: 100}
	cfg.Agents.List = []config.Agent{{ID: "big", Tools: config.AgentTools{Exec: config.AgentExec{Limits: &protocol.Limits{MemoryMax: 4 << 30, CPUMax: 2}}}}}
	for _, tc := range []struct {
		agent string
		call  *protocol.Limits
		want  protocol.Limits
		err   string
	}{
		{"main", nil, protocol.Limits{MemoryMax: 1 << 30, PidsMax: 100}, ""},
		{"big", nil, protocol.Limits{MemoryMax: 4 << 30, PidsMax: 100, CPUMax: 2}, ""},
		{"big", &protocol.Limits{MemoryMax: 2 << 30, CPUMax: 0.5}, protocol.Limits{MemoryMax: 2 << 30, PidsMax: 100, CPUMax: 0.5}, ""},
		{"main", &protocol.Limits{CPUMax: 1}, protocol.Limits{MemoryMax: 1 << 30, PidsMax: 100, CPUMax: 1}, ""},
		{"main", &protocol.Limits{MemoryMax: 2 << 30}, protocol.Limits{}, `exec parameter "limits.memoryMax" (2G) may only tighten the configured limit (1G)`},
		{"big", &protocol.Limits{CPUMax: 3}, protocol.Limits{}, `exec parameter "limits.cpuMax" (3 CPUs) may only tighten`},
	} {
		got, err := effectiveLimits(&cfg, tc.agent, tc.call)
		if tc.err != "" {
			if err == nil || !strings.HasPrefix(err.Error(), tc.err) {
				t.Errorf("%s %+v: %v, want %q", tc.agent, tc.call, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s %+v: %+v %v, want %+v", tc.agent, tc.call, got, err, tc.want)
		}
	}
}

// TestLimitsRefusedWithoutControllers: where the controllers are missing
// (process-group containment, or a cgroup subtree without them), start-up
// names the configured key and what is missing, and a call's limits are
// a 400 that runs nothing.
func TestLimitsRefusedWithoutControllers(t *testing.T) {
	cfg := config.Default()
	cfg.StateDir = t.TempDir()
	cfg.Tools.Exec.Containment = session.ContainmentProcessGroup
	cfg.Tools.Exec.Limits = protocol.Limits{PidsMax: 50}
	ns := bustest.StartServer(t)
	_, err := New(t.Context(), cfg, Options{Conn: bustest.Connect(t, ns, bus.ClientConfig{Name: "gateway"}), Server: ns,
		Cwd: t.TempDir(), Getenv: func(string) string { return "" }, LoginShellPath: func() string { return "" }})
	if err == nil || !strings.HasPrefix(err.Error(), "tools.exec.limits: resource limits are not available here: pidsMax needs the pids controller") {
		t.Fatalf("start-up with limits in process-group mode: %v", err)
	}
	tg := startGateway(t, func(c *config.Config, _ *Options) { c.Tools.Exec.Containment = session.ContainmentProcessGroup })
	tok := testutil.SleepToken()
	r := tg.invokeRaw("exec", map[string]any{"command": "sleep " + tok, "limits": map[string]any{"memoryMax": "256M"}}, "")
	if r.Status != http.StatusBadRequest || r.Error == nil || !strings.Contains(r.Error.Message, "memoryMax needs the memory controller") {
		t.Fatalf("exec with limits: %d %s", r.Status, r.Raw)
	}
	r = tg.invokeRaw("exec", map[string]any{"command": "true", "limits": map[string]any{"memory": "1G"}}, "")
	if r.Status != http.StatusBadRequest || !strings.Contains(string(r.Raw), `limits.memory`) {
		t.Fatalf("unknown limit: %d %s", r.Status, r.Raw)
	}
	if len(testutil.ProcsWith(tok)) != 0 {
		t.Fatal("the refused command ran")
	}
}
