package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/execmesh/execmesh/protocol"
)

// execDefaults are the per-sessionKey exec defaults of
// /v1/sessions/<sessionKey>/exec.
type execDefaults struct {
	Host     string `json:"host"`
	Security string `json:"security"`
	Ask      string `json:"ask"`
	Node     string `json:"node"`
}

// newSessionCmd is `execmesh session exec [--host H] [--security S]
// [--ask A] [--node N]`: without setting flags it shows the sessionKey's
// exec defaults; with them it changes only the named settings (an empty
// value clears one) and shows the result.
func (c *cli) newSessionCmd() *cobra.Command {
	var f clientFlags
	var d execDefaults
	cmd := groupCmd(&cobra.Command{
		Use:         "session exec [flags]",
		Short:       "show or set this sessionKey's exec defaults",
		Annotations: map[string]string{annSynopsis: "session exec [--host H] [--security S] [--ask A] [--node N]"},
	})
	exec := &cobra.Command{
		Use:   "exec [--host H] [--security S] [--ask A] [--node N]",
		Short: "show or set the sessionKey's exec defaults (they only tighten the configuration)",
		Long: "Without flags, print the sessionKey's exec defaults (GET /v1/sessions/<sessionKey>/exec); with\n" +
			"flags, change only the settings named (an empty value clears one) and print the result.",
		Example: "  execmesh session exec\n  execmesh session exec --security allowlist --ask always\n" +
			"  execmesh session exec --session-key agent:ops:main --host node --node build-1\n  execmesh session exec --node ''",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return c.runSessionExec(cmd, &f, &d) },
	}
	fs := exec.Flags()
	f.register(fs, withSessionKey|withJSON)
	fs.StringVar(&d.Host, "host", "", "default exec `host`: auto|sandbox|gateway|node (\"\" clears)")
	fs.StringVar(&d.Security, "security", "", "default `security`: deny|allowlist|full (\"\" clears)")
	fs.StringVar(&d.Ask, "ask", "", "default `ask`: off|on-miss|always (\"\" clears)")
	fs.StringVar(&d.Node, "node", "", "default `node` id or name (\"\" clears)")
	completeValues(exec, "host", "auto", "sandbox", "gateway", "node")
	completeValues(exec, "security", "deny", "allowlist", "full")
	completeValues(exec, "ask", "off", "on-miss", "always")
	cmd.AddCommand(exec)
	return cmd
}

func (c *cli) runSessionExec(cmd *cobra.Command, f *clientFlags, want *execDefaults) error {
	ctx := cmd.Context()
	cl, err := f.client(c)
	if err != nil {
		return err
	}
	defer cl.close()
	path := "/v1/sessions/" + url.PathEscape(f.sessionKey) + "/exec"
	var cur execDefaults
	data, err := cl.getJSON(ctx, path, nil, &cur)
	if err != nil {
		return err
	}
	changed := false
	for _, s := range []struct {
		name string
		val  *string
		dst  *string
	}{{"host", &want.Host, &cur.Host}, {"security", &want.Security, &cur.Security}, {"ask", &want.Ask, &cur.Ask}, {"node", &want.Node, &cur.Node}} {
		if cmd.Flags().Changed(s.name) {
			*s.dst, changed = *s.val, true
		}
	}
	if changed {
		// PUT carries every setting: the ones not named on the command line
		// keep the values just read.
		next := cur
		if data, err = cl.apiJSON(ctx, http.MethodPut, path, nil, next, &cur); err != nil {
			return err
		}
		if len(strings.TrimSpace(string(data))) == 0 {
			cur = next
			data, _ = json.Marshal(cur)
		}
	}
	if f.json {
		return printJSON(c.stdout, data)
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "sessionKey\t%s\n", f.sessionKey)
	for _, kv := range [][2]string{{"host", cur.Host}, {"security", cur.Security}, {"ask", cur.Ask}, {"node", cur.Node}} {
		fmt.Fprintf(tw, "%s\t%s\n", kv[0], orDash(kv[1], "(config default)"))
	}
	return tw.Flush()
}

// orDash returns s, or alt when s is empty.
func orDash(s, alt string) string {
	if s == "" {
		return alt
	}
	return s
}

// newEventsCmd is `execmesh events [--wait-ms N] [--follow]`: prints the
// sessionKey's queued system events (acknowledging them), waiting up to
// --wait-ms for the first; --follow streams them until interrupted.
func (c *cli) newEventsCmd() *cobra.Command {
	var f clientFlags
	var waitMs int
	var follow bool
	cmd := &cobra.Command{
		Use:   "events [--wait-ms N] [--follow]",
		Short: "print queued system events (exec exits, approvals); they are acknowledged",
		Long: "Print the sessionKey's queued system events (exec.exit, exec.denied, exec.running,\n" +
			"exec.finished) as TIME KIND TEXT. Reading them acknowledges them: they are the agent's, so\n" +
			"read them with the agent's sessionKey only when you stand in for the agent.",
		Example: "  execmesh events --wait-ms 30000\n  execmesh events --follow --session-key agent:ops:main",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case waitMs < 0:
				return usageErrorf("events: --wait-ms must not be negative")
			case follow && cmd.Flags().Changed("wait-ms"):
				return usageErrorf("events: --wait-ms and --follow do not mix")
			}
			cl, err := f.client(c)
			if err != nil {
				return err
			}
			defer cl.close()
			if follow {
				return followEvents(cmd.Context(), c, cl, f.sessionKey, f.json)
			}
			return printEvents(cmd.Context(), c, cl, f.sessionKey, waitMs, f.json)
		},
	}
	f.register(cmd.Flags(), withSessionKey|withJSON)
	cmd.Flags().IntVar(&waitMs, "wait-ms", 0, "wait up to `ms` for an event when none is queued")
	cmd.Flags().BoolVar(&follow, "follow", false, "stream events (server-sent events) until interrupted")
	return cmd
}

