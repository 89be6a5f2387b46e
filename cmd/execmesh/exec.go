package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/execmesh/execmesh/config"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/execmesh/execmesh/gateway"
	"github.com/execmesh/execmesh/internal/hostid"
	"github.com/execmesh/execmesh/internal/visible"
	"github.com/execmesh/execmesh/protocol"
	"github.com/execmesh/execmesh/session"
)

// Exit statuses of `execmesh exec` beyond the command's own.
const (
	// exitTimeout is a command the exec timeout ended (GNU timeout's 124).
	exitTimeout = 124
	// exitSignalBase plus the signal number is a command a signal ended,
	// as a shell reports it.
	exitSignalBase = 128
	// exitTruncated is a command that exited 0 whose output execmesh
	// could not print whole: the session core keeps 200 000 characters,
	// and what was dropped before a poll took it is gone. 125 is what
	// docker run, env and GNU timeout return for a failure of the
	// wrapper rather than of the command. --allow-truncated makes it 0.
	exitTruncated = 125
	// exitApprovalPending is `exec --background` for a command that
	// awaits an operator's approval (sysexits' EX_TEMPFAIL: not run yet,
	// try again later); the approval id is on stdout.
	exitApprovalPending = 75
)

// Approval waits: how often exec asks what became of a pending approval.
const (
	approvalPollMin = 250 * time.Millisecond
	approvalPollMax = 2 * time.Second
)

// execOptions are the flags of `execmesh exec` beyond the client flags.
type execOptions struct {
	workdir    string
	env        listFlag
	yieldMs    int
	background bool
	noWait     bool
	timeout    float64
	pty        bool
	elevated   bool
	host       string
	security   string
	ask        string
	node       string
	follow     bool
	// allowTruncated accepts output cut at the retention cap: exit with
	// the command's status instead of exitTruncated (the note stays).
	allowTruncated bool
	// stream: -i, -t, --signal, --keep of a streamed run (stream.go).
	stream streamOptions
}

