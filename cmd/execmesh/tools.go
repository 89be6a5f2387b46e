package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/execmesh/execmesh/protocol"
)

// maxCallInput bounds a `call` request read from stdin; the gateway refuses
// anything over 2 MB anyway.
const maxCallInput = 4 << 20

// runCall is `execmesh call [flags] [JSON]`: one tool call, printed as the
// gateway's JSON answer. Exit 1 when ok is false or details.status is
// failed.
func runCall(ctx context.Context, c *cli, args []string) error {
	const synopsis = "[flags] [JSON]  (JSON from the argument, or stdin when absent or \"-\")"
	fs := newFlagSet("call")
	var f clientFlags
	f.register(fs)
	pos, err := c.parseFlags(fs, synopsis, args, true)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return usageErrorf("call: want one JSON argument, got %d (quote the JSON)", len(pos))
	}
	cl, err := f.client(c)
	if err != nil {
		return err
	}
	defer cl.close()

	var raw []byte
	if len(pos) == 1 && pos[0] != "-" {
		raw = []byte(pos[0])
	} else if raw, err = io.ReadAll(io.LimitReader(c.stdin, maxCallInput)); err != nil {
		return fmt.Errorf("call: reading stdin: %w", err)
	}
	body, err := callBody(raw, f.sessionKey)
	if err != nil {
		return err
	}

	data, ans, err := cl.invoke(ctx, body)
	var pe *protocol.Error
	if err != nil && !(errors.As(err, &pe) && json.Valid(data)) {
		return err
	}
	if err := printJSON(c.stdout, data); err != nil {
		return err
	}
	if err != nil || ans.Result.Status() == protocol.StatusFailed {
		return &exitError{code: exitFail}
	}
	return nil
}

// callBody checks that raw is a JSON object naming a tool and adds the
// sessionKey unless the object has one.
func callBody(raw []byte, sessionKey string) (json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return nil, usageErrorf(`call: no request: pass {"tool":…,"args":{…}} as the argument or on stdin`)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		return nil, usageErrorf("call: the request must be a JSON object: %v", errOr(err, "got null"))
	}
	if _, ok := obj["tool"]; !ok {
		return nil, usageErrorf(`call: the request has no "tool" (want {"tool":"exec","args":{…}})`)
	}
	if _, ok := obj["sessionKey"]; !ok && sessionKey != "" {
		obj["sessionKey"], _ = json.Marshal(sessionKey)
	}
	body, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("call: encoding the request: %w", err)
	}
	return body, nil
}

func errOr(err error, msg string) string {
	if err != nil {
		return err.Error()
	}
	return msg
}

