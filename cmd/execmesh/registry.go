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

	"github.com/spf13/cobra"

	"github.com/execmesh/execmesh/internal/visible"
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

// newNodesCmd is `execmesh nodes list|pending|approve|reject|invite|
// approvals get|set|credentials`.
func (c *cli) newNodesCmd() *cobra.Command {
	var f clientFlags
	cmd := groupCmd(&cobra.Command{
		Use:   "nodes SUBCOMMAND",
		Short: "node registry, pairing, join codes and the nodes' exec-approvals files",
		Annotations: map[string]string{annSynopsis: "nodes list | pending | approve NODE | reject NODE | invite [--name N] [--ttl D]\n" +
			"nodes approvals get NODE | set NODE FILE|- --base-hash H\n" +
			"nodes credentials --name N [--out DIR] [--prefix P] [--gateway]"},
	})
	f.register(cmd.PersistentFlags(), withJSON)
	nodeArg := func(verb string) cobra.PositionalArgs {
		return exactArgs(1, "want one node id or name ("+verb+" which node?)")
	}
	completeNode := func(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return c.completeNodes(cmd.Context(), &f), cobra.ShellCompDirectiveNoFileComp
	}
	withClient := func(fn func(ctx context.Context, cl *client, args []string) error) func(*cobra.Command, []string) error {
		return f.run(c, fn)
	}
	list := func(pending bool) func(ctx context.Context, cl *client, _ []string) error {
		return func(ctx context.Context, cl *client, _ []string) error { return listNodes(ctx, c, cl, pending, f.json) }
	}
	cmd.AddCommand(
		&cobra.Command{Use: "list", Short: "every known node: id, name, status, pairing, last seen, sessions, NATS server",
			Example: "  execmesh nodes list\n  execmesh nodes list --json", Args: noArgs, RunE: withClient(list(false))},
		&cobra.Command{Use: "pending", Short: "the nodes that wait for pairing", Example: "  execmesh nodes pending\n  execmesh nodes approve build-1", Args: noArgs, RunE: withClient(list(true))},
	)
	for _, verb := range []string{"approve", "reject"} {
		sub := &cobra.Command{
			Use:   verb + " NODE",
			Short: map[string]string{"approve": "pair a node (by id or name)", "reject": "refuse a node: its identity is removed and its connections closed"}[verb],
			Long: "NODE is a node id or a node's name, as for exec --node (an ambiguous name is refused: use the id).\n" +
				"An operator call: it sends the operator token (--operator-token, $EXECMESH_OPERATOR_TOKEN, else <state-dir>/operator.token).",
			Example:           "  execmesh nodes " + verb + " build-1",
			Args:              nodeArg(verb),
			ValidArgsFunction: completeNode,
			RunE: withClient(func(ctx context.Context, cl *client, args []string) error {
				var ans struct {
					Node nodeInfo `json:"node"`
				}
				data, err := cl.apiJSON(ctx, http.MethodPost, "/v1/nodes/"+url.PathEscape(args[0])+"/"+verb, nil, struct{}{}, &ans)
				if err != nil {
					return err
				}
				if f.json {
					return printJSONOrEmpty(c.stdout, data)
				}
				who := args[0]
				if ans.Node.ID != "" && ans.Node.ID != args[0] {
					who = fmt.Sprintf("%s (id %s)", args[0], ans.Node.ID)
				}
				fmt.Fprintf(c.stdout, "node %s: %s\n", who, map[string]string{"approve": "approved", "reject": "rejected"}[verb])
				return nil
			}),
		}
		f.registerOperator(sub.Flags())
		cmd.AddCommand(sub)
	}

	var name string
	var ttl time.Duration
	var local bool
	invite := &cobra.Command{
		Use:   "invite [--name N] [--ttl D] [--local]",
		Short: "print the one command line that joins a new machine: execmesh node --join CODE",
		Long: "Create a join code and print the command to run on the new machine. The code carries the NATS\n" +
			"URL(s) of the gateway's embedded server and a one-time secret; the node joins, gets its own\n" +
			"confined NATS credentials and is paired. The embedded server must listen where the new machine\n" +
			"can reach it: start the gateway with --nats-listen 0.0.0.0:4222 (and a --token); on loopback\n" +
			"only, the gateway refuses, unless --local says the node runs on this machine. An operator call\n" +
			"(see nodes approve).",
		Example: "  execmesh nodes invite --name build-1\n  execmesh nodes invite --ttl 1h\n  execmesh nodes invite --local --name side-node   # a second node on this machine",
		Args:    noArgs,
		RunE: withClient(func(ctx context.Context, cl *client, _ []string) error {
			if ttl < 0 {
				return usageErrorf("nodes invite: --ttl must not be negative")
			}
			return inviteNode(ctx, c, cl, name, ttl, local, f.json)
		}),
	}
	invite.Flags().StringVar(&name, "name", "", "`name` of the new node")
	invite.Flags().DurationVar(&ttl, "ttl", 0, "how long the join code stays valid, such as 15m (default: the gateway's, 15m)")
	invite.Flags().BoolVar(&local, "local", false, "the node runs on the gateway's machine (a loopback NATS address is fine)")
	f.registerOperator(invite.Flags())
	cmd.AddCommand(invite, c.newCredentialsCmd())

	approvals := groupCmd(&cobra.Command{
		Use:   "approvals get|set NODE",
		Short: "read or replace a node's exec-approvals.json",
	})
	var baseHash string
	get := &cobra.Command{
		Use:               "get NODE",
		Short:             "print a node's exec-approvals.json with its path and hash",
		Example:           "  execmesh nodes approvals get build-1",
		Args:              nodeArg("get"),
		ValidArgsFunction: completeNode,
		RunE: withClient(func(ctx context.Context, cl *client, args []string) error {
			data, err := cl.apiJSON(ctx, http.MethodGet, "/v1/nodes/"+url.PathEscape(args[0])+"/approvals", nil, nil, nil)
			if err != nil {
				return err
			}
			return printJSON(c.stdout, data)
		}),
	}
	set := &cobra.Command{
		Use:   "set NODE FILE|- --base-hash H",
		Short: "replace a node's exec-approvals.json when it still has the hash get printed",
		Example: "  execmesh nodes approvals get build-1 > a.json   # note its hash\n" +
			"  execmesh nodes approvals set build-1 new.json --base-hash 3f2a…",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 2 {
				return usageErrorf("nodes approvals set: want a node and a FILE (or - for stdin)")
			}
			if !cmd.Flags().Changed("base-hash") {
				return usageErrorf("nodes approvals set: --base-hash is required (the hash printed by \"nodes approvals get\"; \"\" when the node has no file)")
			}
			return nil
		},
		RunE: withClient(func(ctx context.Context, cl *client, args []string) error {
			return setNodeApprovals(ctx, c, cl, args[0], args[1], baseHash)
		}),
	}
	set.Flags().StringVar(&baseHash, "base-hash", "", "the `hash` that approvals get printed (\"\" when the node has no file yet; required)")
	for _, sub := range []*cobra.Command{get, set} {
		f.registerOperator(sub.Flags())
		approvals.AddCommand(sub)
	}
	cmd.AddCommand(approvals)
	return cmd
}

