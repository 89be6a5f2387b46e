package session

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/execmesh/execmesh/protocol"
)

func TestExitEvents(t *testing.T) {
	t.Parallel()
	rec := newEventRecorder()
	m := newManager(t, func(c *Config) { c.OnExit = rec.onExit; c.OnAcknowledged = rec.onAck })
	const scope = "agent:main:main"

	hooked := make(chan protocol.ExitEvent, 1)
	id := startBackground(t, m, ExecRequest{Command: "echo hello", ScopeKey: scope, OnExitHook: func(ev protocol.ExitEvent) { hooked <- ev }})
	ev := rec.next(t)
	if ev.SessionID != id || ev.SessionKey != scope || ev.Command != "echo hello" || ev.Status != "completed" ||
		ev.ExitCode == nil || *ev.ExitCode != 0 || ev.ExitReason != "exit" || ev.Tail != "hello\n" || !ev.Notify ||
		ev.Text != "Exec completed ("+id+", code 0) :: hello" || ev.EndedAt < ev.StartedAt {
		t.Errorf("event: %+v", ev)
	}
	select {
	case h := <-hooked:
		if h.Text != ev.Text {
			t.Errorf("hook got %+v", h)
		}
	case <-time.After(waitLimit):
		t.Fatal("OnExitHook not called")
	}

	// Quiet success and NotifyOff: an event, but nothing to notify.
	startBackground(t, m, ExecRequest{Command: "true", ScopeKey: scope})
	if ev := rec.next(t); ev.Notify || ev.Text != "" {
		t.Errorf("quiet success: %+v", ev)
	}
	startBackground(t, m, ExecRequest{Command: "echo loud", ScopeKey: scope, NotifyOff: true})
	if ev := rec.next(t); ev.Notify {
		t.Errorf("NotifyOff: %+v", ev)
	}
	// No scope, no notification target.
	startBackground(t, m, ExecRequest{Command: "echo x"})
	if ev := rec.next(t); ev.Notify {
		t.Errorf("no scope: %+v", ev)
	}
	// Foreground runs send no event at all.
	mustExec(t, m, ExecRequest{Command: "echo fg", ScopeKey: scope})
	select {
	case ev := <-rec.ch:
		t.Errorf("event for a foreground run: %+v", ev)
	case <-time.After(100 * time.Millisecond):
	}

	// The first terminal poll acknowledges, once.
	proc(t, m, scope, protocol.ProcessArgs{Action: "poll", SessionID: id})
	proc(t, m, scope, protocol.ProcessArgs{Action: "poll", SessionID: id})
	rec.mu.Lock()
	acks := append([]string(nil), rec.acks...)
	rec.mu.Unlock()
	if len(acks) != 1 || acks[0] != scope+"|"+id {
		t.Errorf("acks = %v", acks)
	}
}

func TestNotifyOnExitEmptySuccess(t *testing.T) {
	t.Parallel()
	rec := newEventRecorder()
	m := newManager(t, func(c *Config) { c.OnExit = rec.onExit; c.NotifyOnExitEmptySuccess = true })
	id := startBackground(t, m, ExecRequest{Command: "true", ScopeKey: "k"})
	if ev := rec.next(t); !ev.Notify || ev.Text != "Exec completed ("+id+", code 0)" {
		t.Errorf("event: %+v", ev)
	}
	m2 := newManager(t, func(c *Config) { c.OnExit = rec.onExit; c.NotifyOnExit = false })
	startBackground(t, m2, ExecRequest{Command: "echo x", ScopeKey: "k"})
	if ev := rec.next(t); ev.Notify {
		t.Errorf("NotifyOnExit off: %+v", ev)
	}
}