func (c *cli) newExecCmd() *cobra.Command {
	var f clientFlags
	var o execOptions
	cmd := &cobra.Command{
		Use:   "exec [flags] [--] CMD…",
		Short: "run a command and wait for it, like ssh host cmd: its output live, its exit status",
		Long: `Run a command through the exec tool and wait for it, as ssh host cmd and kubectl exec do:
its output is printed as it comes, and execmesh exits with the command's exit status
(127 not found, 126 not executable, 128+N for signal N, 124 when the exec timeout ended it,
1 when it could not run; the reason goes to stderr).

Several words are shell-quoted where needed and joined with spaces, so "exec -- sh -c 'exit 3'"
runs exactly those three words; a single word is the command line as is ("exec 'ls *.go | wc -l'").

While the command awaits an exec approval, execmesh says so on stderr and waits for the
decision: approved, the command runs and is followed; denied, execmesh exits 1 with the reason.

The output is the command's own bytes: stdout to stdout, stderr to stderr, each in order,
uncut and byte-exact (exec -- gzip -c f | gunzip works). -i forwards stdin, its end of file
included; -t runs a pseudo-terminal attached to this one (raw mode, the window size, Ctrl-C
to the remote foreground job; Ctrl-] detaches). Without -t an interrupt (Ctrl-C) is sent on
to the command (--signal NAME sends that one instead); a second within 2 s detaches. When
execmesh goes away the command is killed, as ssh's is; --keep leaves it running.

With --yield-ms, --no-wait or -o json the output is the text agents read instead: the last
200 000 characters, control bytes shown as \xNN, invalid UTF-8 as U+FFFD, terminal escapes
removed. execmesh never passes that off as the whole output: when a part was dropped before
it could be printed, a note on stderr says so and execmesh exits 125 (unless
--allow-truncated, or the command failed: then its own status); when the output shows
escaped bytes, a note on stderr says so.

--background starts the command in the background and prints its session id alone on stdout
(S=$(execmesh exec --background -- make) captures it); when the command awaits an operator's
approval it prints the approval id alone on stdout instead, the explanation on stderr, and
exits 75. --no-wait returns when the command goes to the background after the yield window
(tools.exec.backgroundMs, or --yield-ms), printing the result an agent would see; it exits 0
for a command still running or awaiting approval. Interrupted (Ctrl-C), execmesh stops
waiting for an approval; the command keeps its course.

Exit statuses of execmesh itself: 1 a failed call, 2 a bad command line, 75 approval pending
(--background), 125 output cut (see above).

Working directory: --workdir, else, when the gateway runs on this machine (the same boot and
mount namespace: GET /healthz reports a hostId, compared with this process's) and the command
is not sent to a node (--node, --host node, or tools.exec.host node in the configuration this
command reads), the current directory; otherwise the gateway's default.`,
		Example: `  execmesh exec -- ls -la
  execmesh exec 'make -j4 2>&1 | tail -n 20'
  execmesh exec --background -- make build
  execmesh exec --node build-1 -- uname -a
  execmesh exec -t --node build-1 -- bash
  execmesh exec -i -- sha256sum < big.iso
  execmesh exec --timeout 60 --env CI=1 -- ./run-tests.sh`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageErrorf("exec: no command given (usage: execmesh exec [flags] [--] CMD…)")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error { return c.runExec(cmd, &f, &o, args) },
	}
	fs := cmd.Flags()
	// Everything after the command's first word is the command's.
	fs.SetInterspersed(false)
	f.register(fs, withSessionKey|withJSON)
	fs.StringVar(&o.workdir, "workdir", "", "working `dir`ectory of the command (default: the current directory when the gateway is local, see above)")
	fs.Var(&o.env, "env", "environment variable `K=V` for the command (repeatable)")
	fs.IntVar(&o.yieldMs, "yield-ms", 0, "background the command after this many `ms` (default tools.exec.backgroundMs with --no-wait; waiting, the command starts in the background at once)")
	fs.BoolVar(&o.background, "background", false, "start in the background at once, print the session id and exit")
	fs.BoolVar(&o.noWait, "no-wait", false, "return when the command goes to the background instead of waiting for it")
	fs.Float64Var(&o.timeout, "timeout", 0, "kill the command after this many `seconds` (0: no timeout; default tools.exec.timeoutSec)")
	fs.BoolVar(&o.pty, "pty", false, "run in a pseudo-terminal (120×30)")
	fs.BoolVar(&o.elevated, "elevated", false, "run outside the sandbox (needs tools.elevated.enabled)")
	fs.StringVar(&o.host, "host", "", "where to run: auto, sandbox, gateway or node (default tools.exec.host)")
	fs.StringVar(&o.security, "security", "", "tighten the security `mode`: deny, allowlist or full")
	fs.StringVar(&o.ask, "ask", "", "tighten the ask `mode`: off, on-miss or always")
	fs.StringVar(&o.node, "node", "", "target node `id or name` (host=node)")
	fs.BoolVar(&o.follow, "follow", false, "follow the output live (the default; kept for scripts written for older versions)")
	_ = fs.MarkHidden("follow")
	fs.BoolVarP(&o.stream.stdin, "interactive", "i", false, "forward stdin to the command (its end of file included)")
	fs.BoolVarP(&o.stream.tty, "tty", "t", false, "run in a pseudo-terminal attached to this one (raw mode, window size, Ctrl-C to the remote foreground job; Ctrl-] detaches); implies -i")
	fs.StringVar(&o.stream.signal, "signal", "", "signal `NAME` an interrupt of execmesh sends to the command (default: the one received, SIGINT for Ctrl-C); a second interrupt within 2 s detaches")
	fs.BoolVar(&o.stream.keep, "keep", false, "keep the command running when execmesh goes away (default: it is killed, as ssh's would be)")
	fs.BoolVar(&o.allowTruncated, "allow-truncated", false, "exit with the command's status even when its output was cut at the 200 000-character retention cap (the note on stderr stays)")
	completeValues(cmd, "host", "auto", "sandbox", "gateway", "node")
	completeValues(cmd, "security", "deny", "allowlist", "full")
	completeValues(cmd, "ask", "off", "on-miss", "always")
	_ = cmd.RegisterFlagCompletionFunc("node", func(cmd *cobra.Command, _ []string, _ string) ([]string, cobra.ShellCompDirective) {
		return c.completeNodes(cmd.Context(), &f), cobra.ShellCompDirectiveNoFileComp
	})
	_ = cmd.MarkFlagDirname("workdir")
	return cmd
}