// setNodeApprovals is `nodes approvals set NODE FILE --base-hash H`: it
// replaces the node's exec-approvals.json when it still has that hash.
func setNodeApprovals(ctx context.Context, c *cli, cl *client, node, file, baseHash string) error {
	var raw []byte
	var err error
	if file == "-" {
		raw, err = io.ReadAll(c.stdin)
	} else {
		raw, err = os.ReadFile(file)
	}
	if err != nil {
		return err
	}
	if !json.Valid(raw) {
		return fmt.Errorf("nodes approvals set: %s is not JSON", file)
	}
	body := struct {
		File     json.RawMessage `json:"file"`
		BaseHash string          `json:"baseHash"`
	}{raw, baseHash}
	data, err := cl.apiJSON(ctx, http.MethodPut, "/v1/nodes/"+url.PathEscape(node)+"/approvals", nil, body, nil)
	if err != nil {
		return err
	}
	return printJSON(c.stdout, data)
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

// newGatewaysCmd is `execmesh gateways list`.
func (c *cli) newGatewaysCmd() *cobra.Command {
	var f clientFlags
	cmd := groupCmd(&cobra.Command{
		Use:         "gateways SUBCOMMAND",
		Short:       "the gateways of the deployment (several share one NATS cluster)",
		Annotations: map[string]string{annSynopsis: "gateways list"},
	})
	f.register(cmd.PersistentFlags(), withJSON)
	cmd.AddCommand(&cobra.Command{
		Use:     "list",
		Short:   "every gateway heart-beating: id, name, version, listen address, started, last seen",
		Example: "  execmesh gateways list\n  execmesh gateways list --json",
		Args:    noArgs,
		RunE: f.run(c, func(ctx context.Context, cl *client, _ []string) error {
			return listGateways(ctx, c, cl, f.json)
		}),
	})
	return cmd
}

// listGateways prints GET /v1/gateways.
func listGateways(ctx context.Context, c *cli, cl *client, raw bool) error {
	var ans struct {
		Gateways []struct {
			ID        string `json:"id"`
			Name      string `json:"name"`
			Version   string `json:"version"`
			Listen    string `json:"listen"`
			StartedAt int64  `json:"startedAt"`
			SeenAt    int64  `json:"seenAt"`
			Self      bool   `json:"self"`
		} `json:"gateways"`
	}
	data, err := cl.getJSON(ctx, "/v1/gateways", nil, &ans)
	if err != nil {
		return err
	}
	if raw {
		return printJSON(c.stdout, data)
	}
	now := time.Now()
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tVERSION\tLISTEN\tSTARTED\tLAST SEEN\t")
	for _, g := range ans.Gateways {
		self := ""
		if g.Self {
			self = "(this gateway)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", g.ID, orDash(g.Name, "-"), orDash(g.Version, "-"), orDash(g.Listen, "-"),
			ago(time.UnixMilli(g.StartedAt), now), ago(time.UnixMilli(g.SeenAt), now), self)
	}
	return tw.Flush()
}

// ago is how long before now t was, rounded to the second.
func ago(t time.Time, now time.Time) string {
	return now.Sub(t).Round(time.Second).String() + " ago"
}

// inviteNode asks for a join code and prints the one command line to run
// on the new machine.
func inviteNode(ctx context.Context, c *cli, cl *client, name string, ttl time.Duration, local, raw bool) error {
	req := struct {
		Name  string `json:"name,omitempty"`
		TTLMs int64  `json:"ttlMs,omitempty"`
		Local bool   `json:"local,omitempty"`
	}{name, ttl.Milliseconds(), local}
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

// newApprovalsCmd is `execmesh approvals list|get ID|resolve ID DECISION`.
func (c *cli) newApprovalsCmd() *cobra.Command {
	var f clientFlags
	cmd := groupCmd(&cobra.Command{
		Use:         "approvals SUBCOMMAND",
		Short:       "pending exec approvals: list them, see what became of one, decide",
		Annotations: map[string]string{annSynopsis: "approvals list | get ID | resolve ID allow-once|allow-always|deny"},
	})
	f.register(cmd.PersistentFlags(), withJSON)
	withClient := func(fn func(ctx context.Context, cl *client, args []string) error) func(*cobra.Command, []string) error {
		return f.run(c, fn)
	}
	completeIDs := func(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
		if len(args) > 0 {
			if cmd.Name() == "resolve" && len(args) == 1 {
				return decisions, cobra.ShellCompDirectiveNoFileComp
			}
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return c.completeApprovals(cmd.Context(), &f), cobra.ShellCompDirectiveNoFileComp
	}
	list := &cobra.Command{
		Use: "list", Short: "the approvals waiting for a decision", Args: noArgs,
		Example: "  execmesh approvals list",
		RunE: withClient(func(ctx context.Context, cl *client, _ []string) error {
			return listApprovals(ctx, c, cl, f.json)
		}),
	}
	get := &cobra.Command{
		Use:               "get ID",
		Short:             "what became of an approval: pending, decided (and how) or expired, and the session of its run",
		Example:           "  execmesh approvals get calm-otter\n  execmesh approvals get calm-otter --json",
		Args:              exactArgs(1, "want one approval id or slug"),
		ValidArgsFunction: completeIDs,
		RunE: withClient(func(ctx context.Context, cl *client, args []string) error {
			var st approvalState
			data, err := cl.getJSON(ctx, "/v1/approvals/"+url.PathEscape(args[0]), nil, &st)
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(c.stdout, data)
			}
			tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
			for _, kv := range [][2]string{{"id", st.ID}, {"state", st.State}, {"decision", st.Decision},
				{"session", st.SessionID}, {"denied", oneLine(st.DeniedReason)}, {"command", oneLine(st.Command)}} {
				fmt.Fprintf(tw, "%s\t%s\n", kv[0], orDash(kv[1], "-"))
			}
			return tw.Flush()
		}),
	}
	resolve := &cobra.Command{
		Use:   "resolve ID allow-once|allow-always|deny",
		Short: "decide a pending approval (by id or slug)",
		Long: "Decide a pending approval. An operator call: it sends the operator token (--operator-token,\n" +
			"$EXECMESH_OPERATOR_TOKEN, else <state-dir>/operator.token, else --token).",
		Example:           "  execmesh approvals resolve calm-otter allow-once",
		Args:              exactArgs(2, "want ID and a decision ("+strings.Join(decisions, ", ")+")"),
		ValidArgsFunction: completeIDs,
		RunE: withClient(func(ctx context.Context, cl *client, args []string) error {
			id, decision := args[0], args[1]
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
		}),
	}
	// The decision is checked before any request.
	resolveArgs := resolve.Args
	resolve.Args = func(cmd *cobra.Command, args []string) error {
		if err := resolveArgs(cmd, args); err != nil {
			return err
		}
		if !slices.Contains(decisions, args[1]) {
			return usageErrorf("approvals resolve: invalid decision %q (want %s)", args[1], strings.Join(decisions, ", "))
		}
		return nil
	}
	f.registerOperator(resolve.Flags())
	cmd.AddCommand(list, get, resolve)
	return cmd
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
			oneLine(a.Cwd), oneLine(a.Command))
	}
	return tw.Flush()
}