// printEvents is one long poll of GET /v1/events.
func printEvents(ctx context.Context, c *cli, cl *client, sessionKey string, waitMs int, raw bool) error {
	q := url.Values{"sessionKey": {sessionKey}, "waitMs": {strconv.Itoa(waitMs)}}
	ctx, cancel := context.WithTimeout(ctx, time.Duration(waitMs)*time.Millisecond+pollMargin)
	defer cancel()
	data, err := cl.request(ctx, http.MethodGet, "/v1/events", q, nil)
	if err != nil {
		return err
	}
	if raw {
		return printJSON(c.stdout, data)
	}
	var ans struct {
		Events []protocol.SystemEvent `json:"events"`
	}
	if err := json.Unmarshal(data, &ans); err != nil {
		return fmt.Errorf("GET /v1/events: unexpected answer: %w", err)
	}
	for _, ev := range ans.Events {
		printEvent(c.stdout, ev)
	}
	return nil
}

// printEvent prints one event as "TIME KIND TEXT".
func printEvent(w io.Writer, ev protocol.SystemEvent) {
	ts := "-"
	if ev.TS > 0 {
		ts = time.UnixMilli(ev.TS).Format(time.RFC3339)
	}
	fmt.Fprintf(w, "%s %s %s\n", ts, orDash(ev.Kind, "-"), ev.Text)
}

// Reconnect backoff of events --follow.
const (
	followRetryMin = 500 * time.Millisecond
	followRetryMax = 10 * time.Second
)

// followEvents prints the event stream until ctx ends, acknowledging each
// event once it is printed (the stream itself confirms nothing), so that
// a follower stopped at any moment, by SIGINT included, never has another
// reader get what it printed. A stream that breaks after it was
// established is reopened with backoff (the gateway may be restarting),
// after the last event printed; failing to open it the first time is an
// error.
func followEvents(ctx context.Context, c *cli, cl *client, sessionKey string, raw bool) error {
	q := url.Values{"sessionKey": {sessionKey}}
	backoff := followRetryMin
	lastPrinted := ""
	for first := true; ; first = false {
		if lastPrinted != "" {
			// Resuming after it also confirms what an ack that failed
			// left unconfirmed.
			q.Set("after", lastPrinted)
		}
		resp, err := cl.send(ctx, http.MethodGet, "/v1/events/stream", q, nil, "text/event-stream")
		if err == nil && resp.StatusCode != http.StatusOK {
			data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			err = answerError(resp.StatusCode, data)
		}
		if ctx.Err() != nil {
			return nil // interrupted: the normal way to stop following
		}
		if err != nil && first {
			return err
		}
		if err == nil {
			backoff = followRetryMin
			err = readSSE(resp.Body, func(data string) error {
				id, err := printStreamEvent(c.stdout, data, raw)
				if err != nil || id == "" {
					return err
				}
				lastPrinted = id
				ackEvent(ctx, c, cl, sessionKey, id)
				return nil
			})
			resp.Body.Close()
			if ctx.Err() != nil {
				return nil
			}
		}
		fmt.Fprintf(c.stderr, "execmesh: event stream interrupted (%v); reconnecting in %v\n", errOr(err, "closed by the gateway"), backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, followRetryMax)
	}
}

// eventAckTimeout bounds the acknowledgement of one printed event.
const eventAckTimeout = 10 * time.Second

// ackEvent confirms the events of sessionKey up to id (POST
// /v1/events/ack). It runs even when ctx was just cancelled (SIGINT after
// the event was printed): what was printed must not be delivered again.
// A failure is said on stderr; the next stream, resumed after id, confirms
// it then.
func ackEvent(ctx context.Context, c *cli, cl *client, sessionKey, id string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), eventAckTimeout)
	defer cancel()
	body := map[string]string{"sessionKey": sessionKey, "upTo": id}
	if _, err := cl.request(ctx, http.MethodPost, "/v1/events/ack", nil, body); err != nil {
		fmt.Fprintf(c.stderr, "execmesh: event %s is printed but not acknowledged (%v); another reader may get it again\n", id, err)
	}
}

// printStreamEvent prints one SSE data payload: the JSON line itself with
// --json, else the event as events prints it. It returns the id to
// acknowledge: the event's, when it is a stored event (the announcement of
// dropped events has none of its own).
func printStreamEvent(w io.Writer, data string, raw bool) (string, error) {
	var ev protocol.SystemEvent
	isEvent := json.Unmarshal([]byte(data), &ev) == nil
	var err error
	switch {
	case raw || !isEvent:
		// Not an event (a server notice): shown as is.
		_, err = fmt.Fprintln(w, data)
	default:
		printEvent(w, ev)
	}
	if err != nil || !isEvent || ev.ID == "" || strings.Trim(ev.ID, "0123456789") != "" {
		return "", err
	}
	return ev.ID, nil
}

// readSSE reads a server-sent event stream and calls fn with the data of
// each event (multi-line data joined by newlines). It returns when the
// stream ends or fn fails.
func readSSE(r io.Reader, fn func(data string) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxAnswer)
	var data []string
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			if len(data) > 0 {
				if err := fn(strings.Join(data, "\n")); err != nil {
					return err
				}
				data = data[:0]
			}
			continue
		}
		if strings.HasPrefix(line, ":") {
			continue // comment / keep-alive
		}
		field, value, _ := strings.Cut(line, ":")
		if field == "data" {
			data = append(data, strings.TrimPrefix(value, " "))
		}
	}
	return sc.Err()
}