// runExec builds the exec call, sends it and, unless told not to, waits
// for the command.
func (c *cli) runExec(cmd *cobra.Command, f *clientFlags, o *execOptions, words []string) error {
	ctx := cmd.Context()
	fs := cmd.Flags()
	switch {
	case o.background && o.noWait:
		return usageErrorf("exec: --background and --no-wait do not mix (--background starts in the background at once)")
	case o.follow && (o.background || o.noWait):
		return usageErrorf("exec: --follow does not mix with --background or --no-wait")
	case (o.stream.stdin || o.stream.tty || o.stream.keep || o.stream.signal != "") && (o.background || o.noWait || fs.Changed("yield-ms") || f.json):
		return usageErrorf("exec: -i, -t, --signal and --keep stream a command execmesh waits for; they do not mix with --background, --no-wait, --yield-ms or --json")
	}
	if o.stream.signal != "" && unix.SignalNum(strings.ToUpper(o.stream.signal)) == 0 && unix.SignalNum("SIG"+strings.ToUpper(o.stream.signal)) == 0 {
		return usageErrorf("exec: --signal %q: not a signal name (SIGTERM, TERM, HUP, …)", o.stream.signal)
	}
	if o.stream.tty {
		o.stream.stdin = true
		if !isTerminal(c.stdin) {
			// As ssh does: a terminal needs one here. Piped input on a
			// remote terminal loses its end (the line discipline eats
			// the Ctrl-D), and nothing could type Ctrl-C.
			fmt.Fprintln(c.stderr, "execmesh: stdin is not a terminal: running without a pseudo-terminal (--pty forces a remote one)")
			o.stream.tty = false
		}
	}
	a := protocol.ExecArgs{
		Command:    joinCommand(words),
		Workdir:    o.workdir,
		Background: o.background,
		PTY:        o.pty,
		Host:       o.host,
		Security:   o.security,
		Ask:        o.ask,
		Node:       o.node,
	}
	if len(o.env.values) > 0 {
		a.Env = make(map[string]string, len(o.env.values))
		for _, kv := range o.env.values {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return usageErrorf("exec: --env %q: want KEY=VALUE", kv)
			}
			a.Env[k] = v
		}
	}
	if fs.Changed("yield-ms") {
		if o.yieldMs < 0 {
			return usageErrorf("exec: --yield-ms must not be negative")
		}
		y := float64(o.yieldMs)
		a.YieldMs = &y
	}
	if fs.Changed("timeout") {
		a.Timeout = &o.timeout
	}
	if fs.Changed("elevated") {
		a.Elevated = &o.elevated
	}
	wait := !o.background && !o.noWait
	if wait && a.YieldMs == nil {
		// Start in the background and follow the session: the output
		// comes live and exact (a foreground result's text carries
		// OpenClaw's notes), instead of after the yield window.
		a.Background = true
	}

	cfg, err := f.load(c)
	if err != nil {
		return err
	}
	cl, err := f.clientFor(c, cfg)
	if err != nil {
		return err
	}
	defer cl.close()
	if a.Workdir == "" && a.Node == "" && !strings.EqualFold(a.Host, "node") && !configuredForNode(cfg, f.sessionKey) {
		if dir, ok := c.localWorkdir(ctx, cl, f.sessionKey); ok {
			a.Workdir = dir
		}
	}

	if wait && !fs.Changed("yield-ms") && !f.json {
		// The real bytes: stdout and stderr apart, whole and exact.
		a.PTY = a.PTY || o.stream.tty
		o.stream.signal = strings.ToUpper(o.stream.signal)
		if err := c.streamExec(ctx, cl, f, o, a); !errors.Is(err, errFallback) {
			return err
		}
		a.PTY = o.pty
	}
	data, ans, err := cl.invokeTool(ctx, protocol.ToolExec, a, f.sessionKey)
	if hint := unknownNodeHint(ctx, cl, a.Node, err); hint != "" {
		// A typo in --node: the gateway refused it and ran nothing; the
		// nearest known name is the likely fix.
		if f.json {
			fmt.Fprintln(c.stderr, "execmesh:", hint)
		} else {
			err = fmt.Errorf("%w; %s", err, hint)
		}
	}
	switch {
	case o.background && err == nil:
		return c.finishBackground(f.json, data, ans.Result)
	case !wait || err != nil:
		return c.finishTool(f.json, data, ans, err, execNoWaitCode)
	}
	res := ans.Result
	switch res.Status() {
	case protocol.StatusRunning:
		return c.followExec(ctx, cl, f, o, res.SessionID(), data)
	case protocol.StatusApprovalPending:
		return c.awaitApproval(ctx, cl, f, o, res, data)
	}
	return c.finishWait(f.json, data, res, c.outputFacts(o, res, nil))
}

