package session

import (
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Texts agents see. They are OpenClaw's, byte for byte (conformance/*.json),
// but for the deviations internal/testutil.Deviations lists (the product's
// name in backgroundHint).
const (
	followUpText = "Use process (list/poll/log/write/send-keys/submit/paste/kill/clear/remove) for follow-up."

	noOutputPlaceholder = "(no output)"

	timeoutRetryGuidance = "The command was terminated, but external side effects may already have completed. " +
		"Verify the resulting state before retrying. Do not automatically rerun non-idempotent commands. " +
		"Use a higher timeout only when the command is known to be safe to retry."

	backgroundHint = "If it should keep running, start it with exec background=true or yieldMs so execmesh can " +
		"register a pollable process session. Do not rely on shell backgrounding with a trailing &."

	pollDroppedNote = "[earlier output is omitted from this poll; use action=log with offset and limit to inspect retained output]\n\n"

	emptyListText = "No running or recent sessions."
)

// Texts of process log that readers of the log (the gateway's session
// stream) need to recognise.
const (
	// RetentionCapNote starts the log (and poll) text once output was
	// discarded at the retention cap.
	RetentionCapNote = "[earlier output was discarded at the retention cap and cannot be recovered]\n\n"
	// LogNoOutputYet is the log text of a running session without output.
	LogNoOutputYet = "(no output yet)"
	// InputWaitHintPrefix begins the hint the log appends while a running
	// session seems to wait for input; the idle time after it changes.
	InputWaitHintPrefix = "\n\nNo new output for "
)

// Exit reasons (ExitEvent.ExitReason, details.exitReason).
const (
	reasonExit          = "exit"
	reasonSignal        = "signal"
	reasonTimeout       = "overall-timeout"
	reasonNoOutput      = "no-output-timeout"
	reasonManualCancel  = "manual-cancel"
	reasonOOM           = "oom" // the kernel's OOM killer ended a process of the session's cgroup
	failureNotFound     = "shell-command-not-found"
	failureNotExec      = "shell-not-executable"
	failureSignal       = "signal"
	failureAborted      = "aborted"
	failureRuntimeError = "runtime-error"
)

// exitLabel renders how a process ended: "signal SIGTERM", "code 3" or
// "unknown exit code" (renderExecExitLabel).
func exitLabel(code *int, signal string) string {
	if signal != "" {
		return "signal " + signal
	}
	if code != nil {
		return "code " + strconv.Itoa(*code)
	}
	return "unknown exit code"
}

// isTimeoutReason reports whether an exit reason is a supervisor timeout.
func isTimeoutReason(reason string) bool {
	return reason == reasonTimeout || reason == reasonNoOutput
}

// appendTimeoutGuidance adds the retry guidance to texts about timed-out
// runs and leaves every other text alone.
func appendTimeoutGuidance(text, reason string) string {
	if !isTimeoutReason(reason) {
		return text
	}
	return text + "\n\n" + timeoutRetryGuidance
}

// formatSeconds prints a timeout the way JavaScript prints a number.
func formatSeconds(sec float64) string {
	return strconv.FormatFloat(sec, 'f', -1, 64)
}

// inputWaitHint is appended to poll and log texts of a session that looks
// like it waits for input.
func inputWaitHint(idleMs int64) string {
	d, ok := compactDuration(float64(idleMs))
	if !ok {
		d = strconv.FormatInt(idleMs, 10) + "ms"
	}
	return InputWaitHintPrefix + d + "; this session may be waiting for input. Use process write, send-keys, submit, or paste to provide input."
}

// NotifyText is the text of the exec.exit system event for a backgrounded
// session that ended, as OpenClaw words it but for the id:
//
//	Exec <status> (<session id>, <code N|signal SIG|unknown exit code>) :: <output>
//
// The id is whole (DESIGN.md §3.5): OpenClaw cuts its random ids to 8
// characters, but the agent polls the session by this id, and a cut
// readable id ("nimble-c" of "nimble-coral") names no session.
//
// output is the session's retained output (or its tail); only its last 400
// UTF-16 units are used, whitespace runs are collapsed and the snippet is
// cut to 179 units + "…". Timeout exits get the retry guidance appended.
// The result is empty when no event is sent: for a stop the caller asked
// for (exitReason manual-cancel) and for a quiet success (status completed,
// exit code 0, no output). Whether notifications are on at all, and
// notifyOnExitEmptySuccess, are the caller's decisions.
func NotifyText(sessionID, status string, exitCode *int, exitSignal, exitReason, output string) string {
	return notifyText(sessionID, status, exitCode, exitSignal, exitReason, output, false)
}

// notifyText is NotifyText with the notifyOnExitEmptySuccess switch.
func notifyText(sessionID, status string, exitCode *int, exitSignal, exitReason, output string, emptySuccess bool) string {
	if exitReason == reasonManualCancel {
		return ""
	}
	snippet := compactNotifyOutput(utf16Tail(output, notifyTailChars))
	if status == "completed" && exitCode != nil && *exitCode == 0 && snippet == "" && !emptySuccess {
		return ""
	}
	summary := "Exec " + status + " (" + sessionID + ", " + exitLabel(exitCode, exitSignal) + ")"
	if snippet != "" {
		summary += " :: " + snippet
	}
	return appendTimeoutGuidance(summary, exitReason)
}

// compactNotifyOutput collapses whitespace and cuts to the snippet size.
func compactNotifyOutput(s string) string {
	normalized := jsTrim(collapseJSSpace(s))
	if normalized == "" || utf16Len(normalized) <= notifySnippetChars {
		return normalized
	}
	return utf16Head(normalized, notifySnippetChars-1) + "…"
}

// compactDuration is OpenClaw's formatDurationCompact: "999ms", "45s",
// "2m5s", "1h30m", "1d5m"; at most two non-zero units among days, hours,
// minutes and seconds. ok is false for values that print as "n/a".
func compactDuration(ms float64) (string, bool) {
	b, ok := appendCompactDuration(make([]byte, 0, 16), ms)
	return string(b), ok
}

// appendCompactDuration appends compactDuration(ms) to dst.
func appendCompactDuration(dst []byte, ms float64) ([]byte, bool) {
	if math.IsNaN(ms) || math.IsInf(ms, 0) || ms <= 0 {
		return dst, false
	}
	v := jsRound(ms)
	if v >= 1000 {
		v = jsRound(ms/1000) * 1000
	}
	type part struct {
		n    float64
		unit string
	}
	parts := [5]part{
		{math.Trunc(v / 86400000), "d"},
		{math.Trunc(math.Mod(v/3600000, 24)), "h"},
		{math.Trunc(math.Mod(v/60000, 60)), "m"},
		{math.Trunc(math.Mod(v/1000, 60)), "s"},
	}
	if v < 1000 {
		parts[4] = part{math.Trunc(v), "ms"}
	}
	shown := 0
	for _, p := range parts {
		if p.n == 0 || shown == 2 {
			continue
		}
		dst = strconv.AppendFloat(dst, p.n, 'f', 0, 64)
		dst = append(dst, p.unit...)
		shown++
	}
	if shown == 0 {
		return append(dst, "0ms"...), true
	}
	return dst, true
}

// jsRound is Math.round: halves round towards +Inf.
func jsRound(x float64) float64 { return math.Floor(x + 0.5) }

// truncateMiddle keeps the head and the tail of s around "..." when s is
// longer than max UTF-16 units; cuts never split a surrogate pair.
func truncateMiddle(s string, max int) string {
	if utf16Len(s) <= max {
		return s
	}
	half := int(math.Floor(float64(max-3) / 2))
	return sliceUTF16(s, 0, half, true) + "..." + sliceUTF16(s, -half, 0, false)
}

// padStatus right-pads a status to width with spaces.
func padStatus(status string, width int) string {
	n := utf16Len(status)
	if n >= width {
		return status
	}
	return status + strings.Repeat(" ", width-n)
}

// deriveSessionName is OpenClaw's deriveSessionName: the command's verb
// and its first non-option argument ("npm run build" → "npm run"), with
// shell quotes removed; ok is false when the command has no words.
func deriveSessionName(command string) (string, bool) {
	tokens := tokenizeCommand(command)
	if len(tokens) == 0 {
		return "", false
	}
	verb := tokens[0]
	target := ""
	for _, t := range tokens[1:] {
		if !strings.HasPrefix(t, "-") {
			target = t
			break
		}
	}
	if target == "" && len(tokens) > 1 {
		target = tokens[1]
	}
	if target == "" {
		return verb, true
	}
	return stripQuotes(verb) + " " + truncateMiddle(stripQuotes(target), 48), true
}

// tokenizeCommand splits a command into words the way OpenClaw's regular
// expression /(?:[^\s"']+|"(?:\\.|[^"\\])*"|'[^']*')+/g does: quoted runs
// belong to the word around them, a quote that is never closed is skipped.
// Shell syntax is not understood. Empty words are dropped.
func tokenizeCommand(command string) []string {
	var tokens []string
	s := command
	for i := 0; i < len(s); {
		end := matchWord(s, i)
		if end == i {
			_, size := utf8.DecodeRuneInString(s[i:])
			i += size
			continue
		}
		if t := stripQuotes(s[i:end]); t != "" {
			tokens = append(tokens, t)
		}
		i = end
	}
	return tokens
}

// matchWord returns the end of the longest word starting at i, or i.
func matchWord(s string, i int) int {
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == '"':
			end, ok := matchDoubleQuoted(s, i)
			if !ok {
				return i
			}
			i = end
		case r == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return i
			}
			i += j + 2
		case jsSpace(r):
			return i
		default:
			i += size
		}
	}
	return i
}

