package protocol

// Tool names served by the gateway.
const (
	ToolExec    = "exec"
	ToolProcess = "process"
)

// Result statuses found in Details["status"].
const (
	StatusRunning         = "running"
	StatusCompleted       = "completed"
	StatusFailed          = "failed"
	StatusApprovalPending = "approval-pending"
)

// Content is one block of a tool result. execmesh only produces text blocks.
type Content struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// Details is the structured part of a tool result. Its keys follow
// OpenClaw's result shapes exactly, including which keys are present with a
// null value and which are absent, so it is kept as a JSON object rather
// than a struct.
type Details map[string]any

// Result is a tool result: {content:[{type:"text",text}], details:{status,…}}.
type Result struct {
	Content []Content `json:"content"`
	Details Details   `json:"details"`
}

// TextResult builds a result with a single text block.
func TextResult(text string, details Details) Result {
	if details == nil {
		details = Details{}
	}
	return Result{Content: []Content{{Type: "text", Text: text}}, Details: details}
}

// FailedResult is the result of a tool action that ran but failed for a
// reason the caller should read (unknown session, stdin not writable, …):
// details {status:"failed", error:text}.
func FailedResult(text string) Result {
	return TextResult(text, Details{"status": StatusFailed, "error": text})
}

// Text returns the concatenated text blocks of the result.
func (r Result) Text() string {
	if len(r.Content) == 1 {
		return r.Content[0].Text
	}
	var s string
	for _, c := range r.Content {
		s += c.Text
	}
	return s
}

// Status returns details.status, or "" when absent.
func (r Result) Status() string {
	s, _ := r.Details["status"].(string)
	return s
}

// SessionID returns details.sessionId, or "" when absent.
func (r Result) SessionID() string {
	s, _ := r.Details["sessionId"].(string)
	return s
}

// WorkdirUnavailableText is OpenClaw's text for a workdir that does not
// exist or is not a directory; the command is not run.
func WorkdirUnavailableText(workdir string) string {
	return `workdir "` + workdir + `" is unavailable or not a directory: command was not executed. ` +
		`workdir is treated as a literal path; shell expansions such as "~" are not applied. ` +
		`Use an existing directory, omit an explicit workdir to use the default cwd, or update the configured default cwd.`
}

// WorkdirUnavailableResult is the failed exec result for such a workdir,
// decided before anything was started (a runtime error, no exit code).
func WorkdirUnavailableResult(workdir string) Result {
	return TextResult(WorkdirUnavailableText(workdir), Details{
		"status": StatusFailed, "exitCode": nil, "exitSignal": nil,
		"failureKind": "runtime-error", "durationMs": 0, "aggregated": "",
		"timedOut": false, "cwd": workdir,
	})
}