// finishBackground reports `exec --background`: the session id alone on
// stdout (what the command substitution of a script captures), or, for a
// command that awaits approval, the approval id alone and exit 75; the
// explanations go to stderr. With --json the answer as is, and the same
// exit statuses.
func (c *cli) finishBackground(raw bool, data []byte, res protocol.Result) error {
	if raw {
		if err := printJSON(c.stdout, data); err != nil {
			return err
		}
	}
	switch res.Status() {
	case protocol.StatusRunning:
		id := res.SessionID()
		if raw {
			return nil
		}
		if id == "" {
			return fmt.Errorf("the gateway answered status running without a session id: %s", strings.TrimSpace(res.Text()))
		}
		// Warnings an agent reads before "Command still running" (a
		// pathPrepend ignored on a node, …) are notes.
		if warn, _, found := strings.Cut(res.Text(), "Command still running"); found && strings.TrimSpace(warn) != "" {
			fmt.Fprintln(c.stderr, "execmesh:", strings.TrimSpace(warn))
		}
		fmt.Fprintln(c.stdout, id)
		return nil
	case protocol.StatusApprovalPending:
		id := res.Details.ApprovalID.Value()
		if !raw {
			if id == "" {
				return fmt.Errorf("the gateway answered approval-pending without an approval id: %s", strings.TrimSpace(res.Text()))
			}
			fmt.Fprintln(c.stdout, id)
			slug := res.Details.ApprovalSlug.Value()
			fmt.Fprintf(c.stderr, "execmesh: the command awaits an operator's approval %s (%s); it has not started. An operator answers with: execmesh approvals resolve %s allow-once|deny; once approved it runs in the background\n",
				id, orDash(slug, id), id)
		}
		return &exitError{code: exitApprovalPending}
	}
	// The command ran in the foreground after all (the process tool is
	// denied for this agent, so nothing runs in the background): there is
	// no session id to print, only the outcome.
	if !raw {
		fmt.Fprintln(c.stderr, "execmesh: the command ran in the foreground (no background session for this agent): no session id")
		printText(c.stdout, res.Text())
	}
	if n := execNoWaitCode(res); n != exitOK {
		return &exitError{code: n}
	}
	return nil
}