// runExec is `execmesh exec [flags] [--] CMD…`.
//
// Several words are shell-quoted where needed and joined with spaces, so
// `exec -- sh -c 'exit 3'` runs exactly those three words; a single word is
// the command line as is (`exec 'ls *.go | wc -l'`).
//
// Exit status: 0 when the command completed with exit code 0, is still
// running (backgrounded) or awaits approval; the command's own exit code
// when it completed with a non-zero one (codes above 125 become 125, so
// they cannot be mistaken for the shell's "not executable", "not found" and
// signal statuses); 1 when the result is failed (not found, timeout,
// signal, …) or the call failed; 2 for a bad command line.
func runExec(ctx context.Context, c *cli, args []string) error {
	const synopsis = "[flags] [--] CMD…"
	fs := newFlagSet("exec")
	var f clientFlags
	f.register(fs)
	var env listFlag
	workdir := fs.String("workdir", "", "working `dir`ectory of the command")
	fs.Var(&env, "env", "environment variable `K=V` for the command (repeatable)")
	yieldMs := fs.Int("yield-ms", 0, "background the command after this many `ms` (default tools.exec.backgroundMs)")
	background := fs.Bool("background", false, "start in the background at once and return a session id")
	timeout := fs.Float64("timeout", 0, "kill the command after this many `seconds` (0: no timeout; default tools.exec.timeoutSec)")
	pty := fs.Bool("pty", false, "run in a pseudo-terminal (120×30)")
	elevated := fs.Bool("elevated", false, "run outside the sandbox (needs tools.elevated.enabled)")
	host := fs.String("host", "", "where to run: `auto|sandbox|gateway|node`")
	security := fs.String("security", "", "tighten security: `deny|allowlist|full`")
	ask := fs.String("ask", "", "tighten approvals: `off|on-miss|always`")
	node := fs.String("node", "", "target node `id or name` (host=node)")
	follow := fs.Bool("follow", false, "stream the output live until the command exits (the default on a terminal)")
	words, cl, err := f.parseAndConnect(c, fs, synopsis, args, false)
	if err != nil {
		return err
	}
	defer cl.close()
	if len(words) == 0 {
		return usageErrorf("exec: no command given (usage: execmesh exec %s)", synopsis)
	}

	a := protocol.ExecArgs{
		Command:    joinCommand(words),
		Workdir:    *workdir,
		Background: *background,
		PTY:        *pty,
		Host:       *host,
		Security:   *security,
		Ask:        *ask,
		Node:       *node,
	}
	if len(env.values) > 0 {
		a.Env = make(map[string]string, len(env.values))
		for _, kv := range env.values {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return usageErrorf("exec: --env %q: want KEY=VALUE", kv)
			}
			a.Env[k] = v
		}
	}
	if isSet(fs, "yield-ms") {
		y := float64(*yieldMs)
		a.YieldMs = &y
	}
	if isSet(fs, "timeout") {
		a.Timeout = timeout
	}
	if isSet(fs, "elevated") {
		a.Elevated = elevated
	}

	// Live output: start in the background almost at once and tail the
	// session, instead of waiting silently for the yield window.
	live := !f.json && !*background && !isSet(fs, "yield-ms") && (*follow || (!isSet(fs, "follow") && isTerminal(c.stdout)))
	if live {
		y := float64(10)
		a.YieldMs = &y
	}
	data, ans, err := cl.invokeTool(ctx, protocol.ToolExec, a, f.sessionKey)
	if live && err == nil && ans.Result.Status() == protocol.StatusRunning {
		res, err := c.follow(ctx, cl, f.sessionKey, ans.Result.SessionID())
		if err != nil {
			return err
		}
		return c.exitFor(res, execExitCode)
	}
	return c.finishTool(f.json, data, ans, err, execExitCode)
}

// exitFor turns a result into the command's exit status.
func (c *cli) exitFor(res protocol.Result, code func(protocol.Result) int) error {
	if n := code(res); n != exitOK {
		return &exitError{code: n}
	}
	return nil
}

// finishTool prints a tool answer (the raw JSON with --json, else the
// result text an agent would see) and picks the exit status with code.
func (c *cli) finishTool(raw bool, data []byte, ans invokeAnswer, err error, code func(protocol.Result) int) error {
	var pe *protocol.Error
	if raw && len(data) > 0 && json.Valid(data) && (err == nil || errors.As(err, &pe)) {
		if perr := printJSON(c.stdout, data); perr != nil {
			return perr
		}
		if err != nil {
			return &exitError{code: exitFail}
		}
	} else if err != nil {
		return err
	} else {
		printText(c.stdout, ans.Result.Text())
	}
	if n := code(ans.Result); n != exitOK {
		return &exitError{code: n}
	}
	return nil
}

// execExitCode maps an exec result to the CLI's exit status (see runExec).
func execExitCode(r protocol.Result) int {
	switch r.Status() {
	case protocol.StatusFailed:
		return exitFail
	case protocol.StatusCompleted:
		n, ok := r.Details.ExitCode.Get()
		switch {
		case !ok || n == 0:
			return exitOK
		case n < 0:
			return exitFail
		case n > 125:
			return 125
		default:
			return n
		}
	default: // running, approval-pending
		return exitOK
	}
}

// processExitCode is 1 for a failed process result, else 0.
func processExitCode(r protocol.Result) int {
	if r.Status() == protocol.StatusFailed {
		return exitFail
	}
	return exitOK
}

// joinCommand turns the command words into one command line: a single word
// is taken as is, several are quoted where the shell would split or expand
// them.
func joinCommand(words []string) string {
	if len(words) == 1 {
		return words[0]
	}
	quoted := make([]string, len(words))
	for i, w := range words {
		quoted[i] = shellQuote(w)
	}
	return strings.Join(quoted, " ")
}

// shellQuote returns w unchanged when it holds only characters no POSIX
// shell treats specially, and single-quoted otherwise.
func shellQuote(w string) string {
	if w == "" {
		return "''"
	}
	plain := strings.IndexFunc(w, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("@%+=:,./_-", r))
	}) < 0
	if plain {
		return w
	}
	return "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
}

// processActionsList returns the process tool's actions.
func processActionsList() []string { return slices.Clone(protocol.ProcessActions) }

