package protocol

// System event kinds (DESIGN.md §7).
const (
	EventExecExit     = "exec.exit"     // notify on exit of a backgrounded session
	EventExecDenied   = "exec.denied"   // approval-gated run denied
	EventExecRunning  = "exec.running"  // approval-gated run still running after the notice delay
	EventExecFinished = "exec.finished" // approval-gated run finished
	EventExecLost     = "exec.lost"     // a session went with its host (restart, crash, rejection)
)

// SystemEvent is one queued system event for a sessionKey, as served by
// GET /v1/events.
type SystemEvent struct {
	ID         string `json:"id"`
	TS         int64  `json:"ts"` // unix milliseconds
	SessionKey string `json:"sessionKey"`
	ContextKey string `json:"contextKey"`
	Kind       string `json:"kind"`
	Text       string `json:"text"`
}

// ExitEvent describes the exit of a backgrounded session. The session core
// emits exactly one per backgrounded session; node agents publish them to
// JetStream for the gateway.
type ExitEvent struct {
	SessionID  string `json:"sessionId"`
	SessionKey string `json:"sessionKey"` // notify target (scope) of the session
	NodeID     string `json:"nodeId,omitempty"`
	Command    string `json:"command"`
	Status     string `json:"status"` // completed or failed
	ExitCode   *int   `json:"exitCode"`
	ExitSignal string `json:"exitSignal,omitempty"`
	ExitReason string `json:"exitReason"` // exit, signal, overall-timeout, manual-cancel, spawn-error
	Tail       string `json:"tail"`       // last 2000 chars of retained output
	StartedAt  int64  `json:"startedAt"`  // unix ms
	EndedAt    int64  `json:"endedAt"`    // unix ms
	// Usage is what the session's processes cost (details.usage).
	Usage *Usage `json:"usage,omitempty"`
	// Notify is true when the exit should become an exec.exit system event
	// (notifyOnExit on, not suppressed by a terminal poll, not a kill, not a
	// silent success unless notifyOnExitEmptySuccess). Text is then its text.
	Notify bool   `json:"notify"`
	Text   string `json:"text,omitempty"`
	// RunID is set on the exit of an approval-gated node run: the
	// approval id the gateway sent with the approved start, so the
	// gateway can send that run's Exec finished event.
	RunID string `json:"runId,omitempty"`
	// Instance is the run of the host that held the session.
	Instance string `json:"instance,omitempty"`
	// Lost, when set, says the session did not exit but was lost with an
	// earlier run of its host (a crash): what is known of it. Its
	// processes were ended when the host started again.
	Lost string `json:"lost,omitempty"`
}
