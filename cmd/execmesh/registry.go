package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// nodeInfo is one entry of GET /v1/nodes. The fields whose JSON type the
// API leaves open (a time as a number or a string, a count or a list) stay
// raw and are rendered by cell.
type nodeInfo struct {
	ID       string          `json:"id"`
	Name     string          `json:"name"`
	Status   string          `json:"status"`
	Paired   bool            `json:"paired"`
	Platform string          `json:"platform"`
	LastSeen json.RawMessage `json:"lastSeen"`
	Sessions json.RawMessage `json:"sessions"`
	Server   json.RawMessage `json:"server"`
}

// runNodes is `execmesh nodes list|pending|approve ID|reject ID|invite`.
func runNodes(ctx context.Context, c *cli, args []string) error {
	const synopsis = "list | pending | approve ID | reject ID | invite [--name N] [--ttl D] | approvals get ID | approvals set ID FILE|- --base-hash H"
	fs := newFlagSet("nodes")
	var f clientFlags
	f.register(fs)
	name := fs.String("name", "", "invite: `name` of the new node")
	ttl := fs.Duration("ttl", 0, "invite: how long the join code stays valid, such as 15m (default: the gateway's)")
	baseHash := fs.String("base-hash", "", "approvals set: the `hash` that approvals get printed (\"\" when the node has no file yet)")
	pos, cl, err := f.parseAndConnect(c, fs, synopsis, args, true)
	if err != nil {
		return err
	}
	defer cl.close()
	if len(pos) == 0 {
		return usageErrorf("nodes: want a subcommand: %s", synopsis)
	}
	sub, rest := pos[0], pos[1:]
	if sub != "invite" && (isSet(fs, "name") || isSet(fs, "ttl")) {
		return usageErrorf("nodes %s: --name and --ttl belong to \"nodes invite\"", sub)
	}
	switch sub {
	case "list", "pending":
		if len(rest) > 0 {
			return usageErrorf("nodes %s: unexpected arguments %q", sub, rest)
		}
		return listNodes(ctx, c, cl, sub == "pending", f.json)
	case "approve", "reject":
		if len(rest) != 1 {
			return usageErrorf("nodes %s: want one node ID", sub)
		}
		data, err := cl.apiJSON(ctx, http.MethodPost, "/v1/nodes/"+url.PathEscape(rest[0])+"/"+sub, nil, struct{}{}, nil)
		if err != nil {
			return err
		}
		if f.json {
			return printJSONOrEmpty(c.stdout, data)
		}
		fmt.Fprintf(c.stdout, "node %s: %s\n", rest[0], map[string]string{"approve": "approved", "reject": "rejected"}[sub])
		return nil
	case "approvals":
		return nodeApprovals(ctx, c, cl, rest, *baseHash, isSet(fs, "base-hash"))
	case "invite":
		if len(rest) > 0 {
			return usageErrorf("nodes invite: unexpected arguments %q", rest)
		}
		if *ttl < 0 {
			return usageErrorf("nodes invite: --ttl must not be negative")
		}
		return inviteNode(ctx, c, cl, *name, *ttl, f.json)
	default:
		return usageErrorf("nodes: unknown subcommand %q (want %s)", sub, synopsis)
	}
}