// matchDoubleQuoted matches "(?:\\.|[^"\\])*" at i. JavaScript's . does
// not match line terminators, so a backslash before one ends the match.
func matchDoubleQuoted(s string, i int) (int, bool) {
	j := i + 1
	for j < len(s) {
		r, size := utf8.DecodeRuneInString(s[j:])
		switch r {
		case '"':
			return j + 1, true
		case '\\':
			if j+1 >= len(s) {
				return 0, false
			}
			next, nsize := utf8.DecodeRuneInString(s[j+1:])
			if next == '\n' || next == '\r' || next == 0x2028 || next == 0x2029 {
				return 0, false
			}
			j += 1 + nsize
		default:
			j += size
		}
	}
	return 0, false
}

// stripQuotes trims s and removes one pair of surrounding quotes.
func stripQuotes(s string) string {
	t := jsTrim(s)
	if (strings.HasPrefix(t, `"`) && strings.HasSuffix(t, `"`)) || (strings.HasPrefix(t, "'") && strings.HasSuffix(t, "'")) {
		if len(t) < 2 {
			return ""
		}
		return t[1 : len(t)-1]
	}
	return t
}

// optNum is a JavaScript number argument that may be undefined (absent),
// null or a number. process log passes undefined for absent parameters;
// null exists only so the fixtures' direct calls can be replayed.
type optNum struct {
	kind uint8 // optUndefined, optNull or optNumber
	v    float64
}

