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

// runSession is `execmesh session exec [--host H] [--security S] [--ask A]
// [--node N]`: without setting flags it shows the sessionKey's exec
// defaults; with them it changes only the named settings (an empty value
// clears one) and shows the result.
func runSession(ctx context.Context, c *cli, args []string) error {
	const synopsis = "exec [--host H] [--security S] [--ask A] [--node N]"
	fs := newFlagSet("session")
	var f clientFlags
	f.register(fs)
	host := fs.String("host", "", "default exec `host`: auto|sandbox|gateway|node (\"\" clears)")
	security := fs.String("security", "", "default `security`: deny|allowlist|full (\"\" clears)")
	ask := fs.String("ask", "", "default `ask`: off|on-miss|always (\"\" clears)")
	node := fs.String("node", "", "default `node` id or name (\"\" clears)")
	pos, cl, err := f.parseAndConnect(c, fs, synopsis, args, true)
	if err != nil {
		return err
	}
	defer cl.close()
	if len(pos) != 1 || pos[0] != "exec" {
		return usageErrorf("session: want \"session %s\"", synopsis)
	}

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
	}{{"host", host, &cur.Host}, {"security", security, &cur.Security}, {"ask", ask, &cur.Ask}, {"node", node, &cur.Node}} {
		if isSet(fs, s.name) {
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

// runEvents is `execmesh events [--wait-ms N] [--follow]`: prints the
// sessionKey's queued system events (acknowledging them), waiting up to
// --wait-ms for the first; --follow streams them until interrupted.
func runEvents(ctx context.Context, c *cli, args []string) error {
	const synopsis = "[--wait-ms N] [--follow]"
	fs := newFlagSet("events")
	var f clientFlags
	f.register(fs)
	waitMs := fs.Int("wait-ms", 0, "wait up to `ms` for an event when none is queued")
	follow := fs.Bool("follow", false, "stream events (server-sent events) until interrupted")
	pos, cl, err := f.parseAndConnect(c, fs, synopsis, args, true)
	if err != nil {
		return err
	}
	defer cl.close()
	switch {
	case len(pos) > 0:
		return usageErrorf("events: unexpected arguments %q", pos)
	case *waitMs < 0:
		return usageErrorf("events: --wait-ms must not be negative")
	case *follow && isSet(fs, "wait-ms"):
		return usageErrorf("events: --wait-ms and --follow do not mix")
	}
	if *follow {
		return followEvents(ctx, c, cl, f.sessionKey, f.json)
	}

	q := url.Values{"sessionKey": {f.sessionKey}, "waitMs": {strconv.Itoa(*waitMs)}}
	ctx, cancel := context.WithTimeout(ctx, time.Duration(*waitMs)*time.Millisecond+pollMargin)
	defer cancel()
	data, err := cl.request(ctx, http.MethodGet, "/v1/events", q, nil)
	if err != nil {
		return err
	}
	if f.json {
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

// followEvents prints the event stream until ctx ends. A stream that
// breaks after it was established is reopened with backoff (the gateway may
// be restarting); failing to open it the first time is an error.
func followEvents(ctx context.Context, c *cli, cl *client, sessionKey string, raw bool) error {
	q := url.Values{"sessionKey": {sessionKey}}
	backoff := followRetryMin
	for first := true; ; first = false {
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
				return printStreamEvent(c.stdout, data, raw)
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

// printStreamEvent prints one SSE data payload: the JSON line itself with
// --json, else the event as events prints it.
func printStreamEvent(w io.Writer, data string, raw bool) error {
	if raw {
		_, err := fmt.Fprintln(w, data)
		return err
	}
	var ev protocol.SystemEvent
	if err := json.Unmarshal([]byte(data), &ev); err != nil {
		// Not an event (a comment or a server notice): show it as is.
		_, err = fmt.Fprintln(w, data)
		return err
	}
	printEvent(w, ev)
	return nil
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