// nodeApprovals is `nodes approvals get ID` (prints the node's
// exec-approvals.json with its path and hash) and `nodes approvals set ID
// FILE --base-hash H` (replaces it when it still has that hash).
func nodeApprovals(ctx context.Context, c *cli, cl *client, args []string, baseHash string, hashSet bool) error {
	if len(args) < 2 {
		return usageErrorf("nodes approvals: want get ID or set ID FILE")
	}
	path := "/v1/nodes/" + url.PathEscape(args[1]) + "/approvals"
	switch args[0] {
	case "get":
		if len(args) != 2 {
			return usageErrorf("nodes approvals get: want one node ID")
		}
		data, err := cl.apiJSON(ctx, http.MethodGet, path, nil, nil, nil)
		if err != nil {
			return err
		}
		return printJSON(c.stdout, data)
	case "set":
		if len(args) != 3 {
			return usageErrorf("nodes approvals set: want a node ID and a FILE (or - for stdin)")
		}
		if !hashSet {
			return usageErrorf("nodes approvals set: --base-hash is required (the hash printed by \"nodes approvals get\"; \"\" when the node has no file)")
		}
		var raw []byte
		var err error
		if args[2] == "-" {
			raw, err = io.ReadAll(c.stdin)
		} else {
			raw, err = os.ReadFile(args[2])
		}
		if err != nil {
			return err
		}
		if !json.Valid(raw) {
			return fmt.Errorf("nodes approvals set: %s is not JSON", args[2])
		}
		body := struct {
			File     json.RawMessage `json:"file"`
			BaseHash string          `json:"baseHash"`
		}{raw, baseHash}
		data, err := cl.apiJSON(ctx, http.MethodPut, path, nil, body, nil)
		if err != nil {
			return err
		}
		return printJSON(c.stdout, data)
	default:
		return usageErrorf("nodes approvals: unknown action %q (want get or set)", args[0])
	}
}

// listNodes prints the node registry as an aligned table; pending lists
// only the nodes not paired yet.
func listNodes(ctx context.Context, c *cli, cl *client, pending, raw bool) error {
	var ans struct {
		Nodes []nodeInfo `json:"nodes"`
	}
	data, err := cl.getJSON(ctx, "/v1/nodes", nil, &ans)
	if err != nil {
		return err
	}
	nodes := ans.Nodes
	if pending {
		nodes = slices.DeleteFunc(nodes, func(n nodeInfo) bool { return n.Paired })
	}
	if raw {
		if !pending {
			return printJSON(c.stdout, data)
		}
		out, err := json.Marshal(struct {
			Nodes []nodeInfo `json:"nodes"`
		}{append([]nodeInfo{}, nodes...)})
		if err != nil {
			return err
		}
		return printJSON(c.stdout, out)
	}
	if len(nodes) == 0 {
		fmt.Fprintln(c.stderr, map[bool]string{false: "no nodes", true: "no nodes awaiting pairing"}[pending])
		return nil
	}
	now := time.Now()
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tSTATUS\tPAIRED\tPLATFORM\tLAST SEEN\tSESSIONS\tSERVER")
	for _, n := range nodes {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
			orDash(n.ID, "-"), orDash(n.Name, "-"), orDash(n.Status, "-"), yesNo(n.Paired),
			orDash(n.Platform, "-"), age(n.LastSeen, now), cell(n.Sessions), cell(n.Server))
	}
	return tw.Flush()
}

// inviteNode asks for a join code and prints the one command line to run
// on the new machine.
func inviteNode(ctx context.Context, c *cli, cl *client, name string, ttl time.Duration, raw bool) error {
	req := struct {
		Name  string `json:"name,omitempty"`
		TTLMs int64  `json:"ttlMs,omitempty"`
	}{name, ttl.Milliseconds()}
	var ans struct {
		Code        string `json:"code"`
		Command     string `json:"command"`
		ExpiresAtMs int64  `json:"expiresAtMs"`
	}
	data, err := cl.apiJSON(ctx, http.MethodPost, "/v1/nodes/invite", nil, req, &ans)
	if err != nil {
		return err
	}
	if raw {
		return printJSON(c.stdout, data)
	}
	if ans.Command == "" {
		if ans.Code == "" {
			return fmt.Errorf("POST /v1/nodes/invite: the answer has no command")
		}
		ans.Command = "execmesh node --join " + ans.Code
	}
	fmt.Fprintln(c.stdout, ans.Command)
	return nil
}