const (
	optUndefined uint8 = iota
	optNull
	optNumber
)

func numOf(v float64) optNum { return optNum{kind: optNumber, v: v} }

func intOpt(p *int) optNum {
	if p == nil {
		return optNum{}
	}
	return numOf(float64(*p))
}

func (o optNum) finite() bool {
	return o.kind == optNumber && !math.IsNaN(o.v) && !math.IsInf(o.v, 0)
}

// sliceLogLines is OpenClaw's sliceLogLines: CRLF becomes LF, one trailing
// empty line is dropped, offset/limit select lines; a limit without an
// offset selects the last lines.
func sliceLogLines(text string, offset, limit optNum) (slice string, totalLines, totalChars int) {
	if text == "" {
		return "", 0, 0
	}
	lines := strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	totalLines = len(lines)
	totalChars = utf16Len(text)
	start := 0
	if offset.finite() {
		start = int(math.Max(0, math.Floor(offset.v)))
	}
	if limit.kind != optUndefined && offset.kind == optUndefined {
		l := 0.0
		if limit.kind == optNumber {
			l = limit.v
		}
		start = 0
		if !math.IsNaN(l) { // JavaScript's slice(NaN) starts at 0
			start = int(math.Max(float64(totalLines)-math.Max(0, math.Floor(l)), 0))
		}
	}
	end := totalLines
	if limit.finite() {
		end = start + int(math.Max(0, math.Floor(limit.v)))
	}
	start = min(start, totalLines)
	end = min(max(end, start), totalLines)
	return strings.Join(lines[start:end], "\n"), totalLines, totalChars
}

// logWindow resolves process log's window: the last 200 lines when neither
// offset nor limit was given.
func logWindow(offset, limit optNum) (effLimit optNum, usingDefaultTail bool) {
	usingDefaultTail = offset.kind == optUndefined && limit.kind == optUndefined
	switch {
	case limit.finite():
		return limit, usingDefaultTail
	case usingDefaultTail:
		return numOf(defaultLogTailLines), true
	}
	return optNum{}, false
}

// defaultTailNote tells the agent that the default window hid lines.
func defaultTailNote(totalLines int, usingDefaultTail bool) string {
	if !usingDefaultTail || totalLines <= defaultLogTailLines {
		return ""
	}
	return "\n\n[showing last " + strconv.Itoa(defaultLogTailLines) + " of " + strconv.Itoa(totalLines) + " lines; pass offset/limit to page]"
}
