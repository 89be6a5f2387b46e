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
		"status":    protocol.StatusRunning,
		"sessionId": s.id,
		"pid":       s.pid,
		"startedAt": s.startedAt.UnixMilli(),
		"cwd":       s.cwd,
		"tail":      tail,
		"followUp":  followUpText,
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
	if r.status == protocol.StatusFailed {
		d := protocol.Details{
			"status":           protocol.StatusFailed,
			"exitCode":         intOrNil(r.code),
			"exitSignal":       stringOrNil(r.signal),
			"failureKind":      r.failureKind,
			"durationMs":       r.durationMs,
			"aggregated":       r.aggregated,
			"timedOut":         r.timedOut,
			"noOutputTimedOut": false,
			"cwd":              s.cwd,
			"usage":            r.usage,
		}
		if r.reason != "" {
			d["exitReason"] = r.reason
		}
		return protocol.TextResult(note+warningText+r.text, d)
	}
	return protocol.TextResult(note+warningText+r.text, protocol.Details{
		"status":           protocol.StatusCompleted,
		"exitCode":         intOrNil(r.code),
		"exitSignal":       stringOrNil(r.signal),
		"exitReason":       r.reason,
		"durationMs":       r.durationMs,
		"aggregated":       r.aggregated,
		"noOutputTimedOut": false,
		"cwd":              s.cwd,
		"usage":            r.usage,
	})
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
		"status":      protocol.StatusFailed,
		"exitCode":    nil,
		"exitSignal":  nil,
		"failureKind": failureRuntimeError,
		"durationMs":  time.Since(startedAt).Milliseconds(),
		"aggregated":  "",
		"timedOut":    false,
		"cwd":         cwd,
	})
}

func intOrNil(p *int) any {
	if p == nil {
		return nil
	}
	return *p
}

func stringOrNil(s string) any {
	if s == "" {
		return nil
	}
	return s
}