// approvalInfo is one entry of GET /v1/approvals.
type approvalInfo struct {
	ID          string `json:"id"`
	Slug        string `json:"slug"`
	Command     string `json:"command"`
	Host        string `json:"host"`
	NodeID      string `json:"nodeId"`
	Cwd         string `json:"cwd"`
	AgentID     string `json:"agentId"`
	SessionKey  string `json:"sessionKey"`
	ExpiresAtMs int64  `json:"expiresAtMs"`
}

// decisions are the answers an approval takes.
var decisions = []string{"allow-once", "allow-always", "deny"}

// runApprovals is `execmesh approvals list|resolve ID DECISION`.
func runApprovals(ctx context.Context, c *cli, args []string) error {
	const synopsis = "list | resolve ID allow-once|allow-always|deny"
	fs := newFlagSet("approvals")
	var f clientFlags
	f.register(fs)
	pos, cl, err := f.parseAndConnect(c, fs, synopsis, args, true)
	if err != nil {
		return err
	}
	defer cl.close()
	if len(pos) == 0 {
		return usageErrorf("approvals: want a subcommand: %s", synopsis)
	}
	switch sub, rest := pos[0], pos[1:]; sub {
	case "list":
		if len(rest) > 0 {
			return usageErrorf("approvals list: unexpected arguments %q", rest)
		}
		return listApprovals(ctx, c, cl, f.json)
	case "resolve":
		if len(rest) != 2 {
			return usageErrorf("approvals resolve: want ID and a decision (%s)", strings.Join(decisions, ", "))
		}
		id, decision := rest[0], rest[1]
		if !slices.Contains(decisions, decision) {
			return usageErrorf("approvals resolve: invalid decision %q (want %s)", decision, strings.Join(decisions, ", "))
		}
		body := struct {
			Decision string `json:"decision"`
		}{decision}
		data, err := cl.apiJSON(ctx, http.MethodPost, "/v1/approvals/"+url.PathEscape(id), nil, body, nil)
		if err != nil {
			return err
		}
		if f.json {
			return printJSONOrEmpty(c.stdout, data)
		}
		fmt.Fprintf(c.stdout, "approval %s: %s\n", id, decision)
		return nil
	default:
		return usageErrorf("approvals: unknown subcommand %q (want %s)", sub, synopsis)
	}
}

// listApprovals prints the pending approvals as an aligned table.
func listApprovals(ctx context.Context, c *cli, cl *client, raw bool) error {
	var ans struct {
		Approvals []approvalInfo `json:"approvals"`
	}
	data, err := cl.getJSON(ctx, "/v1/approvals", nil, &ans)
	if err != nil {
		return err
	}
	if raw {
		return printJSON(c.stdout, data)
	}
	if len(ans.Approvals) == 0 {
		fmt.Fprintln(c.stderr, "no pending approvals")
		return nil
	}
	now := time.Now()
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSLUG\tHOST\tNODE\tAGENT\tSESSION KEY\tEXPIRES\tCWD\tCOMMAND")
	for _, a := range ans.Approvals {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
			orDash(a.ID, "-"), orDash(a.Slug, "-"), orDash(a.Host, "-"), orDash(a.NodeID, "-"),
			orDash(a.AgentID, "-"), orDash(a.SessionKey, "-"), until(a.ExpiresAtMs, now),
			orDash(a.Cwd, "-"), oneLine(a.Command))
	}
	return tw.Flush()
}

// runAdmin is `execmesh admin blockers`.
func runAdmin(ctx context.Context, c *cli, args []string) error {
	const synopsis = "blockers"
	fs := newFlagSet("admin")
	var f clientFlags
	f.register(fs)
	pos, cl, err := f.parseAndConnect(c, fs, synopsis, args, true)
	if err != nil {
		return err
	}
	defer cl.close()
	if len(pos) != 1 || pos[0] != "blockers" {
		return usageErrorf("admin: want \"admin %s\"", synopsis)
	}
	var ans struct {
		Blockers []json.RawMessage `json:"blockers"`
	}
	data, err := cl.getJSON(ctx, "/v1/admin/blockers", nil, &ans)
	if err != nil {
		return err
	}
	if f.json {
		return printJSON(c.stdout, data)
	}
	if len(ans.Blockers) == 0 {
		fmt.Fprintln(c.stdout, "no blockers: a restart would interrupt nothing")
		return nil
	}
	for _, b := range ans.Blockers {
		fmt.Fprintln(c.stdout, describe(b))
	}
	return nil
}