// newAdminCmd is `execmesh admin blockers`.
func (c *cli) newAdminCmd() *cobra.Command {
	var f clientFlags
	cmd := groupCmd(&cobra.Command{
		Use:         "admin SUBCOMMAND",
		Short:       "gateway administration",
		Annotations: map[string]string{annSynopsis: "admin blockers"},
	})
	f.register(cmd.PersistentFlags(), withJSON)
	cmd.AddCommand(&cobra.Command{
		Use:     "blockers",
		Short:   "the gateway-host sessions a restart would interrupt",
		Example: "  execmesh admin blockers",
		Args:    noArgs,
		RunE: f.run(c, func(ctx context.Context, cl *client, _ []string) error {
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
		}),
	})
	return cmd
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

// oneLine keeps a table row on one line and shows text exactly: newlines,
// tabs, control and bidi characters become visible escapes
// (internal/visible), so that a command cannot overprint, hide or reorder
// what the operator reads, and spaces are kept as they are.
func oneLine(s string) string {
	if s == "" {
		return "-"
	}
	return visible.String(s)
}

// printJSONOrEmpty prints a JSON answer, or {} for an empty one.
func printJSONOrEmpty(w io.Writer, data []byte) error {
	if len(bytes.TrimSpace(data)) == 0 {
		data = []byte("{}")
	}
	return printJSON(w, data)
}