// TestAcknowledgementFollowsEvent: a poll that delivers the terminal status
// while the exit event is being delivered is acknowledged after it, and
// OnExit may call back into the Manager.
func TestAcknowledgementFollowsEvent(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	delivering := make(chan struct{}, 1)
	delivered := make(chan protocol.ExitEvent, 1)
	acked := make(chan string, 1)
	m := newManager(t, func(c *Config) {
		c.OnExit = func(ev protocol.ExitEvent) { delivering <- struct{}{}; <-release; delivered <- ev }
		c.OnAcknowledged = func(scope, id string) { acked <- id }
	})
	id := startBackground(t, m, ExecRequest{Command: "echo hi", ScopeKey: "k"})
	waitExited(t, m, id)
	// The event is computed after done closes: a poll before that would
	// deliver the terminal status first, and rightly leave the event
	// without a notification. The case here is the poll during the
	// delivery.
	select {
	case <-delivering:
	case <-time.After(waitLimit):
		t.Fatal("the exit event was not delivered")
	}
	// The poll's answer waits for the event and the acknowledgement, so a
	// caller that reads its events after the poll never sees the
	// notification; the acknowledgement follows the event.
	answered := make(chan protocol.Result, 1)
	go func() { answered <- proc(t, m, "k", protocol.ProcessArgs{Action: "poll", SessionID: id}) }()
	select {
	case <-acked:
		t.Fatal("acknowledged before the exit event was delivered")
	case <-answered:
		t.Fatal("the poll answered before the exit event and its acknowledgement")
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	ev := <-delivered
	if got := <-acked; got != id {
		t.Errorf("ack for %s", got)
	}
	if r := <-answered; r.Status() != "completed" {
		t.Errorf("poll: %s", r.Status())
	}
	if !ev.Notify {
		t.Errorf("the event was computed before the poll, so it notifies: %+v", ev)
	}
}

// TestNoNotifyAfterTerminalPoll: when a poll delivered the terminal status
// first, the event is still sent, with Notify false.
func TestNoNotifyAfterTerminalPoll(t *testing.T) {
	rec := newEventRecorder()
	m := newManager(t, func(c *Config) { c.OnExit = rec.onExit })
	code := 0
	s := &session{m: m, id: "calm-cove", command: "echo x", scopeKey: "k", notify: true, startedAt: time.Now(),
		out: newOutputBuffer(1000, 1000), done: make(chan struct{}), termDone: make(chan struct{}), eventDone: make(chan struct{})}
	s.out.add(streamStdout, "x\n")
	s.exited, s.backgrounded, s.terminalPolled = true, true, true
	s.res = exitResult{status: "completed", code: &code, reason: reasonExit}
	m.emitExit(s)
	if ev := rec.next(t); ev.Notify || ev.SessionID != "calm-cove" {
		t.Errorf("event: %+v", ev)
	}
}

// TestNotifyLiveRuns replays notify_text.json's live runs: real background
// commands and the event each one produced.
func TestNotifyLiveRuns(t *testing.T) {
	t.Parallel()
	var fx struct {
		LiveRuns []struct {
			Command        string   `json:"command"`
			TimeoutSeconds *float64 `json:"timeoutSeconds"`
			Killed         bool     `json:"killedWithProcessKill"`
			Status         string   `json:"status"`
			ExitCode       *int     `json:"exitCode"`
			ExitSignal     *string  `json:"exitSignal"`
			ExitReason     string   `json:"exitReason"`
			Text           *string  `json:"text"`
		}
	}
	loadFixture(t, "notify_text.json", &fx)
	for _, run := range fx.LiveRuns {
		t.Run(run.Command, func(t *testing.T) {
			t.Parallel()
			rec := newEventRecorder()
			m := newManager(t, func(c *Config) { c.OnExit = rec.onExit })
			const scope = "agent:main:main"
			id := startBackground(t, m, ExecRequest{Command: run.Command, ScopeKey: scope, TimeoutSec: run.TimeoutSeconds})
			if run.Killed {
				waitOutput(t, m, id, "killed")
				proc(t, m, scope, protocol.ProcessArgs{Action: "kill", SessionID: id})
			}
			ev := rec.next(t)
			status := run.Status
			if run.Killed {
				status = "completed" // DESIGN.md §7: a requested stop ends completed
			}
			signal := ""
			if run.ExitSignal != nil {
				signal = *run.ExitSignal
			}
			if ev.Status != status || ev.ExitReason != run.ExitReason || ev.ExitSignal != signal ||
				(run.ExitCode == nil) != (ev.ExitCode == nil) || (run.ExitCode != nil && *run.ExitCode != *ev.ExitCode) {
				t.Errorf("event %+v, want %+v", ev, run)
			}
			want := ""
			if run.Text != nil {
				want = strings.ReplaceAll(*run.Text, "<sid>", id) // the whole id (testutil.Deviations)
			}
			if ev.Text != want || ev.Notify != (want != "") {
				t.Errorf("text %q (notify %v), want %q", ev.Text, ev.Notify, want)
			}
		})
	}
}

func TestExitEventJSON(t *testing.T) {
	code := 2
	ev := protocol.ExitEvent{SessionID: "a-b", Status: "completed", ExitCode: &code}
	b, err := json.Marshal(ev)
	if err != nil || !strings.Contains(string(b), `"exitCode":2`) {
		t.Errorf("%s %v", b, err)
	}
}

// TestOnExitMayCallBack: OnExit runs under no lock, so it may use the
// Manager, even for the session that ended.
func TestOnExitMayCallBack(t *testing.T) {
	t.Parallel()
	var m *Manager
	got := make(chan protocol.Result, 1)
	acked := make(chan string, 1)
	m = newManager(t, func(c *Config) {
		c.OnExit = func(ev protocol.ExitEvent) {
			got <- m.Process(context.Background(), ev.SessionKey, protocol.ProcessArgs{Action: "poll", SessionID: ev.SessionID})
		}
		c.OnAcknowledged = func(scope, id string) { acked <- id }
	})
	id := startBackground(t, m, ExecRequest{Command: "echo hi", ScopeKey: "k"})
	select {
	case r := <-got:
		if r.Status() != "completed" || r.Text() != "hi\n\nProcess exited with code 0." {
			t.Errorf("poll from OnExit: %s %q", r.Status(), r.Text())
		}
	case <-time.After(waitLimit):
		t.Fatal("OnExit did not return: deadlock?")
	}
	if a := <-acked; a != id {
		t.Errorf("ack %s", a)
	}
}
