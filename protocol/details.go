package protocol

import "encoding/json"

// Details is the structured part of a tool result. Its fields are the keys
// of OpenClaw's result shapes; each is an Opt, so which keys are present,
// and which of them are null, is part of the value as it is of OpenClaw's
// results (conformance/results.json). Fields are declared in the byte
// order of their JSON names, the order encoding/json gave the keys of the
// map this type replaced, so the JSON of a result is what it always was
// (details_test.go checks both).
//
// The zero value has no keys.
type Details struct {
	Added            Opt[[]string]  `json:"added,omitzero"`            // apply_patch
	Aggregated       Opt[string]    `json:"aggregated,omitzero"`       // the whole retained output
	ApprovalID       Opt[string]    `json:"approvalId,omitzero"`       // approval-pending
	ApprovalSlug     Opt[string]    `json:"approvalSlug,omitzero"`     // approval-pending
	Command          Opt[string]    `json:"command,omitzero"`          // list entries, approval-pending
	Cwd              Opt[string]    `json:"cwd,omitzero"`              // exec results, list entries
	Deleted          Opt[[]string]  `json:"deleted,omitzero"`          // apply_patch
	DurationMs       Opt[int64]     `json:"durationMs,omitzero"`       // finished exec
	EndedAt          Opt[int64]     `json:"endedAt,omitzero"`          // finished list entries, unix ms
	Error            Opt[string]    `json:"error,omitzero"`            // failed process actions
	ExitCode         Opt[int]       `json:"exitCode,omitzero"`         // null when there is none
	ExitReason       Opt[string]    `json:"exitReason,omitzero"`       // exit, signal, overall-timeout, manual-cancel, …
	ExitSignal       Opt[string]    `json:"exitSignal,omitzero"`       // null when there is none
	ExpiresAtMs      Opt[int64]     `json:"expiresAtMs,omitzero"`      // approval-pending
	FailureKind      Opt[string]    `json:"failureKind,omitzero"`      // failed exec
	FollowUp         Opt[string]    `json:"followUp,omitzero"`         // backgrounded exec
	Host             Opt[string]    `json:"host,omitzero"`             // approval-pending
	IdleMs           Opt[int64]     `json:"idleMs,omitzero"`           // running sessions
	LastOutputAt     Opt[int64]     `json:"lastOutputAt,omitzero"`     // running sessions, unix ms
	Limit            Opt[int]       `json:"limit,omitzero"`            // paged list
	Lost             Opt[bool]      `json:"lost,omitzero"`             // a node session whose node run ended
	Modified         Opt[[]string]  `json:"modified,omitzero"`         // apply_patch
	Moved            Opt[[]Move]    `json:"moved,omitzero"`            // apply_patch
	Name             Opt[string]    `json:"name,omitzero"`             // derived session name
	NextOffset       Opt[int]       `json:"nextOffset,omitzero"`       // paged list
	NoOutputTimedOut Opt[bool]      `json:"noOutputTimedOut,omitzero"` // exec results
	NodeID           Opt[string]    `json:"nodeId,omitzero"`           // node session list entries
	NodeName         Opt[string]    `json:"nodeName,omitzero"`         // node session list entries
	Offset           Opt[int]       `json:"offset,omitzero"`           // paged list
	Output           Opt[string]    `json:"output,omitzero"`           // log
	PID              Opt[int]       `json:"pid,omitzero"`              // running sessions
	RetryInMs        Opt[int]       `json:"retryInMs,omitzero"`        // poll of a running session
	RuntimeMs        Opt[int64]     `json:"runtimeMs,omitzero"`        // list entries
	SessionID        Opt[string]    `json:"sessionId,omitzero"`        //
	Sessions         Opt[[]Details] `json:"sessions,omitzero"`         // list
	StartedAt        Opt[int64]     `json:"startedAt,omitzero"`        // unix ms
	Status           Opt[string]    `json:"status,omitzero"`           // running, completed, failed, approval-pending
	StdinWritable    Opt[bool]      `json:"stdinWritable,omitzero"`    // running sessions
	Tail             Opt[string]    `json:"tail,omitzero"`             // the end of the output
	TimedOut         Opt[bool]      `json:"timedOut,omitzero"`         // exec results
	Total            Opt[int]       `json:"total,omitzero"`            // log lines; paged list size
	TotalChars       Opt[int]       `json:"totalChars,omitzero"`       // log
	TotalLines       Opt[int]       `json:"totalLines,omitzero"`       // log
	Truncated        Opt[bool]      `json:"truncated,omitzero"`        // output was cut by the retention cap
	Usage            Opt[Usage]     `json:"usage,omitzero"`            // execmesh: what the session's processes cost
	WaitingForInput  Opt[bool]      `json:"waitingForInput,omitzero"`  // running sessions
}

// Move is one file an apply_patch update moved.
type Move struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// String returns the details as JSON, for logs and test failures.
func (d Details) String() string {
	b, err := json.Marshal(d)
	if err != nil {
		return "details: " + err.Error()
	}
	return string(b)
}