// configuredForNode reports whether the configuration this command read
// sends the sessionKey's agent to host=node by default.
func configuredForNode(cfg config.Config, sessionKey string) bool {
	host := cfg.Tools.Exec.Host
	if _, agentID, err := gateway.ParseSessionKey(sessionKey); err == nil {
		if a, ok := cfg.Agent(agentID); ok && a.Tools.Exec.Host != "" {
			host = a.Tools.Exec.Host
		}
	}
	return host == "node"
}

// localWorkdir returns the current directory when the gateway runs on this
// machine, in the same boot and mount namespace (its /healthz hostId
// equals this process's), so that the directory means the same to it, and
// the sessionKey's exec defaults do not send commands to a node.
func (c *cli) localWorkdir(ctx context.Context, cl *client, sessionKey string) (string, bool) {
	mine, err := hostid.ID()
	if err != nil {
		return "", false
	}
	var health struct {
		HostID string `json:"hostId"`
	}
	if _, err := cl.getJSON(ctx, "/healthz", nil, &health); err != nil || health.HostID != mine {
		return "", false
	}
	var defaults execDefaults
	if _, err := cl.getJSON(ctx, "/v1/sessions/"+url.PathEscape(sessionKey)+"/exec", nil, &defaults); err == nil && defaults.Host == "node" {
		return "", false
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", false
	}
	return dir, true
}

// followExec follows a running session until it exits: its output live
// (or nothing with --json, which prints the last answer), then the exit
// status, with notes on stderr when the output printed is not the whole
// output or shows escaped bytes.
func (c *cli) followExec(ctx context.Context, cl *client, f *clientFlags, o *execOptions, sessionID string, first []byte) error {
	var last []byte
	facts := outputFacts{allowTruncated: o.allowTruncated}
	took := false // a poll returned output before
	poll := func(ctx context.Context, timeoutMs int) (protocol.Result, error) {
		data, ans, err := cl.invokeTool(ctx, protocol.ToolProcess, protocol.ProcessArgs{Action: "poll", SessionID: sessionID, Timeout: &timeoutMs}, f.sessionKey)
		last = data
		if r := ans.Result; err == nil && r.Details.Aggregated.Value() != "" {
			// The first output execmesh sees already lacks its start:
			// the retention cap dropped it before this poll.
			if !took && strings.HasPrefix(r.Text(), session.RetentionCapNote) {
				facts.cut = true
			}
			took = true
		}
		return ans.Result, err
	}
	scan := &escapeScanner{w: c.stdout}
	res, err := c.followWith(ctx, poll, sessionID, f.json, scan, func() { facts.cut = true })
	if err != nil {
		return err
	}
	if f.json {
		if last == nil {
			last = first
		}
		// What is printed is the last answer, whose aggregated output is
		// whole only when nothing was dropped.
		facts.cut = strings.HasPrefix(res.Text(), session.RetentionCapNote)
		facts.escaped = hasEscapes(res.Details.Aggregated.Value())
		return c.finishWait(true, last, res, facts)
	}
	facts.escaped = scan.found
	return c.finishWait(false, nil, res, facts)
}

// outputFacts is what execmesh exec knows about the output it printed.
type outputFacts struct {
	// cut: a part of the output was dropped at the session core's
	// retention cap before execmesh could print it.
	cut bool
	// escaped: the output shows bytes the sanitizer escaped (\xNN for
	// control bytes, U+FFFD for invalid UTF-8).
	escaped bool
	// allowTruncated is --allow-truncated: a cut does not change the
	// exit status.
	allowTruncated bool
}

// outputFacts are the facts of a result printed whole (a foreground
// answer): its text begins with the retention-cap note when output was
// dropped.
func (c *cli) outputFacts(o *execOptions, res protocol.Result, _ []byte) outputFacts {
	return outputFacts{
		cut:            strings.HasPrefix(res.Text(), session.RetentionCapNote),
		escaped:        hasEscapes(res.Details.Aggregated.Value()),
		allowTruncated: o.allowTruncated,
	}
}