// describe renders one JSON value on a line: an object as key=value pairs
// (identifying keys first), anything else as cell does.
func describe(raw json.RawMessage) string {
	var obj map[string]json.RawMessage
	if json.Unmarshal(raw, &obj) != nil || obj == nil {
		return cell(raw)
	}
	first := []string{"id", "sessionId", "nodeId", "pid", "status", "reason"}
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	sort.SliceStable(keys, func(i, j int) bool {
		ri, rj := rank(first, keys[i]), rank(first, keys[j])
		if ri != rj {
			return ri < rj
		}
		return keys[i] < keys[j]
	})
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		v := cell(obj[k])
		if strings.ContainsAny(v, " \t") {
			v = strconv.Quote(v)
		}
		parts = append(parts, k+"="+v)
	}
	return strings.Join(parts, " ")
}

// rank is the position of k in order, or len(order) when absent.
func rank(order []string, k string) int {
	if i := slices.Index(order, k); i >= 0 {
		return i
	}
	return len(order)
}

// cell renders a JSON value for a table cell: strings plain, null and empty
// as "-", lists by their length, anything else compact.
func cell(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" || string(raw) == `""` {
		return "-"
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return oneLine(s)
	}
	var l []json.RawMessage
	if json.Unmarshal(raw, &l) == nil {
		return strconv.Itoa(len(l))
	}
	var b bool
	if json.Unmarshal(raw, &b) == nil {
		return yesNo(b)
	}
	var buf bytes.Buffer
	if json.Compact(&buf, raw) != nil {
		return string(raw)
	}
	return buf.String()
}

// age renders a point in time (unix ms, or an RFC 3339 string) as the time
// since then: "12s ago".
func age(raw json.RawMessage, now time.Time) string {
	t, ok := parseTime(raw)
	if !ok {
		var n float64
		if json.Unmarshal(raw, &n) == nil {
			return "-" // 0: never seen
		}
		return cell(raw)
	}
	d := now.Sub(t)
	if d < time.Second {
		return "just now"
	}
	return shortDuration(d) + " ago"
}

// until renders an expiry in unix ms as the time left: "in 4m".
func until(ms int64, now time.Time) string {
	if ms <= 0 {
		return "-"
	}
	d := time.UnixMilli(ms).Sub(now)
	if d <= 0 {
		return "expired"
	}
	return "in " + shortDuration(d)
}

// parseTime reads unix milliseconds or an RFC 3339 string; zero is no time.
func parseTime(raw json.RawMessage) (time.Time, bool) {
	var ms float64
	if json.Unmarshal(raw, &ms) == nil {
		if ms <= 0 {
			return time.Time{}, false
		}
		return time.UnixMilli(int64(ms)), true
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if t, err := time.Parse(time.RFC3339Nano, s); err == nil && !t.IsZero() {
			return t, true
		}
	}
	return time.Time{}, false
}

// shortDuration renders d in its largest unit: 45s, 12m, 3h, 2d.
func shortDuration(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d/time.Hour))
	default:
		return fmt.Sprintf("%dd", int(d/(24*time.Hour)))
	}
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// oneLine keeps a table row on one line.
func oneLine(s string) string {
	if s == "" {
		return "-"
	}
	return strings.Join(strings.Fields(s), " ")
}

// printJSONOrEmpty prints a JSON answer, or {} for an empty one.
func printJSONOrEmpty(w io.Writer, data []byte) error {
	if len(bytes.TrimSpace(data)) == 0 {
		data = []byte("{}")
	}
	return printJSON(w, data)
}
