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

// Result is a tool result: {content:[{type:"text",text}], details:{status,…}}.
type Result struct {
	Content []Content `json:"content"`
	Details Details   `json:"details"`
}

// TextResult builds a result with a single text block.
func TextResult(text string, details Details) Result {
	return Result{Content: []Content{{Type: "text", Text: text}}, Details: details}
}

// FailedResult is the result of a tool action that ran but failed for a
// reason the caller should read (unknown session, stdin not writable, …):
// details {status:"failed", error:text}.
func FailedResult(text string) Result {
	return TextResult(text, Details{Status: Some(StatusFailed), Error: Some(text)})
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
func (r Result) Status() string { return r.Details.Status.Value() }

// SessionID returns details.sessionId, or "" when absent.
func (r Result) SessionID() string { return r.Details.SessionID.Value() }

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
		Status: Some(StatusFailed), ExitCode: Null[int](), ExitSignal: Null[string](),
		FailureKind: Some("runtime-error"), DurationMs: Some[int64](0), Aggregated: Some(""),
		TimedOut: Some(false), Cwd: Some(workdir),
	})
}