// escapedText matches what the session core's sanitizer writes for bytes
// it cannot show: \xNN (lower-case hex) for a control byte, U+FFFD for a
// byte of invalid UTF-8. A command may print such text itself, which is
// why the note says "shows", not "had".
var escapedText = regexp.MustCompile(`\\x[0-9a-f]{2}|\x{FFFD}`)

// hasEscapes reports whether text shows escaped bytes.
func hasEscapes(text string) bool { return escapedText.MatchString(text) }

// escapeScanner passes writes on to w and notes whether they show escaped
// bytes, also across the boundary of two writes.
type escapeScanner struct {
	w     io.Writer
	carry []byte // the last bytes written, an escape's possible start
	found bool
}

func (s *escapeScanner) Write(p []byte) (int, error) {
	if !s.found {
		buf := append(append([]byte(nil), s.carry...), p...)
		s.found = escapedText.Match(buf)
		// \xN or two bytes of U+FFFD's three: at most 3 bytes to keep.
		s.carry = append(s.carry[:0], buf[max(0, len(buf)-3):]...)
	}
	return s.w.Write(p)
}

// finishWait reports how a waited-for command ended: with --json the last
// answer, else (the output was printed already for a followed session, or
// is printed here for one that ended within the yield window) the reason
// on stderr when it did not simply exit; then, on stderr, what the output
// lacks (a cut, escaped bytes); then the exit status: the command's, or
// 125 for a command that exited 0 but whose output was cut, unless
// --allow-truncated.
func (c *cli) finishWait(raw bool, data []byte, res protocol.Result, facts outputFacts) error {
	code, why := exitStatus(res)
	if raw {
		if err := printJSON(c.stdout, data); err != nil {
			return err
		}
	} else {
		if data != nil {
			// A foreground answer (the command ended within a --yield-ms
			// window, or the process tool is denied and nothing runs in
			// the background): its text is what an agent reads, the
			// output with OpenClaw's notes. When the command did not
			// simply exit, the output alone, and the reason below.
			out := res.Details.Aggregated.Value()
			switch {
			case why == "":
				printText(c.stdout, res.Text())
			case out != "" && out != res.Text():
				printText(c.stdout, out)
			}
		}
		if why != "" {
			fmt.Fprintln(c.stderr, "execmesh:", why)
		}
	}
	if facts.cut {
		fmt.Fprintln(c.stderr, "execmesh: the output was cut: a session keeps the last 200 000 characters of a command's output (fewer when configured so), and an earlier part was dropped before execmesh could print it; it cannot be recovered (exec without --yield-ms, --no-wait and -o json streams the whole output)")
	}
	if facts.escaped {
		fmt.Fprintln(c.stderr, `execmesh: the output shows escaped bytes: control bytes appear as \xNN and invalid UTF-8 as U+FFFD (the text agents read; exec without --yield-ms, --no-wait and -o json streams the raw bytes)`)
	}
	if code == exitOK && facts.cut && !facts.allowTruncated {
		code = exitTruncated
	}
	if code != exitOK {
		return &exitError{code: code}
	}
	return nil
}

// exitStatus maps a finished exec or poll result to the exit status of
// `execmesh exec` and, when the command did not simply exit, the reason
// to print: the command's exit code; 124 for a timeout; 128+N for signal
// N; 1 for a command that could not run.
func exitStatus(r protocol.Result) (int, string) {
	d := r.Details
	reason := d.ExitReason.Value()
	signal := d.ExitSignal.Value()
	code, hasCode := d.ExitCode.Get()
	timedOut := d.TimedOut.Value()
	switch {
	case r.Status() == protocol.StatusRunning || r.Status() == protocol.StatusApprovalPending:
		return exitOK, ""
	case timedOut || reason == "overall-timeout" || reason == "no-output-timeout":
		return exitTimeout, firstLineWith(r.Text(), "timed out", "command timed out: the exec timeout ended it ("+orDash(signal, "killed")+")")
	case reason == "manual-cancel":
		return signalStatus(signal), "command stopped by request (" + orDash(signal, "killed") + ")"
	case signal != "":
		return signalStatus(signal), "command ended by signal " + signal
	case hasCode && code >= 0:
		return code & 0xff, ""
	case r.Status() == protocol.StatusFailed:
		return exitFail, strings.TrimSpace(r.Text())
	}
	return exitOK, ""
}

