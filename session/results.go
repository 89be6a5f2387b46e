package session

import (
	"time"

	"github.com/execmesh/execmesh/protocol"
)

// Exec results, shaped exactly as OpenClaw's (conformance/results.json):
// which keys exist, and which are null, matters to agents.

// runningResult answers an exec that went to the background.
func (s *session) runningResult(warningText string) protocol.Result {
	s.mu.Lock()
	tail := s.out.tail()
	s.mu.Unlock()
	return s.runningResultWithTail(warningText, tail)
}

func (s *session) runningResultWithTail(warningText, tail string) protocol.Result {
	text := warningText + "Command still running (session " + s.id + ", pid " + itoa(s.pid) + "). " + followUpText
	return protocol.TextResult(text, protocol.Details{
		Status:    protocol.Some(protocol.StatusRunning),
		SessionID: protocol.Some(s.id),
		PID:       protocol.Some(s.pid),
		StartedAt: protocol.Some(s.startedAt.UnixMilli()),
		Cwd:       protocol.Some(s.cwd),
		Tail:      protocol.Some(tail),
		FollowUp:  protocol.Some(followUpText),
	})
}

// foregroundResult answers an exec whose command ended in the foreground.
func (s *session) foregroundResult(warningText string) protocol.Result {
	s.mu.Lock()
	r := s.res
	lost := s.out.lostOutput()
	s.mu.Unlock()
	note := ""
	if lost {
		note = RetentionCapNote
	}
	d := protocol.Details{
		Status:           protocol.Some(r.status),
		ExitCode:         protocol.SomeOrNull(r.code),
		ExitSignal:       nullIfEmpty(r.signal),
		DurationMs:       protocol.Some(r.durationMs),
		Aggregated:       protocol.Some(r.aggregated),
		NoOutputTimedOut: protocol.Some(false),
		Cwd:              protocol.Some(s.cwd),
		Usage:            protocol.Some(r.usage),
	}
	if r.status == protocol.StatusFailed {
		d.FailureKind = protocol.Some(r.failureKind)
		d.TimedOut = protocol.Some(r.timedOut)
		if r.reason != "" {
			d.ExitReason = protocol.Some(r.reason)
		}
	} else {
		d.ExitReason = protocol.Some(r.reason)
	}
	return protocol.TextResult(note+warningText+r.text, d)
}

// unavailableWorkdirResult answers an exec whose workdir is missing or not
// a directory; nothing was run.
func unavailableWorkdirResult(workdir, warningText string, startedAt time.Time) protocol.Result {
	return runtimeErrorResult(warningText, protocol.WorkdirUnavailableText(workdir), workdir, startedAt)
}

// runtimeErrorResult is OpenClaw's runtime-error outcome (spawn failures,
// invalid workdir): no exit code, no exit reason.
func runtimeErrorResult(warningText, reason, cwd string, startedAt time.Time) protocol.Result {
	return protocol.TextResult(warningText+reason, protocol.Details{
		Status:      protocol.Some(protocol.StatusFailed),
		ExitCode:    protocol.Null[int](),
		ExitSignal:  protocol.Null[string](),
		FailureKind: protocol.Some(failureRuntimeError),
		DurationMs:  protocol.Some(time.Since(startedAt).Milliseconds()),
		Aggregated:  protocol.Some(""),
		TimedOut:    protocol.Some(false),
		Cwd:         protocol.Some(cwd),
	})
}

// nullIfEmpty is null for "", else the string.
func nullIfEmpty(s string) protocol.Opt[string] {
	if s == "" {
		return protocol.Null[string]()
	}
	return protocol.Some(s)
}
