package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/execmesh/execmesh/protocol"
)

// maxCallInput bounds a `call` request read from stdin; the gateway refuses
// anything over 2 MB anyway.
const maxCallInput = 4 << 20

// newCallCmd is `execmesh call [flags] [JSON]`: one tool call, printed as
// the gateway's JSON answer. Exit 1 when ok is false or details.status is
// failed.
func (c *cli) newCallCmd() *cobra.Command {
	var f clientFlags
	cmd := &cobra.Command{
		Use:   "call [flags] [JSON]",
		Short: "one tool call; JSON from the argument or stdin; prints the JSON answer",
		Long: "Send one tool call to POST /tools/invoke and print the gateway's JSON answer. The request is\n" +
			"{\"tool\":…,\"args\":{…}} (or OpenClaw's flat form) from the argument, or from stdin when the\n" +
			"argument is absent or \"-\"; --session-key is added unless the request names one.\n\n" +
			"Exit status: 0 for an answer with ok true, 1 when ok is false or details.status is failed.",
		Example: "  execmesh call '{\"tool\":\"process\",\"args\":{\"action\":\"list\"}}'\n" +
			"  echo '{\"tool\":\"exec\",\"command\":\"uname -a\"}' | execmesh call",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 1 {
				return usageErrorf("call: want one JSON argument, got %d (quote the JSON)", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error { return c.runCall(cmd.Context(), &f, args) },
	}
	f.register(cmd.Flags(), withSessionKey)
	return cmd
}

func (c *cli) runCall(ctx context.Context, f *clientFlags, args []string) error {
	var raw []byte
	var err error
	if len(args) == 1 && args[0] != "-" {
		raw = []byte(args[0])
	} else if raw, err = io.ReadAll(io.LimitReader(c.stdin, maxCallInput)); err != nil {
		return fmt.Errorf("call: reading stdin: %w", err)
	}
	body, err := callBody(raw, f.sessionKey)
	if err != nil {
		return err
	}
	cl, err := f.client(c)
	if err != nil {
		return err
	}
	defer cl.close()

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

// processExitCode is 1 for a failed process result, else 0.
func processExitCode(r protocol.Result) int {
	if r.Status() == protocol.StatusFailed {
		return exitFail
	}
	return exitOK
}

// processAction describes one `execmesh process ACTION` subcommand.
type processAction struct {
	name    string
	short   string
	example string
	// flags registers the action's own flags; set copies them into the
	// tool arguments (only those given: absent is not zero).
	flags func(fs *pflag.FlagSet)
	set   func(fs *pflag.FlagSet, a *protocol.ProcessArgs) error
}

// processFlags holds every action flag; each action registers its own.
type processFlags struct {
	data, literal, text string
	eof, noBracketed    bool
	keys, hex           listFlag
	offset, limit       int
	timeout             int
	follow              bool
}

func (p *processFlags) actions() []processAction {
	paging := func(what string) func(fs *pflag.FlagSet) {
		return func(fs *pflag.FlagSet) {
			fs.IntVar(&p.offset, "offset", 0, "first `N` of the "+what)
			fs.IntVar(&p.limit, "limit", 0, "how many `N` of the "+what)
		}
	}
	setPaging := func(fs *pflag.FlagSet, a *protocol.ProcessArgs) error {
		return setInts(fs, map[string]struct {
			v   *int
			dst **int
		}{"offset": {&p.offset, &a.Offset}, "limit": {&p.limit, &a.Limit}})
	}
	return []processAction{
		{name: "list", short: "the sessionKey's background and recently finished sessions, newest first",
			example: "  execmesh process list\n  execmesh process list --limit 50 --offset 50",
			flags:   paging("sessions (newest first) to list"), set: setPaging},
		{name: "poll", short: "new output and the status of a session (--follow: until it exits)",
			example: "  execmesh process poll nimble-coral --timeout 5000\n  execmesh process poll nimble-coral --follow",
			flags: func(fs *pflag.FlagSet) {
				fs.IntVar(&p.timeout, "timeout", 0, "wait up to this many `ms` for output or the exit (at most 30000)")
				fs.BoolVar(&p.follow, "follow", false, "print the output live until the session exits, then exit with its status")
			},
			set: func(fs *pflag.FlagSet, a *protocol.ProcessArgs) error {
				return setInts(fs, map[string]struct {
					v   *int
					dst **int
				}{"timeout": {&p.timeout, &a.Timeout}})
			}},
		{name: "log", short: "the session's retained output by lines (the last 200 without --offset and --limit)",
			example: "  execmesh process log nimble-coral --offset 0 --limit 20",
			flags:   paging("lines to show"), set: setPaging},
		{name: "write", short: "write data to the session's stdin (PTY sessions)",
			example: "  execmesh process write nimble-coral --data 'yes\\n'\n  execmesh process write nimble-coral --eof",
			flags: func(fs *pflag.FlagSet) {
				fs.StringVar(&p.data, "data", "", "the `text` to write")
				fs.BoolVar(&p.eof, "eof", false, "close stdin after the data (sends ^D)")
			},
			set: func(fs *pflag.FlagSet, a *protocol.ProcessArgs) error {
				if fs.Changed("data") {
					a.Data = &p.data
				}
				a.EOF = p.eof
				return nil
			}},
		{name: "send-keys", short: "send key tokens, raw bytes or literal text to a PTY session",
			example: "  execmesh process send-keys nimble-coral --keys C-c\n  execmesh process send-keys nimble-coral --keys Up,Enter --literal q",
			flags: func(fs *pflag.FlagSet) {
				p.keys.split, p.hex.split = true, true
				fs.Var(&p.keys, "keys", "key `tokens` such as C-c,Enter,Up (comma-separated or repeated)")
				fs.Var(&p.hex, "hex", "raw `bytes` in hex, such as 1b,5b,41 (comma-separated or repeated)")
				fs.StringVar(&p.literal, "literal", "", "literal `text` to type")
			},
			set: func(fs *pflag.FlagSet, a *protocol.ProcessArgs) error {
				a.Keys, a.Hex = p.keys.values, p.hex.values
				if fs.Changed("literal") {
					a.Literal = &p.literal
				}
				return nil
			}},
		{name: "submit", short: "press Enter in a PTY session (sends CR)", example: "  execmesh process submit nimble-coral"},
		{name: "paste", short: "paste text into a PTY session (bracketed paste unless --no-bracketed)",
			example: "  execmesh process paste nimble-coral --text 'print(1)'",
			flags: func(fs *pflag.FlagSet) {
				fs.StringVar(&p.text, "text", "", "the `text` to paste")
				fs.BoolVar(&p.noBracketed, "no-bracketed", false, "without bracketed-paste markers")
			},
			set: func(fs *pflag.FlagSet, a *protocol.ProcessArgs) error {
				if fs.Changed("text") {
					a.Text = &p.text
				}
				if p.noBracketed {
					a.Bracketed = new(bool)
				}
				return nil
			}},
		{name: "kill", short: "end the session's whole process tree (SIGTERM, SIGKILL after the grace)", example: "  execmesh process kill nimble-coral"},
		{name: "clear", short: "forget a finished session's output", example: "  execmesh process clear nimble-coral"},
		{name: "remove", short: "remove a session (killing it when it still runs)", example: "  execmesh process remove nimble-coral"},
	}
}

// setInts copies the integer flags that were given into their arguments,
// refusing negative values.
func setInts(fs *pflag.FlagSet, flags map[string]struct {
	v   *int
	dst **int
}) error {
	for name, fl := range flags {
		if !fs.Changed(name) {
			continue // absent, not zero: the tool's default applies
		}
		if *fl.v < 0 {
			return usageErrorf("--%s must not be negative", name)
		}
		*fl.dst = fl.v
	}
	return nil
}

// newProcessCmd is `execmesh process ACTION [SESSION-ID] [flags]`. Exit 1
// when details.status is failed.
func (c *cli) newProcessCmd() *cobra.Command {
	var f clientFlags
	var sessionID string
	var pf processFlags
	cmd := groupCmd(&cobra.Command{
		Use:   "process ACTION [SESSION-ID] [flags]",
		Short: "the process tool: follow up on background sessions",
		Long: "The process tool, one subcommand per action. Every action but list takes the session id,\n" +
			"after the action or with --session-id. Exit status 1 when the result's status is failed\n" +
			"(an unknown session, for instance).",
		Annotations: map[string]string{annSynopsis: "process " + strings.Join(protocol.ProcessActions, "|") + " [SESSION-ID] [flags]"},
	})
	f.register(cmd.PersistentFlags(), withSessionKey|withJSON)
	cmd.PersistentFlags().StringVarP(&sessionID, "session-id", "s", "", "the session `id` (or pass it after the action)")
	for _, act := range pf.actions() {
		use := act.name + " SESSION-ID"
		if act.name == "list" {
			use = "list"
		}
		sub := &cobra.Command{
			Use:     use,
			Short:   act.short,
			Example: act.example,
			Args: func(cmd *cobra.Command, args []string) error {
				if act.name == "list" {
					return noArgs(cmd, args)
				}
				_, err := sessionArg(act.name, args, sessionID)
				return err
			},
			ValidArgsFunction: func(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
				if act.name == "list" || len(args) > 0 {
					return nil, cobra.ShellCompDirectiveNoFileComp
				}
				return c.completeSessionIDs(cmd.Context(), &f), cobra.ShellCompDirectiveNoFileComp
			},
			RunE: func(cmd *cobra.Command, args []string) error {
				id := sessionID
				if act.name != "list" {
					id, _ = sessionArg(act.name, args, sessionID)
				}
				a := protocol.ProcessArgs{Action: act.name, SessionID: id}
				if act.set != nil {
					if err := act.set(cmd.Flags(), &a); err != nil {
						return &usageError{msg: "process " + act.name + ": " + err.Error()}
					}
				}
				cl, err := f.client(c)
				if err != nil {
					return err
				}
				defer cl.close()
				if act.name == "poll" && pf.follow {
					res, err := c.follow(cmd.Context(), cl, f.sessionKey, id, true)
					if err != nil {
						return err
					}
					if n, _ := exitStatus(res); n != exitOK {
						return &exitError{code: n}
					}
					return nil
				}
				data, ans, err := cl.invokeTool(cmd.Context(), protocol.ToolProcess, a, f.sessionKey)
				return c.finishTool(f.json, data, ans, err, processExitCode)
			},
		}
		if act.flags != nil {
			act.flags(sub.Flags())
		}
		cmd.AddCommand(sub)
	}
	return cmd
}

// sessionArg returns the session id of a process action, from its one
// positional argument or --session-id; none, two or two different ones
// are usage errors.
func sessionArg(action string, args []string, flagID string) (string, error) {
	switch {
	case len(args) > 1:
		return "", usageErrorf("process %s: unexpected arguments %q", action, args[1:])
	case len(args) == 1 && flagID != "" && flagID != args[0]:
		return "", usageErrorf("process %s: two different session ids: %q and %q", action, flagID, args[0])
	case len(args) == 1:
		return args[0], nil
	case flagID == "":
		return "", usageErrorf("process %s: no session id given (pass it after %q or with --session-id)", action, action)
	}
	return flagID, nil
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

// writeJSONValue prints v as indented JSON.
func writeJSONValue(w io.Writer, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return printJSON(w, data)
}