// signalStatus is 128+N for signal name N, as a shell reports it (137 for
// SIGKILL); 1 for a name it does not know.
func signalStatus(name string) int {
	if n := unix.SignalNum(name); n > 0 {
		return exitSignalBase + int(n)
	}
	return exitFail
}

// firstLineWith returns the first line of text that contains sub (OpenClaw's
// timeout text), or alt.
func firstLineWith(text, sub, alt string) string {
	for line := range strings.SplitSeq(text, "\n") {
		if strings.Contains(line, sub) {
			return strings.TrimSpace(line)
		}
	}
	return alt
}

// execNoWaitCode is the exit status of `exec --background` and `exec
// --no-wait`: the command's status when it ended within the yield window,
// 0 while it runs or awaits approval.
func execNoWaitCode(r protocol.Result) int {
	code, _ := exitStatus(r)
	return code
}

// approvalState is GET /v1/approvals/<id>: what became of an approval.
type approvalState struct {
	ID           string   `json:"id"`
	Slug         string   `json:"slug"`
	State        string   `json:"state"` // pending, decided, expired
	Decision     string   `json:"decision"`
	SessionID    string   `json:"sessionId"`
	DeniedReason string   `json:"deniedReason"`
	Command      string   `json:"command"`
	Decisions    []string `json:"decisions"`
}

// awaitApproval waits for the decision on an approval-pending exec (saying
// so on stderr), then follows the approved command or reports the denial.
// It reads the approval's state (GET /v1/approvals/<id>), never the
// sessionKey's system events, which stay the agent's.
func (c *cli) awaitApproval(ctx context.Context, cl *client, f *clientFlags, o *execOptions, res protocol.Result, first []byte) error {
	id := res.Details.ApprovalID.Value()
	if id == "" {
		return c.finishTool(f.json, first, invokeAnswer{OK: true, Result: res}, nil, execNoWaitCode)
	}
	slug := res.Details.ApprovalSlug.Value()
	fmt.Fprintf(c.stderr, "execmesh: waiting for approval %s; an operator answers with: execmesh approvals resolve %s allow-once|deny\n", orDash(slug, id), orDash(slug, id))
	delay := approvalPollMin
	for {
		var st approvalState
		data, err := cl.getJSON(ctx, "/v1/approvals/"+url.PathEscape(id), nil, &st)
		switch {
		case ctx.Err() != nil:
			fmt.Fprintf(c.stderr, "\nexecmesh: stopped waiting; approval %s is still pending (the command runs in the background once approved)\n", orDash(slug, id))
			return &exitError{code: exitFail}
		case err != nil:
			var pe *protocol.Error
			if errors.As(err, &pe) && pe.Type == protocol.ErrNotFound {
				return fmt.Errorf("approval %s: %w (the gateway may have restarted)", orDash(slug, id), err)
			}
			return err
		case st.SessionID != "":
			if st.State == "expired" {
				fmt.Fprintf(c.stderr, "execmesh: approval %s timed out; the fallback policy allows the command\n", orDash(slug, id))
			}
			return c.followExec(ctx, cl, f, o, st.SessionID, nil)
		case st.DeniedReason != "":
			if f.json {
				if err := printJSON(c.stdout, data); err != nil {
					return err
				}
			}
			fmt.Fprintf(c.stderr, "execmesh: exec denied (%s): %s\n", visible.String(st.DeniedReason), visible.String(st.Command))
			return &exitError{code: exitFail}
		}
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		}
		delay = min(2*delay, approvalPollMax)
	}
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
