package main

import (
	"context"
	"errors"

	"github.com/spf13/cobra"

	"github.com/execmesh/execmesh/gateway"
	"github.com/execmesh/execmesh/mcpserver"
	"github.com/execmesh/execmesh/protocol"
)

// newMCPCmd is `execmesh mcp`: the exec and process tools (and apply_patch
// where the gateway serves it) as an MCP server over stdio, forwarding to
// a gateway (--gateway, --token, --session-key) or, with --embedded, to a
// private in-process gateway.
func (c *cli) newMCPCmd() *cobra.Command {
	var f clientFlags
	var embedded bool
	cmd := &cobra.Command{
		Use:   "mcp [--embedded]",
		Short: "serve the exec and process tools as an MCP server on stdio",
		Long: "Serve the exec and process tools (and apply_patch when the gateway has\n" +
			"tools.exec.applyPatch.enabled) to an MCP client on stdin/stdout, forwarding every call to a\n" +
			"running gateway; with --embedded to a private in-process gateway instead (host=gateway only,\n" +
			"and nothing can answer an approval from outside). Exit notices of background sessions arrive\n" +
			"as MCP log messages.",
		Example: "  claude mcp add execmesh -- execmesh mcp\n" +
			"  execmesh mcp --session-key agent:coder:main\n" +
			"  execmesh mcp --embedded --config ~/.config/execmesh-mcp.json",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return c.runMCP(cmd.Context(), &f, embedded) },
	}
	f.register(cmd.Flags(), withSessionKey)
	cmd.Flags().BoolVar(&embedded, "embedded", false, "run a private in-process gateway (host=gateway only) instead of calling one")
	return cmd
}

func (c *cli) runMCP(ctx context.Context, f *clientFlags, embedded bool) error {
	opts := mcpserver.Options{Version: buildVersion().Version}
	if embedded {
		cfg, err := f.load(c)
		if err != nil {
			return err
		}
		cfg.StateDir = f.stateDir // "" = a temporary dir, removed on exit
		emb, err := mcpserver.NewEmbedded(ctx, cfg, gateway.Options{ConfigPath: f.filePath(c)})
		if err != nil {
			return err
		}
		defer emb.Close(context.WithoutCancel(ctx))
		opts.ApplyPatch = func() bool { return cfg.Tools.Exec.ApplyPatch.Enabled }
		return mcpserver.ServeStdio(ctx, emb.Invoker(f.sessionKey), opts, c.stdin, c.stdout)
	}
	cl, err := f.client(c)
	if err != nil {
		return err
	}
	defer cl.close()
	opts.ApplyPatch = func() bool { return cl.servesApplyPatch(ctx, f.sessionKey) }
	return mcpserver.ServeStdio(ctx, mcpserver.NewHTTPInvoker(cl.base, cl.token, f.sessionKey, cl.hc), opts, c.stdin, c.stdout)
}

// servesApplyPatch asks the gateway whether sessionKey may use apply_patch:
// an empty call is refused as "Tool not available" (404) when it may not,
// and as an invalid request (no patch: nothing is applied) when it may.
func (cl *client) servesApplyPatch(ctx context.Context, sessionKey string) bool {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	_, _, err := cl.invokeTool(ctx, protocol.ToolApplyPatch, struct{}{}, sessionKey)
	var pe *protocol.Error
	if errors.As(err, &pe) {
		return pe.Type == protocol.ErrInvalidRequest
	}
	return err == nil
}