// runProcess is `execmesh process ACTION [SESSION-ID] [flags]`. Exit 1 when
// details.status is failed.
func runProcess(ctx context.Context, c *cli, args []string) error {
	synopsis := "ACTION [SESSION-ID] [flags]  (ACTION: " + strings.Join(protocol.ProcessActions, ", ") + ")"
	fs := newFlagSet("process")
	var f clientFlags
	f.register(fs)
	var keys, hex listFlag
	keys.split, hex.split = true, true
	var sessionID string
	fs.StringVar(&sessionID, "session-id", "", "the session `id` (or pass it after ACTION)")
	fs.StringVar(&sessionID, "s", "", "shorthand for --session-id")
	data := fs.String("data", "", "write: the `text` to write to stdin")
	eof := fs.Bool("eof", false, "write: close stdin after the data")
	fs.Var(&keys, "keys", "send-keys: key `tokens` such as C-c,Enter,Up (comma-separated or repeatable)")
	fs.Var(&hex, "hex", "send-keys: raw `bytes` in hex, such as 1b,5b,41 (comma-separated or repeatable)")
	literal := fs.String("literal", "", "send-keys: literal `text` to type")
	text := fs.String("text", "", "paste: the `text` to paste")
	noBracketed := fs.Bool("no-bracketed", false, "paste: without bracketed-paste markers")
	offset := fs.Int("offset", 0, "log: first `line` to show")
	limit := fs.Int("limit", 0, "log: how many `lines` to show")
	timeout := fs.Int("timeout", 0, "poll: wait up to this many `ms` for output or exit (at most 30000)")
	follow := fs.Bool("follow", false, "poll: tail the session until it exits")
	pos, cl, err := f.parseAndConnect(c, fs, synopsis, args, true)
	if err != nil {
		return err
	}
	defer cl.close()

	if len(pos) == 0 {
		return usageErrorf("process: no action given (one of: %s)", strings.Join(protocol.ProcessActions, ", "))
	}
	action := pos[0]
	if !slices.Contains(protocol.ProcessActions, action) {
		return usageErrorf("process: unknown action %q (one of: %s)", action, strings.Join(protocol.ProcessActions, ", "))
	}
	switch {
	case len(pos) > 2:
		return usageErrorf("process %s: unexpected arguments %q", action, pos[2:])
	case len(pos) == 2 && sessionID != "" && sessionID != pos[1]:
		return usageErrorf("process %s: two different session ids: %q and %q", action, sessionID, pos[1])
	case len(pos) == 2:
		sessionID = pos[1]
	}

	a := protocol.ProcessArgs{Action: action, SessionID: sessionID, EOF: *eof, Keys: keys.values, Hex: hex.values}
	if isSet(fs, "data") {
		a.Data = data
	}
	if isSet(fs, "literal") {
		a.Literal = literal
	}
	if isSet(fs, "text") {
		a.Text = text
	}
	if *noBracketed {
		a.Bracketed = new(bool)
	}
	for _, n := range []struct {
		name string
		val  *int
		dst  **int
	}{{"offset", offset, &a.Offset}, {"limit", limit, &a.Limit}, {"timeout", timeout, &a.Timeout}} {
		if !isSet(fs, n.name) {
			continue // absent, not zero: the tool's default applies
		}
		if *n.val < 0 {
			return usageErrorf("process: --%s must not be negative", n.name)
		}
		*n.dst = n.val
	}

	if *follow {
		if action != "poll" {
			return usageErrorf("process %s: --follow is for poll", action)
		}
		res, err := c.follow(ctx, cl, f.sessionKey, sessionID)
		if err != nil {
			return err
		}
		return c.exitFor(res, execExitCode)
	}
	dataOut, ans, err := cl.invokeTool(ctx, protocol.ToolProcess, a, f.sessionKey)
	return c.finishTool(f.json, dataOut, ans, err, processExitCode)
}

// printText prints a result text, ending it with a newline.
func printText(w io.Writer, text string) {
	if text == "" {
		return
	}
	io.WriteString(w, text)
	if !strings.HasSuffix(text, "\n") {
		io.WriteString(w, "\n")
	}
}

// printJSON prints a JSON document indented by two spaces.
func printJSON(w io.Writer, data []byte) error {
	var buf bytes.Buffer
	if err := json.Indent(&buf, bytes.TrimSpace(data), "", "  "); err != nil {
		return fmt.Errorf("the gateway's answer is not JSON: %w", err)
	}
	buf.WriteByte('\n')
	_, err := w.Write(buf.Bytes())
	return err
}
