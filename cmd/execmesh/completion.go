package main

import (
	"context"
	"time"

	"github.com/spf13/cobra"

	"github.com/execmesh/execmesh/protocol"
)

// completionTimeout bounds the gateway calls of dynamic completion: a
// shell waits for them on every Tab.
const completionTimeout = 2 * time.Second

// completeValues completes flag name with a fixed list of values.
func completeValues(cmd *cobra.Command, name string, values ...string) {
	_ = cmd.RegisterFlagCompletionFunc(name, cobra.FixedCompletions(values, cobra.ShellCompDirectiveNoFileComp))
}

// withCompletionClient runs fn with a client built from the flags given so
// far; any failure completes nothing.
func withCompletionClient[T any](ctx context.Context, c *cli, f *clientFlags, fn func(context.Context, *client) ([]T, error)) []T {
	cl, err := f.client(c)
	if err != nil {
		return nil
	}
	defer cl.close()
	ctx, cancel := context.WithTimeout(ctx, completionTimeout)
	defer cancel()
	out, err := fn(ctx, cl)
	if err != nil {
		return nil
	}
	return out
}

// completeNodes lists node names and ids, "NAME\tid ID" (shells show the
// part after the tab as a description).
func (c *cli) completeNodes(ctx context.Context, f *clientFlags) []string {
	return withCompletionClient(ctx, c, f, func(ctx context.Context, cl *client) ([]string, error) {
		var ans struct {
			Nodes []nodeInfo `json:"nodes"`
		}
		if _, err := cl.getJSON(ctx, "/v1/nodes", nil, &ans); err != nil {
			return nil, err
		}
		var out []string
		for _, n := range ans.Nodes {
			if n.Name != "" && n.Name != n.ID {
				out = append(out, n.Name+"\t"+n.Status+", id "+n.ID)
			}
			out = append(out, n.ID+"\t"+orDash(n.Name, "")+" "+n.Status)
		}
		return out, nil
	})
}

// completeSessionIDs lists the sessionKey's session ids with their
// commands.
func (c *cli) completeSessionIDs(ctx context.Context, f *clientFlags) []string {
	return withCompletionClient(ctx, c, f, func(ctx context.Context, cl *client) ([]string, error) {
		_, ans, err := cl.invokeTool(ctx, protocol.ToolProcess, protocol.ProcessArgs{Action: "list"}, f.sessionKey)
		if err != nil {
			return nil, err
		}
		var out []string
		for _, e := range ans.Result.Details.Sessions.Value() {
			if id := e.SessionID.Value(); id != "" {
				out = append(out, id+"\t"+e.Status.Value()+": "+oneLine(e.Command.Value()))
			}
		}
		return out, nil
	})
}

// completeApprovals lists the pending approvals' slugs with their
// commands.
func (c *cli) completeApprovals(ctx context.Context, f *clientFlags) []string {
	return withCompletionClient(ctx, c, f, func(ctx context.Context, cl *client) ([]string, error) {
		var ans struct {
			Approvals []approvalInfo `json:"approvals"`
		}
		if _, err := cl.getJSON(ctx, "/v1/approvals", nil, &ans); err != nil {
			return nil, err
		}
		var out []string
		for _, a := range ans.Approvals {
			out = append(out, a.Slug+"\t"+oneLine(a.Command))
		}
		return out, nil
	})
}
